"""The blocking runner: :class:`SyncRunner`, :func:`open_runner_sync` and :func:`launch`."""

from __future__ import annotations

import inspect
import os
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack

from .._core._options import StartOptions
from .._core._token import LoopToken
from .._errors import CorralError
from .._results import CompletedProcess, LaunchResult
from .._runner._options import RunnerLaunchOptions, RunnerOptions
from .._runner._runner import Runner, open_runner
from .._scaleout import LaunchOptions
from .._sys._proc import ResourceUsage
from ._handles import SyncProcess
from ._portal import Portal, hide_internal_frames

__all__ = ["SyncRunner", "launch", "open_runner_sync"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: The event loops of ``backend=``; any other name is a launch's process group (torchrunx's).
_BACKENDS = ("asyncio", "trio")

#: The runners' names of the :func:`launch` calls under way that were not given one: the
#: first is ``corral``, one made while it runs ``corral-2``, and so on, so that calls made at
#: once (from a thread pool) do not share their sources' names.
_UNNAMED: set[str] = set()
_UNNAMED_LOCK = threading.Lock()


def _take_name() -> str:
    with _UNNAMED_LOCK:
        name, number = "corral", 1
        while name in _UNNAMED:
            number += 1
            name = f"corral-{number}"
        _UNNAMED.add(name)
        return name


def _give_back(name: str) -> None:
    with _UNNAMED_LOCK:
        _UNNAMED.discard(name)


def _keywords(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    """The keyword-only parameters of ``fn``, with their defaults: the one spelling of each."""
    return {
        name: p
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _check_keywords(options: Mapping[str, object], known: Mapping[str, object], what: str) -> None:
    """``TypeError`` for a keyword that is none of ``known``, worded as Python words it."""
    for key in options:
        if key not in known:
            raise TypeError(f"{what}() got an unexpected keyword argument {key!r}")


def _same_keywords(*twins: Callable[..., Any]) -> Callable[[F], F]:
    """Show the keywords of the async ``twins`` where the blocking ``fn``'s ``**options`` stands.

    For :func:`help`, :mod:`inspect` and the API pages: the keywords are
    their twins' (where two twins have one, the first's), spelled nowhere
    else.  What a type checker sees is the same ``Unpack[...]`` of a
    :class:`typing.TypedDict` on both sides.
    """

    def apply(fn: F) -> F:
        signature = inspect.signature(fn)
        params = [
            p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        taken = {p.name for p in params}
        for twin in twins:
            for name, p in _keywords(twin).items():
                if name not in taken:
                    taken.add(name)
                    params.append(p)
        fn.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return fn

    return apply


class SyncRunner:
    """A :class:`Runner` for synchronous code; create it with :func:`open_runner_sync`.

    ``with corral.open_runner_sync() as r:`` opens the runner on an event
    loop of its own, in a helper thread; its methods block the calling
    thread until the runner's loop has done the work.  Leaving the block
    waits for the children that still run, as ``async with`` does; leaving
    it by an exception (:class:`KeyboardInterrupt` included) stops them
    first.  A child started with ``check=True`` that fails stops the others,
    and its :class:`ProcessFailed` (in an :class:`ExceptionGroup`, as out of
    ``async with``) is raised by the call that was waiting, or by the next
    one, or at the end of the block.

    The runner belongs to the thread that opened it.
    """

    def __init__(self, backend: str, options: Mapping[str, Any]) -> None:
        keywords = _keywords(open_runner)
        _check_keywords(options, keywords, "open_runner_sync")
        if backend not in _BACKENDS:
            raise ValueError(
                f'backend must be "asyncio" or "trio", the event loop, not {backend!r}; a '
                "process group's backend (torchrunx's) goes to the launch: "
                f"r.launch(func, backend={backend!r})"
            )
        if options.get("handle_signals"):
            raise ValueError(
                "a blocking runner's loop runs on a helper thread, where Python delivers no "
                "signal: it cannot take signal handlers (handle_signals=True).  Ctrl-C "
                "reaches the calling thread as KeyboardInterrupt and stops every child"
            )
        self._backend = backend
        self._name = str(options.get("name", keywords["name"].default))
        try:
            self._longest_grace = max(0.0, float(options.get("grace", keywords["grace"].default)))
        except (TypeError, ValueError):
            self._longest_grace = 0.0  # the runner refuses it on entry
        self._entered = False
        self._portal = Portal(backend, dict(options), self._name, self._longest_grace)

    # -- properties -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The runner's name, the first part of every log source it produces."""
        return self._name

    @property
    def backend(self) -> str:
        """``"asyncio"`` or ``"trio"``: the event loop the runner runs on."""
        return self._backend

    @property
    def runner(self) -> Runner:
        """The :class:`Runner` itself, running on the helper thread's loop.

        Its methods belong to that loop: reach them through :attr:`token`.
        """
        runner = self._portal.runner
        if runner is None:
            raise CorralError("the runner is not open (use 'with corral.open_runner_sync() as r:')")
        return runner

    @property
    def token(self) -> LoopToken:
        """The :class:`LoopToken` of the runner's loop, to call into it from any other thread."""
        return self.runner.token

    @property
    def grace(self) -> float:
        """Default seconds between the stop signal and SIGKILL."""
        return self.runner.grace

    @property
    def log_path(self) -> str | None:
        """The folder of this run's log files (with ``log_dir=``)."""
        return self.runner.log_path

    @property
    def log_lines_lost(self) -> int:
        """The lines the log files could not write, as :attr:`Runner.log_lines_lost`."""
        return self.runner.log_lines_lost

    @property
    def usage(self) -> Mapping[str, ResourceUsage]:
        """What each running child costs at the last sample, as :attr:`Runner.usage`."""
        runner = self.runner
        return self._portal.peek("Runner.usage", lambda: dict(runner.usage))

    @property
    def monitor_url(self) -> str | None:
        """The monitor's address (with ``monitor=``), as :attr:`Runner.monitor_url`."""
        return self.runner.monitor_url

    def __repr__(self) -> str:
        portal = self._portal
        state = "closed" if portal.closed else "open" if portal.runner is not None else "new"
        return f"<corral.SyncRunner {self._name!r} on {self._backend}, {state}>"

    # -- scope ------------------------------------------------------------------------

    def __enter__(self) -> SyncRunner:
        if self._entered:
            raise RuntimeError(
                "a SyncRunner can be entered only once; call open_runner_sync() again"
            )
        self._entered = True
        self._portal.enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._portal.exit(exc)

    def cancel(self) -> None:
        """Cancel the runner's scope: stop every child; the block then ends.

        Returns at once; leaving the ``with`` block waits for the stop.  Any
        later call on the runner raises :class:`CorralError`.
        """
        self._portal.cancel()

    # -- what the runner does -----------------------------------------------------------

    @_same_keywords(Runner.start)
    def start(
        self, argv: Sequence[str | os.PathLike[str]], **options: Unpack[StartOptions]
    ) -> SyncProcess:
        """Start ``argv`` as :meth:`Runner.start` does (same options); return its handle.

        ``stdin``, ``stdout`` and ``stderr`` cannot be ``PIPE`` here (the
        streams are asynchronous): use :meth:`run` to collect output, or
        :meth:`SyncProcess.logs` to follow it.
        """
        for stream in ("stdin", "stdout", "stderr"):
            value = options.get(stream)
            if value == subprocess.PIPE or getattr(value, "pipe", False):
                raise ValueError(
                    f"{stream}=PIPE gives an asynchronous stream, which a blocking runner "
                    "cannot hand out; use run() to collect output, or logs() to follow it"
                )
        self._portal.note_grace(options.get("grace"))
        proc = self._portal.call("Runner.start", lambda r: r.start(argv, **options))
        return SyncProcess(self._portal, proc)

    @_same_keywords(Runner.run)
    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        input: bytes | None = None,
        **options: Unpack[StartOptions],
    ) -> CompletedProcess:
        """Run ``argv`` to completion as :meth:`Runner.run` does; return its result.

        Returns a :class:`CompletedProcess`.  With ``check=True`` (the default) a failure raises
        :class:`ProcessFailed` here.  Interrupted (Ctrl-C), it stops the
        child and every other one before :class:`KeyboardInterrupt` comes out.
        """
        self._portal.note_grace(options.get("grace"))
        try:
            return self._portal.call("Runner.run", lambda r: r.run(argv, input=input, **options))
        except BaseException as exc:
            hide_internal_frames(exc)
            raise

    @_same_keywords(Runner.launch)
    def launch(
        self, func: Callable[..., T], /, *args: Any, **options: Unpack[LaunchOptions]
    ) -> LaunchResult[T]:
        """Run ``func(*args)`` on every worker as :meth:`Runner.launch` does (same options)."""
        self._portal.note_grace(options.get("grace"))
        try:
            return self._portal.call("Runner.launch", lambda r: r.launch(func, *args, **options))
        except BaseException as exc:
            hide_internal_frames(exc)
            raise

    @_same_keywords(Runner.launch_command)
    def launch_command(
        self, argv: Sequence[str | os.PathLike[str]], **options: Unpack[LaunchOptions]
    ) -> LaunchResult[CompletedProcess]:
        """Run the command on every worker as :meth:`Runner.launch_command` does."""
        self._portal.note_grace(options.get("grace"))
        try:
            return self._portal.call(
                "Runner.launch_command", lambda r: r.launch_command(argv, **options)
            )
        except BaseException as exc:
            hide_internal_frames(exc)
            raise


@_same_keywords(open_runner)
def open_runner_sync(*, backend: str = "asyncio", **options: Unpack[RunnerOptions]) -> SyncRunner:
    """Create a blocking runner: ``with corral.open_runner_sync() as r:``.

    For scripts, notebooks and synchronous code: the runner runs on an event
    loop of its own in a helper thread, so it works where a loop already
    runs in the calling thread (a Jupyter cell, a function called from
    ``asyncio.run``) and from any thread.  See :class:`SyncRunner` and
    :doc:`howto/sync`.

    Args:
        backend: ``"asyncio"`` (the default) or ``"trio"``, the helper
            thread's event loop.
        options: the keywords of :func:`open_runner` (``name``, ``grace``,
            ``console``, ``handlers``, ``log_dir``...: a
            :class:`RunnerOptions`), except ``handle_signals=True``: Ctrl-C
            reaches the calling thread as :class:`KeyboardInterrupt`, and
            stops every child.
    """
    return SyncRunner(backend, options)


@_same_keywords(open_runner, Runner.launch)
def launch(
    func: Callable[..., T],
    /,
    *args: Any,
    hostnames: Sequence[str] | str | None = None,
    backend: str | None = "asyncio",
    **options: Unpack[RunnerLaunchOptions],
) -> LaunchResult[T]:
    """Run ``func(*args)`` on every worker and return their results: one blocking call.

    Opens a runner, calls :meth:`Runner.launch`, and closes the runner
    again, with every guarantee of :meth:`Runner.launch`: the first failure
    stops every other worker and raises here (the worker's own exception,
    with its remote traceback), every line the workers write reaches the
    console (and ``log_dir=``), and nothing outlives the call.  It works
    from a plain script, from any thread, and where an event loop already
    runs in the calling thread (a Jupyter cell; a synchronous function called
    from async code), without calling :func:`anyio.run` on that loop.
    Ctrl-C, or a kernel interrupt in Jupyter, stops every worker and raises
    :class:`KeyboardInterrupt` within the grace period plus one second.

    Args:
        func: the function (see :meth:`Runner.launch`).
        args: its positional arguments; keyword arguments go in with
            :func:`functools.partial`.
        hostnames: torchrunx's spelling of ``hosts``, with torchrunx's
            meanings: ``"auto"`` is the Slurm allocation inside one
            (``SLURM_JOB_ID`` set) and this machine elsewhere, and
            ``["localhost"]`` is this machine (no ssh).  Give one of
            ``hosts`` and ``hostnames``.
        backend: ``"asyncio"`` (the default) or ``"trio"``, the event loop to
            run on; or, as torchrunx's ``backend=``, the process group each
            worker initialises before the function runs (``"gloo"``,
            ``"nccl"``, ``"mpi"``, ``"ucc"``, ``"auto"``: :meth:`Runner.launch`'s
            ``backend=``), on the asyncio loop; ``None`` (torchrunx's "no
            process group") is the default loop without one.  The two kinds
            of names never collide.
        options: the keywords of :func:`open_runner` (``name``, ``grace``,
            ``console``, ``log_dir``...) and of :meth:`Runner.launch`
            (``hosts``, ``workers_per_host``, ``extra_env``, ``ssh``,
            ``start_timeout``...); ``grace`` and ``name`` are the runner's,
            which the launch inherits.  Without ``name``, the runner is
            ``corral``, or ``corral-2``, ``corral-3``... while other calls
            without one are under way (from other threads), so that their
            lines, log files and monitors are told apart.
    """
    loop = "asyncio"
    runner_keywords = _keywords(open_runner)
    runner_options: dict[str, Any] = {}
    launch_options: dict[str, Any] = {}
    for key, value in options.items():
        (runner_options if key in runner_keywords else launch_options)[key] = value
    _check_keywords(launch_options, _keywords(Runner.launch), "launch")
    if backend in _BACKENDS:
        loop = backend
    elif backend is not None:
        launch_options["backend"] = backend  # torchrunx's: the workers' process group
    if hostnames is not None:
        if launch_options.get("hosts") is not None:
            raise TypeError("give hosts or hostnames (its torchrunx spelling), not both")
        launch_options["hosts"] = _from_hostnames(hostnames)
    taken = None
    if "name" not in runner_options:
        taken = runner_options["name"] = _take_name()
    try:
        with SyncRunner(loop, runner_options) as r:
            return r.launch(func, *args, **launch_options)
    except BaseException as exc:
        hide_internal_frames(exc)
        raise
    finally:
        if taken is not None:
            _give_back(taken)


def _from_hostnames(hostnames: Sequence[str] | str) -> Sequence[str] | str | None:
    if hostnames == "auto":
        return "slurm" if os.environ.get("SLURM_JOB_ID") else None
    if isinstance(hostnames, str):
        return hostnames  # "slurm", or a mistake Runner.launch explains
    if list(hostnames) == ["localhost"]:
        return None
    return hostnames
