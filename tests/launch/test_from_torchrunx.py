"""The rows of "From torchrunx" in docs/howto/switching.rst, each run for real.

torchrunx 0.2 has ``torchrunx.launch(func, func_args=..., func_kwargs=...,
hostnames=..., workers_per_host=...)``; 0.3 and 0.4 have
``torchrunx.Launcher(hostnames=..., workers_per_host=..., ...).run(func,
*args, **kwargs)``.  Each test below calls :func:`corral.launch` (or
:meth:`Runner.launch`) with the keyword the table maps a torchrunx one to.
"""

from __future__ import annotations

import functools
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from tests.helpers.loops import OTHER_LOOP, one_loop
from tests.helpers.processes import TAG_VAR

import corral

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests

pytestmark = pytest.mark.timeout(60)

# One loop (tests/helpers/loops.py): these rows are about what workers get and return.
anyio_backend = one_loop()


def where(scale: int, *, offset: int = 0) -> dict[str, Any]:
    """What torchrunx's workers read of their environment, and the arguments."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    env = {name: int(os.environ[name]) for name in names}
    env["MASTER"] = f"{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT'])}"
    env["value"] = env["RANK"] * scale + offset
    return env


def test_function_arguments_and_the_worker_environment(tag: str) -> None:
    """``func_args``/``func_kwargs`` (0.2), ``run(func, *args, **kwargs)`` (0.4)."""
    results = corral.launch(
        functools.partial(where, offset=1),  # func_kwargs={"offset": 1}
        10,  # func_args=(10,)
        hostnames=["localhost"],  # torchrunx's "this machine": no ssh
        workers_per_host=3,
        console=False,
        extra_env={TAG_VAR: tag},
    )
    assert [r["value"] for r in results] == [1, 11, 21]
    assert [(r["RANK"], r["LOCAL_RANK"]) for r in results] == [(0, 0), (1, 1), (2, 2)]
    assert {(r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"], r["GROUP_RANK"]) for r in results} == {
        (3, 3, 0)
    }
    assert len({r["MASTER"] for r in results}) == 1


@OTHER_LOOP
@pytest.mark.anyio
async def test_launcher_run_is_runner_launch(tag: str) -> None:
    """``Launcher(workers_per_host=[2]).run(func, 3)`` in async code: ``Runner.launch``."""
    async with corral.open_runner(console=False) as r:
        results = await r.launch(where, 3, workers_per_host=[2], extra_env={TAG_VAR: tag})
    assert [x["value"] for x in results] == [0, 3]


def test_the_launch_result(tag: str) -> None:
    """``.rank(i)``, ``.index(hostname, local_rank)`` and ``.results``."""
    results = corral.launch(where, 1, workers_per_host=2, console=False, extra_env={TAG_VAR: tag})
    assert results[1]["RANK"] == 1  # .rank(1)
    assert results.by_host["localhost"][1]["LOCAL_RANK"] == 1  # .index("localhost", 1)
    assert list(results.by_host) == ["localhost"]  # .results: {hostname: [...]}


def test_ssh_hosts_and_an_ssh_config_file(tmp_path: Path) -> None:
    """``hostnames=[...]`` over ssh; ``ssh_config_file=`` is ``ssh -F``; AgentFailedError."""
    config = tmp_path / "ssh_config"
    config.write_text("Host trainbox\n  HostName no-such-host.invalid\n")
    with pytest.raises(corral.LaunchError, match=r"on trainbox .*no-such-host\.invalid"):
        corral.launch(
            where,
            1,
            hostnames=["trainbox"],
            ssh=corral.SSH(options=("-F", str(config))),
            start_timeout=20,  # agent_timeout=20
            console=False,
        )


def test_hostnames_slurm_is_hosts_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    errors = []
    for keywords in ({"hostnames": "slurm"}, {"hosts": "slurm"}):
        with pytest.raises(Exception) as caught:  # the same, whatever it is
            corral.launch(where, 1, console=False, **keywords)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1]
    assert "slurm" in errors[0][1].lower()


def test_workers_per_host_cpu_is_the_cpus_this_process_may_use(tag: str) -> None:
    cpus = len(os.sched_getaffinity(0))  # workers_per_host="cpu"
    results = corral.launch(
        where, 1, workers_per_host=cpus, console=False, extra_env={TAG_VAR: tag}
    )
    assert len(results) == cpus


# -- backend=: the process group the workers initialise, as torchrunx's -------------------


def distributed_training(output_dir: str, num_steps: int = 10) -> str | None:
    """torchrunx's README function (0.4), but for the device: this torch has no GPU.

    The README's ``model.to(local_rank)``, ``.to(local_rank)`` on the inputs
    and ``device_ids=[local_rank]`` need a CUDA device; on the CPU, DDP takes
    no ``device_ids``.  Otherwise line for line: no ``init_process_group``.
    """
    import torch
    import torch.nn as nn

    rank = int(os.environ["RANK"])

    model = nn.Linear(10, 10)
    ddp_model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp_model.parameters())

    for _step in range(num_steps):
        optimizer.zero_grad()

        inputs = torch.randn(5, 10)
        labels = torch.randn(5, 10)
        outputs = ddp_model(inputs)

        torch.nn.functional.mse_loss(outputs, labels).backward()
        optimizer.step()

    if rank == 0:
        os.makedirs(output_dir, exist_ok=True)
        checkpoint_path = os.path.join(output_dir, "model.pt")
        torch.save(model, checkpoint_path)
        return checkpoint_path

    return None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_readme_function_with_backend_gloo(tmp_path: Path, tag: str) -> None:
    """``Launcher(workers_per_host=2, backend="gloo").run(distributed_training, ...)``."""
    pytest.importorskip("torch")
    results = corral.launch(
        functools.partial(distributed_training, output_dir=str(tmp_path), num_steps=10),
        workers_per_host=2,
        backend="gloo",
        console=False,
        extra_env={TAG_VAR: tag},
    )
    assert list(results) == [str(tmp_path / "model.pt"), None]
    assert (tmp_path / "model.pt").stat().st_size > 0


def dist_func() -> Any:
    """torchrunx's own CPU test function (its ``tests/test_ci.py``), unchanged."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])

    w = torch.rand((100, 100)) if rank == 0 else torch.zeros((100, 100))

    dist.broadcast(w, 0)

    i = torch.rand((500, 100))  # batch, dim
    o = torch.matmul(i, w)

    dist.all_reduce(o, op=dist.ReduceOp.SUM)

    print(i)

    return o.detach()


def dist_func_and_its_timeout() -> tuple[Any, float, bool]:
    import torch
    import torch.distributed as dist

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))  # type: ignore[union-attr]
    return dist_func(), backend.options._timeout.total_seconds(), dist.get_backend() == "gloo"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torchrunxs_own_function_with_backend_auto_and_a_timeout(tag: str) -> None:
    """``backend="auto"`` is Gloo without CUDA; ``worker_timeout=42`` is the group's."""
    pytest.importorskip("torch")
    results = corral.launch(
        dist_func_and_its_timeout,
        workers_per_host=2,
        backend="auto",
        process_group_timeout=42,
        console=False,
        extra_env={TAG_VAR: tag},
    )
    (first, timeout, gloo), (second, *_) = results
    assert bool((first == second).all())
    assert (timeout, gloo) == (42.0, True)


def all_reduce_without_a_group() -> None:
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_no_process_group_the_error_names_backend(tag: str) -> None:
    """torch's "Default process group has not been initialized" says what fixes it."""
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="process group has not been initialized") as caught:
        corral.launch(
            all_reduce_without_a_group, workers_per_host=1, console=False, extra_env={TAG_VAR: tag}
        )
    notes = getattr(caught.value, "__notes__", [])
    assert any('backend="gloo"' in note for note in notes), notes
    assert 'backend="gloo"' in str(caught.value.__cause__)  # the remote traceback says it too


@pytest.mark.anyio
async def test_backend_on_the_wrong_keyword_is_one_line_naming_the_right_one() -> None:
    with pytest.raises(ValueError) as caught:
        corral.open_runner_sync(backend="gloo")
    assert "r.launch(func, backend='gloo')" in str(caught.value)
    async with corral.open_runner(console=False) as r:
        for kind, keywords, words in [
            (ValueError, {"backend": "trio"}, "open_runner_sync(backend='trio')"),
            (ValueError, {"backend": "glue"}, "is not a process-group backend"),
            (TypeError, {"backend": 1}, "process-group backend such as 'gloo'"),
            (ValueError, {"backend": "gloo", "process_group_timeout": 0}, "positive number"),
        ]:
            with pytest.raises(kind) as caught:
                await r.launch(where, 1, **keywords)
            assert words in str(caught.value) and "\n" not in str(caught.value), caught.value
        with pytest.raises(ValueError, match="a command initialises its own"):
            await r.launch_command(["true"], backend="gloo")
        assert r.processes == ()


def gloo_all_reduce(seconds: int) -> float:
    """``backend=None``: the function initialises (and destroys) its process group itself."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=seconds))
    try:
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        return float(value.item())
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_process_group_in_the_function(tag: str) -> None:
    pytest.importorskip("torch")
    results = corral.launch(
        gloo_all_reduce, 600, workers_per_host=2, console=False, extra_env={TAG_VAR: tag}
    )
    assert list(results) == [3.0, 3.0]


def read_env(*names: str) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in names}


def test_extra_env_copy_env_and_an_env_file(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``extra_env_vars={...}``, ``copy_env_vars=(...)`` and ``env_file=``."""
    from dotenv import dotenv_values

    env_file = tmp_path / "job.env"
    env_file.write_text("FROM_FILE=file\n")
    monkeypatch.setenv("MY_COPIED", "copied")
    file_env = {k: v for k, v in dotenv_values(env_file).items() if v is not None}
    results = corral.launch(
        read_env,
        "EXTRA",
        "MY_COPIED",
        "FROM_FILE",
        workers_per_host=1,
        console=False,
        copy_env=("MY_*",),
        extra_env={"EXTRA": "extra", TAG_VAR: tag, **file_env},
    )
    assert results[0] == {"EXTRA": "extra", "MY_COPIED": "copied", "FROM_FILE": "file"}


def fails(rank: int) -> None:
    if int(os.environ["RANK"]) == rank:
        raise KeyError("rank gave up")


def crashes() -> None:
    sys.stdout.flush()
    os._exit(3)


def test_failures(tag: str) -> None:
    """The worker's exception re-raised; ``WorkerFailedError`` is ``WorkerFailed``."""
    with pytest.raises(KeyError, match="rank gave up") as caught:
        corral.launch(fails, 1, workers_per_host=2, console=False, extra_env={TAG_VAR: tag})
    assert isinstance(caught.value.__cause__, corral.RemoteTraceback)
    with pytest.raises(corral.WorkerFailed):
        corral.launch(crashes, workers_per_host=1, console=False, extra_env={TAG_VAR: tag})


def say(text: str) -> None:
    print(text, os.environ["RANK"])


def test_logs_in_a_folder(tmp_path: Path, tag: str) -> None:
    """``$TORCHRUNX_LOG_DIR``: ``log_dir=``, a file per worker under a timestamped folder."""
    corral.launch(
        say,
        "hello",
        workers_per_host=2,
        name="train",
        log_dir=str(tmp_path),
        console=False,
        extra_env={TAG_VAR: tag},
    )
    files = {p.name: p.read_text() for p in tmp_path.rglob("*.log")}
    worker_files = [name for name in files if "worker-1" in name]
    assert worker_files, files
    assert "hello 1" in files[worker_files[0]]
