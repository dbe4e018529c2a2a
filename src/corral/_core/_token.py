"""The one explicit event-loop token.

A runner belongs to the event loop it was opened in.  Rather than looking
that loop up again and again (or caching a global one, which breaks the
moment two loops exist), the runner captures a token once, on entry, and
hands the same :class:`LoopToken` to every object that may be touched from
another thread.

The token does two jobs:

* it *calls back* into the loop from any thread: :meth:`LoopToken.run` and
  :meth:`LoopToken.run_sync` block the calling thread until the call has run
  on the loop and return its result (or raise
  :class:`anyio.RunFinishedError` at once if the loop has stopped, rather
  than wait for a loop turn that will never come);
* it *guards* the loop: :meth:`LoopToken.check` raises
  :class:`~corral.WrongLoopError` at once when code runs on a thread or
  inside an event loop that is not the token's, instead of letting it hang or
  corrupt state.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple, Unpack

import anyio.from_thread
import anyio.lowlevel
from anyio import NoEventLoopError, RunFinishedError

from .._errors import WrongLoopError
from .._sys._backend import Backend, LoopHandle, current_loop

__all__ = ["LoopToken"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: How often a thread blocked in :meth:`LoopToken.run_sync` on asyncio checks
#: that the loop still runs (asyncio has no "loop stopped" notification).
_LIVENESS_CHECK = 0.2


class LoopToken:
    """A handle on the event loop a runner belongs to.

    Get one from :attr:`Runner.token`; :meth:`current` captures the running
    loop's token directly.
    """

    __slots__ = ("_anyio", "_loop", "_thread_id", "_thread_name")

    def __init__(self, loop: LoopHandle, anyio_token: anyio.lowlevel.EventLoopToken) -> None:
        self._loop = loop
        self._anyio = anyio_token
        thread = threading.current_thread()
        self._thread_id = thread.ident
        self._thread_name = thread.name

    @classmethod
    def current(cls) -> LoopToken:
        """Capture the token of the event loop running in this thread."""
        try:
            anyio_token = anyio.lowlevel.current_token()
            loop = current_loop()
        except (NoEventLoopError, RuntimeError):
            raise WrongLoopError(
                "no AnyIO-supported event loop is running in this thread"
            ) from None
        return cls(loop, anyio_token)

    @property
    def native(self) -> anyio.lowlevel.EventLoopToken:
        """The underlying :class:`anyio.lowlevel.EventLoopToken`."""
        return self._anyio

    @property
    def backend(self) -> Backend:
        """``"asyncio"`` or ``"trio"``."""
        return self._loop.backend

    @property
    def loop(self) -> LoopHandle:
        """The loop itself, for signal-handler-safe callbacks (internal)."""
        return self._loop

    def check(self, what: str = "this object") -> None:
        """Raise :class:`WrongLoopError` unless called from inside the token's loop.

        Cheap enough to call at the top of every method: a thread-id
        comparison, and one loop comparison to catch a second event loop run
        later on the same thread.
        """
        if threading.get_ident() != self._thread_id:
            raise WrongLoopError(
                f"{what} belongs to the event loop in thread {self._thread_name!r} and was "
                f"used from thread {threading.current_thread().name!r}; call it through the "
                "runner's token (r.token.run / r.token.run_sync) instead"
            )
        try:
            current = current_loop()
        except RuntimeError:
            raise WrongLoopError(
                f"{what} was used outside of the event loop it belongs to"
            ) from None
        if current.native is not self._loop.native:
            raise WrongLoopError(f"{what} belongs to another event loop than the one running now")

    def _check_foreign(self, what: str) -> None:
        if threading.get_ident() == self._thread_id:
            raise WrongLoopError(
                f"{what} was called on the event loop's own thread, where it would deadlock; "
                "await or call the function directly instead"
            )
        if not self._loop.is_running():
            raise RunFinishedError

    def run(self, async_fn: Callable[[Unpack[Ts]], Awaitable[T]], *args: *Ts) -> T:
        """Run ``await async_fn(*args)`` on the token's loop; block this thread for the result.

        Call it from any thread except the loop's own.  Exceptions propagate
        to the caller; :class:`anyio.RunFinishedError` if the loop has
        finished or stopped.
        """
        self._check_foreign("LoopToken.run")

        async def call() -> T:
            return await async_fn(*args)

        return anyio.from_thread.run(call, token=self._anyio)

    def run_sync(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Run ``fn(*args)`` on the token's loop; block this thread for the result.

        Raises :class:`anyio.RunFinishedError` if the loop has finished, or
        stops before it got to the call.
        """
        self._check_foreign("LoopToken.run_sync")
        if self._loop.backend == "trio":
            return anyio.from_thread.run_sync(fn, *args, token=self._anyio)
        # asyncio: AnyIO's call would wait forever on a loop that was stopped
        # but not closed, so hand the call over and wait while the loop runs.
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        while True:
            try:
                return future.result(timeout=_LIVENESS_CHECK)
            except concurrent.futures.TimeoutError:
                if not self._loop.is_running() and future.cancel():
                    raise RunFinishedError from None

    def run_sync_soon(self, fn: Callable[[Unpack[Ts]], object], *args: *Ts) -> None:
        """Schedule ``fn(*args)`` to run on the token's loop soon, and return at once.

        Unlike :meth:`run_sync` it never waits, so it may be called from any
        thread, the loop's own and one that runs another event loop (a Trio
        loop refuses blocking calls from such a thread) included.  ``fn``
        runs as a plain callback of the loop, outside of any task: it must
        not raise, and whatever it returns is dropped.  Raises
        :class:`anyio.RunFinishedError` if the loop has finished.
        """
        if not self._loop.is_running():
            raise RunFinishedError

        def call() -> None:
            fn(*args)

        self._loop.call_soon_threadsafe(call)

    def __repr__(self) -> str:
        return f"<LoopToken {self.backend} loop in thread {self._thread_name!r}>"
