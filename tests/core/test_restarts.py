"""Restart policies of ``Runner.start``: ``restart=``, ``max_restarts=``, ``backoff=``.

Every child here is a real ``sh`` script that counts its runs in a file of
its own (``count``) and prints ``run <n> pid <pid>``, so the test can tell
the runs apart without guessing.  Nothing waits by sleeping: tests wait for
lines (a tail of the process, or the runner's lifecycle records), for
exits and for the runner's block to end.  Children that must stay up for a
while block on a FIFO that the test opens when it is done looking.

The "stable period" (a run that lasts ``STABLE_AFTER`` = 60 s resets the
count of restarts in a row) is tested with the threshold lowered to a
fraction of a second, by patching the module constant that the supervisor
reads at each decision: the same code path, not the real 60 s.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import time
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from tests.helpers.processes import TAG_VAR, ListHandler, release

import corral
import corral._core._supervisor
from corral._core._options import MAX_BACKOFF, ProcessOptions

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

#: Counts its runs in ./count and says which run and pid it is.
COUNT = 'n=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > count; echo "run $n pid $$"'

RESTARTING = re.compile(
    r"restarting (?P<name>\S+) in (?P<delay>[0-9.]+) s \(restart (?P<restart>\d+), "
    r"(?P<row>\d+) of (?P<max>\d+) in a row\); it (?P<why>.*)"
)
RESTARTED = re.compile(r"restarted (?P<name>\S+) \(pid (?P<pid>\d+)\): .*")


class Records(ListHandler):
    """A ListHandler that a test can wait on (from the loop, in a worker thread)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)

    def matching(self, pattern: re.Pattern[str], source: str = "t") -> list[logging.LogRecord]:
        """The records of ``source`` whose whole message matches ``pattern``."""
        with self._changed:
            return [
                r
                for r in self.records
                if getattr(r, "corral_source", None) == source and pattern.fullmatch(r.getMessage())
            ]

    async def until(self, pattern: re.Pattern[str], count: int = 1, timeout: float = 10) -> None:
        if not await self.wait_for(lambda: len(self.matching(pattern)) >= count, timeout):
            raise AssertionError(f"no {count} records like {pattern.pattern!r}: {self.messages()}")


def runs(lines: list[str]) -> list[tuple[int, int]]:
    """(run number, pid) of each ``run <n> pid <pid>`` line."""
    found = []
    for line in lines:
        match = re.fullmatch(r"run (\d+) pid (\d+)", line)
        if match:
            found.append((int(match[1]), int(match[2])))
    return found


def failures(group: BaseExceptionGroup[BaseException]) -> list[corral.ProcessFailed]:
    matched = group.subgroup(corral.ProcessFailed)
    assert matched is not None, group
    flat: list[corral.ProcessFailed] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            assert isinstance(exc, corral.ProcessFailed)
            flat.append(exc)

    walk(matched)
    return flat


# -- restarting until it works ------------------------------------------------------------


async def test_on_failure_restarts_the_same_process_until_it_succeeds(
    tmp_path: Path, tag: str
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = f"{COUNT}; [ $n -lt 3 ] && exit 5; echo waiting; read x < fifo; exit 0"
    records = Records()
    async with corral.open_runner(name="t", console=False, handlers=[records]) as r:
        proc = await r.start(
            ["sh", "-c", script],
            name="f",
            cwd=tmp_path,
            extra_env={TAG_VAR: tag},
            restart="on-failure",
            max_restarts=3,
            backoff=0.02,
        )
        first_pid = proc.pid
        assert proc.restarts == 0
        assert proc.previous_exit is None
        async with proc.logs() as tail:
            seen: list[str] = []
            async for record in tail:
                seen.append(record.getMessage())
                if record.getMessage() == "waiting":
                    break
            # The third run is up: the same object, a new pid, the history visible.
            assert r.processes == (proc,)
            assert proc.returncode is None
            assert proc.restarts == 2
            assert proc.previous_exit == 5
            await anyio.to_thread.run_sync(release, fifo)
            seen.extend([record.getMessage() async for record in tail])  # ends with the last run
        assert await proc.wait() == 0
    assert proc.returncode == 0
    assert proc.restarts == 2
    assert proc.previous_exit == 5
    numbered = runs(seen)
    assert [n for n, _ in numbered] == [1, 2, 3]
    pids = [pid for _, pid in numbered]
    assert len(set(pids)) == 3
    assert pids[0] == first_pid
    assert pids[2] == proc.pid
    # Each restart is logged as a lifecycle record of the runner: why, and the new pid.
    restarting = records.matching(RESTARTING)
    assert [m.levelno for m in restarting] == [logging.WARNING, logging.WARNING]
    parsed = [RESTARTING.fullmatch(m.getMessage()) for m in restarting]
    assert [(p["name"], p["restart"], p["row"], p["max"]) for p in parsed if p] == [
        ("f", "1", "1", "3"),
        ("f", "2", "2", "3"),
    ]
    assert all(p and p["why"] == "exited with code 5" for p in parsed)
    restarted = records.matching(RESTARTED)
    assert [m.levelno for m in restarted] == [logging.INFO, logging.INFO]
    assert [int(m.getMessage().split("pid ")[1].split(")")[0]) for m in restarted] == pids[1:]


async def test_a_death_by_signal_is_a_failure_and_is_restarted(tmp_path: Path, tag: str) -> None:
    script = f"{COUNT}; [ $n -eq 1 ] && kill -KILL $$; exit 0"
    async with corral.open_runner(name="t", console=False) as r:
        proc = await r.start(
            ["sh", "-c", script],
            cwd=tmp_path,
            extra_env={TAG_VAR: tag},
            restart="on-failure",
            backoff=0.01,
        )
        assert await proc.wait() == 0
    assert proc.restarts == 1
    assert proc.previous_exit == -9


async def test_always_restarts_after_a_success_too(tmp_path: Path, tag: str) -> None:
    async with corral.open_runner(name="t", console=False) as r:
        proc = await r.start(
            ["sh", "-c", f"{COUNT}; exit 0"],
            cwd=tmp_path,
            extra_env={TAG_VAR: tag},
            restart="always",
            max_restarts=2,
            backoff=0.01,
        )
        assert await proc.wait() == 0
    # A spent budget after a success is no failure: the block ended without raising.
    assert (tmp_path / "count").read_text().strip() == "3"
    assert proc.restarts == 2
    assert proc.previous_exit == 0


# -- the budget ---------------------------------------------------------------------------


async def test_a_spent_budget_raises_process_failed_with_the_count(
    tmp_path: Path, tag: str
) -> None:
    script = f"{COUNT}; echo boom $n >&2; exit 4"
    records = Records()
    proc: corral.Process | None = None
    with pytest.raises(BaseExceptionGroup) as caught:
        async with corral.open_runner(name="t", console=False, handlers=[records]) as r:
            proc = await r.start(
                ["sh", "-c", script],
                name="f",
                cwd=tmp_path,
                extra_env={TAG_VAR: tag},
                restart="on-failure",
                max_restarts=2,
                backoff=0.01,
            )
            await anyio.sleep_forever()  # the failure cancels the body
    assert proc is not None
    [failed] = failures(caught.value)
    assert failed.restarts == 2
    assert failed.returncode == 4
    assert failed.name == "f"
    assert failed.pid == proc.pid
    assert "after 2 restarts" in str(failed)
    assert b"boom 3" in failed.stderr
    assert (tmp_path / "count").read_text().strip() == "3"
    assert proc.restarts == 2
    assert proc.previous_exit == 4
    assert proc.returncode == 4
    assert len(records.matching(RESTARTING)) == 2


async def test_the_failure_that_spends_the_budget_is_logged_as_an_error(
    tmp_path: Path, tag: str
) -> None:
    """The exits that are restarted are warnings; the one that stops the runner is an error.

    That is what a child without a restart policy gets for the failure that
    stops its runner (``check=True``).
    """
    exited = re.compile(r"f \(pid \d+\) exited with code 4 after [0-9.]+ s")
    records = Records()
    with pytest.raises(BaseExceptionGroup):
        async with corral.open_runner(name="t", console=False, handlers=[records]) as r:
            await r.start(
                ["sh", "-c", "exit 4"],
                name="f",
                cwd=tmp_path,
                extra_env={TAG_VAR: tag},
                restart="on-failure",
                max_restarts=1,
                backoff=0.01,
            )
    levels = [m.levelno for m in records.matching(exited)]
    assert levels == [logging.WARNING, logging.ERROR], levels


async def test_check_false_a_spent_budget_is_only_an_exit_code(tmp_path: Path, tag: str) -> None:
    async with corral.open_runner(name="t", console=False) as r:
        proc = await r.start(
            ["sh", "-c", f"{COUNT}; exit 6"],
            cwd=tmp_path,
            extra_env={TAG_VAR: tag},
            check=False,
            restart="on-failure",
            max_restarts=1,
            backoff=0.01,
        )
        assert await proc.wait() == 6
    assert proc.restarts == 1
    assert (tmp_path / "count").read_text().strip() == "2"


# -- backoff --------------------------------------------------------------------------------


async def test_backoff_doubles_and_is_really_waited(tmp_path: Path, tag: str) -> None:
    backoff = 0.04
    records = Records()
    async with corral.open_runner(name="t", console=False, handlers=[records]) as r:
        proc = await r.start(
            ["sh", "-c", f"{COUNT}; exit 3"],
            name="f",
            cwd=tmp_path,
            extra_env={TAG_VAR: tag},
            check=False,
            restart="on-failure",
            max_restarts=4,
            backoff=backoff,
        )
        await proc.wait()
    restarting = records.matching(RESTARTING)
    restarted = records.matching(RESTARTED)
    assert len(restarting) == len(restarted) == 4
    for attempt, (before, after) in enumerate(zip(restarting, restarted, strict=True), 1):
        match = RESTARTING.fullmatch(before.getMessage())
        assert match is not None
        announced = float(match["delay"])
        base = backoff * 2 ** (attempt - 1)
        # Jitter of +-20 % around the doubling base (the message rounds to 10 ms).
        assert 0.8 * base - 0.006 <= announced <= 1.2 * base + 0.006, (attempt, announced)
        waited = after.created - before.created
        assert waited >= announced - 0.006, (attempt, announced, waited)


def test_backoff_jitter_spreads_the_delays_and_respects_the_cap() -> None:
    options = ProcessOptions(restart="on-failure", max_restarts=3, backoff=1.0)
    policy = options.checked(["true"]).policy
    for attempt in (1, 2, 3):
        base = 2.0 ** (attempt - 1)
        delays = [policy.delay(attempt) for _ in range(1000)]
        assert all(0.8 * base <= d <= 1.2 * base for d in delays)
        # Really random: spread over the whole +-20 % band, not a constant.
        assert min(delays) < 0.85 * base and max(delays) > 1.15 * base
        assert statistics.pstdev(delays) > 0.05 * base
    # "doubled each time, up to 30 s": however many attempts, never more than the cap.
    late = [policy.delay(attempt) for attempt in range(6, 40) for _ in range(30)]
    assert max(late) <= MAX_BACKOFF, max(late)


# -- the stable period ------------------------------------------------------------------------


@pytest.mark.parametrize("stable_after", [0.4, None], ids=["patched-0.4s", "real-60s"])
async def test_a_stable_run_resets_the_count(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch, stable_after: float | None
) -> None:
    """Run 1 fails at once, run 2 fails after 0.6 s, run 3 fails at once; max_restarts=1.

    With the stable period lowered to 0.4 s, run 2 counts as stable: the count
    starts over and run 3 happens (2 restarts in all, each "1 of 1 in a row",
    the backoff back to its first step).  With the real 60 s, run 2's failure
    spends the budget: run 3 never starts.
    """
    if stable_after is not None:
        monkeypatch.setattr(corral._core._supervisor, "STABLE_AFTER", stable_after)
    backoff = 0.05
    script = f"{COUNT}; [ $n -eq 2 ] && sleep 0.6; exit 3"
    records = Records()
    with pytest.raises(BaseExceptionGroup) as caught:
        async with corral.open_runner(name="t", console=False, handlers=[records]) as r:
            await r.start(
                ["sh", "-c", script],
                name="f",
                cwd=tmp_path,
                extra_env={TAG_VAR: tag},
                restart="on-failure",
                max_restarts=1,
                backoff=backoff,
            )
    [failed] = failures(caught.value)
    parsed = [RESTARTING.fullmatch(m.getMessage()) for m in records.matching(RESTARTING)]
    rows = [(p["restart"], p["row"]) for p in parsed if p]
    delays = [float(p["delay"]) for p in parsed if p]
    if stable_after is None:
        assert failed.restarts == 1
        assert (tmp_path / "count").read_text().strip() == "2"
        assert rows == [("1", "1")]
    else:
        assert failed.restarts == 2
        assert (tmp_path / "count").read_text().strip() == "3"
        assert rows == [("1", "1"), ("2", "1")]
        # The backoff starts over with the count: both delays are the first step's.
        assert all(0.8 * backoff - 0.006 <= d <= 1.2 * backoff + 0.006 for d in delays), delays


# -- stopping ---------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_a_stop_during_the_backoff_ends_it_at_once(
    tmp_path: Path, tag: str, how: str
) -> None:
    records = Records()
    async with corral.open_runner(name="t", console=False, handlers=[records]) as r:
        proc = await r.start(
            ["sh", "-c", f"{COUNT}; exit 3"],
            name="f",
            cwd=tmp_path,
            extra_env={TAG_VAR: tag},
            restart="on-failure",
            backoff=20.0,  # the test would time out if the stop waited for it
        )
        await records.until(RESTARTING)
        started = time.monotonic()
        with anyio.fail_after(5):
            if how == "stop":
                assert await proc.stop() == 3
            else:
                r.cancel()
                await anyio.sleep_forever()
    # The block ended without ProcessFailed: a stop that was asked for is no failure.
    assert time.monotonic() - started < 5
    assert proc.restarts == 0
    assert (tmp_path / "count").read_text().strip() == "1"
    assert records.matching(RESTARTED) == []


async def test_terminate_is_not_restarted_even_with_always(tmp_path: Path, tag: str) -> None:
    async with corral.open_runner(name="t", console=False) as r:
        proc = await r.start(
            ["sh", "-c", f"{COUNT}; exec sleep 60"],
            cwd=tmp_path,
            extra_env={TAG_VAR: tag},
            restart="always",
            backoff=0.01,
        )
        async with proc.logs() as tail:
            async for record in tail:
                if record.getMessage().startswith("run 1"):
                    break
        proc.terminate()
        assert await proc.wait() == -15
    assert proc.restarts == 0
    assert (tmp_path / "count").read_text().strip() == "1"
