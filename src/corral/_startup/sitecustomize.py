"""corral's start-up hook for the Python children of a runner: prompt lines, block-buffered.

A runner puts this file's folder first on a Python child's ``PYTHONPATH``
and ``CORRAL_FLUSH_EVERY`` (seconds) in its environment; Python imports it
at start-up as ``sitecustomize``, before the program.  It then:

* leaves ``sys.stdout`` block-buffered, as Python makes it on a pipe (a
  ``print`` costs a copy into a buffer, not a ``write(2)`` as with
  ``PYTHONUNBUFFERED=1``);
* starts one thread that flushes ``sys.stdout`` and ``sys.stderr`` every
  ``CORRAL_FLUSH_EVERY`` seconds, so that a line reaches the launcher that
  long after its ``print`` at the latest (a forked child gets one too,
  and a fork flushes first: no child writes its parent's buffer again);
* flushes them before ``os._exit`` and ``os.abort`` return to the system,
  and stops its thread before the interpreter's own final flush (an uncaught
  exception, ``sys.exit``, the end of the program), so that nothing printed
  is lost then;
* imports the ``sitecustomize`` module that this one hides, if there is one.

What a process loses that ``PYTHONUNBUFFERED=1`` would have kept: the last
``CORRAL_FLUSH_EVERY`` seconds of its output when a signal kills it
(SIGKILL, SIGTERM without a handler, a segfault).  The docs' logging page
says so beside the other settings.

Every Python child pays for this at start-up, whatever it runs: it imports
nothing that Python has not loaded by then but ``_thread`` and ``_signal``
(built in).  The program sees the module as ``sitecustomize``; its folder is
taken off ``sys.path`` again (it holds nothing else).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: importing it would cost every child
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

_VARIABLE = "CORRAL_FLUSH_EVERY"


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # closed, replaced by something odd: not ours to report
            pass


class _Flusher:
    """The thread that flushes, and its end at exit."""

    def __init__(self, every: float) -> None:
        import _thread

        self._every = every
        self._thread = _thread
        self.start()

    def start(self) -> None:
        import _signal  # type: ignore[import-not-found]  # built in; signal would load enum

        self._stop = False
        self._lock = self._thread.allocate_lock()  # held while the thread flushes
        # The thread is born with every signal blocked (it inherits this thread's
        # mask): a signal for the process never lands on it, so a program that
        # blocks one to sigwait() for it, or relies on its default action, sees
        # no difference.
        every = _signal.valid_signals()
        mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, every)
        try:
            self._thread.start_new_thread(self._run, ())
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)

    def _run(self) -> None:
        import time

        while True:
            time.sleep(self._every)
            with self._lock:
                if self._stop:
                    return
                _flush()

    def stop(self) -> None:
        """No flush from the thread any more: waits only for one under way (on a full pipe)."""
        with self._lock:
            self._stop = True


def _wrap_exit(real: Callable[..., NoReturn]) -> Callable[..., NoReturn]:
    def wrapper(*args: object) -> NoReturn:
        _flush()
        real(*args)

    wrapper.__name__ = real.__name__
    wrapper.__qualname__ = real.__qualname__
    wrapper.__doc__ = real.__doc__
    wrapper.__wrapped__ = real  # type: ignore[attr-defined]
    return wrapper


def _install(every: float) -> None:
    import atexit

    flusher = _Flusher(every)
    # atexit runs before the interpreter's final flush, while threads still run:
    # the thread is stopped (and its flush finished) before that flush begins.
    atexit.register(flusher.stop)
    if hasattr(os, "register_at_fork"):
        # Flushed before a fork, a buffer is not copied into the child, which would
        # write it a second time (on its exit, or its thread's next flush).
        os.register_at_fork(before=_flush, after_in_child=flusher.start)
    os._exit = _wrap_exit(os._exit)
    os.abort = _wrap_exit(os.abort)


def _chain() -> None:
    """Take this folder off ``sys.path``; import the ``sitecustomize`` it hid, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _main() -> None:
    text = os.environ.get(_VARIABLE, "")
    try:
        every = float(text)
    except ValueError:
        every = 0.0
    if every > 0:
        _install(every)
    _chain()


_main()
