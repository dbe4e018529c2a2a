"""``Runner.launch``: run a function on N workers across hosts, torchrun-style.

::

    results = await r.launch(train, cfg, hosts=["node1", "node2"], workers_per_host=4)

runs ``train(cfg)`` once per worker — eight here — and returns their return
values in global rank order.  Each worker is a fresh Python process (``python
-m corral._worker``) with the environment ``torch.distributed`` expects from
torchrun: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (a free port on the first
host), so ``init_process_group("gloo")`` works with no arguments.

The parts:

* **This machine** (``hosts=None``): the launcher's own runner starts the
  workers (:class:`corral._launch._workers.HostWorkers`); no ssh, no agent process.
* **Other hosts**: one agent per host (:mod:`corral._agent`), started with ssh
  or one ``srun`` step, dials back to a TCP listener of the launcher and
  authenticates with a secret made for this launch (:mod:`corral._launch._link`).
  The agent processes are children of the runner like any other, so they are
  stopped and reaped with it.
* The function and its arguments travel pickled with cloudpickle (so
  closures, lambdas and functions of ``__main__`` work), over the
  authenticated link only.

**Failures.**  The first worker that raises makes ``launch`` stop every
other worker on every host (stop signal, grace, SIGKILL), then raise: the
original exception if it can be rebuilt here (with the remote traceback as
its cause and the rank and host in a note), else :class:`WorkerFailed`.  A
worker that dies without an exception (``os._exit(3)``, a signal) raises
:class:`WorkerFailed` naming its rank, host and exit, with its stderr tail.
An agent that cannot start raises :class:`LaunchError` naming its host:
with ssh's own message if ssh exited, at ``start_timeout`` (counted from the
call) if it hangs — a host that accepts the connection and never speaks, a
cut link, an agent stuck in its hello.  A host whose link is lost later
(closed, or silent past ``link_timeout``: see :mod:`corral._launch._link`) raises
:class:`LaunchError` naming it, once the other hosts stopped their workers;
its own agent stops its workers when it notices the same silence.

**Stops.**  Cancelling ``launch`` (Ctrl-C, a timeout, the runner's scope)
tells every agent to stop its workers (stop signal, grace, SIGKILL), and
returns once each confirmed them reaped or its link was lost — never later
than ``grace`` + :data:`STOP_SLACK` seconds after the stop began.  The link
itself is what carries the stop: the ssh clients may be gone already (the
signal fan-out reaches them too), and a client hung on a cut link is
stopped, not waited for.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import anyio.to_thread

from .._errors import LaunchError
from .._results import LaunchResult
from .._scaleout import LaunchSpec
from ._coordinator import Coordinator
from ._hosts import free_port
from ._plan import Plan, make_plan
from ._remote import launch_remote
from ._source import pickle_job
from ._workers import HostWorkers

if TYPE_CHECKING:
    from ._context import LaunchContext

__all__ = ["launch"]

T = TypeVar("T")


async def launch(
    ctx: LaunchContext,
    spec: LaunchSpec,
    func: Callable[..., T] | None,
    args: tuple[Any, ...],
    *,
    argv: Sequence[str] | None = None,
) -> LaunchResult[T]:
    """Run ``func(*args)``, or the command ``argv``, on the workers of ``spec``, in ``ctx``."""
    plan = await make_plan(spec, ctx.grace, argv)
    for notice in plan.notices:
        ctx.logs.warn(notice)
    if argv is not None:
        payload = b""
    else:
        assert func is not None
        # In a thread: pickling reads the source files of the code it sends by value.
        payload = await anyio.to_thread.run_sync(pickle_job, func, args)
    coordinator = Coordinator(plan)
    if plan.remote:
        try:
            await launch_remote(ctx, plan, payload, coordinator)
        except BaseExceptionGroup as group:
            # An agent that could not start is one error, however many task
            # groups it crossed (and however many agents failed alike).
            errors, rest = group.split(LaunchError)
            if errors is None or rest is not None:
                raise
            first: BaseException = errors
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
    else:
        await _launch_here(ctx, plan, payload, coordinator)
    if coordinator.failure is not None:
        raise coordinator.exception()
    return cast(LaunchResult[T], coordinator.outcome())


async def _launch_here(
    ctx: LaunchContext, plan: Plan, payload: bytes, coordinator: Coordinator
) -> None:
    """This machine: the runner's own children are the workers."""
    workers = HostWorkers(
        ctx.start, host=0, prefix=f"{plan.agent(0)}.", python=sys.executable, scratch=ctx.scratch
    )
    job = plan.job(0, payload, "127.0.0.1", free_port("127.0.0.1"))
    try:
        async with anyio.create_task_group() as tg:
            coordinator.serve(tg)

            async def run() -> None:
                await workers.run(job, coordinator)

            tg.start_soon(run)
            await coordinator.settled.wait()
            if coordinator.failure is not None:
                with anyio.CancelScope(shield=True):
                    await workers.stop(plan.grace)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await workers.stop(plan.grace)
        raise
