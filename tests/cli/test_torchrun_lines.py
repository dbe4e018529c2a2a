"""torchrun lines from PyTorch's own docs, pasted after ``corral run``: each runs or says why.

The ten lines are those of ``torch/distributed/run.py``'s docstring (the torchrun
page of the docs), ``torch/distributed/launch.py``'s, the DDP tutorial, the DDP
tutorial series and pytorch/examples (FSDP, tensor parallelism), with their
``$VARIABLES`` filled in.  A line corral takes is checked by its plan (what
``corral run`` would start, without starting it; two of them also run for
real); a line it does not is one usage error that names corral's way.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli.test_cli import corral, messages
from tests.programs import path

from corral._cli._main import main
from corral._cli._run import plan_run, run

pytestmark = pytest.mark.timeout(60)

#: (where the line comes from, the line after ``torchrun``, how corral takes it).
LINES = [
    (
        "run.py, single-node multi-worker",
        "--standalone --nnodes=1 --nproc-per-node=2 train.py",
        {"nproc": 2},
    ),
    (
        "run.py, stacked single-node multi-worker",
        "--rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 --nproc-per-node=4 train.py",
        {"nproc": 4, "master_addr": "localhost", "master_port": None},
    ),
    (
        "run.py, fault tolerant",
        "--nnodes=4 --nproc-per-node=8 --max-restarts=3 --rdzv-id=job7 --rdzv-backend=c10d "
        "--rdzv-endpoint=node1:29400 train.py",
        "--nnodes 4: one corral run starts the workers of every node: give the nodes with "
        "--hosts H1,H2 (or --hosts slurm) and run it once",
    ),
    (
        "run.py, elastic",
        "--nnodes=1:4 --nproc-per-node=8 --max-restarts=3 --rdzv-id=job7 --rdzv-backend=c10d "
        "--rdzv-endpoint=node1:29400 train.py",
        "--nnodes 1:4 asks for an elastic number of nodes; one corral run starts the workers of "
        "every node: give the nodes with --hosts H1,H2 (or --hosts slurm) and run it once",
    ),
    (
        "launch.py, node 0 of two",
        '--nproc-per-node=8 --nnodes=2 --node-rank=0 --master-addr="192.168.1.1" '
        "--master-port=1234 train.py",
        "--nnodes 2: one corral run starts the workers of every node",
    ),
    (
        "ddp_tutorial, elastic_ddp.py on two hosts",
        "--nnodes=2 --nproc_per_node=8 --rdzv_id=100 --rdzv_backend=c10d "
        "--rdzv_endpoint=node1:29400 elastic_ddp.py",
        "--nnodes 2: one corral run starts the workers of every node",
    ),
    (
        "ddp-tutorial-series, multigpu_torchrun.py",
        "--standalone --nproc_per_node=4 multigpu_torchrun.py 50 10",
        {"nproc": 4, "args": ["multigpu_torchrun.py", "50", "10"]},
    ),
    (
        "ddp-tutorial-series, multinode_torchrun.py",
        "--nproc_per_node=4 --nnodes=2 --node_rank=0 --rdzv_id=456 --rdzv_backend=c10d "
        "--rdzv_endpoint=172.31.43.139:29603 multinode_torchrun.py 50 10",
        "--nnodes 2: one corral run starts the workers of every node",
    ),
    (
        "examples, distributed/FSDP",
        "--nnodes 1 --nproc_per_node 4 T5_training.py",
        {"nproc": 4, "args": ["T5_training.py"]},
    ),
    (
        "examples, distributed/tensor_parallelism",
        '--nnodes=1 --nproc_per_node=2 --rdzv_id=101 --rdzv_endpoint="localhost:5972" '
        "fsdp_tp_example.py",
        {"nproc": 2, "master_addr": "localhost", "master_port": 5972, "run_id": "101"},
    ),
]


def words(line: str) -> list[str]:
    import shlex

    return shlex.split(line)


def plan(args: list[str]) -> dict[str, object]:
    """What ``corral run ARGS`` would run, from its plan: nothing starts."""
    with run.make_context("run", args) as ctx:
        _name, _output, job = ctx.invoke(plan_run, **ctx.params)
    assert job.argv[0] == sys.executable  # a .py script runs with this Python
    return {
        "nproc": job.nproc,
        "hosts": job.hosts,
        "args": job.argv[1:],
        "master_addr": job.master_addr,
        "master_port": job.master_port,
        "run_id": job.run_id,
    }


@pytest.mark.parametrize(("where", "line", "taken"), LINES, ids=[w for w, _, _ in LINES])
def test_a_pasted_torchrun_line_runs_or_says_corrals_way(
    capfd: pytest.CaptureFixture[str], where: str, line: str, taken: dict[str, object] | str
) -> None:
    args = words(line)
    if isinstance(taken, str):
        with pytest.raises(SystemExit) as exited:
            main(["run", *args])
        err = capfd.readouterr().err
        assert exited.value.code == 2, err
        assert err.startswith(f"corral run: error: {taken}"), err
        assert err.count("\n") == 1 and "--hosts" in err, err
        return
    got = plan(args)
    assert got["hosts"] is None
    for key, value in taken.items():
        assert got[key] == value, (key, got)
    if "run_id" not in taken:
        assert len(str(got["run_id"])) == 36  # a fresh uuid4, as torchrun --standalone makes


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 9], ids=["standalone", "rdzv-endpoint"])
def test_two_pasted_lines_run(tmp_path: Path, tag: str, index: int) -> None:
    _, line, taken = LINES[index]
    assert isinstance(taken, dict)
    args = words(line)
    script = args[-1]
    shutil.copy(path("torchrun_probe"), tmp_path / script)  # under the name the line uses
    out = corral("run", *args, "arg", cwd=tmp_path, tag=tag)
    assert out.returncode == 0, out.stderr
    seen = [messages(out.stdout.splitlines(), f"agent-0.worker-{r}") for r in (0, 1)]
    for rank, said in enumerate(seen):
        [env] = said
        _, got_rank, size, addr, port, run_id, arg = env.split()
        assert (got_rank, size, arg) == (str(rank), "2", "arg"), env
        if "master_addr" in taken:
            assert (addr, int(port), run_id) == ("localhost", 5972, "101"), env
        else:
            assert addr == "127.0.0.1" and len(run_id) == 36, env
    # Each worker's stderr line on corral's stderr, prefixed: not on its stdout.
    err = out.stderr.splitlines()
    assert [messages(err, f"agent-0.worker-{r}") for r in (0, 1)] == [
        ["to stderr 0"],
        ["to stderr 1"],
    ]
    assert "to stderr" not in out.stdout


def test_master_port_and_addr_on_one_node() -> None:
    got = plan(["--master-port", "29500", "--master_addr", "localhost", "train.py"])
    assert (got["master_addr"], got["master_port"]) == ("localhost", 29500)
    # torchrun's rule: --rdzv-endpoint wins over them; a port of 0 leaves corral's.
    got = plan(["--master-port", "29500", "--rdzv-endpoint", "[::1]:0", "train.py"])
    assert (got["master_addr"], got["master_port"]) == ("::1", 29500)
    got = plan(["--rdzv-endpoint", "node1", "train.py"])  # torchrun's default port
    assert (got["master_addr"], got["master_port"]) == ("node1", 29400)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--nnodes", "2", "--hosts", "a,b,c"], "--nnodes 2, but --hosts names 3 hosts"),
        (["--nnodes", "x"], "'x' is not a number of nodes (N, or MIN:MAX)"),
        (["--node-rank", "1"], "--node-rank 1: one corral run starts the workers of every node"),
        (["--rdzv-backend", "etcd"], "corral needs no rendezvous server"),
        (["--rdzv-endpoint", "a:b:c"], "'a:b:c' is not HOST[:PORT]"),
        (["--master-port", "0"], "0 is not in the range 1<=x<=65535"),
        (["--tee", "4"], "'4' is not 0-3 (1 stdout, 2 stderr, 3 both)"),
        (["-r", "x:1"], "'x:1' is not 0-3"),
    ],
)
def test_a_bad_torchrun_value_is_one_line(
    capfd: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", *args, "--", "true"])
    err = capfd.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1, err
    assert error in err, err


def test_nnodes_matching_the_hosts_is_taken() -> None:
    with run.make_context("run", ["--nnodes", "2:2", "--hosts", "a,b", "--", "true"]) as ctx:
        _name, _output, job = ctx.invoke(plan_run, **ctx.params)
    assert job.hosts == ["a", "b"]


BOTH = 'echo "out $LOCAL_RANK"; echo "err $LOCAL_RANK" >&2'


@pytest.mark.slow
def test_redirects_keep_streams_off_the_console_and_in_the_files(tmp_path: Path, tag: str) -> None:
    """``-r 0:1,1:2``: rank 0's stdout and rank 1's stderr go to the files alone."""
    logs = tmp_path / "logs"
    out = corral(
        "run", "-n", "2", "-r", "0:1,1:2", "--log-dir", str(logs), "--", "sh", "-c", BOTH,
        cwd=tmp_path, tag=tag,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    shown = out.stdout.splitlines() + out.stderr.splitlines()
    assert messages(shown, "agent-0.worker-0") == ["err 0"]
    assert messages(shown, "agent-0.worker-1") == ["out 1"]
    [folder] = list(logs.iterdir())
    for rank in (0, 1):
        text = (folder / f"run.agent-0.worker-{rank}.log").read_text()
        assert f"out {rank}" in text and f"err {rank}" in text, text


@pytest.mark.slow
def test_tee_without_a_log_dir_writes_to_a_new_folder_and_says_where(
    tmp_path: Path, tag: str
) -> None:
    out = corral("run", "--tee", "3", "--", "sh", "-c", BOTH, cwd=tmp_path, tag=tag)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if line.startswith("corral: --tee")]
    assert len(said) == 1, out.stderr
    folder = Path(said[0].split(" under ", 1)[1].split(" (", 1)[0])
    try:
        assert messages(out.stdout.splitlines(), "agent-0.worker-0") == ["out 0"]
        [run_folder] = list(folder.iterdir())
        assert "err 0" in (run_folder / "run.agent-0.worker-0.log").read_text()
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=True)
