"""A script that launches one of its own functions, as a user's training script does.

``launching.py CONFIG``: CONFIG is a JSON object.  The function is one of this script's
(defined in ``__main__``: a launch sends it by value, over ssh and srun too), named by
``function`` and given ``args``:

``square(x)``
    returns ``x * x + RANK``.
``up()``, ``up_with_error_file()``
    print ``up RANK`` (or ``up`` and the worker's ``TORCHELASTIC_ERROR_FILE``), then sleep.
``sleep()``
    sleeps 1000 s.
``whoami()``
    logs a warning (logger ``app``) and prints a line, then returns its torchrun variables.
``fail_on_rank_3()``
    rank 3 raises ``KeyError(repr(time.time()))`` after 0.5 s; the others sleep.
``up_with_pid()``, ``up_with_agent()``
    print ``up PID GROUP_RANK`` (or ``up PID PPID GROUP_RANK``: its agent's pid too), sleep.
``stubborn()``
    ignores SIGTERM (only SIGKILL at the grace deadline stops it), then as ``up_with_pid``.
``reports_and_holds()``
    prints ``got SIGNAME GROUP_RANK`` for every SIGINT and SIGTERM it gets, and goes on.

The launch: ``runner`` (keywords of ``corral.open_runner``), ``launch`` (keywords of
``Runner.launch``; ``ssh``, a dict, becomes ``corral.SSH(**ssh)``), ``tag_var`` and ``tag``
(into ``extra_env``), ``backend``.  It prints ``lifeline PID`` first if ``lifeline`` is true,
``launching`` just before the launch if ``say_launching`` is,
then ``RESULTS JSON`` (``values`` and ``by_host``) when the launch returns, or ``RAISED JSON``
(``type``, ``took`` the seconds from the launch's start, ``message``, ``notes``, ``cause``
the type of ``__cause__``, ``late`` for ``fail_on_rank_3``'s: how long after its raise) when
it raises; last, if ``starts`` is true, ``STARTED JSON``: the argvs the launcher itself
started (not those its agents report).  A KeyboardInterrupt (with ``handle_signals``, a
Ctrl-C) ends it with ``interrupted`` and exit status 130.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import anyio

import corral

TORCHRUN = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURMD_NODENAME",
)


def square(x: int) -> int:
    return x * x + int(os.environ["RANK"])


def up() -> None:
    print("up", os.environ["RANK"], flush=True)
    time.sleep(1000)


def up_with_error_file() -> None:
    print("up", os.environ["TORCHELASTIC_ERROR_FILE"], flush=True)
    time.sleep(1000)


def sleep() -> None:
    time.sleep(1000)


def whoami(tag_var: str) -> dict[str, str]:
    logging.getLogger("app").warning("hello from rank %s", os.environ["RANK"])
    print("stdout of rank", os.environ["RANK"])
    return {k: os.environ[k] for k in (*TORCHRUN, tag_var)}


def fail_on_rank_3() -> None:
    if os.environ["RANK"] != "3":
        time.sleep(1000)
    time.sleep(0.5)
    raise KeyError(repr(time.time()))


def up_with_pid() -> None:
    print("up", os.getpid(), os.environ["GROUP_RANK"], flush=True)
    time.sleep(1000)


def up_with_agent() -> None:
    print("up", os.getpid(), os.getppid(), os.environ["GROUP_RANK"], flush=True)
    time.sleep(1000)


def stubborn() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    up_with_pid()


def reports_and_holds() -> None:
    def say(signum: int, frame: FrameType | None) -> None:
        print("got", signal.Signals(signum).name, os.environ["GROUP_RANK"], flush=True)

    signal.signal(signal.SIGINT, say)
    signal.signal(signal.SIGTERM, say)
    print("up", os.getpid(), os.environ["GROUP_RANK"], flush=True)
    while True:
        time.sleep(1000)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        square,
        up,
        up_with_error_file,
        sleep,
        whoami,
        fail_on_rank_3,
        up_with_pid,
        up_with_agent,
        stubborn,
        reports_and_holds,
    )
}


class Starts(logging.Handler):
    """The argvs of the launcher's own starts (not those its agents report)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name_ = name
        self.argvs: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        source = getattr(record, "corral_source", None)
        if source in (None, self.name_) and record.getMessage().startswith("started "):
            self.argvs.append(record.getMessage().split(": ", 1)[1])


def raised(exc: BaseException, started: float) -> dict[str, Any]:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    said: dict[str, Any] = {
        "type": type(exc).__name__,
        "took": time.monotonic() - started,
        "message": str(exc),
        "notes": getattr(exc, "__notes__", []),
        "cause": type(exc.__cause__).__name__,
    }
    if isinstance(exc, KeyError):  # fail_on_rank_3's: the time of its raise
        said["late"] = time.time() - float(exc.args[0].strip("'"))
    return said


async def main(cfg: dict[str, Any]) -> None:
    runner = dict(cfg.get("runner", {}))
    starts = Starts(runner.get("name", "corral"))
    handlers: list[logging.Handler] = [starts] if cfg.get("starts") else []
    launch = dict(cfg.get("launch", {}))
    if launch.get("ssh"):
        launch["ssh"] = corral.SSH(**launch["ssh"])
    if "tag" in cfg:
        launch["extra_env"] = {cfg["tag_var"]: cfg["tag"]}
    function = FUNCTIONS[cfg["function"]]
    args = cfg.get("args", [])
    async with corral.open_runner(handlers=handlers, **runner) as r:
        if cfg.get("lifeline"):
            print("lifeline", r._lifeline.pid, flush=True)
        if cfg.get("say_launching"):
            print("launching", flush=True)
        started = time.monotonic()
        try:
            results = await r.launch(function, *args, **launch)
        except Exception as exc:
            print("RAISED", json.dumps(raised(exc, started)), flush=True)
        else:
            values = {"values": list(results), "by_host": results.by_host}
            print("RESULTS", json.dumps(values), flush=True)
    if cfg.get("starts"):
        print("STARTED", json.dumps(starts.argvs), flush=True)


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    try:
        anyio.run(main, config, backend=config.get("backend", "asyncio"))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
