"""The start-up handshake: a child tells the launcher it is ready, and what it knows.

1. A Python worker picks a run id, reports it at once with
   ``corral.child.started(...)`` and keeps working.  The launcher prints the
   run id as soon as ``start()`` returns, lets the worker do a few steps
   (counting its output lines with a logging handler), then stops it.
2. A shell child reports without Python: one line of JSON written to the
   descriptor whose number is in ``$CORRAL_STARTED_FD``.
3. A child that exits before reporting makes ``start()`` raise
   ``StartupFailed``.

Run it with ``python examples/handshake.py``.
"""

import logging
import sys

import anyio

import corral

PYTHON = sys.executable

WORKER = """
import time, uuid
import corral.child

run_id = uuid.uuid4().hex[:8]
corral.child.started({"run_id": run_id})   # the launcher's start() returns now
step = 0
while True:                                # ...while the worker keeps working
    step += 1
    print(f"step {step} of run {run_id}")
    time.sleep(0.05)
"""

# Any program can report: one line of JSON to the descriptor $CORRAL_STARTED_FD.
SHELL = """echo '{"port": 8080}' >&$CORRAL_STARTED_FD; exec sleep 30"""

BROKEN = "import sys; sys.exit('no config file')"


class StepCounter(logging.Handler):
    """Counts the worker's "step" lines and sets ``enough`` once it has seen ``wanted``."""

    def __init__(self, wanted: int) -> None:
        super().__init__(logging.INFO)
        self.wanted = wanted
        self.seen = 0
        self.enough = anyio.Event()
        self.token: corral.LoopToken | None = None

    def emit(self, record: logging.LogRecord) -> None:
        # Handlers are called on a worker thread, never on the event loop, so
        # the event is set through the runner's loop token.
        if record.getMessage().startswith("step "):
            self.seen += 1
            if self.seen == self.wanted and self.token is not None:
                self.token.run_sync(self.enough.set)


async def main() -> None:
    counter = StepCounter(wanted=3)
    # Route: this handler only receives the records of the process "worker".
    route = corral.Route(counter, pattern="worker")
    async with corral.open_runner(name="demo", grace=2.0, handlers=[route]) as r:
        counter.token = r.token

        worker = await r.start(
            [PYTHON, "-c", WORKER], name="worker", wait_started=True, start_timeout=30
        )
        print(f"worker reported run id {worker.started_value['run_id']} and keeps working")
        with anyio.fail_after(30):
            await counter.enough.wait()
        print(f"worker has done {counter.wanted} steps; stopping it")
        code = await worker.stop()
        print(f"worker stopped, return code {code}")

        shell = await r.start(["sh", "-c", SHELL], name="shell", wait_started=True)
        print(f"shell child reported {shell.started_value}")
        await shell.stop()

        try:
            await r.start([PYTHON, "-c", BROKEN], name="broken", wait_started=True)
        except corral.StartupFailed as failure:
            print(f"caught StartupFailed: {failure.name} {failure.reason}")
            print(f"  its stderr tail: {failure.stderr_text.strip()!r}")
    print("done: every child has exited")


if __name__ == "__main__":
    anyio.run(main)
