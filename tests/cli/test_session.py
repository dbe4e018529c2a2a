"""The test suite defends itself: a session started as ``nohup`` or ``&`` starts it, or one that
hangs and is ended by pytest-timeout, leaves nothing behind.

Each test runs a sub-session (``python -m pytest`` on a small generated test file, with the
project's ``conftest`` loaded as a plugin) under ``nohup sh -c '... & wait'``, which starts it
with SIGHUP, SIGINT and SIGQUIT ignored, as a script or a cron job would.  The sub-session uses
another ``CORRAL_TEST_SLOT`` than this one, so that its hosts, namespaces and ports are its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.processes import TAG_VAR, tagged_pids, wait_gone

TESTS = Path(__file__).resolve().parents[1]
SLOT = int(os.environ.get("CORRAL_TEST_SLOT", "0"))
#: The sub-session's slot: another one than ours.
INNER_SLOT = (SLOT + 5) % 10
#: The prefix of the sub-session's namespaces (tests/helpers/hosts.py): in a parallel session,
#: the sub-session of each worker inherits its worker's name and so has a sub-slot of its own.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
INNER_NETNS_PREFIX = f"corral{INNER_SLOT or ''}{'' if _WORKER == '0' else f'w{_WORKER}'}-h"

#: Runs ``"$@"`` as a script's background job: with SIGINT and SIGQUIT ignored (a
#: non-interactive shell does that for ``&``), and SIGHUP ignored by ``nohup``.
NOHUP = ["nohup", "sh", "-c", '"$@" & wait $!', "sh"]

#: What a process does with SIGINT, SIGHUP and SIGQUIT, in words: ``dispositions``.
DISPOSITIONS = """\
import signal
words = {signal.SIG_IGN: "ignored", signal.SIG_DFL: "default",
         signal.default_int_handler: "KeyboardInterrupt"}
dispositions = {
    name: words.get(signal.getsignal(getattr(signal, name)), "other")
    for name in ("SIGINT", "SIGHUP", "SIGQUIT")
}
"""

HANGING = (
    DISPOSITIONS
    + """
import json, os, subprocess, sys, threading

from tests.helpers import hosts as _hosts
from tests.helpers.processes import children_of

pytest_plugins = ["tests.helpers.hosts"]


def test_hang(ssh_hosts, slurm_cluster):
    host = ssh_hosts.hosts[0]
    report = {
        "signals": dispositions,
        "netns": [h.name for h in ssh_hosts.hosts],
        "dirs": [str(ssh_hosts.identity_file.parent), str(slurm_cluster.conf.parent)],
        "etc_hosts_mark": _hosts.ETC_HOSTS_MARK,
    }
    # A corral launcher and its workers, in a session of their own.
    launcher = subprocess.Popen(
        [sys.executable, "-m", "corral._cli", "run", "-n", "2", "--", "sh", "-c",
         "echo up; exec sleep 300"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    for _ in range(2):
        assert launcher.stdout.readline().endswith("| up\\n")
    # A command on an ssh host (it outlives its ssh client), and two tasks of a Slurm job.
    remote = subprocess.Popen(
        ssh_hosts.ssh_argv(host, "sh", "-c", "echo $$; exec sleep 300"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )
    srun = subprocess.Popen(
        slurm_cluster.srun_argv("sh", "-c", "echo $$; exec sleep 300"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=slurm_cluster.environ(),
    )
    report["remote"] = [int(remote.stdout.readline()), int(srun.stdout.readline()),
                        int(srun.stdout.readline())]
    report["children"] = children_of(os.getpid())  # the daemons, ssh, srun, the session's reaper
    with open(os.environ["HANG_REPORT"], "w") as f:
        json.dump(report, f)
    threading.Event().wait()  # hang: pytest-timeout ends the session with os._exit
"""
)


def nohup_run(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [*NOHUP, *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv} (or what it left holding its output) ran past {timeout} s: {exc}")


def inner_environ(tag: str, **more: str) -> dict[str, str]:
    """The sub-session's environment: its own slot, our tag, the tests' helpers importable."""
    path = os.pathsep.join(
        [str(TESTS), str(TESTS.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return os.environ | {
        "CORRAL_TEST_SLOT": str(INNER_SLOT),
        TAG_VAR: tag,
        "PYTHONPATH": path,
        **more,
    }


def test_nohup_and_a_background_job_start_with_signals_ignored(tmp_path: Path, tag: str) -> None:
    """What the sub-sessions below are started with (so what the conftest has to undo)."""
    script = DISPOSITIONS + "print(sorted(dispositions.items()))"
    env = inner_environ(tag)
    out = nohup_run([sys.executable, "-c", script], cwd=tmp_path, env=env, timeout=30)
    assert out.stdout == "[('SIGHUP', 'ignored'), ('SIGINT', 'ignored'), ('SIGQUIT', 'ignored')]\n"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_hung_session_ended_by_pytest_timeout_leaves_nothing_behind(
    tmp_path: Path, tag: str
) -> None:
    """sshd, munged, slurmctld, slurmd, the namespaces, a launcher: all gone with the session.

    The sub-session is started with SIGINT and SIGHUP ignored, sets up both fixtures, starts a
    corral launcher, a command over ssh and a Slurm job, and hangs; pytest-timeout's ``thread``
    method ends it with ``os._exit``, so no teardown runs.
    """
    if os.geteuid() != 0:
        pytest.skip("the sub-session's fixtures need root")
    (tmp_path / "test_hang.py").write_text(HANGING)
    report_path = tmp_path / "report.json"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "conftest",
        "-p",
        "no:cacheprovider",
        "-s",
        "-q",
        "-o",
        "timeout=5",
        "-o",
        "timeout_method=thread",
        "-o",
        "timeout_func_only=true",
        "--rootdir",
        str(tmp_path),
        str(tmp_path / "test_hang.py"),
    ]
    env = inner_environ(tag, HANG_REPORT=str(report_path))
    try:
        # With -s, the session's reaper shares its stderr: run() returns once it is done.
        out = nohup_run(argv, cwd=tmp_path, env=env, timeout=60)
        said = out.stdout + out.stderr
        assert report_path.exists(), said
        report = json.loads(report_path.read_text())
        assert re.search(r"^\+{5,} Timeout \+{5,}$", said, re.MULTILINE), said
        assert out.returncode == 1, said  # pytest-timeout's os._exit(1)
        # The session had its signals back before any test ran.
        assert report["signals"] == {
            "SIGINT": "KeyboardInterrupt",
            "SIGHUP": "default",
            "SIGQUIT": "default",
        }
        # Two sshd, munged, slurmctld, two slurmd; the launcher, ssh and srun at least.
        assert len(report["children"]) >= 9, report
        pids = [*report["children"], *report["remote"]]
        assert wait_gone(pids, 15) == [], "still alive after the session ended"
        assert tagged_pids(tag) == []
        for name in report["netns"]:
            assert not Path("/run/netns", name).exists(), name
            assert not Path("/sys/class/net", f"{name}r").exists(), name
        for folder in report["dirs"]:
            assert not Path(folder).exists(), folder
        # A line of the sub-session's ends with its mark (another slot's mark may begin
        # with it: slot 0's is the others' without their " slot N").
        mark = report["etc_hosts_mark"]
        lines = Path("/etc/hosts").read_text().splitlines()
        assert not [line for line in lines if line.rstrip().endswith(mark)], lines
    finally:
        if tagged_pids(tag) or any(Path("/run/netns").glob(f"{INNER_NETNS_PREFIX}*")):
            clean_up_after(tmp_path, tag)


CLEAN_UP = """\
pytest_plugins = ["tests.helpers.hosts"]


def test_clean_up(ssh_hosts, slurm_cluster):
    pass  # setting up removes what a dead session left; the teardown, what this one made
"""


def clean_up_after(folder: Path, tag: str) -> None:
    """After a failure: a normal session of the same slot removes what the dead one left."""
    for pid in tagged_pids(tag):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    (folder / "test_clean_up.py").write_text(CLEAN_UP)
    argv = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q"]
    argv += ["--rootdir", str(folder), str(folder / "test_clean_up.py")]
    subprocess.run(argv, cwd=folder, env=inner_environ("none"), capture_output=True, timeout=60)
