"""The real-host fixtures of ``_hosts`` work, and the facts a multi-host launcher builds on hold.

These tests start real daemons (two sshd in network namespaces; munged, slurmctld and two
slurmd) and run the real ``ssh``, ``salloc`` and ``srun`` against them.  Besides proving the
fixtures, they pin down behaviour that a launcher must design around: a remote command survives
the death of its local ``ssh``; an agent on a host can dial back only to the host's
``launcher_address``; SIGTERM to ``srun`` SIGKILLs its tasks, while ``scancel --signal`` and a
SIGUSR1 to srun reach them as they are.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from tests.helpers.processes import TAG_VAR, is_alive, tagged_pids, wait_gone
from tests.programs import program

if TYPE_CHECKING:
    # Only for the annotations: imported here at run time, before pytest loads it as the plugin
    # below, the module would miss pytest's assertion rewriting (and pytest would warn).
    from tests.helpers import hosts as _hosts

pytest_plugins = ["tests.helpers.hosts"]

PY = sys.executable  # the same interpreter is there on every host: the filesystem is shared


def run(
    argv: list[str], env: Mapping[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run a client command to the end, its output captured as text."""
    return subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


# ------------------------------------------------------------------------------------------
# SSH hosts
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_ssh_command_runs_inside_the_hosts_namespace(ssh_hosts: _hosts.SshHosts) -> None:
    """Over ssh, a command runs as root in the host's namespace, seeing its address only."""
    assert len(ssh_hosts.hosts) == 2
    assert len(set(ssh_hosts.addresses)) == 2
    for host in ssh_hosts.hosts:
        done = run(ssh_hosts.ssh_argv(host, *program("where_am_i")))
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)

        assert seen["uid"] == 0
        assert seen["netns"] == os.stat(f"/run/netns/{host.name}").st_ino
        assert seen["netns"] != os.stat("/proc/self/ns/net").st_ino
        assert f"inet {host.address}/24" in seen["addresses"]
        assert "inet 127.0.0.1/8" in seen["addresses"], "loopback is up inside"
        for other in ssh_hosts.hosts:
            if other != host:
                assert other.address not in seen["addresses"]
        # SSH_CONNECTION is "client-address client-port server-address server-port".
        client, _, server, port = seen["ssh_connection"]
        assert (client, server, port) == (host.launcher_address, host.address, "22")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_ssh_argv_keeps_the_remote_argv_intact(ssh_hosts: _hosts.SshHosts) -> None:
    """Words with spaces, quotes and shell syntax reach the remote program as they were."""
    words = ["two words", "it's", '"quoted"', "$HOME", "*", "a;b", ""]
    script = "import json, sys; print(json.dumps(sys.argv[1:]))"
    done = run(ssh_hosts.ssh_argv(ssh_hosts.addresses[0], PY, "-c", script, *words))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == words


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_host_reaches_its_launcher_address(ssh_hosts: _hosts.SshHosts) -> None:
    """A command on a host connects back to a listener on the host's ``launcher_address``."""
    dial = (
        "import socket, sys\n"
        "with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:\n"
        "    s.sendall(sys.argv[3].encode())\n"
    )
    for host in ssh_hosts.hosts:
        with socket.create_server((host.launcher_address, 0)) as listener:
            listener.settimeout(20)
            port = listener.getsockname()[1]
            token = f"hello from {host.name}"
            ssh = subprocess.Popen(
                ssh_hosts.ssh_argv(host, PY, "-c", dial, host.launcher_address, str(port), token),
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                conn, peer = listener.accept()
                with conn:
                    conn.settimeout(10)
                    received = b""
                    while chunk := conn.recv(1024):
                        received += chunk
            finally:
                _, err = ssh.communicate(timeout=20)
            assert ssh.returncode == 0, err
            assert received.decode() == token
            assert peer[0] == host.address


def _sshd_ancestor(pid: int) -> int:
    """The nearest ancestor of ``pid`` that is an sshd: the session that runs the command."""
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        with open(f"/proc/{ppid}/comm") as f:
            if f.read().strip() == "sshd":
                return ppid
        pid = ppid
    raise AssertionError("no sshd above the remote command")


@pytest.mark.timeout(60)
def test_killing_the_ssh_client_leaves_the_remote_command_running(
    ssh_hosts: _hosts.SshHosts,
) -> None:
    """The fact a launcher must design around: ssh without a tty does not stop what it started.

    Once the local client is killed, the server's session process notices the closed connection
    and exits, and the remote command runs on, orphaned.  (It would only notice when it next
    wrote to its stdout, or if it watched its connection or its launcher itself.)
    """
    host = ssh_hosts.hosts[1]
    sleeper = "import os, time; print(os.getpid(), flush=True); time.sleep(300)"
    ssh = subprocess.Popen(
        ssh_hosts.ssh_argv(host, PY, "-c", sleeper),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert ssh.stdout is not None
    remote_pid = int(ssh.stdout.readline())
    try:
        session = _sshd_ancestor(remote_pid)
        ssh.kill()
        ssh.wait(10)
        ssh.stdout.close()
        assert wait_gone([session], 10) == [], "the sshd session did not notice the client died"
        assert is_alive(remote_pid), "the remote command died with its ssh client"
    finally:
        ssh.kill()
        ssh.wait()
        try:
            os.kill(remote_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert wait_gone([remote_pid], 10) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_an_unreachable_host_fails_fast_with_ssh_s_message(ssh_hosts: _hosts.SshHosts) -> None:
    """ssh to an address no namespace has gives up after ConnectTimeout, saying why."""
    address = ssh_hosts.unreachable_address
    assert address not in ssh_hosts.addresses
    started = time.monotonic()
    done = run(ssh_hosts.ssh_argv(address, "true", options=["-o", "ConnectTimeout=2"]))
    elapsed = time.monotonic() - started
    assert done.returncode == 255
    assert f"ssh: connect to host {address} port 22: " in done.stderr
    assert "Connection timed out" in done.stderr or "No route to host" in done.stderr
    assert elapsed < 10


# ------------------------------------------------------------------------------------------
# Slurm
# ------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_srun_in_salloc_runs_one_task_per_node(slurm_cluster: _hosts.SlurmCluster) -> None:
    """``salloc -N2`` then ``srun`` starts one task on n1 and one on n2."""
    report = "import os; print(os.environ['SLURMD_NODENAME'], os.environ['SLURM_PROCID'])"
    argv = slurm_cluster.salloc_argv("srun", PY, "-c", report, nodes=2, ntasks_per_node=1)
    done = run(argv, env=slurm_cluster.environ())
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["n1 0", "n2 1"]


@pytest.mark.timeout(60)
def test_the_job_nodelist_expands_to_resolvable_nodes(slurm_cluster: _hosts.SlurmCluster) -> None:
    """Inside an allocation the node list is compressed; scontrol expands it; names resolve."""
    script = 'echo "$SLURM_JOB_NODELIST"; scontrol show hostnames "$SLURM_JOB_NODELIST"'
    done = run(slurm_cluster.salloc_argv("sh", "-c", script), env=slurm_cluster.environ())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["n[1-2]", "n1", "n2"]
    assert slurm_cluster.nodes == ("n1", "n2")
    for node in slurm_cluster.nodes:
        assert socket.gethostbyname(node) == "127.0.0.1"


def start_tasks(cluster: _hosts.SlurmCluster) -> tuple[subprocess.Popen[str], list[int], str]:
    """``srun`` of ``slurm_task.py`` on both nodes, once every task is up: srun, the task pids,
    the step id."""
    srun = subprocess.Popen(
        cluster.srun_argv(*program("slurm_task")),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster.environ(),
    )
    assert srun.stdout is not None
    ups = []
    for _ in cluster.nodes:
        line = srun.stdout.readline()
        if not line:
            srun.kill()
            _, err = srun.communicate()
            pytest.fail(f"srun ended before its tasks were up:\n{err}")
        ups.append(line.split())
    assert sorted(node for _, node, _, _ in ups) == ["n1", "n2"], ups
    pids = [int(pid) for _, _, pid, _ in ups]
    assert all(is_alive(pid) for pid in pids)
    return srun, pids, ups[0][3]


@pytest.mark.timeout(60)
def test_sigterm_to_srun_kills_its_tasks(slurm_cluster: _hosts.SlurmCluster) -> None:
    """One SIGTERM to ``srun`` ends every task on every node, and srun, at once.

    The tasks are SIGKILLed, not sent SIGTERM: their handler never runs, so they get no chance
    to clean up ("forcing job termination").  SIGHUP does the same, and so does SIGINT, right
    after passing the SIGINT on, when it ends srun (a second one within a second, or the first
    with ``--quit-on-interrupt``): whether a task's SIGINT handler gets to run is a race.
    """
    srun, pids, _ = start_tasks(slurm_cluster)
    try:
        srun.send_signal(signal.SIGTERM)
        out, err = srun.communicate(timeout=30)
        assert wait_gone(pids, 30) == [], f"tasks outlived srun; its stderr:\n{err}"
        assert out == "", "a task was sent SIGTERM rather than killed"
        assert srun.returncode == 128 + signal.SIGKILL, err
        assert "forcing job termination" in err
    finally:
        srun.kill()
        srun.wait()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["scancel --signal=TERM", "SIGUSR1 to srun"])
def test_a_signal_can_reach_the_tasks_without_killing_them(
    slurm_cluster: _hosts.SlurmCluster, how: str
) -> None:
    """The graceful ways: the tasks get the signal itself, and decide how to end.

    ``scancel --signal=TERM JOB.STEP`` sends SIGTERM to every task of the step and nothing
    more; ``srun`` passes SIGUSR1 (and SIGUSR2, SIGCONT...) on to its tasks as they are.  Tasks
    that exit 0 on it leave srun with status 0.
    """
    srun, pids, step = start_tasks(slurm_cluster)
    try:
        if how == "scancel --signal=TERM":
            cancel = run(["scancel", "--signal=TERM", step], env=slurm_cluster.environ())
            assert cancel.returncode == 0, cancel.stderr
            expected = "SIGTERM"
        else:
            srun.send_signal(signal.SIGUSR1)
            expected = "SIGUSR1"
        out, err = srun.communicate(timeout=30)
        assert sorted(out.splitlines()) == [f"got {expected} n1", f"got {expected} n2"], err
        assert srun.returncode == 0, err
        assert wait_gone(pids, 30) == []
    finally:
        srun.kill()
        srun.wait()


def test_ssh_is_asked_only_about_names_this_machine_cannot_resolve(tmp_path: Path) -> None:
    """``ssh -G`` once per unresolvable host, never for one the route lookup knows."""
    from corral._launch._hosts import dial_back_addresses
    from corral._scaleout import SSH

    # The real ssh client, with a configuration that notes each host it is asked about.
    calls = tmp_path / "calls"
    config = tmp_path / "ssh_config"
    config.write_text(f'Match exec "echo %n >> {calls}"\n  HostName 127.0.0.1\n')
    ssh = SSH(options=["-F", str(config)])
    assert anyio.run(dial_back_addresses, ["127.0.0.1", "localhost"], ssh) == ["127.0.0.1"] * 2
    assert not calls.exists()  # both resolved here: no ssh at all
    assert anyio.run(dial_back_addresses, ["corral-alias.invalid"], ssh) == ["127.0.0.1"]
    assert calls.read_text().split() == ["corral-alias.invalid"]


@pytest.mark.anyio
async def test_a_launch_cancelled_during_the_address_lookup_ends_at_once(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ssh -G`` (here one that never answers) and the name lookups are cancellable."""
    import corral

    hung = tmp_path / "ssh"
    hung.write_text('#!/bin/sh\necho started > "$0.started"\nexec sleep 1000\n')
    hung.chmod(0o755)
    monkeypatch.setenv(TAG_VAR, tag)  # the hung ssh -G inherits it
    async with corral.open_runner(console=False) as r:
        began = time.monotonic()
        with anyio.move_on_after(1.0) as scope:
            await r.launch(
                os.getpid, hosts=["corral-nowhere.invalid"], ssh=corral.SSH(executable=str(hung))
            )
        took = time.monotonic() - began
    assert scope.cancelled_caught
    assert (tmp_path / "ssh.started").exists()  # the lookup was under way
    assert took < 2.0, f"the cancelled launch took {took:.2f} s"
    assert tagged_pids(tag) == []  # ssh -G was killed, not left behind
