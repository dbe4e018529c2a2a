"""Signals fan out at once: real signals, real launchers, real children.

The end-to-end tests run a launcher script as a process of its own, in its
own session (so that "its process group" means what a terminal's Ctrl-C
means), wait for the line it prints once every child has reported that it
started, send it a signal, and then check three things: how it ended, how
long that took, and that no child of it is left.  Each child appends the
name of every signal it receives to a file of its own, which shows that the
*same* signal was forwarded, exactly once.

The in-process tests signal the test process itself, which is as real as a
signal gets, and look at ``signal.getsignal`` before, during and after.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from tests.helpers.processes import TAG_VAR, tagged_pids, wait_gone

import corral
from corral._core import _signals

PY = sys.executable
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The launcher: two runners (nested in one task, or siblings in a task
# group) with three children each.  argv: backend layout grace tag outdir
# child_mode outcome_mode.  Prints "READY <pid>..." once every child has
# reported, then waits forever.
LAUNCHER = r'''
import os, signal, sys
import anyio
import corral

backend, layout, grace, tag, outdir, child_mode, outcome_mode, handle = sys.argv[1:9]
grace = float(grace)
handle = {"true": True, "default": None}[handle]

CHILD = f"""
import os, signal, sys, time
import corral.child

def on_signal(signum, frame):
    with open(os.path.join({outdir!r}, str(os.getpid())), "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    print("got", signal.Signals(signum).name, flush=True)
    if {child_mode!r} == "obey":
        sys.exit(3)  # a non-zero exit that must not count as a failure

for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, on_signal)
corral.child.started()
while True:
    time.sleep(600)
"""

async def fill(r):
    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(lambda i=i: r.start(
                [sys.executable, "-c", CHILD], name=f"c{i}", extra_env={"CORRAL_TEST_TAG": tag},
                wait_started=True,
            ))

def ready(*runners):
    pids = [p.pid for r in runners for p in r.processes]
    print("READY", *pids, flush=True)

async def main():
    console = outcome_mode == "console"
    if layout == "nested":
        async with corral.open_runner(
            name="a", grace=grace, console=console, handle_signals=handle
        ) as a:
            await fill(a)
            async with corral.open_runner(
                name="b", grace=grace, console=console, handle_signals=handle
            ) as b:
                await fill(b)
                ready(a, b)
                await anyio.sleep_forever()
    else:
        runners = []
        async def one(name):
            async with corral.open_runner(
                name=name, grace=grace, console=console, handle_signals=handle
            ) as r:
                await fill(r)
                runners.append(r)
                if len(runners) == 2:
                    ready(*runners)
                await anyio.sleep_forever()
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "a")
            tg.start_soon(one, "b")

if outcome_mode == "uncaught":
    anyio.run(main, backend=backend)
    sys.exit("anyio.run returned")
try:
    anyio.run(main, backend=backend)
except BaseException as exc:
    shape = "group" if isinstance(exc, BaseExceptionGroup) else "bare"
    try:
        raise exc
    except* KeyboardInterrupt:
        print("OUTCOME KeyboardInterrupt", shape, flush=True)
    except* corral.Signalled as group:
        print("OUTCOME Signalled", shape, group.exceptions[0].signal.name, flush=True)
        print("MESSAGE", group.exceptions[0], flush=True)
else:
    print("OUTCOME none", flush=True)
'''


class Launcher:
    """A launcher process in its own session, and what it reported."""

    def __init__(
        self,
        tmp_path: Path,
        tag: str,
        *,
        backend: str,
        layout: str = "nested",
        grace: float = 5.0,
        child_mode: str = "obey",
        outcome_mode: str = "catch",
        handle: str = "true",
    ) -> None:
        script = tmp_path / "launcher.py"
        script.write_text(LAUNCHER)
        self.outdir = tmp_path / "received"
        self.outdir.mkdir()
        self.errfile = tmp_path / "launcher.err"
        console = outcome_mode == "console"
        with open(self.errfile, "w") as err:
            self.proc = subprocess.Popen(
                [
                    PY,
                    str(script),
                    backend,
                    layout,
                    str(grace),
                    tag,
                    str(self.outdir),
                    child_mode,
                    outcome_mode,
                    handle,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if console else err,
                text=True,
                start_new_session=True,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("READY "), f"launcher did not get ready: {line!r}{self.errors()}"
        self.children = [int(pid) for pid in line.split()[1:]]
        assert len(self.children) == 6
        assert sorted(tagged_pids(tag)) == sorted(self.children)

    def errors(self) -> str:
        """The launcher's stderr, for assertion messages."""
        if not self.errfile.exists():
            return ""
        return "\nlauncher stderr:\n" + self.errfile.read_text()[-4000:]

    def signal(self, sig: int, target: str = "pid") -> float:
        start = time.monotonic()
        if target == "pid":
            os.kill(self.proc.pid, sig)
        else:
            os.killpg(self.proc.pid, sig)  # what a terminal's Ctrl-C does
        return start

    def finish(self, timeout: float = 20.0) -> tuple[int, list[str]]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out.splitlines()

    def received(self) -> dict[int, list[str]]:
        return {int(path.name): path.read_text().split() for path in self.outdir.iterdir()}

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its lifeline then kills the children
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


Launch = Callable[..., Launcher]


@pytest.fixture
def launch(tmp_path: Path, tag: str) -> Iterator[Launch]:
    made: list[Launcher] = []

    def make(**options: Any) -> Launcher:
        launcher = Launcher(tmp_path, tag, **options)
        made.append(launcher)
        return launcher

    yield make
    for launcher in made:
        launcher.kill()


def _outcome_line(sig: int, shape: str) -> str:
    if sig == signal.SIGINT:
        return f"OUTCOME KeyboardInterrupt {shape}"
    return f"OUTCOME Signalled {shape} {signal.Signals(sig).name}"


BACKENDS = ["asyncio", "trio"]

# The fan-out, pairwise: the signal (SIGINT, SIGTERM, SIGHUP), where it is sent (the pid, or
# the process group as a terminal's Ctrl-C does; SIGHUP to the pid only), the runners' layout
# (nested in one task, or siblings in a task group) and the backend.  Each delivery (signal and
# target) is there, and every pair of values of any two of the four: each signal with each
# layout and each backend, each target with each layout and each backend, each layout with
# each backend.  The whole product (20 launchers) would add no pair.
FAN_OUT = [
    (signal.SIGINT, "pid", "nested", "asyncio"),
    (signal.SIGINT, "group", "siblings", "trio"),
    (signal.SIGTERM, "pid", "siblings", "trio"),
    (signal.SIGTERM, "group", "nested", "asyncio"),
    (signal.SIGHUP, "pid", "nested", "trio"),
    (signal.SIGHUP, "pid", "siblings", "asyncio"),
]


def test_the_fan_out_cases_hold_every_pair() -> None:
    values = [HANDLED, ("pid", "group"), ("nested", "siblings"), tuple(BACKENDS)]
    for i, j in itertools.combinations(range(4), 2):
        pairs = {(a, b) for a in values[i] for b in values[j]}
        if (i, j) == (0, 1):
            pairs.discard((signal.SIGHUP, "group"))  # SIGHUP goes to the pid only
        assert pairs <= {(case[i], case[j]) for case in FAN_OUT}, (i, j)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("sig", "target", "layout", "backend"), FAN_OUT)
def test_signal_fans_out_to_every_child_of_every_runner(
    launch: Launch, tag: str, backend: str, layout: str, sig: int, target: str
) -> None:
    launcher = launch(backend=backend, layout=layout)
    start = launcher.signal(sig, target)
    returncode, lines = launcher.finish()
    elapsed = time.monotonic() - start
    # Nested runners in one task raise the interrupt bare; runners in the
    # tasks of a task group raise it the way task groups do, in a group.
    shape = "bare" if layout == "nested" else "group"
    assert _outcome_line(sig, shape) in lines, f"{lines}{launcher.errors()}"
    if sig != signal.SIGINT:
        name = signal.Signals(sig).name
        assert f"MESSAGE received {name}; every child was stopped" in lines
    assert returncode == 0, launcher.errors()
    assert elapsed < 5.0, f"took {elapsed:.2f} s to stop obeying children{launcher.errors()}"
    # Every child got the launcher's signal, once, and nothing else.
    received = launcher.received()
    assert received == {pid: [signal.Signals(sig).name] for pid in launcher.children}, (
        launcher.errors()
    )
    assert wait_gone(launcher.children, 5.0) == []
    assert tagged_pids(tag) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("sig", "target"), [(signal.SIGINT, "group"), (signal.SIGTERM, "pid")])
def test_children_that_ignore_the_signal_are_killed_at_the_deadline(
    launch: Launch, tag: str, backend: str, sig: int, target: str
) -> None:
    grace = 0.5
    launcher = launch(backend=backend, layout="siblings", grace=grace, child_mode="ignore")
    start = launcher.signal(sig, target)
    returncode, lines = launcher.finish()
    elapsed = time.monotonic() - start
    assert _outcome_line(sig, "group") in lines, f"{lines}{launcher.errors()}"
    assert returncode == 0, launcher.errors()
    assert grace <= elapsed < grace + 5.0, f"stopped after {elapsed:.2f} s with grace {grace}"
    # They saw the forwarded signal once (no second, different stop signal), then SIGKILL.
    received = launcher.received()
    assert received == {pid: [signal.Signals(sig).name] for pid in launcher.children}, (
        launcher.errors()
    )
    assert wait_gone(launcher.children, 5.0) == []
    assert tagged_pids(tag) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_second_sigint_kills_everything_at_once(launch: Launch, tag: str, backend: str) -> None:
    # A grace far longer than the test's timeout: only the second SIGINT can end it.
    launcher = launch(backend=backend, grace=600.0, child_mode="ignore", outcome_mode="console")
    launcher.signal(signal.SIGINT)
    # Wait until every child has reported the first SIGINT (their "got" lines
    # reach the launcher's console on stderr) before sending the second.
    assert launcher.proc.stderr is not None
    got = 0
    while got < 6:
        line = launcher.proc.stderr.readline()
        assert line, "launcher's stderr ended before every child got the signal"
        got += "got SIGINT" in line
    start = launcher.signal(signal.SIGINT)
    returncode, lines = launcher.finish()
    elapsed = time.monotonic() - start
    assert "OUTCOME KeyboardInterrupt bare" in lines, lines
    assert returncode == 0
    assert elapsed < 5.0
    assert wait_gone(launcher.children, 5.0) == []
    assert tagged_pids(tag) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_uncaught_interrupt_ends_the_launcher_like_ctrl_c(
    launch: Launch, tag: str, backend: str
) -> None:
    # Left uncaught, the bare KeyboardInterrupt makes Python end the way it
    # does on a plain Ctrl-C: killed by SIGINT, as a shell expects.  No hang
    # at exit, no leftover worker thread keeping the process alive.
    launcher = launch(backend=backend, outcome_mode="uncaught")
    launcher.signal(signal.SIGINT, "group")
    returncode, _ = launcher.finish()
    assert returncode == -signal.SIGINT
    assert wait_gone(launcher.children, 5.0) == []
    assert tagged_pids(tag) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["nested", "siblings"])
def test_borrowed_sigterm_stops_the_children_then_ends_the_launcher(
    launch: Launch, tag: str, backend: str, layout: str
) -> None:
    # Nobody holds SIGTERM, so a default runner borrows it: every child is
    # stopped with it and its last lines are shown, and then the launcher
    # ends by SIGTERM as it would have without corral, raising nothing that
    # a server's lifespan handler could swallow.
    launcher = launch(backend=backend, layout=layout, handle="default", outcome_mode="console")
    start = launcher.signal(signal.SIGTERM, "pid")
    out, err = launcher.proc.communicate(timeout=20)
    elapsed = time.monotonic() - start
    assert launcher.proc.returncode == -signal.SIGTERM, f"{out}\n{err}"
    assert "OUTCOME" not in out  # nothing was raised: the process ended by the signal
    assert err.count("got SIGTERM") == 6, err  # every child's last line was drained first
    assert elapsed < 5.0
    received = launcher.received()
    assert received == {pid: ["SIGTERM"] for pid in launcher.children}
    assert wait_gone(launcher.children, 5.0) == []
    assert tagged_pids(tag) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_default_sigint_under_the_loop_still_raises_keyboard_interrupt(
    launch: Launch, tag: str, backend: str
) -> None:
    launcher = launch(backend=backend, layout="nested", handle="default")
    launcher.signal(signal.SIGINT, "group")
    returncode, lines = launcher.finish()
    assert any(line.startswith("OUTCOME KeyboardInterrupt") for line in lines), (
        f"{lines}{launcher.errors()}"
    )
    assert returncode == 0
    assert wait_gone(launcher.children, 5.0) == []
    assert tagged_pids(tag) == []


# -- in-process: the handler, its subscribers, and what it restores ------------------------


def _custom_handler(signum: int, frame: object) -> None:
    raise AssertionError(f"the application's handler ran for {signum} while a runner was open")


@pytest.fixture
def custom_handlers() -> Iterator[dict[int, object]]:
    """Install the application's own handlers for the three signals; put the old ones back."""
    old = {s: signal.getsignal(s) for s in HANDLED}
    for s in HANDLED:
        signal.signal(s, _custom_handler)
    try:
        yield {s: _custom_handler for s in HANDLED}
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _current() -> dict[int, object]:
    return {s: signal.getsignal(s) for s in HANDLED}


def _sleep_child() -> list[str]:
    return [PY, "-c", "import corral.child, time; corral.child.started(); time.sleep(600)"]


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_previous_handlers_are_restored_exactly(
    custom_handlers: dict[int, object],
) -> None:
    async with corral.open_runner(console=False, handle_signals=True):
        during = _current()
        assert all(h is not _custom_handler for h in during.values())
        async with corral.open_runner(console=False):
            assert _current() == during  # one handler, shared
        assert _current() == during  # still open: still installed
    after = _current()
    assert all(after[s] is custom_handlers[s] for s in HANDLED)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_backend_handlers_are_restored_exactly() -> None:
    # Whatever the event loop installed (Trio's KeyboardInterrupt handler,
    # asyncio.Runner's SIGINT handler, or Python's own) comes back as is.
    before = _current()
    async with corral.open_runner(console=False, handle_signals=True):
        assert all(_current()[s] is not before[s] for s in HANDLED)
    after = _current()
    assert all(after[s] is before[s] for s in HANDLED)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_by_default_a_runner_takes_only_signals_nobody_holds(
    custom_handlers: dict[int, object],
) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # free, but not taken by default
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own: free
    async with corral.open_runner(console=False):
        during = _current()
        assert during[signal.SIGTERM] is _custom_handler  # the application's: left alone
        assert during[signal.SIGHUP] == signal.SIG_DFL  # a closed terminal is not ours
        assert during[signal.SIGINT] is not signal.default_int_handler
    after = _current()
    assert after[signal.SIGTERM] is _custom_handler
    assert after[signal.SIGHUP] == signal.SIG_DFL
    assert after[signal.SIGINT] is signal.default_int_handler
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # free now: taken
    async with corral.open_runner(console=False):
        assert _current()[signal.SIGTERM] not in (signal.SIG_DFL, _custom_handler)
    assert _current()[signal.SIGTERM] == signal.SIG_DFL


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", BACKENDS)
def test_by_default_the_loops_own_sigint_handler_is_left_alone(backend: str) -> None:
    """asyncio.run and trio.run install a SIGINT handler: the runner must not replace it."""
    seen: dict[str, object] = {}

    async def main() -> None:
        seen["loop"] = signal.getsignal(signal.SIGINT)
        async with corral.open_runner(console=False):
            seen["runner"] = signal.getsignal(signal.SIGINT)
            seen["sigterm"] = signal.getsignal(signal.SIGTERM)

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    anyio.run(main, backend=backend)
    assert seen["loop"] is not signal.default_int_handler  # the loop took it
    assert seen["runner"] is seen["loop"]
    assert seen["sigterm"] != signal.SIG_DFL  # nobody held SIGTERM: the runner took it


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_sibling_runners_share_the_handler_until_the_last_leaves(
    custom_handlers: dict[int, object],
) -> None:
    first_in = anyio.Event()
    second_in = anyio.Event()
    first_out = anyio.Event()
    seen: dict[str, dict[int, object]] = {}

    async def first() -> None:
        async with corral.open_runner(name="first", console=False, handle_signals=True):
            first_in.set()
            await second_in.wait()
        first_out.set()

    async def second() -> None:
        await first_in.wait()
        async with corral.open_runner(name="second", console=False, handle_signals=True):
            second_in.set()
            await first_out.wait()
            seen["after first left"] = _current()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        tg.start_soon(second)
    assert all(h is not _custom_handler for h in seen["after first left"].values())
    assert all(_current()[s] is custom_handlers[s] for s in HANDLED)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_handle_signals_false_installs_nothing(custom_handlers: dict[int, object]) -> None:
    async with corral.open_runner(console=False, handle_signals=False):
        assert all(_current()[s] is custom_handlers[s] for s in HANDLED)
    assert all(_current()[s] is custom_handlers[s] for s in HANDLED)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_ignored_signals_stay_ignored(custom_handlers: dict[int, object]) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    async with corral.open_runner(console=False, handle_signals=True):
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is not _custom_handler
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", BACKENDS)
def test_runner_off_the_main_thread_installs_nothing(backend: str, tag: str) -> None:
    before = _current()
    seen: list[dict[int, object]] = []
    errors: list[BaseException] = []

    async def main() -> None:
        async with corral.open_runner(console=False) as r:
            await r.start(_sleep_child(), extra_env={TAG_VAR: tag}, wait_started=True)
            seen.append(_current())
            r.cancel()
        with pytest.raises(RuntimeError, match="main thread"):
            async with corral.open_runner(console=False, handle_signals=True):
                pass

    def thread() -> None:
        try:
            anyio.run(main, backend=backend)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=thread)
    t.start()
    t.join(20)
    assert not t.is_alive()
    assert errors == []
    assert len(seen) == 1
    assert all(seen[0][s] is before[s] for s in HANDLED)


@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
async def test_signal_to_this_process_raises_signalled(tag: str, sig: int) -> None:
    before = _current()
    with pytest.raises(corral.Signalled) as info:
        # Raised only when the runner was asked to take the signal: a signal
        # merely borrowed (the default) ends the process instead, as below.
        async with corral.open_runner(console=False, handle_signals=True) as r:
            p = await r.start(_sleep_child(), extra_env={TAG_VAR: tag}, wait_started=True)
            os.kill(os.getpid(), sig)
            await anyio.sleep_forever()
    assert info.value.signal == sig
    assert signal.Signals(sig).name in str(info.value)
    assert p.returncode == -sig  # the same signal reached the child
    assert not isinstance(info.value, Exception)  # like KeyboardInterrupt
    assert all(_current()[s] is before[s] for s in HANDLED)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_sigint_to_this_process_raises_keyboard_interrupt(tag: str) -> None:
    caught = []
    try:
        async with corral.open_runner(console=False, handle_signals=True) as outer:
            a = await outer.start(_sleep_child(), extra_env={TAG_VAR: tag}, wait_started=True)
            async with corral.open_runner(console=False) as inner:
                b = await inner.start(_sleep_child(), extra_env={TAG_VAR: tag}, wait_started=True)
                os.kill(os.getpid(), signal.SIGINT)
                await anyio.sleep_forever()
    except* KeyboardInterrupt as group:
        caught.append(group)
    assert len(caught) == 1
    assert a.returncode == b.returncode == -signal.SIGINT


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_interrupt_from_runners_in_a_task_group_is_caught_by_except_star(tag: str) -> None:
    caught = []

    async def one(task_status: anyio.abc.TaskStatus[None]) -> None:
        async with corral.open_runner(console=False, handle_signals=True) as r:
            await r.start(_sleep_child(), extra_env={TAG_VAR: tag}, wait_started=True)
            task_status.started()
            await anyio.sleep_forever()

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(one)
            await tg.start(one)
            os.kill(os.getpid(), signal.SIGINT)
            await anyio.sleep_forever()
    except* KeyboardInterrupt as group:
        caught.append(group)
    assert len(caught) == 1
    assert tagged_pids(tag) == []


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_failure_before_the_signal_travels_with_it(tag: str) -> None:
    with pytest.raises(BaseExceptionGroup) as info:
        async with corral.open_runner(console=False, handle_signals=True) as r:
            await r.start(_sleep_child(), extra_env={TAG_VAR: tag}, wait_started=True)
            # A check=True child fails; the signal arrives while the runner
            # is stopping because of it.
            failing = await r.start([PY, "-c", "raise SystemExit(5)"], name="failing")
            with anyio.CancelScope(shield=True):
                await failing.wait()
            os.kill(os.getpid(), signal.SIGTERM)
            await anyio.sleep_forever()
    signalled, rest = info.value.split(corral.Signalled)
    assert signalled is not None
    assert rest is not None
    assert rest.subgroup(corral.ProcessFailed) is not None


def test_signalled_pickles() -> None:
    import pickle

    exc = pickle.loads(pickle.dumps(corral.Signalled(signal.SIGTERM)))
    assert isinstance(exc, corral.Signalled)
    assert exc.signal is signal.SIGTERM
    assert "SIGTERM" in str(exc)


def test_nothing_is_subscribed_between_tests() -> None:
    # No signal still has corral's handler.
    assert all(signal.getsignal(s) is not _signals._handle for s in _signals.HANDLED_SIGNALS)


# Trio in guest mode on asyncio, the way Trio's documentation shows it: the
# host, under asyncio.run, starts the guest run and awaits its end.  The guest
# opens a runner with two children; each appends the signals it gets to its
# file and exits on SIGTERM.  asyncio.run holds SIGINT: Ctrl-C cancels the
# host's task, which the guest never hears of.  argv: tag outdir.
GUEST_MODE = r'''
import asyncio, os, signal, sys
import trio
import corral

signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever we inherited
tag, outdir = sys.argv[1:3]

CHILD = f"""
import os, signal, sys, time
import corral.child

def on_signal(signum, frame):
    with open(os.path.join({outdir!r}, str(os.getpid())), "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    sys.exit(3)

signal.signal(signal.SIGTERM, on_signal)
corral.child.started()
while True:
    time.sleep(600)
"""


async def guest():
    async with corral.open_runner(name="guest", grace=5, console=False) as r:
        for i in range(2):
            await r.start([sys.executable, "-c", CHILD], name=f"c{i}",
                          extra_env={"CORRAL_TEST_TAG": tag}, wait_started=True)
        print("READY", *(p.pid for p in r.processes), flush=True)
        await trio.sleep_forever()
    print("LEFT", flush=True)


async def host():
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def finished(outcome):
        if not done.done():
            done.set_result(outcome)

    trio.lowlevel.start_guest_run(
        guest, run_sync_soon_threadsafe=loop.call_soon_threadsafe, done_callback=finished
    )
    (await done).unwrap()


try:
    asyncio.run(host())
except KeyboardInterrupt:
    print("OUTCOME KeyboardInterrupt", flush=True)
'''


def test_trio_guest_mode_ctrl_c_stops_the_guests_children_in_order(
    tmp_path: Path, tag: str
) -> None:
    """Ctrl-C under asyncio.run reaches the guest's children as their stop signal.

    Not by the lifeline's SIGKILL once the process is gone: the runner stops
    them (SIGTERM, grace, SIGKILL, reap) while asyncio.run winds down.
    """
    script = tmp_path / "guest.py"
    script.write_text(GUEST_MODE)
    outdir = tmp_path / "received"
    outdir.mkdir()
    proc = subprocess.Popen(
        [PY, str(script), tag, str(outdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        children = [int(pid) for pid in line.split()[1:]]
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert wait_gone(children, 10.0) == []
    received = {int(path.name): path.read_text().split() for path in outdir.iterdir()}
    assert received == {pid: ["SIGTERM"] for pid in children}, err
    assert out.split("\n")[:2] == ["LEFT", "OUTCOME KeyboardInterrupt"], out + err
    assert took < 5, f"took {took:.2f} s"
    assert tagged_pids(tag) == []
