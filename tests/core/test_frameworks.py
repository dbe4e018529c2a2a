"""A runner inside a real web framework: Ctrl-C stops the server and its children.

By default a runner takes SIGINT and SIGTERM only when nobody holds them
(and leaves SIGHUP alone); a framework that installed its own handler keeps
it, and stopping the server stops the runner.  These tests check that end
to end, with the real servers:

* **uvicorn** (asyncio) serving a Starlette app whose lifespan keeps a
  runner open for the app's life, and cancels it when the app shuts down;
* **hypercorn** with its Trio worker serving a Quart-Trio app whose
  ``before_serving`` starts a service task that owns the runner (in the
  app's background nursery), and whose ``after_serving`` cancels it: once
  through hypercorn's command line (a master process that holds the
  signals and one worker), once through ``trio.run(hypercorn.trio.serve)``
  in a single process (where ``trio.run`` holds SIGINT).

Each server runs as a process of its own, in its own session, so that a
signal to its process group is what a terminal's Ctrl-C (or a service
manager's SIGTERM) does.  It listens on a socket the test bound and passes
down (no port is guessed, none can be taken in between), prints a line
once the app's start-up has started both children (and, under
``trio.run``, one more once it serves), and answers ``GET /`` with the
children's pids and the handler of each signal; it prints STOPPED when the
app's own shutdown code has left the runner.  The children lead
process groups of their own, so the signal to the server's group never
reaches them: only the server, through corral, can stop them.  Every
process of a test (the server, its workers, corral's lifeline, the
children) carries the test's tag, and none may outlive the test.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import docs
from tests.helpers.processes import TAG_VAR, is_alive, tagged_pids, wait_gone

PY = sys.executable

#: Seconds a server gets to exit after one signal.  It needs well under one
#: (its children obey their stop signal at once; their grace is 2 s).
EXIT_BOUND = 6.0

#: Seconds a server gets to start its children and report them.
START_BOUND = 20.0

# What the app prints on stdout when its own shutdown code ran to its end:
# the runner was left without an error, so every child was reaped.
STOPPED = "STOPPED"

# A Python child that changes no signal disposition.
CHILD = "import time, corral.child\ncorral.child.started()\ntime.sleep(1000)\n"

# The child of a request waiting in ``r.run()``: it says it runs, on the
# server's stdout, which it inherits.
RUN_CHILD = "import os, time\nos.write(1, b'RUN %d\\n' % os.getpid())\ntime.sleep(1000)\n"

# The handler of a signal, as the test compares it: module and qualified
# name of a function or bound method, the repr of anything else.
HOLDER = """
def holder(signum):
    handler = signal.getsignal(signum)
    function = getattr(handler, "__func__", handler)
    if callable(function):
        return f"{function.__module__}.{function.__qualname__}"
    return repr(handler)


def report(pids):
    return {
        "pids": pids,
        "handlers": {s.name: holder(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)},
    }
"""

# Starlette under uvicorn; argv: the listening socket's descriptor.
# ``uvicorn.Server.run`` is what ``uvicorn.run`` calls; it is the one entry
# point that takes an open socket of any family.
UVICORN_SERVER = f"""
import contextlib, os, signal, socket, sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

import corral

TAG = os.environ[{TAG_VAR!r}]
CHILD = {CHILD!r}
RUN_CHILD = {RUN_CHILD!r}
{HOLDER}

@contextlib.asynccontextmanager
async def lifespan(app):
    async with corral.open_runner(name="web", grace=2.0, console=False) as r:
        env = {{{TAG_VAR!r}: TAG}}
        await r.start(["sleep", "1000"], name="sleeper", extra_env=env)
        await r.start([sys.executable, "-c", CHILD], name="worker", extra_env=env,
                      wait_started=True)
        app.state.runner = r
        print("READY", *(p.pid for p in r.processes), flush=True)
        try:
            yield
        finally:
            r.cancel()  # the app is shutting down: so are its children
    print({STOPPED!r}, flush=True)


async def status(request):
    return JSONResponse(report([p.pid for p in request.app.state.runner.processes]))


async def run(request):
    # A request that waits in r.run(); its child says it runs on our stdout.
    result = await request.app.state.runner.run(
        [sys.executable, "-c", RUN_CHILD], extra_env={{{TAG_VAR!r}: TAG}}, stdout=None
    )
    return JSONResponse({{"returncode": result.returncode}})


async def churn(request):
    # A request that keeps starting children (and kills each one at once, so
    # that they do not pile up): at almost any moment a start is under way.
    print("CHURN", flush=True)
    runner = request.app.state.runner
    while True:
        proc = await runner.start(["sleep", "1000"], extra_env={{{TAG_VAR!r}: TAG}})
        proc.kill()


app = Starlette(
    routes=[Route("/", status), Route("/run", run), Route("/churn", churn)], lifespan=lifespan
)
listener = socket.socket(fileno=int(sys.argv[1]))
loop = sys.argv[2] if len(sys.argv) > 2 else "auto"  # uvloop if installed, as by default
config = uvicorn.Config(app, log_level="info", access_log=False, loop=loop)
uvicorn.Server(config).run(sockets=[listener])
"""

# Quart-Trio, for hypercorn's Trio worker.  The runner lives in a task of the
# app's background nursery, so that its scope is its own task's; it is
# cancelled by ``after_serving``.
QUART_APP = f"""
import os, signal, sys

import trio
from quart_trio import QuartTrio

import corral

TAG = os.environ[{TAG_VAR!r}]
CHILD = {CHILD!r}
{HOLDER}

app = QuartTrio(__name__)
state = {{}}


async def children(*, task_status=trio.TASK_STATUS_IGNORED):
    stopped = state["stopped"] = trio.Event()
    try:
        async with corral.open_runner(name="web", grace=2.0, console=False) as r:
            env = {{{TAG_VAR!r}: TAG}}
            await r.start(["sleep", "1000"], name="sleeper", extra_env=env)
            await r.start([sys.executable, "-c", CHILD], name="worker", extra_env=env,
                          wait_started=True)
            task_status.started(r)
            await trio.sleep_forever()
    finally:
        stopped.set()
    print({STOPPED!r}, flush=True)


@app.before_serving
async def start_children():
    r = state["runner"] = await app.nursery.start(children)
    print("READY", *(p.pid for p in r.processes), flush=True)


@app.after_serving
async def stop_children():
    state["runner"].cancel()  # the app is shutting down: so are its children
    await state["stopped"].wait()


@app.route("/")
async def status():
    return report([p.pid for p in state["runner"].processes])
"""

# The same app in one process: ``trio.run(hypercorn.trio.serve)``, as
# Hypercorn's documentation shows for running it programmatically.  SIGINT
# is Trio's here, and Trio raises KeyboardInterrupt in whatever code runs
# when it arrives: during Quart's start-up, Hypercorn logs it as a lifespan
# error and serves on, whatever corral does.  So the test waits for the
# "SERVING" line, which the shutdown trigger (started once Hypercorn's main
# task waits for a shutdown, and never firing) prints from KI-protected code:
# from then on an idle server gets a Ctrl-C in that main task, which catches
# it and shuts down.
HYPERCORN_SERVE = """
import sys
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from app import app


@trio.lowlevel.enable_ki_protection
async def serving():
    print("SERVING", flush=True)
    await trio.sleep_forever()


config = Config()
config.bind = [f"fd://{sys.argv[1]}"]
trio.run(partial(serve, app, config, shutdown_trigger=serving))
"""

UVICORN = "uvicorn"
HYPERCORN_CLI = "hypercorn-cli"
HYPERCORN_SERVE_ = "hypercorn-serve"

#: How a server may end after one signal: exit 0 (it stopped on its own),
#: 128 + signal (it reported the signal), or death by the signal (it raised
#: it again once its clean-up was done, as uvicorn does).
ALLOWED_EXITS: dict[int, set[int]] = {
    signal.SIGINT: {0, 128 + signal.SIGINT, -signal.SIGINT},
    signal.SIGTERM: {0, 128 + signal.SIGTERM, -signal.SIGTERM},
    signal.SIGHUP: {0, 128 + signal.SIGHUP, -signal.SIGHUP},
}

#: The signals held in the process where the app runs (uvicorn's; Trio's
#: SIGINT; hypercorn's worker ignores SIGINT and leaves it to its master, which
#: then shuts the worker down): for those, the app's own shutdown must run.
#: The others (SIGTERM in hypercorn's worker and under ``trio.run``) end that
#: process by their default action, as without corral, once corral has
#: stopped the children.
HELD: dict[str, set[int]] = {
    UVICORN: {signal.SIGINT, signal.SIGTERM},
    HYPERCORN_CLI: {signal.SIGINT},
    HYPERCORN_SERVE_: {signal.SIGINT},
}

CORRAL_HANDLER = "corral._core._signals._handle"
UVICORN_HANDLER = "uvicorn.server.Server.handle_exit"


class Server:
    """A web server in a session of its own, serving on a socket the test bound."""

    def __init__(self, kind: str, tmp_path: Path, tag: str, extra: Sequence[str] = ()) -> None:
        self.kind = kind
        self.tag = tag
        (tmp_path / "uvicorn_server.py").write_text(UVICORN_SERVER)
        (tmp_path / "app.py").write_text(QUART_APP)
        (tmp_path / "hypercorn_serve.py").write_text(HYPERCORN_SERVE)
        self.errfile = tmp_path / "server.err"
        self.out = b""
        self.children: list[int] = []
        listener = socket.create_server(("127.0.0.1", 0))
        try:
            self.port = listener.getsockname()[1]
            fd = listener.fileno()
            argv = {
                UVICORN: [PY, "uvicorn_server.py", str(fd), *extra],
                HYPERCORN_CLI: [PY, "-m", "hypercorn", "-k", "trio", "-b", f"fd://{fd}", "app:app"],
                HYPERCORN_SERVE_: [PY, "hypercorn_serve.py", str(fd)],
            }[kind]
            pythonpath = os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            )
            env = {**os.environ, TAG_VAR: tag, "PYTHONPATH": pythonpath}
            with open(self.errfile, "wb") as err:
                self.proc = subprocess.Popen(
                    argv,
                    cwd=tmp_path,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    pass_fds=[fd],
                    start_new_session=True,
                    bufsize=0,
                )
        finally:
            # The server holds the socket now; a connection made before it
            # accepts waits in the backlog.
            listener.close()

    def wait_ready(self) -> None:
        """Wait for the app to report its children (and, under Trio, for the server to serve)."""
        line = self._readline(START_BOUND)
        assert line.startswith("READY "), f"the server did not get ready: {line!r}{self.errors()}"
        self.children = [int(pid) for pid in line.split()[1:]]
        assert len(self.children) == 2, line
        if self.kind == HYPERCORN_SERVE_:
            line = self._readline(START_BOUND)
            assert line == "SERVING", f"the server did not serve: {line!r}{self.errors()}"

    def _readline(self, timeout: float) -> str:
        """The first line of the server's stdout, waiting at most ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while b"\n" not in self.out:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                return f"(no line within {timeout} s) {self.out!r}"
            chunk = os.read(fd, 4096)
            if not chunk:
                break  # the server exited before it was ready
            self.out += chunk
        line, _, self.out = self.out.partition(b"\n")
        return line.decode()

    def get(self, timeout: float = 10.0) -> dict[str, Any]:
        """``GET /``: the children's pids and the handler of each signal."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", "/", headers={"Connection": "close"})
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        assert response.status == 200, f"GET / answered {response.status}: {body!r}"
        answer: dict[str, Any] = json.loads(body)
        return answer

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)  # what a terminal's Ctrl-C does

    def wait(self, timeout: float) -> int | None:
        """The server's exit code, or ``None`` if it still runs after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stdout(self) -> str:
        """What the server printed after its READY line (once it has exited)."""
        assert self.proc.stdout is not None
        if self.proc.poll() is not None:
            self.out += self.proc.stdout.read() or b""
        return self.out.decode(errors="replace")

    def errors(self) -> str:
        """The tail of the server's stderr, for assertion messages."""
        text = self.errfile.read_text(errors="replace") if self.errfile.exists() else ""
        return f"\nserver stderr:\n{text[-6000:]}"

    def still_serving(self) -> str:
        """For a server that did not exit: what it answers now, and which children live."""
        try:
            answer = repr(self.get(timeout=2.0))
        except (OSError, AssertionError) as exc:
            answer = f"no answer ({exc!r})"
        alive = [pid for pid in self.children if is_alive(pid)]
        return f"GET / now answers {answer}; children still alive: {alive}"

    def close(self) -> None:
        """Kill what is left (its lifeline then kills the children) and reap it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        wait_gone(tagged_pids(self.tag), 10.0)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


Serve = Callable[..., Server]


@pytest.fixture
def serve(tmp_path: Path, tag: str) -> Iterator[Serve]:
    """``serve(kind, *extra)``: a server of ``kind`` (its script gets ``extra`` arguments)."""
    servers: list[Server] = []

    def start(kind: str, *extra: str) -> Server:
        server = Server(kind, tmp_path, tag, extra)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.close()


def _stops_server_and_children(serve: Serve, tag: str, kind: str, sig: int) -> None:
    server = serve(kind)
    children = server.children
    # Under ``trio.run``, Trio raises KeyboardInterrupt in whatever code runs
    # when SIGINT arrives; right after a request that can be Hypercorn's
    # connection or request task, and then ``serve`` either ends with an error
    # (exit 1) or logs it and serves on, whatever corral does.  So there the
    # pids come from the READY line alone.
    if not (kind == HYPERCORN_SERVE_ and sig == signal.SIGINT):
        assert sorted(server.get()["pids"]) == sorted(children)
    for pid in children:
        # Leaders of their own groups: the signal to the server's group does
        # not reach them; only the server can pass it on.
        assert os.getpgid(pid) == pid != os.getpgid(server.proc.pid)
    assert set(children) <= set(tagged_pids(tag))

    server.signal(sig)
    returncode = server.wait(EXIT_BOUND)
    name = signal.Signals(sig).name
    assert returncode is not None, (
        f"one {name} did not stop the server within {EXIT_BOUND} s: "
        f"{server.still_serving()}{server.errors()}"
    )
    assert returncode in ALLOWED_EXITS[sig], f"exit code {returncode}{server.errors()}"
    assert wait_gone(children + tagged_pids(tag), 10.0) == [], server.errors()
    if sig not in HELD[kind]:
        # Nobody held it where the app runs: corral stopped the children (they
        # are gone, checked above), then the signal's default action ended
        # that process.  The one-process server shows it in its exit status.
        if kind == HYPERCORN_SERVE_:
            assert returncode == -sig, f"exit code {returncode}{server.errors()}"
        return
    assert STOPPED in server.stdout().split(), (
        f"the app's shutdown did not run to its end (stdout {server.stdout()!r}){server.errors()}"
    )


SERVERS = [UVICORN, HYPERCORN_CLI, HYPERCORN_SERVE_]


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", SERVERS)
def test_ctrl_c_stops_server_and_children(serve: Serve, tag: str, kind: str) -> None:
    _stops_server_and_children(serve, tag, kind, signal.SIGINT)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", SERVERS)
def test_sigterm_stops_server_and_children(serve: Serve, tag: str, kind: str) -> None:
    _stops_server_and_children(serve, tag, kind, signal.SIGTERM)


# Not under hypercorn's command line: its master reloads the workers on SIGHUP.
@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", [UVICORN, HYPERCORN_SERVE_])
def test_sighup_stops_server_and_children(serve: Serve, tag: str, kind: str) -> None:
    """A closed terminal: no framework here holds SIGHUP."""
    _stops_server_and_children(serve, tag, kind, signal.SIGHUP)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_uvicorn_keeps_its_signal_handlers(serve: Serve, tag: str) -> None:
    server = serve(UVICORN)
    handlers = server.get()["handlers"]
    assert handlers["SIGINT"] == UVICORN_HANDLER, handlers
    assert handlers["SIGTERM"] == UVICORN_HANDLER, handlers
    server.signal(signal.SIGINT)
    assert server.wait(EXIT_BOUND) is not None, server.errors()
    assert wait_gone(tagged_pids(tag), 10.0) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_trio_run_keeps_its_sigint_handler(serve: Serve) -> None:
    server = serve(HYPERCORN_SERVE_)
    handlers = server.get()["handlers"]
    assert handlers["SIGINT"].startswith("trio."), handlers
    assert handlers["SIGINT"] != CORRAL_HANDLER
    # No Ctrl-C to end this one: right after a request, Trio may raise the
    # KeyboardInterrupt inside Hypercorn's request task, which logs it and
    # serves on (see _stops_server_and_children).  The fixture kills the
    # server; its lifeline kills the children.


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("gap", [0.1, 1.0])
def test_uvicorn_force_quit_with_requests_waiting_in_run(
    serve: Serve, tag: str, gap: float
) -> None:
    """uvicorn's defaults: the first Ctrl-C waits for the open requests, the second forces.

    The requests wait in ``r.run()`` for children that never end on their own.
    The second Ctrl-C (uvicorn's force quit, which skips the app's shutdown)
    must end the process, with every child stopped and reaped.
    """
    server = serve(UVICORN)
    connections = []
    try:
        for _ in range(3):
            connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            connection.sendall(b"GET /run HTTP/1.1\r\nHost: test\r\n\r\n")
            connections.append(connection)
        running = []
        for _ in connections:
            line = server._readline(START_BOUND)
            assert line.startswith("RUN "), f"{line!r}{server.errors()}"
            running.append(int(line.split()[1]))
        server.signal(signal.SIGINT)
        time.sleep(gap)  # the user's second Ctrl-C, this long after the first
        server.signal(signal.SIGINT)
        returncode = server.wait(EXIT_BOUND)
        assert returncode is not None, (
            f"the second Ctrl-C did not end the server within {EXIT_BOUND} s: "
            f"{server.still_serving()}{server.errors()}"
        )
        assert returncode in ALLOWED_EXITS[signal.SIGINT], f"exit {returncode}{server.errors()}"
        assert wait_gone(server.children + running + tagged_pids(tag), 10.0) == []
    finally:
        for connection in connections:
            connection.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_uvicorn_force_quit_while_requests_start_children(
    serve: Serve, tag: str, loop: str
) -> None:
    """The force quit lands while requests start children, and others wait in ``r.run()``.

    uvicorn's force quit ends its main task with :class:`KeyboardInterrupt`
    in the middle of a loop iteration; ``asyncio.run`` then cancels every task
    left, among them the tasks a start had just created and that had not run
    yet (a child's supervisor, the task that reaps it).  A task cancelled
    before its first step runs none of its code: the children got their stop
    signal, but nobody reaped them, and the process waited for its own tasks
    until a third Ctrl-C.  It must end on the second, every child reaped.
    """
    server = serve(UVICORN, loop)
    connections = []
    try:
        for path in ["/run", "/run", "/churn", "/churn", "/churn"]:
            connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            connection.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            connections.append(connection)
        running = []
        lines = [server._readline(START_BOUND) for _ in connections]
        for line in lines:
            assert line.startswith(("RUN ", "CHURN")), f"{line!r}{server.errors()}"
            if line.startswith("RUN "):
                running.append(int(line.split()[1]))
        server.signal(signal.SIGINT)
        time.sleep(0.5)  # the user's second Ctrl-C, this long after the first
        server.signal(signal.SIGINT)  # uvicorn's force quit, while the churn goes on
        returncode = server.wait(EXIT_BOUND)
        assert returncode is not None, (
            f"the second Ctrl-C did not end the server within {EXIT_BOUND} s: "
            f"{server.still_serving()}{server.errors()}"
        )
        assert returncode in ALLOWED_EXITS[signal.SIGINT], f"exit {returncode}{server.errors()}"
        assert wait_gone(server.children + running + tagged_pids(tag), 10.0) == []
    finally:
        for connection in connections:
            connection.close()


# -- the servers of the embedding how-to ------------------------------------------------

#: The ``:name:`` of each server program in docs/howto/embedding.rst.
DOC_SERVERS = ["server-uvicorn", "server-hypercorn-quart"]


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("name", DOC_SERVERS)
def test_the_how_to_s_servers_stop_their_services(
    tmp_path: Path, tag: str, name: str, sig: int
) -> None:
    """Run as the page says (``python app.py``), one signal stops the server and its helper.

    The helper (``service=True``) would keep the lifespan's block, and so the
    server, waiting for ever without it.
    """
    (tmp_path / "app.py").write_text(docs.named("howto/embedding.rst", name))
    errfile = tmp_path / "server.err"
    with open(errfile, "wb") as err:
        proc = subprocess.Popen(
            [PY, "app.py"],
            cwd=tmp_path,
            env={**os.environ, TAG_VAR: tag, "PORT": "0"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], START_BOUND)
        line = proc.stdout.readline().decode() if ready else "(nothing)"
        assert line == "serving with ['files']\n", f"{line!r}\n{errfile.read_text()}"
        helpers = [pid for pid in tagged_pids(tag) if pid != proc.pid]
        assert helpers, "the helper is not running"
        os.killpg(proc.pid, sig)  # what a terminal's Ctrl-C or a service manager does
        try:
            returncode = proc.wait(EXIT_BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"one {signal.Signals(sig).name} did not stop the server within "
                f"{EXIT_BOUND} s\n{errfile.read_text()}"
            )
        assert returncode in ALLOWED_EXITS[sig], f"{returncode}\n{errfile.read_text()}"
        assert proc.stdout.read().decode() == "every child has stopped\n"
        assert wait_gone(helpers + tagged_pids(tag), 10.0) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
