"""Watch a runner live: a WebSocket monitor, a page for a browser, ``corral tail``.

``open_runner(monitor="127.0.0.1:0")`` starts a :class:`Monitor` in the
runner's task group, stopped with it.  :attr:`Runner.monitor_url` is
``http://HOST:PORT/?token=...``: opened in a browser it is a live page (the
process table and a filterable log tail); the same address with ``ws://`` is
the WebSocket endpoint, which speaks the JSON protocol below.  The server is
the WebSocket library of the running loop: trio-websocket on Trio, the
``websockets`` package's asyncio server on asyncio.

**Security.**  The monitor binds to loopback unless told otherwise
(``monitor=True`` or a port alone).  Every
connection — the page, the WebSocket — must carry the access token
(``?token=``, compared in constant time); a missing or wrong one is refused
with ``403`` and no data.  A browser's ``Origin`` must be the monitor's own
page: its port, and a name that cannot be made to point elsewhere; or one of
``monitor_origins`` (a reverse proxy's pages).  Before
its token is checked a connection costs next to nothing: it may send a
request of at most :data:`MAX_REQUEST` bytes within
:data:`HANDSHAKE_TIMEOUT` seconds, and of :data:`MAX_HANDSHAKES` such
connections the oldest is closed when another comes.

**Never in the way.**  The monitor keeps one queue of log events for all
its clients, bounded in records and bytes (:data:`QUEUE_RECORDS`,
:data:`QUEUE_BYTES`; only the few hundred a client gets on connecting while
none is connected); each client has its place in it.  A client that reads
slowly (or not at all) loses its *oldest* log events, and the next message
it gets says how many (``{"type": "dropped"}``).  The runner, the other
clients, the log files and handlers lose nothing and wait for nobody, and
adding to the queue costs the same whatever the clients.  The queue holds
output as it was read; it is split into records only to be sent, in a
worker thread, one message of at most :data:`MESSAGE_ROWS` records and
:data:`MESSAGE_BYTES` bytes at a time (the messages on their way to all
clients hold at most :data:`SEND_BUDGET` bytes, or :data:`MIN_MESSAGE` each),
and the kernel holds at most :data:`SEND_BUFFER` bytes for a connection: a
client that stops reading is prepared one message for, not everything that
follows.

The protocol (version 1), JSON text messages, server to client:

``{"type": "hello", "v": 1, "runner": NAME, "log_path": PATH|null, "processes": [PROCESS...],
"usage": [SAMPLE...]}``
    first, a snapshot of every process and the last samples of what each
    costs (oldest first, at most :data:`USAGE_HISTORY` and
    :data:`USAGE_HISTORY_BYTES`); then, in a ``logs`` message, the last few
    hundred log records from before the client came.
``{"type": "process", ...PROCESS}``
    a process changed state.  PROCESS is ``{"name", "source", "pid", "state"
    ("running", "restarting", or how its run ended: "exited" with 0, "failed"
    on its own, "stopped" by its owner), "returncode", "signal" (the name of
    the signal that ended it, or null), "started" (Unix time), "restarts"}``.
``{"type": "logs", "records": [[SOURCE, STREAM, LEVEL, TIME, LOGGER, MESSAGE], ...]}``
    log records, in order.  STREAM is ``"stdout"``, ``"stderr"``,
    ``"logging"`` or ``null`` (the runner's own); LEVEL a number.
``{"type": "usage", ...SAMPLE}``
    about once a second, what each running process costs (a client that
    falls behind gets the newest only).  SAMPLE is ``{"time", "processes":
    {NAME: {"pid", "cpu" (percent of one core), "rss" (bytes), "gpu" (bytes
    or null), "processes", "host" (null, or a remote worker's host)}}}``.
``{"type": "dropped", "count": N}``
    N log events were dropped because this client fell behind.
``{"type": "end", "status": N, "failure": FAILURE|null}``
    the runner has ended, with the status the ``corral`` command exits with
    (128 + N after a signal N, else the first failure's code, else 0) and
    the failure that ended it, ``{"name", "source", "returncode", "stderr"
    (its last lines)}``; the server closes the connection.

Client to server, at any time: ``{"type": "filter", "source": GLOB, "level":
N}`` keeps only the log records of sources matching the glob (the full
source, ``<runner>.<process>``) at level N or above.  The same filter can be
given as ``source=`` and ``level=`` query parameters of the URL.

The modules: ``_rows`` (a client's filter, rows in JSON), ``_clients`` (the
one queue of log events and each client's place in it), ``_server`` (the
monitor's state, who may connect, the life of a client), ``_serve`` (serving
with the loop's own WebSocket library: ``_asyncio``, ``_trio``) and
``page.html`` (the page).

Public face: _server, _clients, _serve
"""
