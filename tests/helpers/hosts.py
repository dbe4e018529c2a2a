"""Real remote hosts for the tests: SSH hosts in network namespaces, and a Slurm cluster.

A launcher that starts processes on other machines has to be tested against the real parts it
talks to, not against mocks: a real ``ssh`` client and ``sshd`` server, a real ``salloc`` and
``srun``.  This module builds both on the one machine the tests run on, as two session-scoped
pytest fixtures that are only set up when a test first asks for them:

``ssh_hosts`` (:class:`SshHosts`)
    Two "hosts", each a Linux network namespace joined to the root namespace by its own veth
    pair and subnet, each running its own OpenSSH server inside the namespace.  A command run
    over ``ssh`` executes inside that namespace: it sees only the namespace's network, but the
    same filesystem, users and processes as the tests.  From inside, the only address outside
    the namespace that can be reached is the root side of its veth pair,
    :attr:`SshHost.launcher_address`: that is where a launcher must listen for agents that dial
    back.

``slurm_cluster`` (:class:`SlurmCluster`)
    A private ``munged``, ``slurmctld`` and two ``slurmd`` daemons that pose as the nodes ``n1``
    and ``n2`` (both really 127.0.0.1, named in ``/etc/hosts`` for the session), with its own
    configuration, state, spool and log directories.  Clients find it through the ``SLURM_CONF``
    variable in :meth:`SlurmCluster.environ`.

A test module uses them by loading this module as a plugin, which registers the fixtures once
for the whole session (importing the fixture functions into several modules instead would set
up one cluster per module)::

    from typing import TYPE_CHECKING

    if TYPE_CHECKING:
        from tests.helpers import hosts as _hosts

    pytest_plugins = ["tests.helpers.hosts"]

    def test_something(ssh_hosts: _hosts.SshHosts) -> None:
        subprocess.run(ssh_hosts.ssh_argv(ssh_hosts.addresses[0], "true"), check=True)

(The import is for annotations only: a module imported before pytest loads it as a plugin misses
assertion rewriting, and pytest warns.  Listing ``"tests.helpers.hosts"`` in ``pytest_plugins`` of
``tests/conftest.py`` instead would let every test module import it freely.)

Both fixtures need root (namespaces, daemons, ``/etc/hosts``); without it they skip, which the
project's conftest turns into a failure in CI.  With root, anything missing or misbehaving is a
loud failure that quotes the daemon's own output.  Readiness is always an event, a line the
daemon writes when it is ready, waited for with a deadline; teardown stops every daemon by its
pid, kills whatever the tests left running under it, and removes every namespace, link, file and
``/etc/hosts`` line it added.  Every one of those steps is also registered with the session's
reaper (``tests/helpers/reaper.py``, a watchdog process), which does it if the session ends
without its teardown: killed, or ended by pytest-timeout's ``os._exit``.  Each setup also first
removes what a crashed earlier session may have left with the same names, once that session's
reaper is done.

The Debian packages these fixtures need are listed in ``.ci/apt-packages.txt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO

import pytest
from tests.helpers import reaper as _reaper

__all__ = ["SlurmCluster", "SshHost", "SshHosts", "slurm_cluster", "ssh_hosts", "start_ssh_hosts"]

#: How long a daemon may take to say it is ready, and to exit once told to stop.
DAEMON_DEADLINE = 10.0

#: Options every ``ssh`` from the tests uses, after ``-i KEY`` (see :attr:`SshHosts.ssh_options`).
#: ``-F /dev/null`` keeps the machine's and the user's ssh configuration out of the tests.
SSH_OPTIONS = (
    "-F",
    "/dev/null",
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    # The code under test on the remote side too (its agents), when PYTHONPATH points at a
    # checkout other than the installed one: on real hosts it is installed alike.
    "-o",
    "SendEnv=PYTHONPATH",
)

# Names of the hosts' namespaces and links, and their subnets: host i (from 1) is the namespace
# ``corral-h<i>`` with address 10.213.<i>.2, reached through the link ``corral-h<i>r`` whose
# root-side address is 10.213.<i>.1.
#
# Several test sessions can have these fixtures up on one machine at once (several checkouts
# tested side by side) when each sets ``CORRAL_TEST_SLOT`` to its own digit: slot ``k`` shifts
# every fixed name, subnet and port below.  Slot 0, the default, uses the names as written.
#
# A session run in parallel (pytest-xdist, ``-n N``) is N sessions, its workers ``gw0``,
# ``gw1``...: each has the fixtures of its own, in a sub-slot of the session's slot.  Worker 0
# uses the slot's names as written; worker w > 0 adds ``w<w>`` to every name (``corral-h1``
# becomes ``corralw1-h1``), takes subnets from 10 * w on (10.213.<10 * w + i>.2) and ports from
# 10 * w on.  So a worker is a session of its own to everything here: its reaper, its private
# directories, its /etc/hosts line.
_SLOT = os.environ.get("CORRAL_TEST_SLOT", "0")
if not (len(_SLOT) == 1 and _SLOT.isdigit()):
    raise RuntimeError(f"CORRAL_TEST_SLOT must be one digit, not {_SLOT!r}")
SLOT = int(_SLOT)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
if not re.fullmatch(r"gw\d+", _WORKER):
    raise RuntimeError(f"PYTEST_XDIST_WORKER is not a pytest-xdist worker's name: {_WORKER!r}")
#: The pytest-xdist worker's sub-slot of :data:`SLOT` (0 outside xdist): its number, modulo 10
#: (a worker that replaces a crashed one gets the next number; the crashed one's reaper has
#: cleaned up, or is waited for, as for any dead session).
WORKER = int(_WORKER[2:]) % 10
_SLOT_TAG = ("" if SLOT == 0 else str(SLOT)) + ("" if WORKER == 0 else f"w{WORKER}")

SSH_HOST_COUNT = 2
NETNS_PREFIX = f"corral{_SLOT_TAG}-h"
SUBNET_PREFIX = f"10.{213 + SLOT}"
#: The third byte of the first host's subnet (host i's is this + i - 1).
FIRST_SUBNET = 1 + 10 * WORKER

# The Slurm cluster: its fake nodes, and fixed ports unlikely to be in use.  The node names are
# the same in every slot (they all resolve to 127.0.0.1); each slot has its own controller.
SLURM_NODES = ("n1", "n2")
SLURMCTLD_PORT = 16817 + 100 * SLOT + 10 * WORKER
SLURMD_FIRST_PORT = SLURMCTLD_PORT + 1
ETC_HOSTS = Path("/etc/hosts")
ETC_HOSTS_MARK = (
    f"# added by corral's tests (tests/helpers/hosts.py){_SLOT_TAG and f' slot {_SLOT_TAG}'}"
)

# Private directories are named <prefix><pid of the pytest process>-<random>, so that a later
# session can tell those of a crashed session (whose pid is gone) from those of a live one.
SSH_DIR_PREFIX = f"corral{_SLOT_TAG}-sshhosts-"
SLURM_DIR_PREFIX = f"corral{_SLOT_TAG}-slurm-"


# --------------------------------------------------------------------------------------------
# The hosts' public face
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SshHost:
    """One SSH host: a network namespace with an ``sshd`` listening on ``address`` port 22."""

    #: The network namespace's name (``ip netns exec NAME ...`` runs a command there directly).
    name: str
    #: The host's address, inside its namespace: the address to ``ssh`` to.
    address: str
    #: The root namespace's end of the host's veth pair: the one address outside the namespace
    #: that commands on the host can reach, so where a launcher listens for agents dialling back.
    launcher_address: str
    #: The pid of the host's ``sshd`` listener.
    sshd_pid: int

    def netns_argv(self, *cmd: str) -> list[str]:
        """An argv that runs ``cmd`` inside the host's namespace without going through ssh."""
        return ["ip", "netns", "exec", self.name, *cmd]

    @contextlib.contextmanager
    def cut(self, *, outgoing: bool = True, incoming: bool = True) -> Iterator[None]:
        """Pull the host's cable for the block: its packets vanish, silently, and nobody is told.

        Each direction is cut by a ``blackhole`` queueing discipline on the sending end of the
        host's veth pair, which drops every packet while telling the sender it went out: no
        reset, no ICMP error, no link-down event, the TCP connections stay "established" on both
        sides and just hear nothing, as when a cable is pulled or a switch dies.  ``outgoing``
        cuts what the host sends, ``incoming`` what it receives (one of them alone: a half-open
        link).  The link is restored when the block ends, however it ends.
        """
        try:
            if incoming:
                _run(["tc", "qdisc", "add", "dev", self.root_link, "root", "blackhole"])
            if outgoing:
                _run(["tc", "-n", self.name, "qdisc", "add", "dev", "eth0", "root", "blackhole"])
            yield
        finally:
            self.restore()

    @contextlib.contextmanager
    def throttle(self, rate: str) -> Iterator[None]:
        """Throttle what the host sends to ``rate`` (tc's words: ``"400mbit"``) in the block.

        A token bucket on the host's end of its veth pair: a slow link, every byte delivered.
        Restored when the block ends, however it ends.
        """
        try:
            bucket = ["tbf", "rate", rate, "burst", "64kb", "latency", "1s"]
            _run(["tc", "-n", self.name, "qdisc", "add", "dev", "eth0", "root", *bucket])
            yield
        finally:
            self.restore()

    def restore(self) -> None:
        """Undo any :meth:`cut` or :meth:`throttle` of the host's link (also one made from
        inside the host)."""
        for argv in (
            ["tc", "qdisc", "del", "dev", self.root_link, "root"],
            ["tc", "-n", self.name, "qdisc", "del", "dev", "eth0", "root"],
        ):
            # "No such file or directory" when that direction was not cut: nothing to undo.
            subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)

    @property
    def root_link(self) -> str:
        """The root namespace's end of the host's veth pair."""
        return f"{self.name}r"


@dataclasses.dataclass(frozen=True)
class SshHosts:
    """What the ``ssh_hosts`` fixture yields: the hosts and how to log in to them as root.

    A command given to :meth:`ssh_argv` runs on the remote side with its argv intact (it is
    quoted for the remote shell).  The remote side has the same filesystem but its own ``PATH``
    (sshd's default plus whatever root's shell startup files add, never an active virtualenv),
    so run Python there as ``sys.executable``, not as ``python3``.  Killing the local ``ssh``
    does not stop the remote command: it runs on until it notices by itself that its connection
    is gone.
    """

    hosts: tuple[SshHost, ...]
    #: The private key that logs in as root on every host.
    identity_file: Path
    #: An address in the first host's subnet that no namespace has: ssh to it cannot connect.
    unreachable_address: str
    #: How long setting the hosts up took, in seconds.
    setup_seconds: float
    user: str = "root"

    @property
    def addresses(self) -> list[str]:
        """The hosts' addresses, in order."""
        return [host.address for host in self.hosts]

    @property
    def ssh_options(self) -> list[str]:
        """The ``ssh`` options that log in without prompts, host-key checks or chatter."""
        return ["-i", str(self.identity_file), *SSH_OPTIONS]

    def host(self, address: str) -> SshHost:
        """The host with this address."""
        for host in self.hosts:
            if host.address == address:
                return host
        raise KeyError(address)

    def ssh_argv(self, host: str | SshHost, *cmd: str, options: Iterable[str] = ()) -> list[str]:
        """An argv that runs ``cmd`` (an argv itself, quoted for the remote shell) on ``host``.

        ``host`` is a :class:`SshHost` or any address (a bad one is fine: the argv is just
        built).  Extra ``options`` such as ``("-o", "ConnectTimeout=2")`` go first, because for
        ``ssh`` the first value given for an option is the one that counts.  With no ``cmd``
        there is no remote command, which ssh takes as a request for a login shell.
        """
        address = host.address if isinstance(host, SshHost) else host
        remote = [shlex.join(cmd)] if cmd else []
        return ["ssh", *options, *self.ssh_options, f"{self.user}@{address}", *remote]


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    """What the ``slurm_cluster`` fixture yields: a running cluster of the nodes ``n1`` and ``n2``.

    Each node is a ``slurmd`` of its own on this machine (``hostname`` inside a task prints this
    machine's name; ``SLURMD_NODENAME`` says which node the task is on).  Run Slurm's clients with
    ``env=cluster.environ()``; jobs inherit that environment, so ``srun`` inside ``salloc`` finds
    the cluster too.
    """

    #: The node names, resolvable to 127.0.0.1 while the fixture lives.
    nodes: tuple[str, ...]
    #: The cluster's configuration file.
    conf: Path
    #: The variables a Slurm client needs (``SLURM_CONF``).
    env: Mapping[str, str]
    #: Where the daemons' log files are (their output is also kept for failure messages).
    log_dir: Path
    #: How long setting the cluster up took, in seconds.
    setup_seconds: float

    def environ(self) -> dict[str, str]:
        """This process's environment, without stray ``SLURM_*`` variables, plus :attr:`env`."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return base | dict(self.env)

    def salloc_argv(
        self, *cmd: str, nodes: int = 2, ntasks_per_node: int = 1, options: Iterable[str] = ()
    ) -> list[str]:
        """An argv that runs ``cmd`` in the background of a new allocation of ``nodes`` nodes.

        ``cmd`` runs once, on this machine, with ``SLURM_JOB_NODELIST`` and the rest of the
        allocation's variables set; an ``srun`` inside it starts ``ntasks_per_node`` tasks on
        each node (salloc's default would be one task in all).  The allocation ends with ``cmd``.
        """
        return [
            "salloc",
            f"--nodes={nodes}",
            f"--ntasks-per-node={ntasks_per_node}",
            *options,
            *cmd,
        ]

    def srun_argv(
        self, *cmd: str, nodes: int = 2, ntasks_per_node: int = 1, options: Iterable[str] = ()
    ) -> list[str]:
        """An argv that runs ``cmd`` as ``ntasks_per_node`` tasks on each of ``nodes`` nodes.

        Outside an allocation ``srun`` makes one for itself and gives it up when the tasks end.
        """
        return [
            "srun",
            f"--nodes={nodes}",
            f"--ntasks-per-node={ntasks_per_node}",
            *options,
            *cmd,
        ]


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def ssh_hosts() -> Iterator[SshHosts]:
    """Two SSH hosts in network namespaces; see :class:`SshHosts`."""
    _require_root("ssh_hosts needs root, to make network namespaces and run sshd in them")
    with contextlib.ExitStack() as undo:
        yield start_ssh_hosts(undo)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A two-node Slurm cluster on this machine; see :class:`SlurmCluster`."""
    _require_root("slurm_cluster needs root, to run Slurm's daemons and name n1, n2 in /etc/hosts")
    with contextlib.ExitStack() as undo:
        yield _start_slurm_cluster(undo)


# --------------------------------------------------------------------------------------------
# Daemons: started in their own session, their output drained and searched, stopped by pid
# --------------------------------------------------------------------------------------------


class _Output:
    """A daemon's output, drained line by line by a thread, that callers can wait on.

    Draining keeps the daemon from blocking on a full pipe for as long as it runs; the lines are
    kept so that a failure can quote them.
    """

    def __init__(self, name: str, stream: IO[bytes]) -> None:
        self._lines: list[str] = []
        self._ended = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(
            target=self._drain, args=(stream,), name=f"{name} output", daemon=True
        )
        self._thread.start()

    def _drain(self, stream: IO[bytes]) -> None:
        with stream:
            for raw in stream:
                line = raw.decode(errors="replace").rstrip("\n")
                with self._changed:
                    self._lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, deadline: float) -> bool:
        """Whether a line matching ``pattern`` came before ``deadline`` and before the end."""
        regex = re.compile(pattern)
        seen = 0
        with self._changed:
            while True:
                if any(regex.search(line) for line in self._lines[seen:]):
                    return True
                seen = len(self._lines)
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    return False
                self._changed.wait(left)

    def text(self) -> str:
        with self._changed:
            return "\n".join(self._lines)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class _Daemon:
    """A daemon run in the foreground as our child, with its stdout and stderr as one stream."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.name = name
        # A session of its own: a Ctrl-C meant for pytest must not reach the daemon before the
        # fixture's teardown does.
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        assert self.proc.stdout is not None
        self.output = _Output(name, self.proc.stdout)
        # Killed by the session's reaper if the session ends without stopping it.
        try:
            self._reaper_key = _reaper.session().process(self.proc.pid)
        except BaseException:
            self.stop(gently=False)
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, pattern: str, deadline: float) -> None:
        """Return once the daemon has written a line matching ``pattern``; fail if it does not."""
        if self.output.wait_for(pattern, deadline):
            return
        code = self.proc.poll()
        state = "still running" if code is None else f"exited with status {code}"
        _fail(f"{self.name} did not write /{pattern}/ in time ({state})", self)

    def __enter__(self) -> _Daemon:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the daemon: gently after a good run, at once if setting up failed."""
        self.stop(gently=exc_type is None)

    def stop(self, *, gently: bool = True) -> None:
        """SIGTERM and wait for the exit, or SIGKILL if not ``gently`` or if SIGTERM is ignored.

        A daemon that ignores SIGTERM is an error, but not while another is being reported: a
        daemon stuck in a setup that failed (a slurmd waiting for a slurmctld that cannot
        answer, say) is expected to, and complaining would hide the real failure.
        """
        try:
            if self.proc.poll() is not None:
                return
            if not gently:
                self.proc.kill()
                self.proc.wait()
                return
            self.proc.terminate()
            try:
                self.proc.wait(DAEMON_DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"{self.name} (pid {self.pid}) ignored SIGTERM for {DAEMON_DEADLINE} s "
                    f"and was killed; its output:\n{self.output.text()}"
                ) from None
        finally:
            key = getattr(self, "_reaper_key", None)
            if key is not None and self.proc.returncode is not None:  # reaped: pid not its own
                _reaper.session().forget(key)
            # Anything the daemon started that still holds the pipe is killed by the caller's
            # later cleanup; do not hang here for it.
            self.output.join(1.0)


def _undo_later(
    undo: contextlib.ExitStack, key: int, step: Callable[..., object], *args: object
) -> None:
    """Run ``step(*args)`` in the teardown, which the reaper (``key``) does if there is none.

    Once the step has run, the session's reaper is told so, and will not do it again.
    """

    def run() -> None:
        step(*args)
        _reaper.session().forget(key)

    undo.callback(run)


def _fail(message: str, *daemons: _Daemon) -> None:
    """Fail the test that set a fixture up, quoting the daemons' output."""
    parts = [message]
    for daemon in daemons:
        parts.append(f"--- output of {daemon.name} (pid {daemon.pid}) ---\n{daemon.output.text()}")
    pytest.fail("\n".join(parts), pytrace=False)


def _require_root(reason: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(reason)


def _program(name: str) -> str:
    """The absolute path of a program (sshd insists on one), searching the sbin dirs too."""
    path = shutil.which(name, path=f"{os.environ.get('PATH', os.defpath)}:/usr/sbin:/sbin")
    if path is None:
        pytest.fail(
            f"{name} is not installed: install the Debian packages in .ci/apt-packages.txt",
            pytrace=False,
        )
    return path


def _run(argv: list[str], *, env: Mapping[str, str] | None = None) -> str:
    """Run a short setup command; fail with its output if it fails; return its stdout."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=DAEMON_DEADLINE,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{shlex.join(argv)} took more than {exc.timeout} s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"{shlex.join(argv)} failed with status {done.returncode}:\n{done.stderr}{done.stdout}",
            pytrace=False,
        )
    return done.stdout


def _private_dir(prefix: str) -> Path:
    """A new private directory named after this process, once no other session has one.

    The fixtures use fixed names (namespaces, ports, ``/etc/hosts`` lines), so only one test
    session on a machine can have them at a time: if the owner of another such directory (the
    pid in its name) is a live Python process, this fails rather than break that session.  A
    directory whose owner is gone belongs to a session that died without its teardown (SIGKILL,
    or pytest-timeout ending the run): every process still mentioning it (a daemon given a path
    inside it on its command line or in its environment, or a job of such a daemon) is killed,
    then it is removed.
    """
    tmp = Path(tempfile.gettempdir())
    for other in tmp.glob(f"{prefix}*"):
        owner = other.name.removeprefix(prefix).split("-", 1)[0]
        if not owner.isdigit():
            continue
        if _is_python(int(owner)):
            pytest.fail(
                f"{other} belongs to another test session (pid {owner}), which is still "
                "running: these fixtures can only be up in one session on a machine at a time",
                pytrace=False,
            )
        # A session that ended without its teardown: its reaper may be removing this very
        # directory, namespaces and all, right now.  Let it finish first.
        if not _reaper.wait_for_reaper_of(other, time.monotonic() + 3 * DAEMON_DEADLINE):
            pytest.fail(f"the reaper of the session that made {other} is still at work")
        _kill(_pids_mentioning(str(other)))
        shutil.rmtree(other, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


# --------------------------------------------------------------------------------------------
# The process table
# --------------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _is_python(pid: int) -> bool:
    """Whether ``pid`` is a live Python process (pytest, say), not a reused pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0]
    except OSError:
        return False
    return b"python" in os.path.basename(argv0) and _alive(pid)


def _pids_mentioning(text: str) -> list[int]:
    """Live processes other than this one whose command line or environment contains ``text``."""
    needle = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if (needle in cmdline or needle in environ) and _alive(int(entry)):
            found.append(int(entry))
    return found


def _kill(pids: Iterable[int]) -> list[int]:
    """SIGKILL these processes and wait (on pidfds, not by polling) until they are gone.

    Returns those that were alive to be killed.  A process that outlives the deadline means the
    kernel is wedged, and is an error.
    """
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        fds[fd] = pid
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        waiting = set(fds)
        deadline = time.monotonic() + DAEMON_DEADLINE
        while waiting and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                waiting.discard(fd)
                poller.unregister(fd)
        if waiting:
            raise AssertionError(f"still alive after SIGKILL: {sorted(fds[fd] for fd in waiting)}")
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


# --------------------------------------------------------------------------------------------
# SSH hosts
# --------------------------------------------------------------------------------------------

_SSHD_CONFIG = """\
# sshd for one of corral's test hosts, run as: ip netns exec NETNS sshd -D -e -f THIS_FILE
ListenAddress {address}
Port 22
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The keys live in a private temporary directory, which StrictModes would reject.
StrictModes no
PrintMotd no
PrintLastLog no
AcceptEnv PYTHONPATH
"""


def start_ssh_hosts(
    undo: contextlib.ExitStack,
    count: int = SSH_HOST_COUNT,
    *,
    netns_prefix: str = NETNS_PREFIX,
    first_subnet: int = FIRST_SUBNET,
    dir_prefix: str = SSH_DIR_PREFIX,
) -> SshHosts:
    """Bring ``count`` hosts up, registering each undo step on ``undo`` as soon as it is needed.

    This is the ``ssh_hosts`` fixture's set-up, for scripts that need hosts outside pytest
    (``bench/scale.py``): host ``i`` (from 1) is the namespace ``<netns_prefix><i>`` with the
    subnet ``<SUBNET_PREFIX>.<first_subnet + i - 1>.0/24``, and the private directory is named
    after ``dir_prefix``.  A script passes names and subnets of its own, so that it never meets
    a test session's hosts of the same slot.  Anything that goes wrong raises pytest's
    ``Failed`` (a :class:`BaseException`) with the daemons' output; leaving ``undo`` stops the
    daemons and removes the namespaces, as does the session's reaper if the process dies first.
    """
    if count < 1 or first_subnet < 1 or first_subnet + count - 1 > 254:
        raise ValueError(f"cannot make {count} hosts from subnet {first_subnet}")
    started = time.monotonic()
    sshd = _program("sshd")
    keygen = _program("ssh-keygen")
    _program("ssh")
    _program("ip")

    workdir = _private_dir(dir_prefix)
    _undo_later(undo, _reaper.session().directory(workdir), shutil.rmtree, workdir, True)
    client_key = workdir / "client_key"
    _run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "corral-tests", "-f", str(client_key)])
    authorized_keys = workdir / "authorized_keys"
    shutil.copyfile(client_key.with_suffix(".pub"), authorized_keys)
    # sshd's privilege-separation directory; normally made by systemd's unit.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    hosts: list[SshHost] = []
    daemons: list[_Daemon] = []
    deadline = time.monotonic() + DAEMON_DEADLINE
    for index in range(1, count + 1):
        name = f"{netns_prefix}{index}"
        subnet = f"{SUBNET_PREFIX}.{first_subnet + index - 1}"
        address = f"{subnet}.2"
        launcher_address = f"{subnet}.1"
        root_link = f"{name}r"

        _remove_netns(name, root_link)  # what a crashed session may have left
        _undo_later(undo, _reaper.session().netns(name, root_link), _remove_netns, name, root_link)
        _run(["ip", "netns", "add", name])
        _run(
            ["ip", "link", "add", root_link, "type", "veth", "peer", "name", "eth0", "netns", name]
        )
        _run(["ip", "addr", "add", f"{launcher_address}/24", "dev", root_link])
        _run(["ip", "link", "set", root_link, "up"])
        _run(["ip", "-n", name, "addr", "add", f"{address}/24", "dev", "eth0"])
        _run(["ip", "-n", name, "link", "set", "eth0", "up"])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

        host_dir = workdir / name
        host_dir.mkdir()
        host_key = host_dir / "host_key"
        _run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(host_key)])
        config = host_dir / "sshd_config"
        config.write_text(
            _SSHD_CONFIG.format(
                address=address,
                host_key=host_key,
                pid_file=host_dir / "sshd.pid",
                authorized_keys=authorized_keys,
            )
        )
        argv = ["ip", "netns", "exec", name, sshd, "-D", "-e", "-f", str(config)]
        daemon = undo.enter_context(_Daemon(f"sshd of {name}", argv))
        daemons.append(daemon)
        hosts.append(SshHost(name, address, launcher_address, daemon.pid))

    for daemon, host in zip(daemons, hosts, strict=True):
        daemon.wait_for(rf"^Server listening on {re.escape(host.address)} port 22\b", deadline)

    result = SshHosts(
        hosts=tuple(hosts),
        identity_file=client_key,
        unreachable_address=f"{SUBNET_PREFIX}.{first_subnet}.254",
        setup_seconds=0.0,
    )
    # One real login per host, all at once, so that a key or configuration problem shows up
    # here, with sshd's side of the story, rather than as "Permission denied" in some test.
    logins = [
        subprocess.Popen(
            result.ssh_argv(host, "true"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for host in hosts
    ]
    for login, daemon, host in zip(logins, daemons, hosts, strict=True):
        out, _ = login.communicate(timeout=DAEMON_DEADLINE)
        if login.returncode != 0:
            _fail(f"ssh root@{host.address} true failed with {login.returncode}:\n{out}", daemon)

    return dataclasses.replace(result, setup_seconds=time.monotonic() - started)


def _remove_netns(name: str, root_link: str) -> None:
    """Kill every process in the namespace, then delete its veth pair and the namespace.

    Deleting the link first matters: ``ip netns del`` only drops a reference, and the kernel
    destroys the namespace and the veths in it a little later, so a same-named link could still
    exist when the next session adds its own.  Deleting either end of a veth pair deletes both,
    at once.
    """
    if Path("/run/netns", name).exists():
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, check=False
        ).stdout.split()
        _kill(int(pid) for pid in pids)
    if Path("/sys/class/net", root_link).exists():
        subprocess.run(["ip", "link", "del", root_link], capture_output=True, check=False)
    if Path("/run/netns", name).exists():
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


# --------------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------------

_SLURM_CONF = """\
# A one-machine Slurm cluster for corral's tests, made by tests/helpers/hosts.py.
ClusterName=corraltests
SlurmctldHost={hostname}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
# A private munged, whose socket every Slurm component is pointed at.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
# No cgroups and no systemd here.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# The fake nodes share this machine's hardware, whatever they claim.
SlurmdParameters=config_overrides
StateSaveLocation={state_dir}
SlurmdSpoolDir={spool_dir}/%n
SlurmctldPidFile={run_dir}/slurmctld.pid
SlurmdPidFile={run_dir}/slurmd-%n.pid
SlurmctldLogFile={log_dir}/slurmctld.log
SlurmdLogFile={log_dir}/slurmd-%n.log
# "debug2" makes slurmctld log when it listens and each node's registration, the events the
# fixture waits for.
SlurmctldDebug=debug2
SlurmdDebug=info
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _start_slurm_cluster(undo: contextlib.ExitStack) -> SlurmCluster:
    """Bring the cluster up, registering each undo step on ``undo`` as soon as it is needed."""
    started = time.monotonic()
    programs = {
        name: _program(name)
        for name in ("mungekey", "munged", "munge", "unmunge", "slurmctld", "slurmd")
    }
    for client in ("salloc", "srun", "sinfo", "scontrol"):
        _program(client)

    workdir = _private_dir(SLURM_DIR_PREFIX)
    _undo_later(undo, _reaper.session().directory(workdir), shutil.rmtree, workdir, True)
    # munged insists that its socket's directory be searchable by everyone.
    workdir.chmod(0o755)
    dirs = {name: workdir / name for name in ("munge", "state", "spool", "run", "log")}
    for path in dirs.values():
        path.mkdir(mode=0o755)
    for node in SLURM_NODES:
        (dirs["spool"] / node).mkdir()

    conf = workdir / "slurm.conf"
    munge_socket = dirs["munge"] / "munge.socket"
    node_lines = "\n".join(
        f"NodeName={node} NodeHostname={socket.gethostname().split('.')[0]} "
        f"NodeAddr=127.0.0.1 Port={SLURMD_FIRST_PORT + i} CPUs={os.cpu_count() or 1}"
        for i, node in enumerate(SLURM_NODES)
    )
    conf.write_text(
        _SLURM_CONF.format(
            hostname=socket.gethostname().split(".")[0],
            ctld_port=SLURMCTLD_PORT,
            munge_socket=munge_socket,
            state_dir=dirs["state"],
            spool_dir=dirs["spool"],
            run_dir=dirs["run"],
            log_dir=dirs["log"],
            node_lines=node_lines,
        )
    )
    env = {"SLURM_CONF": str(conf)}
    cluster = SlurmCluster(
        nodes=SLURM_NODES,
        conf=conf,
        env=MappingProxyType(env),
        log_dir=dirs["log"],
        setup_seconds=0.0,
    )
    environ = cluster.environ()

    _add_etc_hosts(undo, SLURM_NODES)
    # Registered before anything starts, so it runs after every daemon has been stopped: kill
    # whatever the tests left in the cluster (salloc, srun, slurmstepd, tasks: all of them carry
    # SLURM_CONF in their environment or the work dir on their command line).
    key = _reaper.session().mentioning(str(workdir))
    _undo_later(undo, key, lambda: _kill(_pids_mentioning(str(workdir))))

    # munge: a private key, daemon and socket, so that the machine's own munge (if any) is
    # neither needed nor disturbed.
    key = dirs["munge"] / "munge.key"
    _run([programs["mungekey"], "--create", f"--keyfile={key}"])
    munged_argv = [
        programs["munged"],
        "--foreground",
        f"--socket={munge_socket}",
        f"--key-file={key}",
        f"--pid-file={dirs['munge'] / 'munged.pid'}",
        f"--seed-file={dirs['munge'] / 'munged.seed'}",
        f"--log-file={dirs['log'] / 'munged.log'}",
    ]
    munged = undo.enter_context(_Daemon("munged", munged_argv))
    munged.wait_for(r"Created socket", time.monotonic() + DAEMON_DEADLINE)
    credential = _run([programs["munge"], "--no-input", f"--socket={munge_socket}"])
    try:
        subprocess.run(
            [programs["unmunge"], f"--socket={munge_socket}"],
            input=credential,
            capture_output=True,
            text=True,
            check=True,
            timeout=DAEMON_DEADLINE,
        )
    except subprocess.CalledProcessError as exc:
        _fail(f"munge credentials do not decode:\n{exc.stderr}", munged)

    deadline = time.monotonic() + DAEMON_DEADLINE
    slurmctld_argv = [programs["slurmctld"], "-D", "-i", "-f", str(conf)]
    slurmctld = undo.enter_context(_Daemon("slurmctld", slurmctld_argv, environ))
    # A slurmd that finds no slurmctld to register with tries again a second later: start them
    # once slurmctld listens, and they register at once.
    slurmctld.wait_for(rf"slurmctld listening on \S+:{SLURMCTLD_PORT}$", deadline)
    slurmds = [
        undo.enter_context(
            _Daemon(
                f"slurmd {node}", [programs["slurmd"], "-D", "-N", node, "-f", str(conf)], environ
            )
        )
        for node in SLURM_NODES
    ]
    # A slurmd registers with slurmctld as it starts.
    for node, slurmd in zip(SLURM_NODES, slurmds, strict=True):
        if not slurmctld.output.wait_for(rf"node {node} registered", deadline):
            _fail(f"node {node} did not register with slurmctld", slurmctld, slurmd)

    # slurmctld logs a registration while it holds the node table's write lock, so any query
    # after the line sees the registration's outcome: one look, not a polling loop.
    states = _run(["sinfo", "--noheader", "--Node", "--format=%N %t"], env=environ).split()
    if states != [word for node in SLURM_NODES for word in (node, "idle")]:
        _fail(f"nodes are not idle after registering: {states}", slurmctld, *slurmds)

    return dataclasses.replace(cluster, setup_seconds=time.monotonic() - started)


def _add_etc_hosts(undo: contextlib.ExitStack, names: Iterable[str]) -> None:
    """Make ``names`` resolve to 127.0.0.1 until ``undo`` runs, which restores the file.

    The file is rewritten in place, never replaced, as it is often a bind mount.  Lines that a
    crashed session added (they carry :data:`ETC_HOSTS_MARK`) are dropped first, and are not put
    back.
    """
    kept = _without_our_lines(ETC_HOSTS.read_text())
    key = _reaper.session().etc_hosts(ETC_HOSTS_MARK)
    _undo_later(undo, key, lambda: _rewrite(ETC_HOSTS, _without_our_lines(ETC_HOSTS.read_text())))
    separator = "" if kept.endswith("\n") or not kept else "\n"
    _rewrite(ETC_HOSTS, f"{kept}{separator}127.0.0.1 {' '.join(names)}  {ETC_HOSTS_MARK}\n")


def _without_our_lines(text: str) -> str:
    """``text`` without the lines this slot's sessions added (other slots' lines stay)."""
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not line.rstrip().endswith(ETC_HOSTS_MARK))


def _rewrite(path: Path, text: str) -> None:
    with open(path, "r+") as f:
        f.write(text)
        f.truncate()
