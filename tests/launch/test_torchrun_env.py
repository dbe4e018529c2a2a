"""A drop-in for torchrun: the workers' environment, the error file, the flags, forwarding.

The comparison with torchrun is real: one probe script runs under ``torchrun
--nproc-per-node 2`` (``python -m torch.distributed.run``, torchrun's own entry
point) and under ``corral run -n 2``, and the two sets of variables they add
to the launching shell's environment are compared, with the rank-derived
values.  The differences corral keeps on purpose are the ones
docs/howto/switching.rst lists (:data:`DELIBERATE`).  Forwarding is tested
over the two sshd hosts and under Slurm (``tests/_hosts.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.helpers.commands import corral_argv
from tests.helpers.loops import OTHER_LOOP, one_loop
from tests.helpers.processes import TAG_VAR, ListHandler
from tests.programs import path, program

import corral
from corral._cli._main import main
from corral._cli._torchrun import TORCHRUN_FLAGS
from corral._sys import _childenv

# One loop (tests/helpers/loops.py): what workers find in their environment, and what their
# error files say, is the same whatever the launcher's loop.
anyio_backend = one_loop()

if TYPE_CHECKING:
    from tests.helpers import hosts as _hosts

pytest_plugins = ["tests.helpers.hosts"]

PY = sys.executable
#: The probe (``tests/programs/env_probe.py``): each worker writes down its environment.
PROBE = str(path("env_probe"))

#: What a worker's environment has that the launching shell's has not (or has otherwise),
#: and that both torchrun and corral set.
TORCHRUN_VARIABLES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
}
#: The same value under both, rank by rank.
SAME_VALUE = TORCHRUN_VARIABLES - {
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
}
#: The differences docs/howto/switching.rst lists: variable -> (torchrun's, corral's).
DELIBERATE = {
    "TORCHELASTIC_USE_AGENT_STORE": ("True", "False"),
    "MASTER_ADDR": ("localhost", "127.0.0.1"),
}
#: Set by torchrun in its own environment (its --signals-to-handle), which workers inherit.
TORCHRUN_ONLY = {"TORCHELASTIC_SIGNALS_TO_HANDLE"}
#: corral's answer to torchrun's ``python -u``: its start-up hook first on ``PYTHONPATH``
#: (prompt lines, block-buffered; for every child that names no ``PYTHONUNBUFFERED``).
CORRAL_ONLY = {"PYTHONPATH"}

#: What a torchrun user's shell does not have (a launcher nested in a launcher would).
NOT_IN_THE_SHELL = (
    "OMP_NUM_THREADS",
    "TORCHELASTIC_",
    "TORCH_NCCL_",
    "ROLE_",
    "PET_",
    "PYTHONUNBUFFERED",
)


def shell_env(tag: str, **more: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(NOT_IN_THE_SHELL) and k not in ("NO_COLOR", "LOGLEVEL")
    }
    env[TAG_VAR] = tag
    return env | more


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 100
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def added(env: dict[str, str], shell: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` the shell has not, or has with another value."""
    return {k: v for k, v in env.items() if shell.get(k) != v}


def probe_both(tmp_path: Path, tag: str, **more: str) -> tuple[Any, Any, str, dict[str, str]]:
    """The probe's environment under torchrun and under corral run, rank by rank."""
    shell = shell_env(tag, PROBE_OUT=str(tmp_path), **more)
    torchrun = run(
        [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", PROBE, "torchrun"],
        tmp_path,
        shell,
    )
    assert torchrun.returncode == 0, torchrun.stderr
    # The same words: torchrun's script is corral run's command.
    ours = run(corral_argv("run", "-n", "2", PROBE, "corral"), tmp_path, shell)
    assert ours.returncode == 0, ours.stderr

    def load(who: str) -> list[dict[str, str]]:
        return [json.loads((tmp_path / f"{who}-{rank}.json").read_text()) for rank in (0, 1)]

    # Each worker leads a session of its own under both (what the CPU scheduler's
    # autogroups share fairly on a busy machine: bench/omp.py).
    for who in ("torchrun", "corral"):
        for rank in (0, 1):
            assert (tmp_path / f"{who}-{rank}.json.session").read_text() == "True", who
    return load("torchrun"), load("corral"), ours.stderr, shell


# -- 1. the worker environment ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_worker_environment_is_torchruns(tmp_path: Path, tag: str) -> None:
    theirs, ours, stderr, shell = probe_both(tmp_path, tag)
    for rank in (0, 1):
        t, c = added(theirs[rank], shell), added(ours[rank], shell)
        ours_only = {k for k in c if not k.startswith("CORRAL_")} - set(t)
        theirs_only = set(t) - set(c)
        assert ours_only == CORRAL_ONLY, ours_only
        assert c["PYTHONPATH"].split(os.pathsep)[0] == _childenv.HOOK_DIR
        assert theirs_only == TORCHRUN_ONLY, theirs_only
        assert set(t) - TORCHRUN_ONLY == TORCHRUN_VARIABLES
        for name in SAME_VALUE:
            assert c[name] == t[name], (name, c[name], t[name])
        assert c["RANK"] == str(rank) and c["OMP_NUM_THREADS"] == "1"
        for name, (their_value, our_value) in DELIBERATE.items():
            assert (t[name], c[name]) == (their_value, our_value), name
        # Each worker its own error file, as torchrun's <dir>/<local rank>/error.json.
        assert c["TORCHELASTIC_ERROR_FILE"].endswith(f"/{rank}/error.json")
        assert t["TORCHELASTIC_ERROR_FILE"].endswith(f"/{rank}/error.json")
    for env in (theirs, ours):
        # One store, one run id for every rank: a free port and a uuid4.
        assert env[0]["MASTER_PORT"] == env[1]["MASTER_PORT"]
        assert 0 < int(env[0]["MASTER_PORT"]) < 65536
        assert env[0]["TORCHELASTIC_RUN_ID"] == env[1]["TORCHELASTIC_RUN_ID"]
        assert uuid.UUID(env[0]["TORCHELASTIC_RUN_ID"]).version == 4
        assert env[0]["TORCHELASTIC_ERROR_FILE"] != env[1]["TORCHELASTIC_ERROR_FILE"]
    # torchrun says so in a block of 4 lines; corral in one.
    notices = [line for line in stderr.splitlines() if "OMP_NUM_THREADS" in line]
    assert notices == [
        "corral: setting OMP_NUM_THREADS=1 for each worker, as torchrun does, to avoid "
        "overloading the machine; set OMP_NUM_THREADS yourself to tune it"
    ], stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["4", ""])
def test_omp_num_threads_of_the_user_is_kept_without_a_notice(
    tmp_path: Path, tag: str, value: str
) -> None:
    """torchrun's test is "is the name present": an empty value is the user's too."""
    shell = shell_env(tag, PROBE_OUT=str(tmp_path), OMP_NUM_THREADS=value)
    out = run(corral_argv("run", "-n", "2", "--", PY, PROBE, "c"), tmp_path, shell)
    assert out.returncode == 0, out.stderr
    assert "OMP_NUM_THREADS" not in out.stderr
    for rank in (0, 1):
        env = json.loads((tmp_path / f"c-{rank}.json").read_text())
        assert env["OMP_NUM_THREADS"] == value


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_one_worker_gets_no_omp_num_threads(tmp_path: Path, tag: str) -> None:
    """As torchrun: with one worker per host nothing is overloaded, nothing is set."""
    shell = shell_env(tag, PROBE_OUT=str(tmp_path))
    out = run(corral_argv("run", "--", PY, PROBE, "c"), tmp_path, shell)
    assert out.returncode == 0, out.stderr
    assert "OMP_NUM_THREADS" not in json.loads((tmp_path / "c-0.json").read_text())
    assert "OMP_NUM_THREADS" not in out.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_record_error_reaches_the_failure_message(tmp_path: Path, tag: str) -> None:
    """torch's @record writes TORCHELASTIC_ERROR_FILE; corral's last line quotes it."""
    pytest.importorskip("torch")
    out = run(corral_argv("run", "-n", "2", str(path("torch_record"))), tmp_path, shell_env(tag))
    assert out.returncode == 1, out.stderr
    last = [line for line in (out.stdout + out.stderr).splitlines() if "rank 1 on host" in line]
    assert last and "exited with code 1: MyErr: boom from rank 1 x=42" in last[-1], out


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_error_file_reaches_worker_failed(tmp_path: Path, tag: str) -> None:
    """What @record writes (torch's JSON, written here by hand) becomes WorkerFailed's."""
    async with corral.open_runner(name="ef", console=False) as r:
        with pytest.raises(corral.WorkerFailed) as caught:
            await r.launch_command(
                program("error_file_writer", 3), workers_per_host=2, extra_env={TAG_VAR: tag}
            )
    failed = caught.value
    assert failed.rank == 1 and failed.returncode == 1
    assert str(failed).startswith(
        "worker rank 1 on host localhost (local rank 1) exited with code 1: MyErr: boom xxx"
    ), str(failed)
    assert failed.exc_type == "MyErr"
    assert failed.remote_traceback.endswith("line 3, in main\nMyErr: boom\n")


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_error_file_larger_than_its_bound_is_named_not_read(tmp_path: Path, tag: str) -> None:
    """docs/howto/limits.rst: corral reads at most 256 KiB of a worker's error file."""
    from corral._launch._torchenv import MAX_ERROR_FILE

    async with corral.open_runner(name="ef", console=False) as r:
        with pytest.raises(corral.WorkerFailed) as caught:
            await r.launch_command(
                program("error_file_writer", MAX_ERROR_FILE),
                workers_per_host=2,
                extra_env={TAG_VAR: tag},
            )
    assert "exited with code 1: (its error file is larger than 256 KiB: not read)" in str(
        caught.value
    )
    assert caught.value.remote_traceback == ""


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_error_files_are_in_a_private_folder_removed_after_the_launch(tag: str) -> None:
    script = "import os; print('file', os.environ['TORCHELASTIC_ERROR_FILE'])"
    logs = ListHandler()
    async with corral.open_runner(name="ef", console=False, handlers=[logs]) as r:
        await r.launch_command([PY, "-c", script], workers_per_host=2, extra_env={TAG_VAR: tag})
    paths = [m[5:] for m in logs.messages() if m.startswith("file ")]
    assert len(paths) == 2, logs.messages()
    folders = {Path(p).parent.parent for p in paths}
    assert len(folders) == 1 and folders.pop().name.startswith("corral-errors-"), paths
    assert not any(Path(p).parent.parent.exists() for p in paths), paths


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_restart_count_and_run_id_across_restarts(tmp_path: Path, tag: str) -> None:
    """``--max-restarts 1`` alone restarts; the workers see the count and one run id."""
    # Rank 1 fails once rank 0 has said its line (a failure stops the other rank at once).
    mark = tmp_path / "said"
    script = (
        'echo "env $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS '
        '$TORCHELASTIC_RUN_ID"; '
        f"touch {mark}-$TORCHELASTIC_RESTART_COUNT-$RANK; "
        'if [ "$RANK" = 1 ]; then '
        f"while [ ! -e {mark}-$TORCHELASTIC_RESTART_COUNT-0 ]; do sleep 0.01; done; exit 3; "
        "fi; exec sleep 1000"
    )
    out = run(
        corral_argv(
            "run", "-n", "2", "--no-prefix", "--max-restarts", "1", "--", "sh", "-c", script
        ),
        tmp_path,
        shell_env(tag, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 3, out.stderr
    seen = [line.split() for line in out.stdout.splitlines() if line.startswith("env ")]
    assert sorted(s[1:3] for s in seen) == [["0", "1"], ["0", "1"], ["1", "1"], ["1", "1"]], seen
    assert len({s[3] for s in seen}) == 1, seen


# -- 3. torchrun's words ---------------------------------------------------------------------


def usage(capfd: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``corral args`` in this process (it fails before anything starts): code, stderr."""
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    code = exited.value.code
    return int(code) if isinstance(code, int) else 1, capfd.readouterr().err


@pytest.mark.parametrize(
    "flag",
    sorted(TORCHRUN_FLAGS)
    + sorted("--" + f[2:].replace("-", "_") for f in TORCHRUN_FLAGS if "-" in f[2:]),
)
def test_a_torchrun_flag_corral_lacks_names_its_equivalent(
    capfd: pytest.CaptureFixture[str], flag: str
) -> None:
    code, err = usage(capfd, "run", flag, "2", "--", "true")
    assert code == 2
    canonical = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
    assert err == (
        f"corral run: error: {flag} is a torchrun option that corral run does not have; "
        f"{TORCHRUN_FLAGS[canonical]} (see corral run --help)\n"
    )


def test_a_torchrun_flag_with_equals_is_named_alone(capfd: pytest.CaptureFixture[str]) -> None:
    code, err = usage(capfd, "run", "--rdzv_conf=join_timeout=900", "--", "true")
    assert code == 2
    assert err.startswith("corral run: error: --rdzv_conf is a torchrun option"), err
    assert err.count("\n") == 1


def test_an_unknown_flag_is_still_clicks_error(capfd: pytest.CaptureFixture[str]) -> None:
    code, err = usage(capfd, "run", "--no-such-flag", "--", "true")
    assert code == 2
    assert "No such option '--no-such-flag'" in err and err.count("\n") == 1


def test_max_restarts_with_restart_never_is_a_usage_error(
    capfd: pytest.CaptureFixture[str],
) -> None:
    code, err = usage(capfd, "run", "--restart", "never", "--max-restarts", "2", "--", "true")
    assert code == 2
    assert err == (
        "corral run: error: --max-restarts restarts on failure: it cannot go with "
        "--restart never (see corral run --help)\n"
    )


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args",
    [
        ["--nproc-per-node", "3"],
        ["--nproc_per_node", "3"],
        ["--nproc_per_node=3"],
        ["-n", "3", "--standalone"],
    ],
    ids=["hyphen", "underscore", "equals", "standalone"],
)
def test_torchruns_spellings_of_n(tmp_path: Path, tag: str, args: list[str]) -> None:
    out = run(
        corral_argv("run", "--no-prefix", *args, "--", "sh", "-c", "echo $LOCAL_WORLD_SIZE"),
        tmp_path,
        shell_env(tag, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["3"] * 3


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("word", ["auto", "cpu"])
def test_n_auto_is_the_cpus_this_process_may_use(tmp_path: Path, tag: str, word: str) -> None:
    """As torch counts them (os.sched_getaffinity): taskset narrows them, here to one."""
    taskset = shutil.which("taskset")
    script = ["sh", "-c", "echo $LOCAL_WORLD_SIZE"]
    env = shell_env(tag, OMP_NUM_THREADS="1")
    out = run(corral_argv("run", "--no-prefix", "-n", word, "--", *script), tmp_path, env)
    assert out.returncode == 0, out.stderr
    cpus = len(os.sched_getaffinity(0))
    assert out.stdout.splitlines() == [str(cpus)] * cpus
    if taskset is None:
        pytest.skip("taskset is not installed: the narrowed case is not checked")
    cpu = str(min(os.sched_getaffinity(0)))
    argv = [taskset, "-c", cpu, *corral_argv("run", "--no-prefix", "-n", word, "--", *script)]
    out = run(argv, tmp_path, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["1"]


def test_n_gpu_without_a_gpu_is_a_usage_error(capfd: pytest.CaptureFixture[str]) -> None:
    if os.path.isdir("/proc/driver/nvidia/gpus"):
        pytest.skip("this machine has an NVIDIA driver")
    code, err = usage(capfd, "run", "-n", "gpu", "--", "true")
    assert code == 2
    assert "gpu: no CUDA device is visible here" in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_log_dir_underscore_spelling(tmp_path: Path, tag: str) -> None:
    out = run(
        corral_argv("run", "--log_dir", str(tmp_path / "logs"), "--", "echo", "hi"),
        tmp_path,
        shell_env(tag),
    )
    assert out.returncode == 0, out.stderr
    files = [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]
    assert any("hi" in p.read_text() for p in files), files


# -- 2. the launcher's environment reaches every host ---------------------------------------


#: The lines a worker prints: what it sees of the variables under test.
SHOW = (
    'echo "seen $RANK ${DATASET_SIZE-unset} ${GLOO_SOCKET_IFNAME-unset} ${FROM_FLAG-unset} '
    '${FROM_FILE-unset} ${SSH_CORRALTEST-unset} ${XDG_CORRALTEST-unset}"'
)


def seen(stdout: str) -> dict[int, list[str]]:
    return {
        int(parts[1]): parts[2:]
        for parts in (line.split() for line in stdout.splitlines())
        if parts and parts[0] == "seen"
    }


def forwarding_env(tag: str) -> dict[str, str]:
    return shell_env(
        tag,
        OMP_NUM_THREADS="1",
        DATASET_SIZE="256",
        GLOO_SOCKET_IFNAME="lo",
        SSH_CORRALTEST="host-specific",
        XDG_CORRALTEST="host-specific",
    )


def ssh_args(hosts: _hosts.SshHosts) -> list[str]:
    args = ["--ssh-user", hosts.user, "--ssh-identity", str(hosts.identity_file)]
    return args + [f"--ssh-option={option}" for option in hosts.ssh_options]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_env_flags_locally(tmp_path: Path, tag: str) -> None:
    (tmp_path / "vars.env").write_text("FROM_FILE=file\nFROM_FLAG=file-loses\n")
    out = run(
        corral_argv(
            "run",
            "-n",
            "2",
            "--no-prefix",
            "--env-file",
            "vars.env",
            "--env",
            "FROM_FLAG=flag",
            "--env",
            "DATASET_SIZE",
            "--env",
            "NOT_SET_ANYWHERE",
            "--",
            "sh",
            "-c",
            SHOW + "; echo ${NOT_SET_ANYWHERE-unset}",
        ),
        tmp_path,
        forwarding_env(tag),
    )
    assert out.returncode == 0, out.stderr
    got = seen(out.stdout)
    # Locally, workers inherit everything (host-specific names included: it is this host).
    expected = ["256", "lo", "flag", "file", "host-specific", "host-specific"]
    assert got == {0: expected, 1: expected}, out.stdout
    assert out.stdout.splitlines().count("unset") == 2


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"A=" + b"x" * (1024 * 1024), "vars.env is larger than 1024 KiB"),
        (b"A=\xe9\n", "vars.env, line 1: not UTF-8 text (byte 0xe9)"),
        (None, "cannot read vars.env: No such file or directory"),
    ],
    ids=["over-1-MiB", "not-utf8", "missing"],
)
def test_a_bad_env_file_is_one_line_and_starts_nothing(
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    content: bytes | None,
    says: str,
) -> None:
    """docs/howto/limits.rst: an --env-file is read as corral up reads .env, within 1 MiB."""
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / "vars.env").write_bytes(content)
    code, err = usage(capfd, "run", "--env-file", "vars.env", "--", "touch", "started")
    assert (code, err) == (2, f"corral: error: {says}\n")
    assert not (tmp_path / "started").exists()


def test_env_flag_needs_a_name(capfd: pytest.CaptureFixture[str]) -> None:
    code, err = usage(capfd, "run", "--env", "=value", "--", "true")
    assert code == 2
    assert "is not NAME or NAME=VALUE" in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_launching_shells_environment_reaches_every_ssh_host(
    ssh_hosts: _hosts.SshHosts, tmp_path: Path, tag: str
) -> None:
    """What the shell exports reaches every rank on both hosts; host-specific names do not."""
    a, b = ssh_hosts.addresses
    (tmp_path / "vars.env").write_text("FROM_FILE=file\n")
    out = run(
        corral_argv(
            "run",
            "-n",
            "2",
            "--no-prefix",
            "--hosts",
            f"{a},{b}",
            *ssh_args(ssh_hosts),
            "--env",
            "FROM_FLAG=flag",
            "--env-file",
            "vars.env",
            "--",
            "sh",
            "-c",
            SHOW + '; echo "home $RANK $HOME"',
        ),
        tmp_path,
        forwarding_env(tag) | {"HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    expected = ["256", "lo", "flag", "file", "unset", "unset"]
    assert seen(out.stdout) == dict.fromkeys(range(4), expected), out.stdout
    homes = [line.split()[2] for line in out.stdout.splitlines() if line.startswith("home ")]
    assert len(homes) == 4 and str(tmp_path) not in homes, homes  # each host's own HOME


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(90)
@OTHER_LOOP
async def test_library_forwarding_over_ssh(
    ssh_hosts: _hosts.SshHosts, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """forward_env="all" (the default), globs, copy_env over HOST_ENV_NAMES, extra_env."""
    monkeypatch.setenv("DATASET_SIZE", "256")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("SSH_CORRALTEST", "host-specific")
    monkeypatch.setenv("XDG_CORRALTEST", "host-specific")
    script = [PY, "-c", "import json, os; print('env', json.dumps(dict(os.environ)))"]
    ssh = corral.SSH(
        user=ssh_hosts.user, identity_file=ssh_hosts.identity_file, options=ssh_hosts.ssh_options
    )

    async def envs(**options: Any) -> list[dict[str, str]]:
        logs = ListHandler()
        async with corral.open_runner(name="fw", console=False, handlers=[logs]) as r:
            await r.launch_command(
                script, hosts=ssh_hosts.addresses, ssh=ssh, extra_env={TAG_VAR: tag}, **options
            )
        found = [m[4:] for m in logs.messages() if m.startswith("env ")]
        assert len(found) == 2, logs.messages()
        return [json.loads(line) for line in found]

    for env in await envs():
        assert env["DATASET_SIZE"] == "256" and env["GLOO_SOCKET_IFNAME"] == "lo"
        assert "SSH_CORRALTEST" not in env and "XDG_CORRALTEST" not in env
    for env in await envs(forward_env=["GLOO_*", "PATH"], copy_env=["SSH_CORRAL*"]):
        assert "DATASET_SIZE" not in env and env["GLOO_SOCKET_IFNAME"] == "lo"
        assert env["SSH_CORRALTEST"] == "host-specific" and "XDG_CORRALTEST" not in env
    # The default patterns forward Gloo's settings as they do NCCL's.
    for env in await envs(forward_env=corral.DEFAULT_ENV_PATTERNS):
        assert "DATASET_SIZE" not in env and env["GLOO_SOCKET_IFNAME"] == "lo"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_launching_shells_environment_reaches_every_slurm_rank(
    slurm_cluster: _hosts.SlurmCluster, tmp_path: Path, tag: str
) -> None:
    """Under Slurm too, while each rank keeps its own node's SLURM_* variables."""
    env = {**slurm_cluster.environ(), **forwarding_env(tag)}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")} | dict(slurm_cluster.env)
    argv = slurm_cluster.salloc_argv(
        *corral_argv(
            "run",
            "--hosts",
            "slurm",
            "-n",
            "2",
            "--no-prefix",
            "--env",
            "FROM_FLAG=flag",
            "--",
            "sh",
            "-c",
            SHOW + '; echo "node $RANK $SLURMD_NODENAME"',
        ),
        ntasks_per_node=2,
    )
    out = run(argv, tmp_path, env)
    assert out.returncode == 0, out.stderr
    expected = ["256", "lo", "flag", "unset", "host-specific", "host-specific"]
    got = seen(out.stdout)
    assert sorted(got) == [0, 1, 2, 3], out.stdout
    for rank in range(4):
        # srun --export=ALL sends SSH_* and XDG_* as they are to its own tasks (the agents),
        # which pass them on: under Slurm, the agents' environment is srun's.
        assert got[rank] == expected, out.stdout
    words = [line.split() for line in out.stdout.splitlines()]
    nodes = {int(p[1]): p[2] for p in words if p and p[0] == "node"}
    assert nodes == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}, out.stdout


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_library_sets_omp_num_threads_with_one_warning(
    tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runner.launch_command as corral run: 1 with a warning of the runner's, or the user's."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    script = [PY, "-c", "import os; print('omp', os.environ.get('OMP_NUM_THREADS', 'unset'))"]
    for options, expected, warned in (
        ({"workers_per_host": 2}, "1", True),
        ({"workers_per_host": 2, "extra_env": {"OMP_NUM_THREADS": "3"}}, "3", False),
        ({"workers_per_host": 1}, "unset", False),
    ):
        logs = ListHandler()
        options["extra_env"] = {TAG_VAR: tag, **options.get("extra_env", {})}
        async with corral.open_runner(name="omp", console=False, handlers=[logs]) as r:
            await r.launch_command(script, **options)
        said = [m for m in logs.messages("omp") if m.startswith("setting OMP_NUM_THREADS")]
        assert said == (
            [
                "setting OMP_NUM_THREADS=1 for each worker, as torchrun does, to avoid "
                "overloading the machine; set OMP_NUM_THREADS yourself to tune it"
            ]
            if warned
            else []
        ), logs.messages()
        seen = [m for m in logs.messages() if m.startswith("omp ")]
        assert seen == [f"omp {expected}"] * options["workers_per_host"], seen


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_error_file_on_a_remote_host_reaches_worker_failed(
    ssh_hosts: _hosts.SshHosts, tmp_path: Path, tag: str
) -> None:
    """The agent reads its worker's error file there, and the link brings it home."""
    ssh = corral.SSH(
        user=ssh_hosts.user, identity_file=ssh_hosts.identity_file, options=ssh_hosts.ssh_options
    )
    async with corral.open_runner(name="ef", console=False) as r:
        with pytest.raises(corral.WorkerFailed) as caught:
            await r.launch_command(
                program("error_file_writer", 3),
                hosts=ssh_hosts.addresses[1:],
                workers_per_host=2,
                ssh=ssh,
                extra_env={TAG_VAR: tag},
            )
    failed = caught.value
    assert failed.rank == 1 and failed.host == ssh_hosts.addresses[1]
    assert "exited with code 1: MyErr: boom xxx" in str(failed), str(failed)
    assert failed.exc_type == "MyErr"
    assert failed.remote_traceback.endswith("line 3, in main\nMyErr: boom\n")


@pytest.mark.anyio
async def test_library_master_addr_and_port(tmp_path: Path, tag: str) -> None:
    """``master_addr=``/``master_port=`` (``corral run --master-addr/--master-port``)."""
    async with corral.open_runner(console=False) as r:
        with pytest.raises(ValueError, match="master_port must be a TCP port, 1 to 65535, not 0"):
            await r.launch_command(["true"], master_port=0)
        with pytest.raises(ValueError, match=r"master_addr: .* is not a host name"):
            await r.launch_command(["true"], master_addr="")
        assert r.processes == ()
        await r.launch_command(
            sh('echo "$MASTER_ADDR:$MASTER_PORT" > "$OUT/$RANK"'),
            workers_per_host=2,
            master_addr="localhost",
            master_port=29777,
            extra_env={TAG_VAR: tag, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"},
        )
    seen = [(tmp_path / str(rank)).read_text().strip() for rank in (0, 1)]
    assert seen == ["localhost:29777"] * 2
