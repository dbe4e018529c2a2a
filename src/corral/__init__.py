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

from . import _facade

__version__ = "0.2.0.dev0"

#: Each public name, once, under the private module it lives in (its home).  Everything else
#: is made from this list: ``__all__``, the lazy loading, and ``__init__.pyi``, the package as
#: type checkers see it (see :mod:`corral._facade`).
_HOMES = _facade.homes(
    {
        "_core._options": ("StartOptions",),
        "_core._process": ("Process",),
        "_core._stdio": ("DEVNULL", "LOG", "PIPE", "STDOUT"),
        "_core._token": ("LoopToken",),
        "_errors": (
            "STDERR_TAIL_BYTES",
            "CorralError",
            "HandshakeError",
            "LaunchError",
            "ProcessFailed",
            "RemoteTraceback",
            "ResourceLimitError",
            "Signalled",
            "StartupFailed",
            "WorkerFailed",
            "WrongLoopError",
        ),
        "_launch._hosts": ("DEFAULT_ENV_PATTERNS", "HOST_ENV_NAMES"),
        "_logs._console": ("ConsoleHandler",),
        "_logs._route": ("Route",),
        "_logs._sources": ("LogTail",),
        "_results": ("CompletedProcess", "LaunchResult"),
        "_runner._options": ("RunnerLaunchOptions", "RunnerOptions"),
        "_runner._runner": ("Runner", "open_runner"),
        "_scaleout": ("LaunchOptions", "SSH"),
        "_sync._handles": ("SyncLogTail", "SyncProcess"),
        "_sync._runner": ("SyncRunner", "launch", "open_runner_sync"),
        "_sys._proc": ("ResourceUsage",),
    }
)

__all__ = list(_HOMES)

# Loaded on first use; ``dir(corral)`` shows the public submodules too, once imported.
__getattr__, __dir__ = _facade.hooks(__name__, _HOMES, submodules=("child", "testing"))
