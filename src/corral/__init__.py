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
    CorralError,
    HandshakeError,
    ProcessFailed,
    ResourceLimitError,
    StartupFailed,
    WrongLoopError,
)
from ._process import Process
from ._routing import ConsoleHandler, Route
from ._runner import Runner, open_runner
from ._token import LoopToken

__all__ = [
    "ConsoleHandler",
    "CorralError",
    "LoopToken",
    "Process",
    "HandshakeError",
    "ProcessFailed",
    "ResourceLimitError",
    "Route",
    "Runner",
    "StartupFailed",
    "WrongLoopError",
    "open_runner",
]

__version__ = "0.1.0.dev0"
