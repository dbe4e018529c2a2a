"""The one explicit event-loop token.

A runner belongs to the event loop it was opened in.  Rather than looking
that loop up again and again (or caching a global one, which breaks the
moment two loops exist), the runner captures a token once, on entry, with
:func:`anyio.lowlevel.current_token`, and hands the same
:class:`LoopToken` to every object that may be touched from another thread.

The token does two jobs:

* it *calls back* into the loop from any thread: :meth:`LoopToken.run` and
  :meth:`LoopToken.run_sync` block the calling thread until the call has run
  on the loop and return its result;
* it *guards* the loop: :meth:`LoopToken.check` raises
  :class:`~corral.WrongLoopError` at once when code runs on a thread or
  inside an event loop that is not the token's, instead of letting it hang or
  corrupt state.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple, Unpack

import anyio.from_thread
import anyio.lowlevel
from anyio import NoEventLoopError

from ._errors import WrongLoopError

__all__ = ["LoopToken"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class LoopToken:
    """A handle on the event loop a runner belongs to.

    Get one from :attr:`Runner.token`; :meth:`current` captures the running
    loop's token directly.
    """

    __slots__ = ("_native", "_thread_id", "_thread_name")

    def __init__(self, native: anyio.lowlevel.EventLoopToken, thread: threading.Thread) -> None:
        self._native = native
        self._thread_id = thread.ident
        self._thread_name = thread.name

    @classmethod
    def current(cls) -> LoopToken:
        """Capture the token of the event loop running in this thread."""
        try:
            native = anyio.lowlevel.current_token()
        except NoEventLoopError:
            raise WrongLoopError(
                "no AnyIO-supported event loop is running in this thread"
            ) from None
        return cls(native, threading.current_thread())

    @property
    def native(self) -> anyio.lowlevel.EventLoopToken:
        """The underlying :class:`anyio.lowlevel.EventLoopToken`."""
        return self._native

    @property
    def backend(self) -> str:
        """``"asyncio"`` or ``"trio"``."""
        name = self._native.backend_class.__module__.rsplit(".", 1)[-1]
        return name.lstrip("_")

    def on_loop_thread(self) -> bool:
        """Whether the caller runs on the loop's own thread."""
        return threading.get_ident() == self._thread_id

    def check(self, what: str = "this object") -> None:
        """Raise :class:`WrongLoopError` unless called from inside the token's loop.

        Cheap enough to call at the top of every method: a thread-id
        comparison, and one token comparison to catch a second event loop run
        later on the same thread.
        """
        if threading.get_ident() != self._thread_id:
            raise WrongLoopError(
                f"{what} belongs to the event loop in thread {self._thread_name!r} and was "
                f"used from thread {threading.current_thread().name!r}; call it through the "
                "runner's token (r.token.run / r.token.run_sync) instead"
            )
        try:
            current = anyio.lowlevel.current_token()
        except NoEventLoopError:
            raise WrongLoopError(
                f"{what} was used outside of the event loop it belongs to"
            ) from None
        if current != self._native:
            raise WrongLoopError(f"{what} belongs to another event loop than the one running now")

    def _check_foreign(self, what: str) -> None:
        if threading.get_ident() == self._thread_id:
            raise WrongLoopError(
                f"{what} was called on the event loop's own thread, where it would deadlock; "
                "await or call the function directly instead"
            )

    def run(self, async_fn: Callable[[Unpack[Ts]], Awaitable[T]], *args: *Ts) -> T:
        """Run ``await async_fn(*args)`` on the token's loop; block this thread for the result.

        Call it from any thread except the loop's own.  Exceptions propagate
        to the caller.
        """
        self._check_foreign("LoopToken.run")

        async def call() -> T:
            return await async_fn(*args)

        return anyio.from_thread.run(call, token=self._native)

    def run_sync(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Run ``fn(*args)`` on the token's loop; block this thread for the result."""
        self._check_foreign("LoopToken.run_sync")
        return anyio.from_thread.run_sync(fn, *args, token=self._native)

    def __repr__(self) -> str:
        return f"<LoopToken {self.backend} loop in thread {self._thread_name!r}>"
