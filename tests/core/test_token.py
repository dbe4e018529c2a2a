"""The one explicit loop token, and WrongLoopError for everyone who ignores it."""

from __future__ import annotations

import asyncio
import threading

import anyio
import anyio.to_thread
import pytest
import trio
from tests.helpers.processes import TAG_VAR

import corral

pytestmark = pytest.mark.anyio


async def test_token_is_captured_on_entry(anyio_backend: str) -> None:
    r = corral.open_runner(console=False)
    with pytest.raises(RuntimeError, match="not been entered"):
        r.token  # noqa: B018
    async with r:
        assert isinstance(r.token, corral.LoopToken)
        assert r.token.backend == anyio_backend
        assert r.token.native == anyio.lowlevel.current_token()


async def test_token_calls_back_into_the_loop_from_a_thread(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        loop_thread = threading.get_ident()

        def in_thread() -> tuple[int, int, int | None]:
            proc = r.token.run(r.start, ["sleep", "1000"])
            where = r.token.run_sync(threading.get_ident)
            code = r.token.run(proc.stop)
            return where, len(r.token.run_sync(lambda: r.processes)), code

        where, count, code = await anyio.to_thread.run_sync(in_thread)
        assert where == loop_thread
        assert count == 0
        assert code == -15


async def test_foreign_thread_gets_wrong_loop_error_at_once(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sleep", "1000"], extra_env={TAG_VAR: tag})
        errors: list[BaseException] = []

        def in_thread() -> None:
            for call in (p.kill, r.cancel, lambda: p.send_signal(9)):
                try:
                    call()
                except corral.WrongLoopError as exc:
                    errors.append(exc)

        await anyio.to_thread.run_sync(in_thread)
        assert len(errors) == 3
        assert "r.token" in str(errors[0])
        assert p.returncode is None  # nothing happened to it
        await p.stop()


async def test_token_run_on_the_loop_thread_refuses_instead_of_deadlocking() -> None:
    async with corral.open_runner(console=False) as r:
        with pytest.raises(corral.WrongLoopError, match="deadlock"):
            r.token.run_sync(lambda: None)


async def test_other_event_loop_gets_wrong_loop_error(anyio_backend: str, tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sleep", "1000"], extra_env={TAG_VAR: tag})
        result: list[BaseException | None] = []

        async def elsewhere() -> None:
            try:
                await p.wait()
            except corral.WrongLoopError as exc:
                result.append(exc)
            else:
                result.append(None)

        def other_loop() -> None:
            # Another loop, on another backend too, in its own thread.
            if anyio_backend == "trio":
                asyncio.run(elsewhere())
            else:
                trio.run(elsewhere)

        await anyio.to_thread.run_sync(other_loop)
        assert isinstance(result[0], corral.WrongLoopError)
        await p.stop()


def test_same_thread_later_loop_gets_wrong_loop_error() -> None:
    saved: list[corral.Process] = []

    async def first() -> None:
        async with corral.open_runner(console=False) as r:
            p = await r.start(["true"])
            await p.wait()
            saved.append(p)

    async def second() -> None:
        with pytest.raises(corral.WrongLoopError, match="another event loop"):
            await saved[0].wait()

    anyio.run(first)
    anyio.run(second)


def test_no_loop_at_all() -> None:
    with pytest.raises(corral.WrongLoopError):
        corral.LoopToken.current()


def test_trio_guest_mode_each_runner_knows_its_own_loop(tag: str) -> None:
    """Trio in guest mode on asyncio: two loops on one thread, one runner on each.

    Each runner is labelled with its own loop, and touching it from the other
    loop's task raises WrongLoopError at once instead of hanging.
    """
    env = {TAG_VAR: tag}
    seen: dict[str, object] = {}

    async def use(runner: corral.Runner, proc: corral.Process, where: str) -> None:
        errors = []
        for call in (lambda: runner.run(["true"]), proc.wait, proc.stop):
            try:
                with anyio.fail_after(5):
                    await call()
            except corral.WrongLoopError as exc:
                errors.append(exc)
        for sync_call in (proc.terminate, runner.cancel, lambda: proc.logs()):
            try:
                sync_call()
            except corral.WrongLoopError as exc:
                errors.append(exc)
        seen[where] = len(errors)

    async def guest(host: corral.Runner, host_proc: corral.Process, ready: asyncio.Event) -> None:
        async with corral.open_runner(console=False, name="guest") as r:
            p = await r.start(["sleep", "1000"], extra_env=env)
            seen["guest runner"] = r.token.backend
            await use(host, host_proc, "host's runner from the guest")
            seen["guest"] = (r, p, trio.lowlevel.current_trio_token())
            go_on = seen["go on"] = trio.Event()
            ready.set()
            await go_on.wait()
            assert p.returncode is None  # the host's attempts did nothing to it
            await p.stop()

    async def host() -> None:
        async with corral.open_runner(console=False, name="host") as r:
            seen["host runner"] = r.token.backend
            p = await r.start(["sleep", "1000"], extra_env=env)
            loop = asyncio.get_running_loop()
            ready, done = asyncio.Event(), asyncio.Event()
            trio.lowlevel.start_guest_run(
                guest,
                r,
                p,
                ready,
                run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                done_callback=lambda outcome: (seen.__setitem__("outcome", outcome), done.set()),
            )
            await asyncio.wait_for(ready.wait(), 20)
            guest_runner, guest_proc, guest_token = seen["guest"]  # type: ignore[misc]
            await use(guest_runner, guest_proc, "guest's runner from the host")
            guest_token.run_sync_soon(seen["go on"].set)  # type: ignore[attr-defined]
            await asyncio.wait_for(done.wait(), 20)
            assert p.returncode is None
            await p.stop()

    asyncio.run(host())
    seen["outcome"].unwrap()  # type: ignore[attr-defined]
    assert seen["host runner"] == "asyncio"
    assert seen["guest runner"] == "trio"
    assert seen["host's runner from the guest"] == 6
    assert seen["guest's runner from the host"] == 6


async def test_run_sync_soon_reaches_the_loop_from_a_thread_that_runs_another_loop(
    anyio_backend: str,
) -> None:
    """The one call that works where a Trio loop refuses blocking calls into other loops."""
    async with corral.open_runner(console=False) as r:
        arrived = anyio.Event()
        seen: list[int] = []

        def deliver() -> None:
            seen.append(threading.get_ident())
            arrived.set()

        def other_loop() -> None:
            async def elsewhere() -> None:
                r.token.run_sync_soon(deliver)  # from inside a running Trio loop

            trio.run(elsewhere)

        await anyio.to_thread.run_sync(other_loop)
        with anyio.fail_after(10):
            await arrived.wait()
        assert seen == [threading.get_ident()]
        r.token.run_sync_soon(seen.append, 0)  # from the loop's own thread, too
    assert seen[-1] == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_run_sync_soon_on_a_finished_loop_raises_run_finished(backend: str) -> None:
    tokens: list[corral.LoopToken] = []

    async def main() -> None:
        async with corral.open_runner(console=False) as r:
            tokens.append(r.token)

    anyio.run(main, backend=backend)
    with pytest.raises(anyio.RunFinishedError):
        tokens[0].run_sync_soon(print)
