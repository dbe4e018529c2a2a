"""Watch a runner live: its monitor's page, its WebSocket protocol, ``corral tail``.

1. ``open_runner(monitor="127.0.0.1:0")`` serves a monitor on a free loopback
   port for as long as the runner lives.  ``r.monitor_url`` is the page's
   address, token included: open it in a browser for the live process table
   and log tail.
2. The example is a client of its own monitor: it connects to the same
   address with ``ws://`` (here with the ``websockets`` package), asks for
   the records of the children at INFO and above (``source=`` and ``level=``
   in the query), and prints each message as it comes: the snapshot
   (``hello``), log records, changes of state, and ``end``.
3. Two children are told what to do on their stdin, one step at a time, so
   that every message can be waited for.

The console shows every record as well (on stderr).  Run it with ``python
examples/monitor.py``; with ``--linger 60`` it waits a minute before the
children finish, to leave you time to open the page or run ``corral tail``
on the address it prints.
"""

import json
import logging
import subprocess
import sys
import urllib.parse
from typing import Any

import anyio
from websockets.asyncio.client import ClientConnection, connect

import corral

#: A child that does what its stdin says: ``out TEXT`` prints TEXT, ``warn
#: TEXT`` logs a warning through corral's log connection, ``exit N`` exits.
CHILD = """\
import logging, sys
import corral.child

corral.child.connect(logging.INFO)
log = logging.getLogger("app")
for line in sys.stdin:
    command, _, text = line.strip().partition(" ")
    if command == "out":
        print(text, flush=True)
    elif command == "warn":
        log.warning(text)
    elif command == "exit":
        sys.exit(int(text))
"""


def websocket_url(page: str, **query: str) -> str:
    """The monitor's WebSocket address: the page's, with ``ws://`` (and more in the query)."""
    parts = urllib.parse.urlsplit(page)
    params = dict(urllib.parse.parse_qsl(parts.query)) | query
    return urllib.parse.urlunsplit(
        parts._replace(scheme="ws", query=urllib.parse.urlencode(params))
    )


def show(message: dict[str, Any]) -> None:
    kind = message["type"]
    if kind == "hello":
        processes = ", ".join(
            f"{p['name']} ({p['state']}, pid {p['pid']})" for p in message["processes"]
        )
        print(f"hello: protocol {message['v']}, runner {message['runner']}, {processes}")
    elif kind == "logs":
        for source, _stream, level, _time, _logger, text in message["records"]:
            print(f"record: {source} {logging.getLevelName(level)} {text}")
    elif kind == "process":
        print(f"process: {message['name']} {message['state']} (exit code {message['returncode']})")
    elif kind == "dropped":
        print(f"dropped: {message['count']} records (this client fell behind)")
    elif kind == "end":
        print("end: the runner has ended")


async def until(ws: ClientConnection, kind: str) -> None:
    """Print messages until one of ``kind`` has come."""
    async for text in ws:
        message = json.loads(text)
        show(message)
        if message["type"] == kind:
            return


async def tell(proc: corral.Process, command: str) -> None:
    assert proc.stdin is not None
    await proc.stdin.send(command.encode() + b"\n")


async def main(linger: float) -> None:
    async with corral.open_runner(name="shop", monitor="127.0.0.1:0") as r:
        assert r.monitor_url is not None
        print(f"monitor page: {r.monitor_url}")
        print(f"in a terminal: corral tail '{r.monitor_url}'")
        web = await r.start([sys.executable, "-c", CHILD], name="web", stdin=subprocess.PIPE)
        worker = await r.start(
            [sys.executable, "-c", CHILD], name="worker", stdin=subprocess.PIPE, check=False
        )
        # Only the children's records (not the runner's own), INFO and above.
        ws = await connect(websocket_url(r.monitor_url, source="shop.*", level="INFO"))
        await until(ws, "hello")
        await tell(web, "out listening on port 8080")
        await until(ws, "logs")
        await tell(worker, "warn disk 91% full")
        await until(ws, "logs")
        await anyio.sleep(linger)  # time to look at the page (0 unless --linger)
        await tell(worker, "exit 1")
        await until(ws, "process")
        assert web.stdin is not None
        await web.stdin.aclose()  # the web child exits at the end of its input
        await until(ws, "process")
    # Every child has exited: the monitor says so, then closes the connection.
    await until(ws, "end")
    await ws.close()


if __name__ == "__main__":
    seconds = float(sys.argv[sys.argv.index("--linger") + 1]) if "--linger" in sys.argv else 0.0
    anyio.run(main, seconds)
