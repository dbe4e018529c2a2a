"""A runner in a process of its own that obeys JSON commands on its stdin.

``launcher.py BACKEND OPTIONS``: OPTIONS is a JSON object: ``runner`` (keywords of
``corral.open_runner``; ``console`` is False unless given), ``console`` (true: a
:class:`corral.ConsoleHandler` on stderr, relative times, INFO and up), ``counting`` (true:
count the lines of the children that ``run`` and ``burst`` start).  It prints ``url URL``
(its monitor's, or ``url -``), then reads one JSON command a line and answers each with one
line ``ok COMMAND ...``:

``["reset"]``
    resets the peak resident size; answers the current one (KiB).
``["memory"]``
    answers ``VmRSS VmHWM`` (KiB).
``["run", N, EACH, ARGV]``
    runs N children ``ARGV`` at once (named ``run-1``, ``run-2``...), each printing EACH
    lines; answers ``SECONDS LINES CPU``: the seconds until every line reached the counting
    handler (``LINES`` of them), and the launcher's own CPU seconds meanwhile (all threads).
``["burst", COUNT, LENGTH]``
    runs ``flood.py COUNT LENGTH`` as ``burst`` and answers ``SECONDS RECORDS CPU`` once the
    counting handler has all COUNT of its lines.
``["start", NAME]``, ``["say", NAME, TEXT]``
    starts ``echo.py`` as NAME (answers its pid); sends TEXT to its stdin.
``["clients", N]`` or ``["clients", [[SOURCE, LEVEL], ...]]``
    waits until the monitor has N clients, or exactly these clients.
``["socket"]``
    answers the log socket's path, as a child sees it.
``["quit"]`` or the end of the input
    ends the runner (the ``echo.py`` children end with their input).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

import corral

HERE = Path(__file__).resolve().parent


class Counter(logging.Handler):
    """Counts the records it gets: a handler that loses none."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.count += 1
            self.changed.notify_all()

    def wait(self, count: int) -> int:
        with self.changed:
            self.changed.wait_for(lambda: self.count >= count, 60)
            return self.count


def memory() -> tuple[int, int]:
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0])
    return found["VmRSS"], found["VmHWM"]


def reply(command: str, *words: object) -> None:
    print("ok", command, *words, flush=True)


def program(name: str, *args: object) -> list[str]:
    return [sys.executable, str(HERE / f"{name}.py"), *map(str, args)]


async def serve(r: corral.Runner, counter: Counter, counting: bool) -> None:
    """Obey the commands on stdin until ``quit`` or its end."""
    runs = 0
    children: dict[str, corral.Process] = {}
    try:
        while True:
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            words: list[Any] = json.loads(line) if line.strip() else ["quit"]
            command, args = str(words[0]), words[1:]
            if command == "quit":
                break
            if command == "reset":
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                reply(command, memory()[0])
            elif command == "memory":
                reply(command, *memory())
            elif command in ("run", "burst"):
                if command == "run":
                    count, each, argv = args
                else:
                    count, each, argv = 1, args[0], program("flood", *args)
                expected = counter.count + count * each
                start, cpu = time.perf_counter(), time.process_time()
                async with anyio.create_task_group() as tg:
                    for _ in range(count):
                        runs += 1
                        name = f"run-{runs}" if command == "run" else "burst"
                        tg.start_soon(lambda argv, name: r.run(argv, name=name), argv, name)
                lines = 0
                if counting:
                    lines = await anyio.to_thread.run_sync(counter.wait, expected)
                    lines -= expected - count * each
                reply(command, time.perf_counter() - start, lines, time.process_time() - cpu)
            elif command == "start":
                child = await r.start(program("echo"), name=args[0], stdin=subprocess.PIPE)
                children[args[0]] = child
                reply(command, child.pid)
            elif command == "say":
                stdin = children[args[0]].stdin
                assert stdin is not None
                await stdin.send(args[1].encode() + b"\n")
                reply(command)
            elif command == "clients":
                await clients(r, args[0])
                reply(command)
            elif command == "socket":
                code = "import os; print(os.environ['CORRAL_LOG_SOCKET'])"
                done = await r.run(
                    [sys.executable, "-c", code], stdout=subprocess.PIPE, name="where"
                )
                assert done.stdout is not None
                reply(command, done.stdout.decode().strip())
            else:
                raise ValueError(f"no command {command!r}")
    finally:
        for child in children.values():
            if child.stdin is not None:
                await child.stdin.aclose()  # an echo.py child exits at the end of its input


async def clients(r: corral.Runner, wanted: int | list[list[Any]]) -> None:
    """Until the monitor's own list of clients (private: for the tests' sake) is ``wanted``."""
    monitor: Any = r._monitor
    if isinstance(wanted, int):
        while len(monitor.clients()) != wanted:
            await anyio.sleep(0.005)
        return
    pairs = sorted((source, level) for source, level in wanted)
    while sorted((c.source, c.level) for c in monitor.clients()) != pairs:
        await anyio.sleep(0.005)


async def main(options: dict[str, Any]) -> None:
    counter = Counter()
    handlers: list[logging.Handler | corral.Route] = []
    if options.get("console"):
        console = corral.ConsoleHandler(sys.stderr, colour=False, prefix="relative")
        console.setLevel(logging.INFO)
        handlers.append(console)
    if options.get("counting"):
        handlers += [corral.Route(counter, pattern="run-*"), corral.Route(counter, pattern="burst")]
    runner_options = {"console": False, **options.get("runner", {})}
    async with corral.open_runner(handlers=handlers, **runner_options) as r:
        print("url", r.monitor_url or "-", flush=True)
        await serve(r, counter, bool(options.get("counting")))


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[2]), backend=sys.argv[1])
