"""corral: a structured-concurrency process runner for Trio and asyncio.

::

    import corral

    async with corral.open_runner() as r:
        web = await r.start(["python", "-m", "http.server", "0"], name="web")
        await r.run(["python", "build.py"])
        await web.terminate()

See the documentation for the tutorial and the guarantees.
"""

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
from ._process import Process
from ._routing import ConsoleHandler, Route
from ._runner import Runner, open_runner
from ._token import LoopToken

__all__ = [
    "STDERR_TAIL_BYTES",
    "ConsoleHandler",
    "CorralError",
    "LoopToken",
    "Process",
    "HandshakeError",
    "ProcessFailed",
    "ResourceLimitError",
    "Route",
    "Runner",
    "Signalled",
    "StartupFailed",
    "WrongLoopError",
    "open_runner",
]

__version__ = "0.1.0.dev0"
