"""Every log line in one place: capture, Python logging, routing, files and a live tail.

1. A shell child writes to stdout and stderr, the last line without a
   newline.  Each line becomes a log record of the source ``logs.shell``:
   stdout at INFO, stderr at WARNING.
2. A Python child calls ``corral.child.connect(logging.INFO)``; from then on
   its ``logging`` records (logger name, level, its own timestamp, the
   traceback of ``log.exception``) stream to the launcher.  It ends with
   ``os._exit``, and still nothing is lost.
3. A ``Route`` sends only that child's WARNING and ERROR records to a
   handler of our own.
4. ``proc.logs()`` tails the Python child live, and ends once it has exited.
5. ``log_dir=`` writes one file per source and a ``combined.log`` into a
   timestamped folder; the example prints the layout and the first lines.

The console shows every record as well (on stderr, ``HH:MM:SS source |``).
Run it with ``python examples/logs.py``.
"""

import logging
import sys
import tempfile
from pathlib import Path

import anyio

import corral

PYTHON = sys.executable

SHELL = 'echo compiling; echo "warning: flag -O9 is deprecated" >&2; printf "no newline at the end"'

APP = """\
import logging, os
import corral.child

corral.child.connect(logging.INFO)   # a no-op when not started by corral
log = logging.getLogger("app.db")

print("app starting")                # stdout: a record at INFO, like the shell's
log.info("connected to %s", "db.example:5432")
log.warning("query took %.1f s", 2.5)
try:
    1 / 0
except ZeroDivisionError:
    log.exception("query failed")    # the traceback travels with the record
print("app done")
os._exit(0)                          # abrupt, and still every record arrives
"""


class Alerts(logging.Handler):
    """Keeps the records it is given.  Called on a worker thread, never on the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def describe(record: logging.LogRecord) -> str:
    stream = getattr(record, "corral_stream", None)
    text = f"[{stream}] {record.levelname} {record.name}: {record.getMessage()}"
    if record.exc_text:
        text += f" (traceback ending in {record.exc_text.splitlines()[-1]!r})"
    return text


async def main() -> None:
    alerts = Alerts()
    # Only the process "app", and only WARNING and above.
    route = corral.Route(alerts, "app", level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "app.py"
        script.write_text(APP)
        log_dir = Path(tmp) / "logs"

        async with corral.open_runner(name="logs", handlers=[route], log_dir=log_dir) as r:
            shell = await r.start(["sh", "-c", SHELL], name="shell")
            app = await r.start([PYTHON, str(script)], name="app")
            # A tail opened right after start() misses nothing (a 256-record
            # backlog), and ends after the last record once the child exited.
            async with app.logs() as records:
                async for record in records:
                    print(f"tail: {describe(record)}")
            print(f"app exited with code {await app.wait()}; its records are all written")
            await shell.wait()
            assert r.log_path is not None
            folder = Path(r.log_path)

        print("the alerts handler got:")
        for line in alerts.lines:
            print(f"  {line}")

        print(f"log folder: {folder.relative_to(tmp)}/")
        for path in sorted(folder.iterdir()):
            print(f"  {path.name:<16} {len(path.read_text().splitlines())} lines")

        print("first lines of combined.log:")
        for line in (folder / "combined.log").read_text().splitlines()[:8]:
            print(f"  {line}")


if __name__ == "__main__":
    anyio.run(main)
