"""What corral needs from each event loop that AnyIO does not offer.

AnyIO hides the difference between asyncio and Trio almost everywhere, and
corral uses it for everything it can.  Four jobs are left that AnyIO has no
public API for, and they live here, each written once per backend with that
backend's own public API:

* **Calling into the loop from a signal handler.**  A signal handler may not
  block or take locks, so it cannot use :func:`anyio.from_thread.run_sync`.
  asyncio's ``loop.call_soon_threadsafe`` and Trio's
  ``TrioToken.run_sync_soon`` are both documented as safe there; the
  :class:`LoopHandle` captured on entry holds whichever applies.
* **Knowing whether the loop still runs**, so that a call from another thread
  into a loop that was stopped (but not closed) fails at once instead of
  waiting forever for a loop turn that never comes.
* **Tasks whose body must run.**  On asyncio, a task that is cancelled
  natively (``Task.cancel()``) before its first step never runs a line of
  its coroutine: no ``try``, no ``finally``.  ``asyncio.run`` does exactly
  that at its end to every task left, among them the ones a start had just
  created (a child's supervisor, its reaper); AnyIO itself never cancels a
  task that has not started.  :func:`start_surely` starts such a task again
  if that happened, before the caller goes on.
* **KeyboardInterrupt safety on Trio.**  Trio raises :class:`KeyboardInterrupt`
  at any bytecode of code that is not marked as protected, which can tear a
  task group or a half-spawned child apart.  Trio's own primitives are
  protected; :func:`protect_on_trio` marks corral's internals the same way
  (Trio then delivers the interrupt to the main task at its next checkpoint,
  as an ordinary exception that our clean-up handles).

Trio is optional: this module never imports it.  When the running loop is
Trio's, ``trio`` is already in :data:`sys.modules`, and that is where it is
taken from.  asyncio is imported only where its loop is the one running (it
is loaded then already): a runner on Trio, and a program that only imports
corral, never load it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio.lowlevel
from anyio import CancelScope, RunFinishedError
from anyio.abc import TaskGroup

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Backend",
    "LoopHandle",
    "HostHold",
    "current_loop",
    "hold_asyncio_host",
    "is_asyncio_main_task",
    "outlast_native_cancel",
    "SureTask",
    "protect_on_trio",
    "start_surely",
]

Backend = Literal["asyncio", "trio"]

T = TypeVar("T")


def _trio() -> Any | None:
    """The ``trio`` module if it is imported (it is, whenever a Trio loop runs)."""
    return sys.modules.get("trio")


def _native_cancel() -> type[BaseException] | tuple[()]:
    """asyncio's ``CancelledError``, for an ``except``: nothing to catch if asyncio is not
    imported (it is, whenever an asyncio loop runs; no such error can exist without it)."""
    if "asyncio" not in sys.modules:
        return ()
    import asyncio

    return asyncio.CancelledError


@dataclass(frozen=True, eq=False)
class LoopHandle:
    """The running loop, captured once with its backend's public API."""

    backend: Backend
    native: Any  # asyncio.AbstractEventLoop or trio.lowlevel.TrioToken

    def call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """Schedule ``fn()`` on the loop; safe from any thread and from a signal handler.

        Raises :class:`anyio.RunFinishedError` if the loop has finished.
        """
        if self.backend == "asyncio":
            try:
                self.native.call_soon_threadsafe(fn)
            except RuntimeError:  # closed
                raise RunFinishedError from None
        else:
            trio = _trio()
            assert trio is not None
            try:
                self.native.run_sync_soon(fn)
            except trio.RunFinishedError:
                raise RunFinishedError from None

    def is_running(self) -> bool:
        """Whether the loop is still running (it may stop right after)."""
        if self.backend == "asyncio":
            loop: asyncio.AbstractEventLoop = self.native
            return loop.is_running() and not loop.is_closed()
        return True  # Trio's token raises RunFinishedError itself when run() is over


def current_loop() -> LoopHandle:
    """Capture the loop running the calling task.

    In Trio's guest mode both loops run on one thread: Trio's tasks run in
    callbacks of the host loop, and the host's tasks run while Trio's run is
    alive.  What counts is whose *task* is running: a Trio task belongs to the
    guest, an asyncio task to the host.  (Outside any task, as in a callback,
    a Trio run in progress wins, as before.)  Raises :class:`RuntimeError`
    when no loop runs here.
    """
    trio = _trio()
    if (
        trio is not None
        and trio.lowlevel.in_trio_run()
        and (trio.lowlevel.in_trio_task() or not _in_asyncio_task())
    ):
        return LoopHandle("trio", trio.lowlevel.current_trio_token())
    import asyncio

    return LoopHandle("asyncio", asyncio.get_running_loop())


def _in_asyncio_task() -> bool:
    if "asyncio" not in sys.modules:
        return False  # no asyncio loop has ever run here
    import asyncio

    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no asyncio loop runs in this thread
        return False


class HostHold:
    """An asyncio task on the host loop of a Trio guest run, for one runner.

    In Trio's guest mode on asyncio, the host owns the signals: Ctrl-C under
    ``asyncio.run`` cancels the host's main task, which the guest never hears
    of; ``asyncio.run`` then cancels the tasks left, waits for them, and closes
    the loop, under the guest's feet.  This task is one of those left: when
    it is cancelled (by that, or by anyone ending the host), it asks the
    runner to stop (``on_ending``, called on the guest's loop) and holds the
    host loop until the runner has left, so that its children are stopped in
    order (stop signal, grace, SIGKILL, reap) instead of by the lifeline.
    Only the wait for the runner's exit is held, which is bounded as every
    stop is.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        guest: LoopHandle,
        on_ending: Callable[[], None],
    ) -> None:
        self._left: asyncio.Future[None] = loop.create_future()
        self._guest = guest
        self._on_ending = on_ending
        self._task = loop.create_task(self._hold(), name="corral: the guest runner's hold")

    async def _hold(self) -> None:
        import asyncio

        cancelled = False
        while not self._left.done():
            try:
                await asyncio.shield(self._left)
            except asyncio.CancelledError:
                if not cancelled:
                    cancelled = True
                    try:
                        self._guest.call_soon_threadsafe(self._on_ending)
                    except RunFinishedError:
                        return  # the guest run is over: nothing left to wait for
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
        if cancelled:
            raise asyncio.CancelledError

    def release(self) -> None:
        """The runner has left: let the host go on (called on the guest's loop)."""
        if self._left.done() or self._task.done():
            return
        try:
            self._left.set_result(None)
        except RuntimeError:  # the host loop is closed already
            pass


def hold_asyncio_host(guest: LoopHandle, on_ending: Callable[[], None]) -> HostHold | None:
    """A :class:`HostHold` if ``guest`` is Trio running as a guest on an asyncio loop."""
    if guest.backend != "trio" or "asyncio" not in sys.modules:
        return None  # (without asyncio imported, no asyncio loop can be the host)
    import asyncio

    try:
        host = asyncio.get_running_loop()
    except RuntimeError:
        return None  # trio.run: no host loop
    return HostHold(host, guest, on_ending)


def is_asyncio_main_task() -> bool:
    """Whether the current asyncio task is the one ``asyncio.run`` (or ``run_until_complete``) runs.

    asyncio lets a :class:`KeyboardInterrupt` escaping any *other* task
    abandon the loop mid-step, so corral raises it bare only from that one.
    asyncio has no public way to tell: the task's done callbacks are private.
    This is the one place corral relies on a private detail (AnyIO does the
    same to find its root task); ``tests/core/test_backend.py`` fails loudly if
    it stops working.  If it ever returns ``False`` wrongly, the interrupt
    is raised inside a :class:`BaseExceptionGroup`, which is safe.
    """
    import asyncio
    import asyncio.base_events

    task = asyncio.current_task()
    if task is None:
        return False
    done_callback = getattr(asyncio.base_events, "_run_until_complete_cb", None)
    callbacks = getattr(task, "_callbacks", None) or ()
    return any(
        callback is done_callback or getattr(callback, "__module__", None) == "uvloop.loop"
        for callback, _context in callbacks
    )


async def outlast_native_cancel(
    wait: Callable[[], Awaitable[T]], scope: CancelScope | None = None
) -> T:
    """Await ``wait()`` to the end, even through a native asyncio cancellation.

    AnyIO's shielded cancel scopes hold back AnyIO's cancellation, not
    ``Task.cancel()`` — which is what ``asyncio.run`` does to every task left
    at its end, and what uvicorn's force-quit does.  Inside the few waits that
    must finish ("signal, grace, SIGKILL, reap"), such a cancellation is
    caught, the wait is started again, and the cancellation is raised once it
    is done.  So ``wait`` must be safe to start again (waiting for an event,
    for a descriptor to be readable).  Use it only inside a shielded scope,
    where no AnyIO cancellation can arrive but from ``scope``, a deadline of
    our own inside the shield: a cancellation while that scope was cancelled
    is its own, and goes through.  On Trio it is a plain await.
    """
    cancelled: BaseException | None = None
    while True:
        try:
            result = await wait()
        except _native_cancel() as exc:
            if scope is not None and scope.cancel_called:
                # Our own deadline.  (A native cancellation absorbed before it
                # is dropped then: the stop goes on to its end either way.)
                raise
            cancelled = exc
            import asyncio  # (loaded: the cancellation is its)

            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            continue
        break
    if cancelled is not None:
        raise cancelled
    return result


#: One task for :func:`start_surely`: the async function, its arguments, the task's name.
SureTask = tuple[Callable[..., Coroutine[Any, Any, object]], tuple[object, ...], str]


async def start_surely(tg: TaskGroup, *tasks: SureTask) -> None:
    """``tg.start_soon`` each task, for tasks whose body must run: return once they all do.

    On asyncio, a task cancelled natively before its first step dies without
    running any of its code (see the module's docs), and what it was there
    for — reaping a child, draining its logs, ending a server — never happens,
    so whoever waits for that waits forever.  asyncio runs callbacks in the
    order they were scheduled, so the new tasks' first steps come before the
    caller's next one: after one checkpoint each task has either started or
    died unstarted, and those are started again.  A native cancellation of
    the caller that came meanwhile (the same ``asyncio.run`` ending) is
    raised once every task runs.  The checkpoint is shielded from AnyIO's
    cancellation, which never stops a task from starting.  The tasks start
    together, in order, as with as many ``start_soon`` calls.  On Trio, where
    every task starts, this is just those calls.
    """
    if current_loop().backend != "asyncio":
        for func, args, name in tasks:
            tg.start_soon(func, *args, name=name)
        return
    import asyncio

    cancelled: BaseException | None = None
    pending = list(tasks)
    while pending:
        attempts: list[tuple[_Attempt, SureTask]] = []
        for task in pending:
            attempt = _Attempt(task[0], task[1])
            try:
                tg.start_soon(attempt.returning(), name=task[2])
            except BaseException:
                attempt.coro.close()
                raise
            attempts.append((attempt, task))
        try:
            with CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()
        except asyncio.CancelledError as exc:
            if cancelled is None:
                cancelled = exc  # raised below, once every task runs
        pending = []
        for attempt, task in attempts:
            if not attempt.started:
                # It never ran, and never will: close its coroutine (no "never
                # awaited" warning), and start the task again.
                attempt.coro.close()
                pending.append(task)
    if cancelled is not None:
        raise cancelled


class _Attempt:
    """One spawn of a task for :func:`start_surely`, and whether its body began."""

    def __init__(self, func: Callable[..., Coroutine[Any, Any, object]], args: tuple[object, ...]):
        self.started = False
        self.coro = self._body(func, args)

    async def _body(
        self, func: Callable[..., Coroutine[Any, Any, object]], args: tuple[object, ...]
    ) -> None:
        self.started = True
        await func(*args)

    def returning(self) -> Callable[[], Coroutine[Any, Any, None]]:
        """A function returning the coroutine, for ``start_soon`` (so that we keep hold of it)."""
        coro = self.coro
        return lambda: coro


_protected: set[int] = set()


def protect_on_trio(modules: Iterable[types.ModuleType]) -> None:
    """Mark the code of ``modules`` as KeyboardInterrupt-protected on Trio.

    Trio decides protection per code object (walking the stack outward to
    the first marked frame, and to its task's root), so marking our code
    protects exactly what runs inside it: spawning, supervising and stopping
    children, the log service, entry and exit of a runner, the tasks they
    start.  An interrupt that arrives there is delivered by Trio to the main
    task at its next checkpoint, as an exception our clean-up handles.

    What is marked is chosen by code, not by name: every function and method
    reachable from the module's namespace whose code was compiled from the
    module's own file, whatever its ``__module__`` says (the facade renames
    public classes and functions ``corral.X``), the original of a decorated
    function (``__wrapped__``), and every function, lambda and comprehension
    nested in those.  Idempotent and cheap after the first call per module;
    does nothing unless Trio is running.
    """
    trio = _trio()
    if trio is None:
        return
    protect = trio.lowlevel.enable_ki_protection
    for module in modules:
        if id(module) in _protected:
            continue
        for code in _own_code(module):
            protect(_HasCode(code))
        _protected.add(id(module))


class _HasCode:
    """What :func:`trio.lowlevel.enable_ki_protection` reads: something with a ``__code__``."""

    def __init__(self, code: types.CodeType) -> None:
        self.__code__ = code


def _own_code(module: types.ModuleType) -> Iterable[types.CodeType]:
    """Every code object of the functions and methods defined in ``module``'s own file.

    Found from its namespace (functions; classes and their methods, static
    and class methods, properties; originals of decorated functions), then
    nested code (closures, lambdas, comprehensions) inside those.
    """
    filename = getattr(module, "__file__", None)
    if filename is None:
        return
    seen: set[int] = set()
    codes: list[types.CodeType] = []
    stack: list[object] = list(vars(module).values())
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            if obj.__code__.co_filename == filename:
                codes.append(obj.__code__)
            wrapped = getattr(obj, "__wrapped__", None)  # a decorated function's original
            if wrapped is not None:
                stack.append(wrapped)
        elif isinstance(obj, type):
            for value in vars(obj).values():
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                elif isinstance(value, property):
                    stack.extend(f for f in (value.fget, value.fset, value.fdel) if f)
                    continue
                if isinstance(value, (types.FunctionType, type)):
                    stack.append(value)
        elif callable(obj):
            wrapped = getattr(obj, "__wrapped__", None)  # functools.cache's wrapper, say
            if isinstance(wrapped, types.FunctionType):
                stack.append(wrapped)
    while codes:
        code = codes.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        yield code
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
