"""The helper thread of a blocking runner: its own event loop, and the calls handed to it.

See :mod:`corral._sync` for how it works: one host task enters an ordinary
:class:`~corral.Runner` and, inside it, a task group of the calls; each
blocking call is handed over with :meth:`LoopToken.run_sync_soon` and
answered through a :class:`concurrent.futures.Future`.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import inspect
import os
import threading
import time
import types
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import anyio

from .._errors import CorralError, WrongLoopError
from .._runner._runner import Runner, open_runner

__all__ = ["INTERRUPT_SLACK", "Portal", "hide_internal_frames"]

T = TypeVar("T")

#: Seconds an interrupted runner gets on top of its longest grace period to
#: stop every child, before :class:`KeyboardInterrupt` is raised regardless.
INTERRUPT_SLACK = 1.0

#: How often, in seconds, the main thread wakes while it waits for the loop, to
#: run a signal handler whose signal the kernel gave to another thread.
WAKE_INTERVAL = 0.1


class Portal:
    """A runner on a loop of its own in a helper thread, and the blocking calls into it.

    It belongs to the thread that entered it: from any other, every call
    raises :class:`~corral.WrongLoopError`; once closed, :class:`~corral.CorralError`.
    """

    def __init__(
        self, backend: str, options: dict[str, Any], name: str, longest_grace: float
    ) -> None:
        if backend == "trio":
            _require_trio()
        self._backend = backend
        self._options = options
        self._name = name
        self._longest_grace = longest_grace
        self.closed = False
        self._owner: threading.Thread | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: concurrent.futures.Future[None] | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.runner: Runner | None = None
        # Touched on the loop only: the calls handed over and not started yet.
        self._pending: deque[_Call] = deque()
        self._wake: anyio.Event | None = None
        self._accepting = False
        self._close_requested = False
        self._stopping = False
        self._delivered = False  # the runner's own error was raised to the caller

    def enter(self) -> None:
        """Start the helper thread and its loop; return once the runner is entered there."""
        self._owner = threading.current_thread()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"corral-{self._name}-loop"
        )
        self._loop = self._executor.submit(self._run_loop)
        try:
            _result(self._started)
        except KeyboardInterrupt:
            self._interrupted()
            raise
        except BaseException:
            # The runner could not be entered (an option it refused, say):
            # the loop ends with the same error.
            self._close(wait=True)
            raise
        assert self.runner is not None
        self._longest_grace = max(self._longest_grace, self.runner.grace)

    def _run_loop(self) -> None:
        try:
            anyio.run(self._host, backend=self._backend)
        except BaseException as exc:
            # The loop could not even start (its backend failed): nobody else
            # would answer the thread waiting in enter().
            if not self._started.done():
                self._started.set_exception(exc)
            raise

    async def _host(self) -> None:
        """The helper thread's main task: the runner, and the calls' task group inside it."""
        try:
            runner = open_runner(**self._options)
            async with runner, anyio.create_task_group() as calls:
                try:
                    self._wake = anyio.Event()
                    self._accepting = True
                    self.runner = runner
                    self._started.set_result(None)
                    if self._stopping:  # interrupted while we were entering
                        runner.cancel()
                    while not self._close_requested:
                        await self._wake.wait()
                        self._wake = anyio.Event()
                        while self._pending:
                            call = self._pending.popleft()
                            calls.start_soon(call.run, runner, name=f"corral call {call.what}")
                finally:
                    self._accepting = False
                    while self._pending:
                        self._pending.popleft().future.cancel()
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)
            raise

    def exit(self, exc: BaseException | None) -> None:
        """Leave the runner (waiting for its children, or stopping them after ``exc``)."""
        if self.closed:
            return
        if exc is not None:
            # As in ``async with``: an error in the body stops every child.
            self._interrupted()
            error = self._loop_error()
            if error is not None and not self._delivered and error is not exc:
                exc.add_note(f"runner {self._name!r} also failed: {error!r}")
            return
        assert self._loop is not None
        try:
            self._on_loop(self._request_close)
            # Like a nursery, the end of the block waits for the children.
            _wait(self._loop)
        except KeyboardInterrupt:
            self._interrupted()
            raise
        self._close(wait=True)
        error = self._loop_error()
        if error is not None and not self._delivered:
            self._delivered = True
            raise error

    def cancel(self) -> None:
        """Cancel the runner's scope, at once (:meth:`SyncRunner.cancel`)."""
        self.call_sync("Runner.cancel", lambda r: r.cancel())
        self._stopping = True

    def _check(self, what: str) -> Runner:
        owner = self._owner
        if owner is None or self.runner is None:
            if self.closed:
                raise CorralError(
                    f"runner {self._name!r} is closed; {what} cannot be used any more"
                )
            raise CorralError(
                f"{what}: the runner is not open (use 'with corral.open_runner_sync() as r:')"
            )
        if threading.current_thread() is not owner:
            raise WrongLoopError(
                f"{what} belongs to the blocking runner {self._name!r} of thread "
                f"{owner.name!r} and was used from thread {threading.current_thread().name!r}; "
                "use it from that thread, or reach the runner's loop through r.token.run / "
                "r.token.run_sync"
            )
        if self.closed:
            raise CorralError(f"runner {self._name!r} is closed; {what} cannot be used any more")
        return self.runner

    def call(self, what: str, func: Callable[[Runner], Awaitable[T]]) -> T:
        """Run ``await func(runner)`` on the loop, in the runner's scope; block for its result."""
        return cast(T, self._submit(what, func))

    def call_sync(self, what: str, func: Callable[[Runner], T]) -> T:
        """Run ``func(runner)`` on the loop, in the runner's scope; block for its result."""
        return cast(T, self._submit(what, func))

    def _submit(self, what: str, func: Callable[[Runner], Any]) -> Any:
        runner = self._check(what)
        call = _Call(what, func)
        future = call.future
        try:
            try:
                runner.token.run_sync_soon(self._hand_over, call)
            except anyio.RunFinishedError:
                raise self._ended(what) from None
            try:
                return _result(future)
            except concurrent.futures.CancelledError:
                # The runner's scope was cancelled under the call (a child
                # failed, or the runner was cancelled), or it was closing.
                raise self._ended(what) from None
        except KeyboardInterrupt:
            self._interrupted()
            raise

    def _hand_over(self, call: _Call) -> None:
        """On the loop: queue one call for the host task, which starts it in the runner's scope."""
        if not self._accepting or self._wake is None:
            call.future.cancel()
            return
        self._pending.append(call)
        self._wake.set()

    def _request_close(self, runner: Runner) -> None:
        """On the loop: let the host task leave the runner (which waits for the children)."""
        self._close_requested = True
        if self._wake is not None:
            self._wake.set()

    def peek(self, what: str, read: Callable[[], T]) -> T:
        """``read()`` on the loop while the runner is open; directly once it has closed."""
        if self.closed:
            return read()
        return self.call_sync(what, lambda r: read())

    def _ended(self, what: str) -> BaseException:
        """Wait for a runner that is ending by itself; return what the call should raise."""
        assert self._loop is not None
        _wait(self._loop)  # the runner's exit is bounded
        self._close(wait=True)
        error = self._loop_error()
        if error is not None and not self._delivered:
            self._delivered = True
            return error
        return CorralError(f"runner {self._name!r} was cancelled; {what} did not complete")

    def _loop_error(self) -> BaseException | None:
        loop = self._loop
        if loop is None or not loop.done():
            return None
        return loop.exception()

    def note_grace(self, grace: object) -> None:
        if isinstance(grace, (int, float)) and not isinstance(grace, bool) and grace >= 0:
            self._longest_grace = max(self._longest_grace, float(grace))

    def _interrupted(self) -> None:
        """Stop every child and close, within the longest grace period plus a second."""
        if self.closed:
            return
        deadline = time.monotonic() + self._longest_grace + INTERRUPT_SLACK
        self._stopping = True
        self._on_loop(lambda r: r.cancel())
        assert self._loop is not None
        ended = False
        killed = False
        while True:
            try:
                left = max(0.0, deadline - time.monotonic())
                ended = _wait(self._loop, left)
                break
            except KeyboardInterrupt:
                # Ctrl-C again: no more grace.
                if not killed:
                    killed = True
                    self._on_loop(_kill_all)
        self._close(wait=ended)

    def _on_loop(self, func: Callable[[Runner], None]) -> None:
        """Call ``func(runner)`` on the loop if the runner is there; never raises."""
        runner = self.runner
        if runner is None or not self._started.done():
            return  # the host cancels the runner itself once it is entered
        try:
            runner.token.run_sync_soon(func, runner)
        except anyio.RunFinishedError:
            pass  # the loop has finished already: nothing left to stop

    def _close(self, *, wait: bool) -> None:
        self.closed = True
        if self._executor is not None:
            # Without ``wait`` the thread finishes the runner's bounded exit on
            # its own (and the interpreter waits for it at exit).
            self._executor.shutdown(wait=wait)


class _Call:
    """One blocking call: what it runs on the loop, and the future its caller waits on."""

    def __init__(self, what: str, func: Callable[[Runner], Any]) -> None:
        self.what = what
        self.func = func
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    async def run(self, runner: Runner) -> None:
        future = self.future
        try:
            value = self.func(runner)
            if inspect.isawaitable(value):
                value = await value
        except anyio.get_cancelled_exc_class():
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit...: the runner's too
        else:
            future.set_result(value)


def _require_trio() -> None:
    """For ``backend="trio"``: if Trio is not installed, say which extra brings it."""
    try:
        found = importlib.util.find_spec("trio") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["trio"] is None
        found = False
    if not found:
        raise ModuleNotFoundError(
            "backend='trio' needs Trio, which is not installed here; install corral's "
            "trio extra: pip install 'corral[trio]'",
            name="trio",
        )


def _kill_all(runner: Runner) -> None:
    for proc in runner.processes:
        proc.kill()


#: Where the frames :func:`hide_internal_frames` takes out come from: corral's own
#: code, and the futures a blocking call waits on.
_INTERNAL = (
    os.path.dirname(os.path.dirname(__file__)) + os.sep,
    os.path.dirname(concurrent.futures.__file__) + os.sep,
)


def hide_internal_frames(exc: BaseException) -> None:
    """Take the frames of corral's own code out of ``exc``'s traceback, before a bare ``raise``.

    As Trio takes its own frames out of what ``trio.run`` raises: an error
    a worker raised, re-raised by :func:`corral.launch`, shows the caller's
    frames down to the call it made and (in its ``__cause__``) the worker's
    traceback, not the launcher's machinery.  A bare ``raise`` adds no
    frame of its own.  Frames of other code in between are kept, in order.
    Only an :class:`Exception`'s: a :class:`KeyboardInterrupt` may still be
    travelling up the runner's own thread.
    """
    if not isinstance(exc, Exception):
        return
    kept: list[tuple[types.FrameType, int, int]] = []
    tb = exc.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_INTERNAL):
            kept.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    rebuilt: types.TracebackType | None = None
    for frame, lasti, lineno in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, frame, lasti, lineno)
    exc.__traceback__ = rebuilt


def _wait(future: concurrent.futures.Future[Any], timeout: float | None = None) -> bool:
    """Wait until ``future`` is done or ``timeout`` seconds have passed; whether it is done.

    Interruptible by Ctrl-C whatever thread the kernel hands the signal to.
    The kernel gives a process's SIGINT to any thread that does not block it:
    given to the loop's thread, it makes Python run the handler in the main
    thread at its next instruction, which a wait without a timeout never
    reaches.  So the main thread waits in slices of :data:`WAKE_INTERVAL`
    (other threads run no signal handler, and wait in one piece).
    """
    if threading.current_thread() is not threading.main_thread():
        return _done_within(future, timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WAKE_INTERVAL
        if deadline is not None:
            left = max(min(left, deadline - time.monotonic()), 0.0)
        if _done_within(future, left):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False


def _done_within(future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
    """Whether ``future`` is done (cancelled included) within ``timeout`` seconds."""
    try:
        future.exception(timeout)  # returns, without raising it, what the future raised
    except concurrent.futures.CancelledError:
        pass
    except TimeoutError:
        return False
    return True


def _result(future: concurrent.futures.Future[T]) -> T:
    """``future.result()``, interruptible as :func:`_wait` is."""
    _wait(future)
    return future.result()
