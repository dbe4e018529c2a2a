"""Every launch has a name of its own: launches under way at once are told apart.

In one runner, a launch begun while another is under way is numbered (``launch-2``) unless
it is given a ``name``; ``corral.launch`` calls made at once (from a thread pool) get runners
of their own names (``corral``, ``corral-2``...).  Their sources, so the console's prefixes,
the log files and the monitor's rows, differ.  The workers hold on a gate (a FIFO the test
holds open) until every launch is under way: nothing waits by sleeping.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import sys
from pathlib import Path

import cloudpickle
import pytest
from tests.helpers.loops import OTHER_LOOP, one_loop
from tests.helpers.processes import TAG_VAR
from tests.launch.test_launch import Lines

import corral

anyio_backend = one_loop()

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Gate:
    """A FIFO that holds workers (``hold``) until the test lets ``count`` of them go."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "gate"
        os.mkfifo(self.path)
        self._fd = os.open(self.path, os.O_RDWR)  # the workers' opens do not wait

    def open(self, count: int) -> None:
        os.write(self._fd, b"x" * count)

    def close(self) -> None:
        os.close(self._fd)


def hold(gate: str, said: str) -> str:
    """A worker: says ``said``, waits at the gate, answers with its launch's view of itself."""
    print(said, flush=True)
    fd = os.open(gate, os.O_RDONLY)
    try:
        os.read(fd, 1)
    finally:
        os.close(fd)
    return f"{said} done"


@OTHER_LOOP
@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_launches_under_way_at_once_in_one_runner_are_told_apart(
    tmp_path: Path, tag: str
) -> None:
    import anyio

    logs = Lines()
    gate = Gate(tmp_path)
    env = {TAG_VAR: tag}
    results: dict[str, list[str]] = {}
    try:
        async with corral.open_runner(
            name="app", console=False, handlers=[logs], log_dir=tmp_path / "logs"
        ) as r:

            async def run(key: str, **options: str) -> None:
                got = await r.launch(hold, str(gate.path), key, extra_env=env, **options)
                results[key] = list(got)

            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "first")
                await logs.until("first", 1)
                tg.start_soon(run, "second")
                await logs.until("second", 1)
                # (start_soon's own name= names the task: the launch's goes through partial)
                tg.start_soon(functools.partial(run, "named", name="eval"))
                await logs.until("named", 1)
                # A name under way may not be taken again; a bad one is refused.
                with pytest.raises(ValueError, match="under way"):
                    await r.launch(hold, str(gate.path), "again", name="eval", extra_env=env)
                for bad in ["", "a.b", "agent-1", "a b"]:
                    with pytest.raises(ValueError, match="launch name"):
                        await r.launch(hold, str(gate.path), "bad", name=bad, extra_env=env)
                gate.open(3)
            # Each under its own name; all three ended, so the next unnamed has none again.
            assert list(await r.launch(_plain, extra_env=env)) == ["plain"]
    finally:
        gate.close()
    assert results == {"first": ["first done"], "second": ["second done"], "named": ["named done"]}
    assert logs.by_source("app.agent-0.worker-0", "stdout") == ["first", "plain"]
    assert logs.by_source("app.launch-2.agent-0.worker-0", "stdout") == ["second"]
    assert logs.by_source("app.eval.agent-0.worker-0", "stdout") == ["named"]
    [folder] = (tmp_path / "logs").iterdir()
    files = {p.name for p in folder.iterdir()}
    assert {
        "app.agent-0.worker-0.log",
        "app.launch-2.agent-0.worker-0.log",
        "app.eval.agent-0.worker-0.log",
    } <= files, files


def _plain() -> str:
    print("plain", flush=True)
    return "plain"


@pytest.mark.timeout(90)
def test_corral_launch_calls_from_a_thread_pool_are_told_apart(tmp_path: Path, tag: str) -> None:
    """Four ``corral.launch`` calls at once: four runners of four names, one line prefix each."""
    logs = Lines()
    gate = Gate(tmp_path)
    calls = 4

    def call(n: int) -> list[str]:
        result = corral.launch(
            hold,
            str(gate.path),
            f"call {n}",
            console=False,
            handlers=[logs],
            extra_env={TAG_VAR: tag},
        )
        return list(result)

    try:
        with concurrent.futures.ThreadPoolExecutor(calls) as pool:
            futures = [pool.submit(call, n) for n in range(calls)]
            # Every call under way (each worker at the gate) before any may end.
            with logs._changed:
                if not logs._changed.wait_for(lambda: len(logs.stdout("call ")) == calls, 60):
                    raise AssertionError([r.getMessage() for r in logs.records])
            gate.open(calls)
            answers = [f.result(60) for f in futures]
    finally:
        gate.close()
    assert answers == [[f"call {n} done"] for n in range(calls)]
    sources = {r.getMessage(): getattr(r, "corral_source", None) for r in logs.stdout("call ")}
    assert sorted(sources.values()) == sorted(
        f"{name}.agent-0.worker-0" for name in ["corral", "corral-2", "corral-3", "corral-4"]
    ), sources
    # The names are given back: the next call alone is "corral" again.
    assert list(
        corral.launch(_plain, console=False, handlers=[logs], extra_env={TAG_VAR: tag})
    ) == ["plain"]
    assert logs.by_source("corral.agent-0.worker-0", "stdout")[-1] == "plain"
