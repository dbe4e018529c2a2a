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

# Before anything of corral imports msgspec: msgspec takes datetime's C API when
# it is first imported and does not check that it got it.  A Ctrl-C landing
# while that import of datetime runs is swallowed there, and the interpreter
# then crashes (SIGSEGV) at the first decoder of a struct.  With datetime
# loaded first, that step runs no Python code, so nothing can interrupt it; an
# interrupt here fails this import cleanly instead.
import datetime  # noqa: F401
import importlib
import sys
import typing
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

__all__ = [
    "DEVNULL",
    "LOG",
    "PIPE",
    "STDERR_TAIL_BYTES",
    "STDOUT",
    "DEFAULT_ENV_PATTERNS",
    "HOST_ENV_NAMES",
    "SSH",
    "CompletedProcess",
    "ConsoleHandler",
    "CorralError",
    "HandshakeError",
    "LaunchError",
    "LaunchOptions",
    "LaunchResult",
    "LogTail",
    "LoopToken",
    "Process",
    "ProcessFailed",
    "RemoteTraceback",
    "ResourceLimitError",
    "ResourceUsage",
    "Route",
    "Runner",
    "RunnerLaunchOptions",
    "RunnerOptions",
    "Signalled",
    "StartOptions",
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
    "DEVNULL": "_core._stdio",
    "LOG": "_core._stdio",
    "PIPE": "_core._stdio",
    "STDOUT": "_core._stdio",
    "STDERR_TAIL_BYTES": "_errors",
    "CompletedProcess": "_results",
    "DEFAULT_ENV_PATTERNS": "_launch._hosts",
    "HOST_ENV_NAMES": "_launch._hosts",
    "SSH": "_launch._hosts",
    "LaunchError": "_errors",
    "LaunchOptions": "_launch._options",
    "LaunchResult": "_results",
    "RemoteTraceback": "_errors",
    "WorkerFailed": "_errors",
    "ConsoleHandler": "_logs._console",
    "CorralError": "_errors",
    "HandshakeError": "_errors",
    "LogTail": "_logs._sources",
    "LoopToken": "_core._token",
    "Process": "_core._process",
    "ProcessFailed": "_errors",
    "ResourceLimitError": "_errors",
    "ResourceUsage": "_sys._proc",
    "Route": "_logs._router",
    "Runner": "_core._runner",
    "RunnerLaunchOptions": "_core._options",
    "RunnerOptions": "_core._options",
    "Signalled": "_errors",
    "StartOptions": "_core._options",
    "StartupFailed": "_errors",
    "WrongLoopError": "_errors",
    "open_runner": "_core._runner",
    "SyncLogTail": "_sync._handles",
    "SyncProcess": "_sync._handles",
    "SyncRunner": "_sync._runner",
    "launch": "_sync._runner",
    "open_runner_sync": "_sync._runner",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"corral.{home}"), name)
    _claim_loaded()
    globals()[name] = value
    return value


def _claim_loaded() -> None:
    """Make each public class and function that is loaded say it is ``corral``'s.

    As Trio and AnyIO do: tracebacks print ``corral.ProcessFailed``, reprs and
    pickles name ``corral.X`` (which the lazy loading resolves), whatever
    private module defines it.  String annotations are resolved first, in
    their own module, so that :func:`typing.get_type_hints` still works.
    """
    for name, home in _HOMES.items():
        module = sys.modules.get(f"corral.{home}")
        value = getattr(module, name, None)
        if not isinstance(value, type) and not callable(value):
            continue
        if getattr(value, "__module__", None) != f"corral.{home}":
            continue  # claimed already, or not corral's own
        if isinstance(value, type) and "__annotations__" in vars(value):
            try:
                hints = typing.get_type_hints(value, include_extras=True)
                value.__annotations__ = {k: hints[k] for k in vars(value)["__annotations__"]}
            except Exception:  # a name only a type checker sees: leave it as it is
                pass
        value.__module__ = "corral"


#: The public submodules, shown by ``dir(corral)`` once imported.
_SUBMODULES = ("child", "testing")


def __dir__() -> list[str]:
    """The public names only: not the modules this one uses (``sys``, ``typing``...)."""
    loaded = [name for name in _SUBMODULES if name in globals()]
    return sorted({*__all__, "__version__", *loaded})


if TYPE_CHECKING:
    from ._core._options import RunnerLaunchOptions, RunnerOptions, StartOptions
    from ._core._process import Process
    from ._core._runner import Runner, open_runner
    from ._core._stdio import DEVNULL, LOG, PIPE, STDOUT
    from ._core._token import LoopToken
    from ._errors import (
        STDERR_TAIL_BYTES,
        CorralError,
        HandshakeError,
        LaunchError,
        ProcessFailed,
        RemoteTraceback,
        ResourceLimitError,
        Signalled,
        StartupFailed,
        WorkerFailed,
        WrongLoopError,
    )
    from ._launch._hosts import DEFAULT_ENV_PATTERNS, HOST_ENV_NAMES, SSH
    from ._launch._options import LaunchOptions
    from ._logs._console import ConsoleHandler
    from ._logs._router import Route
    from ._logs._sources import LogTail
    from ._results import CompletedProcess, LaunchResult
    from ._sync._handles import SyncLogTail, SyncProcess
    from ._sync._runner import SyncRunner, launch, open_runner_sync
    from ._sys._proc import ResourceUsage
