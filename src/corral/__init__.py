"""corral: a structured-concurrency process runner for Trio and asyncio.

::

    import corral

    async with corral.open_runner() as r:
        web = await r.start(["python", "-m", "http.server", "0"], name="web")
        await r.run(["python", "build.py"])
        await web.stop()

See the documentation for the tutorial and the guarantees.

The names below are loaded on first use: ``import corral.child`` in a child
process (which imports this package first) loads none of the launcher.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

__all__ = [
    "DEVNULL",
    "LOG",
    "PIPE",
    "STDERR_TAIL_BYTES",
    "STDOUT",
    "DEFAULT_ENV_PATTERNS",
    "SSH",
    "CompletedProcess",
    "ConsoleHandler",
    "CorralError",
    "HandshakeError",
    "LaunchError",
    "LaunchResult",
    "LogTail",
    "LoopToken",
    "Process",
    "ProcessFailed",
    "RemoteTraceback",
    "ResourceLimitError",
    "Route",
    "Runner",
    "Signalled",
    "StartupFailed",
    "SyncLogTail",
    "SyncProcess",
    "SyncRunner",
    "WorkerFailed",
    "WrongLoopError",
    "launch",
    "open_runner",
    "open_runner_sync",
]

# Where each public name lives.
_HOMES = {
    "DEVNULL": "_stdio",
    "LOG": "_stdio",
    "PIPE": "_stdio",
    "STDOUT": "_stdio",
    "STDERR_TAIL_BYTES": "_errors",
    "CompletedProcess": "_process",
    "DEFAULT_ENV_PATTERNS": "_hosts",
    "SSH": "_hosts",
    "LaunchError": "_launch",
    "LaunchResult": "_launch",
    "RemoteTraceback": "_launch",
    "WorkerFailed": "_launch",
    "ConsoleHandler": "_routing",
    "CorralError": "_errors",
    "HandshakeError": "_errors",
    "LogTail": "_sources",
    "LoopToken": "_token",
    "Process": "_process",
    "ProcessFailed": "_errors",
    "ResourceLimitError": "_errors",
    "Route": "_routing",
    "Runner": "_runner",
    "Signalled": "_errors",
    "StartupFailed": "_errors",
    "WrongLoopError": "_errors",
    "open_runner": "_runner",
    "SyncLogTail": "_sync",
    "SyncProcess": "_sync",
    "SyncRunner": "_sync",
    "launch": "_sync",
    "open_runner_sync": "_sync",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"corral.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from ._errors import (
        STDERR_TAIL_BYTES,
        CorralError,
        HandshakeError,
        ProcessFailed,
        ResourceLimitError,
        Signalled,
        StartupFailed,
        WrongLoopError,
    )
    from ._hosts import DEFAULT_ENV_PATTERNS, SSH
    from ._launch import LaunchError, LaunchResult, RemoteTraceback, WorkerFailed
    from ._process import CompletedProcess, Process
    from ._routing import ConsoleHandler, Route
    from ._runner import Runner, open_runner
    from ._sources import LogTail
    from ._stdio import DEVNULL, LOG, PIPE, STDOUT
    from ._sync import SyncLogTail, SyncProcess, SyncRunner, launch, open_runner_sync
    from ._token import LoopToken
