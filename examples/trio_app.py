"""A small Trio application that runs helper processes with corral.

The same job as ``asyncio_app.py``, written the way a Trio program is: corral
needs no adapter, its runner is used like a nursery.

1. start a web server child and wait until it reports the port it bound;
2. fetch a page from it;
3. run a "build step" to completion, and a "lint step" whose failure we expect;
4. stop the server;
5. show how a failing child surfaces: as ``ProcessFailed`` out of the runner,
   after its siblings were stopped.

It needs Trio, corral's ``trio`` extra (``pip install -e '.[trio]'`` in a
checkout, which the README's set-up does; without it the example says so).
Run it with ``python examples/trio_app.py``.  Lines printed by the children
appear on stderr with a ``HH:MM:SS source |`` prefix; the program's own
report goes to stdout.
"""

import sys

try:
    import trio
except ModuleNotFoundError:
    sys.exit("this example runs on Trio: install corral[trio] (pip install -e '.[trio]')")

import corral

# The web server: binds a free port, tells the launcher which one, then serves.
SERVER = """
import http.server, os
import corral.child

class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the web child"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = http.server.HTTPServer(("127.0.0.1", 0), Hello)
corral.child.started({"port": server.server_address[1]})
server.serve_forever()
"""

BUILD = "print('compiling...'); print('linking...'); print('build ok')"
LINT = "import sys; print('3 style errors', file=sys.stderr); sys.exit(3)"
CRASH = "import sys; print('error: out of coffee', file=sys.stderr); sys.exit(2)"

PYTHON = sys.executable


async def fetch(port: int) -> str:
    """GET / from 127.0.0.1:port with a plain Trio TCP stream; return the body."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
        response = b""
        while chunk := await stream.receive_some():
            response += chunk
    return response.partition(b"\r\n\r\n")[2].decode()


async def main() -> None:
    async with corral.open_runner(name="app", grace=2.0) as r:
        # wait_started=True: start() returns once the child has called
        # corral.child.started(...), with the value in started_value.
        web = await r.start([PYTHON, "-c", SERVER], name="web", wait_started=True, start_timeout=30)
        port = web.started_value["port"]
        print(f"web: listening on port {port} (pid {web.pid})")
        print(f"web: GET / -> {await fetch(port)!r}")

        # run() = start + wait, like subprocess.run.  Its output goes to the log
        # (corral.LOG, the default) and, with PIPE, into the result as well.
        # It raises ProcessFailed itself on failure...
        build = await r.run([PYTHON, "-c", BUILD], name="build", stdout=corral.LOG | corral.PIPE)
        print(f"build: exited with code {build.returncode}, said {build.stdout!r}")
        # ...unless check=False, which just returns the result (a CompletedProcess).
        lint = await r.run([PYTHON, "-c", LINT], name="lint", check=False)
        print(f"lint: exited with code {lint.returncode} (check=False, so not an error)")

        # Stop signal to the server's process group, up to grace, then SIGKILL.
        # (web.terminate() would send SIGTERM at once and not wait.)
        code = await web.stop()
        print(f"web: stopped, return code {code}")

    # A started child that fails takes the runner down: its siblings are
    # stopped and the failure comes out of the block in an ExceptionGroup.
    try:
        async with corral.open_runner(name="pipeline", grace=2.0) as r:
            await r.start(["sleep", "30"], name="worker")
            await r.start([PYTHON, "-c", CRASH], name="step")
    except* corral.ProcessFailed as group:
        for failure in group.exceptions:
            assert isinstance(failure, corral.ProcessFailed)
            print(f"caught ProcessFailed: {failure.name} {failure.reason}")
            print(f"  its stderr tail: {failure.stderr_text.strip()!r}")
    print("done: every child has exited")


if __name__ == "__main__":
    trio.run(main)
