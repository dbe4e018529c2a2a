"""The few loop-specific things corral does without AnyIO, and the one private detail.

``is_asyncio_main_task`` reads a private attribute of asyncio tasks (their done
callbacks) to tell the task ``asyncio.run`` runs from every other.  If a
Python release changes that, these tests fail loudly, here, rather than
silently making every KeyboardInterrupt come out wrapped in a group.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import types
from collections.abc import Iterator

import anyio
import pytest

import corral
from corral._sys._backend import (
    current_loop,
    is_asyncio_main_task,
    outlast_native_cancel,
    start_surely,
)


def test_the_main_task_of_asyncio_run_is_recognised() -> None:
    seen: dict[str, bool] = {}

    async def other() -> None:
        seen["other"] = is_asyncio_main_task()

    async def main() -> None:
        seen["main"] = is_asyncio_main_task()
        await asyncio.gather(asyncio.ensure_future(other()))

    asyncio.run(main())
    assert seen == {"main": True, "other": False}


def test_the_main_task_of_run_until_complete_is_recognised() -> None:
    seen: list[bool] = []

    async def main() -> None:
        seen.append(is_asyncio_main_task())

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert seen == [True]


@pytest.mark.leaks_allowed  # uvloop keeps a self-pipe open for the process's whole life
def test_the_main_task_of_uvloop_is_recognised() -> None:
    uvloop = pytest.importorskip("uvloop")
    seen: list[bool] = []

    async def main() -> None:
        seen.append(is_asyncio_main_task())

    uvloop.run(main())
    assert seen == [True]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_loop_is_captured_with_the_backends_own_api(backend: str) -> None:
    async def main() -> None:
        loop = current_loop()
        assert loop.backend == backend
        assert loop.is_running()
        called = anyio.Event()
        # From another thread, as a signal handler would (both are documented as safe).
        thread = threading.Thread(target=loop.call_soon_threadsafe, args=(called.set,))
        thread.start()
        with anyio.fail_after(5):
            await called.wait()
        thread.join()

    anyio.run(main, backend=backend)


def test_trio_guest_mode_in_asyncio_counts_as_trio() -> None:
    trio = pytest.importorskip("trio")
    seen: list[str] = []

    async def trio_main() -> None:
        seen.append(current_loop().backend)

    async def host() -> None:
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=lambda outcome: done.set(),
        )
        await done.wait()

    asyncio.run(host())
    assert seen == ["trio"]


def test_outlast_native_cancel_finishes_the_wait_then_cancels() -> None:
    """asyncio's Task.cancel() goes through AnyIO's shields; this wait does not give way."""

    async def main() -> list[str]:
        steps: list[str] = []
        event = anyio.Event()

        async def critical() -> None:
            with anyio.CancelScope(shield=True):
                try:
                    await outlast_native_cancel(event.wait)
                finally:
                    steps.append(f"left the wait with the event set: {event.is_set()}")

        task = asyncio.ensure_future(critical())
        await asyncio.sleep(0)
        task.cancel()  # what asyncio.run does to every task at its end
        await asyncio.sleep(0)
        steps.append("cancel delivered")
        event.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return steps

    assert asyncio.run(main()) == ["cancel delivered", "left the wait with the event set: True"]


@pytest.mark.parametrize("caller_too", [False, True])
def test_start_surely_runs_tasks_cancelled_before_their_first_step(caller_too: bool) -> None:
    """A native Task.cancel() before a task's first step kills it unstarted; it is started again.

    ``asyncio.run`` cancels every task left at its end, ones that were just
    created included.  The cancellation is scheduled here to come first, as
    it does there.  If it reached the caller too, the caller gets it once the
    tasks run.  They start together, in order.
    """

    async def main() -> list[str]:
        steps: list[str] = []
        caller = asyncio.current_task()

        async def body(name: str) -> None:
            steps.append(f"{name} ran")

        def cancel_all() -> None:
            for task in asyncio.all_tasks():
                if task is not caller or caller_too:
                    task.cancel()

        async with anyio.create_task_group() as tg:
            asyncio.get_running_loop().call_soon(cancel_all)
            try:
                await start_surely(tg, (body, ("a",), "a"), (body, ("b",), "b"))
            except asyncio.CancelledError:
                steps.append(f"caller cancelled, after {len(steps)} steps")
                assert caller is not None
                caller.uncancel()
            else:
                steps.append("returned")
        return steps

    last = "caller cancelled, after 2 steps" if caller_too else "returned"
    assert asyncio.run(main()) == ["a ran", "b ran", last]


@pytest.mark.slow
def test_interrupts_on_asyncio_main_task_are_bare_elsewhere_grouped(tmp_path: object) -> None:
    """The consequence of the check, end to end: SIGINT out of a runner in a side task."""
    code = (
        "import asyncio, os, signal, corral\n"
        "async def side():\n"
        "    async with corral.open_runner(console=False, handle_signals=True):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        await asyncio.sleep(10)\n"
        "async def main():\n"
        "    try:\n"
        "        await asyncio.ensure_future(side())\n"
        "    except BaseExceptionGroup as group:\n"
        "        print('group', [type(e).__name__ for e in group.exceptions])\n"
        "asyncio.run(main())\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "group ['KeyboardInterrupt']"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- KeyboardInterrupt protection on Trio -----------------------------------------------------

#: Public names whose code runs on the caller's thread, outside any Trio run (the blocking
#: facade: its loop runs on a helper thread, where Python delivers no signal): not protected.
UNPROTECTED_PUBLIC = {"SyncRunner", "SyncProcess", "SyncLogTail", "launch", "open_runner_sync"}

CORRAL_SRC = os.path.dirname(corral.__file__)


def _corral_code(value: object) -> Iterator[types.CodeType]:
    """The code objects of a public function, or of every method of a public class (and of
    its bases), and the code nested in them."""
    if isinstance(value, type):
        functions: list[object] = []
        for cls in value.__mro__:
            for member in vars(cls).values():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    functions.extend(f for f in (member.fget, member.fset, member.fdel) if f)
                else:
                    functions.append(member)
    else:
        functions = [value]
    codes = []
    for function in functions:
        while hasattr(function, "__wrapped__"):
            if isinstance(function, types.FunctionType):
                codes.append(function.__code__)
            function = function.__wrapped__
        if isinstance(function, types.FunctionType):
            codes.append(function.__code__)
    while codes:  # and the code nested in them: closures (tasks, callbacks), lambdas
        code = codes.pop()
        yield code
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def _is_marked(code: types.CodeType) -> bool:
    # Trio keeps what enable_ki_protection marked in a private map of code objects;
    # fail loudly here if a release moves it.
    import trio._core._ki

    try:
        return bool(trio._core._ki._CODE_KI_PROTECTION_STATUS_WMAP[code])
    except KeyError:
        return False


def _helper_of_this_test() -> None:
    pass


@pytest.mark.trio
async def test_every_method_of_every_public_class_is_ki_protected_on_trio() -> None:
    """Protection goes by code, not by ``__module__`` (which the facade sets to "corral")."""
    async with corral.open_runner(console=False) as r:
        await r.launch(os.getpid)  # loads the launch's code, which is protected then
    unprotected = []
    checked = 0
    for name in corral.__all__:
        value = getattr(corral, name)
        if not (isinstance(value, type) or callable(value)) or name in UNPROTECTED_PUBLIC:
            continue
        for code in _corral_code(value):
            if not code.co_filename.startswith(CORRAL_SRC):
                continue
            checked += 1
            if not _is_marked(code):
                unprotected.append(f"{name}: {code.co_qualname}")
    assert checked > 100, checked
    assert unprotected == [], "\n".join(unprotected)
    # The check can tell: what corral does not mean to protect is not marked.
    sync_code = [c for c in _corral_code(corral.SyncRunner) if c.co_filename.startswith(CORRAL_SRC)]
    assert sync_code and not any(_is_marked(c) for c in sync_code)
    assert not _is_marked(_helper_of_this_test.__code__)


#: The units whose code is the application's or a child's, not the runner's: not protected.
APPLICATION_SIDE = {
    *("__init__", "_facade", "child", "testing", "_cli", "_sync", "_agent", "_worker"),
    "_startup",  # the start-up hook of a runner's Python children
}


def _own_functions(module: types.ModuleType) -> Iterator[types.CodeType]:
    """The code of every function and method defined in ``module``'s own file, and nested code."""
    path = module.__file__
    for value in vars(module).values():
        for code in _corral_code(value) if callable(value) else ():
            if code.co_filename == path:
                yield code


@pytest.mark.trio
async def test_every_module_of_the_loop_side_folders_is_ki_protected_after_a_launch() -> None:
    """The protected code is derived from the folders, not listed: a new module is covered."""
    import importlib
    from pathlib import Path

    from corral._runner._scope import LOOP_SIDE

    root = Path(CORRAL_SRC)
    units = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir() if p.is_dir()}
    units.discard("__pycache__")
    assert units - APPLICATION_SIDE == set(LOOP_SIDE), "every unit is on one side or the other"
    names = []
    for unit in LOOP_SIDE:
        folder = root / unit
        files = sorted(folder.glob("_*.py")) if folder.is_dir() else [root / f"{unit}.py"]
        names += [f"corral.{unit}" + ("" if not folder.is_dir() else f".{p.stem}") for p in files]
    names = [n for n in names if not n.endswith(".__init__")]
    # Everything loaded first (as a launch with a monitor would): each must then be covered.
    modules = [importlib.import_module(n) for n in names]
    async with corral.open_runner(console=False, monitor=True) as r:
        await r.launch(os.getpid)
    unprotected = [
        f"{m.__name__}: {code.co_qualname}"
        for m in modules
        for code in _own_functions(m)
        if not _is_marked(code)
    ]
    assert len(modules) > 50
    assert unprotected == [], "\n".join(unprotected)
