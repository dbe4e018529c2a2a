"""No crash at any instant of a Ctrl-C, the earliest ones included.

msgspec takes datetime's C API when it is first imported, and does not check that it got
it: a :class:`KeyboardInterrupt` raised while that import of ``datetime`` runs is swallowed
there, and the interpreter later crashes (SIGSEGV) at the first decoder of a struct, which
corral builds on the first ``open_runner``.  corral loads ``datetime`` before anything of it
imports msgspec.  One test hits that instant exactly; the other sends SIGINT at random
instants of a process's first runner and first launch.

The random one runs :data:`TRIALS` trials per backend (``CORRAL_CTRL_C_TRIALS`` sets more;
the documented run is 300: ``CORRAL_CTRL_C_TRIALS=300 pytest tests/core/test_early_ctrl_c.py``,
a few minutes).  Each trial is a child forked from a helper interpreter that has imported
AnyIO and Trio but neither msgspec nor ``datetime`` nor corral's modules, so that it pays only
for what a first runner and a first launch do; the two backends' helpers run side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.helpers.processes import TAG_VAR

PY = sys.executable

#: Trials per backend in the suite; ``CORRAL_CTRL_C_TRIALS`` asks for more.
TRIALS = int(os.environ.get("CORRAL_CTRL_C_TRIALS", "4"))
#: Seconds for them all: a trial takes well under a second on a quiet machine.
TIMEOUT = 30 + 10 * TRIALS

#: A KeyboardInterrupt at the very first line of ``datetime`` the process runs: where a
#: Ctrl-C lands if it comes while msgspec's first import takes datetime's C API.
INTERRUPTED_DATETIME = textwrap.dedent(
    """
    import sys

    def interrupt_datetime(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith("datetime.py"):
            sys.settrace(None)
            raise KeyboardInterrupt
        return interrupt_datetime

    sys.settrace(interrupt_datetime)
    try:
        import corral._logs._wire
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.settrace(None)
    import anyio, corral

    async def main():
        async with corral.open_runner(console=False) as r:
            print((await r.run([sys.executable, "-c", "print('ok')"], stdout=corral.PIPE)).stdout)

    anyio.run(main)
    """
)


@pytest.mark.slow
def test_a_ctrl_c_while_msgspec_takes_the_datetime_api_cannot_crash() -> None:
    out = subprocess.run(
        [PY, "-c", INTERRUPTED_DATETIME], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-3000:]}"
    assert out.stdout.split() == ["interrupted", "b'ok\\n'"], out.stdout


TRIALS_SCRIPT = textwrap.dedent(
    """
    import json, os, random, signal, sys, tempfile, time, traceback
    import anyio, anyio._backends._asyncio

    backend, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if backend == "trio":
        import trio, anyio._backends._trio
    assert not {"datetime", "msgspec", "corral._core"} & set(sys.modules)

    def first_runner_and_launch(marks):
        import corral
        async def main():
            async with corral.open_runner(name="ki", console=False, grace=0.5) as r:
                marks.append(time.monotonic())
                await r.launch(os.getpid)
                marks.append(time.monotonic())
        anyio.run(main, backend=backend)

    def trial(instant):
        # A child that gets SIGINT ``instant`` seconds in (never if None): exit code, marks.
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            marks = [time.monotonic()]
            code = 0
            try:
                if instant is not None:
                    def interrupt(*_):
                        os.kill(os.getpid(), signal.SIGINT)
                    signal.signal(signal.SIGALRM, interrupt)
                    signal.setitimer(signal.ITIMER_REAL, instant)
                first_runner_and_launch(marks)
            except KeyboardInterrupt:
                code = 1
            except BaseExceptionGroup as group:
                code = 1 if group.split(KeyboardInterrupt)[1] is None else 3
                if code == 3:
                    traceback.print_exc()
            except BaseException:
                traceback.print_exc()
                code = 3
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                os.write(write, json.dumps([m - marks[0] for m in marks]).encode())
                os.close(write)
            sys.exit(code)
        os.close(write)
        # A child that hangs is killed (and fails the test: killed by SIGKILL is no outcome).
        signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
        signal.alarm(60)
        with os.fdopen(read) as f:
            said = f.read()
        _, status = os.waitpid(pid, 0)
        signal.alarm(0)
        return os.waitstatus_to_exitcode(status), json.loads(said or "[]")

    code, marks = trial(None)
    assert code == 0 and len(marks) == 3, (code, marks)
    _, entered, launched = marks
    rng = random.Random(seed)
    outcomes = {}
    for _ in range(trials):
        # Half the instants in the imports and the runner's entry, half in the launch.
        if rng.random() < 0.5:
            instant = rng.uniform(0, entered)
        else:
            instant = rng.uniform(entered, launched)
        code, _ = trial(max(instant, 1e-6))
        outcomes[code] = outcomes.get(code, 0) + 1
    left = [d for d in os.listdir(tempfile.gettempdir()) if d.startswith("corral-")]
    print(json.dumps({"outcomes": outcomes, "left": left}))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 30)
def test_ctrl_c_at_random_instants_of_the_first_runner_and_launch(tag: str, tmp_path: Path) -> None:
    """SIGINT at random instants of a fresh process's first runner and first launch."""
    helpers = {}
    for seed, backend in enumerate(["asyncio", "trio"]):
        folder = tmp_path / backend
        folder.mkdir()
        helpers[backend] = subprocess.Popen(
            [PY, "-c", TRIALS_SCRIPT, backend, str(TRIALS), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": str(folder), TAG_VAR: tag},
        )
    try:
        said = {backend: helper.communicate(timeout=TIMEOUT) for backend, helper in helpers.items()}
    finally:
        for helper in helpers.values():
            helper.kill()
            helper.wait()
    for backend, (out, err) in said.items():
        helper = helpers[backend]
        assert helper.returncode == 0, f"{backend}: exit {helper.returncode}: {err[-3000:]}"
        report = json.loads(out.splitlines()[-1])
        outcomes = {int(code): n for code, n in report["outcomes"].items()}
        # 0: the launch finished before the signal; 1: KeyboardInterrupt came out.  Not a
        # crash (a negative code: killed by SIGSEGV, SIGABRT...), nor another error (3).
        assert set(outcomes) <= {0, 1}, f"{backend}: {outcomes}: {err[-3000:]}"
        assert outcomes.get(1), f"{backend}: no trial was interrupted: {outcomes}"
        assert report["left"] == [], f"{backend}: left behind in TMPDIR: {report['left']}"
