"""The ``corral`` command, driven for real: ``corral run`` and ``corral up`` in subprocesses.

Every test starts the installed console script (or ``python -m corral._cli``
where there is none) with the test's tag in its environment, which the
workers inherit (remote workers get it from ``env TAG=... cmd``, since ssh
does not carry the launcher's environment): the ``tag`` fixture then fails a
test that leaves any of them behind.  Nothing waits by sleeping: the tests
read the command's output until the line they wait for, wait for its exit,
or (for the terminal tests) replay a pseudo-terminal's output into a
``pyte`` screen until it shows what they wait for.  Workers that must stay
up while the test looks block reading a FIFO of their own until the test
writes to it.
"""

from __future__ import annotations

import errno
import fcntl
import importlib.metadata
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import tempfile
import termios
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
import pyte
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers.commands import corral_argv
from tests.helpers.processes import TAG_VAR, release, tagged_pids, wait_gone
from tests.helpers.tmux import ScrollOnClearScreen
from tests.programs import program

from corral import open_runner
from corral._cli import _group, _procfile, _tail

if TYPE_CHECKING:
    from tests.helpers import hosts as _hosts

pytest_plugins = ["tests.helpers.hosts"]

pytestmark = pytest.mark.timeout(60)  # 15 s was seen under a load of 15

#: ``HH:MM:SS source | message``: a line as the command shows it, prefix on; a worker's
#: source comes after its global rank (``[2] agent-1.worker-0``).
PREFIXED = re.compile(
    r"(?P<stamp>\d\d:\d\d:\d\d) (?:\[(?P<rank>\d+)\] )?(?P<source>\S+) +\| (?P<message>.*)"
)
#: The header of the live status table.
HEADER = re.compile(r"name\s+state\s+pid\s+cpu\s+mem\s+uptime\s+restarts\s+last exit")
#: A row of the live status table.
ROW = re.compile(
    r"(?P<name>\S+)\s+(?P<state>running|exited|failed|stopped|killing|stopping, \d+ s left)"
    r"\s+(?P<pid>\d+)\s+(?P<cpu>\d+\.\d%|-)\s+(?P<mem>\d+(?:\.\d)?[KMG]|-)\s+"
    r"(?P<uptime>\d+:\d\d:\d\d)\s+(?P<restarts>\d+)\s+(?P<last>\S+)"
)
#: The header and a row of the summary left on a terminal at the end.
SUMMARY_HEADER = re.compile(r"name\s+ended\s+how\s+ran for")
SUMMARY_ROW = re.compile(
    r"(?P<name>\S+)\s+(?P<ended>exited|failed|stopped)\s+"
    r"(?P<how>code \d+|SIG[A-Z]+)\s+(?P<ran>\d+:\d\d:\d\d)"
)
#: An SGR sequence (colours, bold...).
SGR = re.compile(rb"\x1b\[[0-9;]*m")


def environ(tag: str | None = None, **more: str) -> dict[str, str]:
    """This process's environment, without NO_COLOR, with the tag and ``more``.

    OMP_NUM_THREADS is set, as a user who tuned it has it: ``corral run -n 2``
    would otherwise say on stderr that it sets it (tests/test_torchrun_env.py
    checks that notice), and these tests read stderr line by line.
    """
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.setdefault("OMP_NUM_THREADS", "1")
    if tag is not None:
        env[TAG_VAR] = tag
    return env | more


def corral(
    *args: str,
    cwd: Path,
    tag: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 20,
) -> subprocess.CompletedProcess[str]:
    """Run ``corral args`` to its end; stdout and stderr apart."""
    return subprocess.run(
        corral_argv(*args),
        cwd=cwd,
        env=env if env is not None else environ(tag),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def shown(out: subprocess.CompletedProcess[str]) -> list[str]:
    """Every line the command showed, on either stream."""
    return out.stdout.splitlines() + out.stderr.splitlines()


def messages(lines: Iterable[str], source: str) -> list[str]:
    """The messages of ``source`` among prefixed lines."""
    found = []
    for line in lines:
        match = PREFIXED.fullmatch(line)
        if match and match["source"] == source:
            found.append(match["message"])
    return found


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def make_fifos(folder: Path, count: int) -> list[Path]:
    fifos = [folder / f"fifo-{rank}" for rank in range(count)]
    for fifo in fifos:
        os.mkfifo(fifo)
    return fifos


class Streaming:
    """``corral ...`` in its own process group, its output (both streams) read line by line."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []

    def until(self, predicate: Callable[[list[str]], bool]) -> None:
        """Read lines until ``predicate(lines so far)`` holds (bounded by the test's timeout)."""
        assert self.proc.stdout is not None
        while not predicate(self.lines):
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the output ended first: {self.lines}")
            self.lines.append(line.rstrip("\n"))

    def finish(self, timeout: float = 15) -> int:
        assert self.proc.stdout is not None
        rest, _ = self.proc.communicate(timeout=timeout)
        self.lines.extend(rest.splitlines())
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate()


class Terminal:
    """A command on a pseudo-terminal of ``cols`` x ``rows``, its output replayed into pyte.

    pyte taught tmux's ``scroll-on-clear`` (on by default there): an erase of
    the whole screen moves it into the history, where a test sees it.
    """

    def __init__(
        self, argv: list[str], *, cwd: Path, env: dict[str, str], cols: int = 120, rows: int = 30
    ) -> None:
        self.master, slave = pty.openpty()
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
            )
        finally:
            os.close(slave)
        self.screen = ScrollOnClearScreen(cols, rows, history=10_000)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.eof = False

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return
        try:
            chunk = os.read(self.master, 65536)
        except OSError as exc:  # EIO: no slave descriptor is open any more
            if exc.errno != errno.EIO:
                raise
            chunk = b""
        if not chunk:
            self.eof = True
            return
        self.raw += chunk
        self.stream.feed(chunk)

    def until(self, what: str, predicate: Callable[[], bool], timeout: float = 15) -> None:
        """Read and replay output until ``predicate()`` holds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                screen = "\n".join(self.lines())
                raise AssertionError(f"{what} did not show; the screen and history:\n{screen}")
            self._read(left)

    def finish(self, timeout: float = 15) -> int:
        """Read everything until the command has exited; its exit code."""
        self.until("the end of the output", lambda: self.eof, timeout)
        return self.proc.wait(timeout)

    def close(self) -> None:
        """Stop the command if it still runs (Ctrl-C, then SIGKILL), close the terminal."""
        try:
            if self.proc.poll() is None and not self.eof:
                os.killpg(self.proc.pid, signal.SIGINT)
                self.until("the end after Ctrl-C", lambda: self.eof, 10)
        finally:
            if self.proc.poll() is None:
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            os.close(self.master)

    def _text(self, line: dict[int, pyte.screens.Char]) -> str:
        return "".join(line[x].data for x in range(self.screen.columns)).rstrip()

    def display(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def lines(self) -> list[str]:
        """Every line: the scrolled-off history, then the screen."""
        return [self._text(line) for line in self.screen.history.top] + self.display()

    def table(self) -> dict[str, re.Match[str]]:
        """The status table's rows on the screen, by name (empty if none is shown)."""
        display = self.display()
        headers = [y for y, line in enumerate(display) if HEADER.fullmatch(line)]
        if not headers:
            return {}
        rows = {}
        for line in display[headers[-1] + 1 :]:
            match = ROW.fullmatch(line)
            if match:
                rows[match["name"]] = match
        return rows


def every_line_whole(lines: Sequence[str], allowed: re.Pattern[str]) -> list[str]:
    """The non-empty lines that are not a whole, expected line (so: garbage)."""
    return [line for line in lines if line and not allowed.fullmatch(line)]


# -- help, version, usage errors ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], ["run", "up", "--version", "--help"]),
        (
            ["run"],
            [
                "--nproc-per-node",
                "--hosts",
                "--name",
                "--log-dir",
                "--grace",
                "--restart",
                "--max-restarts",
                "--no-prefix",
                "--no-color",
                "--no-status",
                "--ssh-user",
                "--ssh-identity",
                "--ssh-option",
                "--ranks",
                "--local-ranks-filter",
                "RANK",
                "WORLD_SIZE",
                "130",
            ],
        ),
        (
            ["up"],
            [
                "--env",
                "--concurrency",
                "--procfile",
                "--port",
                "--log-dir",
                "--no-prefix",
                "--no-color",
                "--no-status",
                "PORT",
                "130",
            ],
        ),
    ],
    ids=["corral", "run", "up"],
)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_is_complete_with_an_example(
    tmp_path: Path, args: list[str], expected: list[str], flag: str
) -> None:
    out = corral(*args, flag, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    text = out.stdout
    assert text.startswith(f"Usage: corral {' '.join(args)}".rstrip() + " ")
    for word in expected:
        assert word in text, (word, text)
    # An example of a whole command line, in every help.
    assert "Example" in text, text
    assert re.search(r"^\s+corral (run|up)\b.*$", text, re.MULTILINE), text


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(tmp_path: Path, flag: str) -> None:
    out = corral(flag, cwd=tmp_path)
    assert out.returncode == 0
    assert out.stdout == f"corral {importlib.metadata.version('corral')}\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["run"],
        ["bogus"],
        ["run", "-n", "0", "--", "true"],
        ["run", "-n", "x", "--", "true"],
        ["run", "--restart", "sometimes", "--", "true"],
        ["run", "--max-restarts", "-1", "--", "true"],
        ["run", "--grace", "-1", "--", "true"],
        ["run", "--hosts", ",", "--", "true"],
        ["run", "--hosts", "a.invalid,b.invalid,a.invalid", "--", "true"],
        ["run", "--link-timeout", "0", "--", "true"],
        ["run", "--link-timeout", "-1", "--", "true"],
        ["run", "--link-timeout", "nan", "--", "true"],
        ["run", "--link-timeout", "inf", "--", "true"],
        ["run", "--link-timeout", "soon", "--", "true"],
        ["run", "--no-such-option", "--", "true"],
        ["up", "-c", "web=x"],
        ["up", "-c", "nosuch=2"],
        ["up", "--port", "0"],
        ["up", "-e", "missing.env"],
    ],
    ids=lambda args: " ".join(args),
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "Procfile").write_text("web: touch started\n")
    out = corral(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("corral"), out.stderr
    assert "error" in out.stderr
    assert not (tmp_path / "started").exists()


@pytest.mark.slow
def test_an_unreadable_ssh_identity_is_a_clear_one_line_error(tmp_path: Path) -> None:
    """A bad --ssh-identity is a bad argument: named in one line, exit 2, nothing started."""
    missing = tmp_path / "no-such-key"
    out = corral("run", "--hosts", "h1", "--ssh-identity", str(missing), "--", "true", cwd=tmp_path)
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert str(missing) in out.stderr, out.stderr
    assert "None" not in out.stderr, out.stderr
    assert out.returncode == 2, out.stderr


@pytest.mark.slow
def test_hosts_slurm_outside_an_allocation_is_a_one_line_error(tmp_path: Path) -> None:
    env = {k: v for k, v in environ().items() if not k.startswith("SLURM_")}
    out = corral("run", "--hosts", "slurm", "--", "true", cwd=tmp_path, env=env)
    assert "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert "allocation" in out.stderr
    assert out.returncode == 2, out.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("program", "code", "reason"),
    [
        ("/nonexistent/program", 127, "No such file or directory"),
        ("no-such-program-on-the-path", 127, "No such file or directory"),
        ("./not-executable", 126, "Permission denied"),
    ],
)
def test_a_command_that_cannot_start(
    tmp_path: Path, tag: str, program: str, code: int, reason: str
) -> None:
    (tmp_path / "not-executable").write_text("#!/bin/sh\necho hi\n")
    out = corral("run", "-n", "2", "--", program, "arg", cwd=tmp_path, tag=tag)
    assert out.returncode == code
    assert out.stderr == f"corral: error: cannot run {program!r}: {reason}\n"


#: An executable file of no format the kernel can run.
BAD_BINARY = b"\x7fELF\x02\x01\x01" + bytes(9) + b"not really an ELF file"
#: A Procfile that leaves a mark if anything starts.
MARKING = b"web: touch started; exec sleep 30\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("files", "args", "code", "says"),
    [
        ({"bad": BAD_BINARY}, ["run", "--", "./bad"], 126, "cannot run './bad': Exec format error"),
        ({}, ["run", "--name", "a.b", "--", "touch", "started"], 2, "--name"),
        ({}, ["run", "--name", "a b", "--", "touch", "started"], 2, "--name"),
        ({}, ["run", "--name", "x" * 200, "--", "touch", "started"], 2, "(200 characters)"),
        ({"Procfile": MARKING}, ["up", "--name", "a/b"], 2, "--name"),
        ({"Procfile": b"x" * 150 + b": touch started\n"}, ["up"], 2, "Procfile, line 1: the name"),
        ({"Procfile": MARKING + b"bad: echo \xff\n"}, ["up"], 2, "line 2: not UTF-8 text"),
        ({"Procfile": MARKING + b"#" * 2**20}, ["up"], 2, "Procfile is larger than 1024 KiB"),
        ({"Procfile": MARKING + b"bad: echo a\0b\n"}, ["up"], 2, "line 2: a NUL character"),
        ({"Procfile": MARKING, ".env": b"A=1\nB=a\0b\n"}, ["up"], 2, ".env, line 2: a NUL"),
        ({"Procfile": MARKING, ".env": b"A=\xe9t\xe9\n"}, ["up"], 2, ".env, line 1: not UTF-8"),
        ({"Procfile": MARKING, ".env": b"A=" + b"x" * 2**20}, ["up"], 2, ".env is larger than"),
        (
            {"Procfile": MARKING, ".env": b"B=1\nA=" + b"x" * 200_000},
            ["up"],
            2,
            ".env, line 2: 'A'",
        ),
        ({"Procfile": MARKING, ".env": b"B=1\nnot a line\n"}, ["up"], 2, ".env, line 2: cannot"),
        ({"Procfile": MARKING, ".env": b"PORT=http\n"}, ["up"], 2, "PORT='http'"),
        ({"Procfile": MARKING}, ["up", "-c", "web=\u00b2"], 2, "--concurrency"),
        ({"Procfile": MARKING}, ["up", "-c", "web=99999999999999999"], 2, "--concurrency"),
        ({"Procfile": MARKING}, ["up", "--grace", "nan"], 2, "--grace"),
        ({}, ["run", "--grace", "inf", "--", "touch", "started"], 2, "--grace"),
        ({}, ["run", "-n", "100000000000", "--", "touch", "started"], 2, "--nproc-per-node"),
        (
            {},
            ["run", "-n", "4096", "--hosts", ",".join(f"h{i}" for i in range(17)), "--", "true"],
            2,
            "at most 65536 copies in all, not 69632",
        ),
        (
            {"file": b""},
            ["run", "--log-dir", "file/logs", "--", "touch", "started"],
            2,
            "--log-dir",
        ),
        ({}, ["run", "--monitor", "192.0.2.1:0", "--", "touch", "started"], 2, "--monitor"),
        ({}, ["tail", "http://[::1"], 2, "URL"),
        ({}, ["tail", "http://127.0.0.1:99999/?token=x"], 2, "URL"),
        ({}, ["tail", "http://127.0.0.1:9/?token=x", "--level", "\u00b2"], 2, "--level"),
        ({}, ["run", "--name", "\udcff", "--", "touch", "started"], 2, "--name"),
        ({}, ["run", "--hosts", "h\udcff", "--", "touch", "started"], 2, "--hosts"),
        ({}, ["run", "--hosts", "h", "--ssh-user", "\udcff", "--", "true"], 2, "--ssh-user"),
        ({}, ["tail", "http://127.0.0.1:9/?token=x", "--source", "\udcff"], 2, "--source"),
    ],
    ids=[
        "bad-binary-format",
        "name-with-a-dot",
        "name-with-a-space",
        "name-of-200",
        "up-name-with-a-slash",
        "procfile-name-of-150",
        "procfile-not-utf8",
        "procfile-over-1mib",
        "procfile-nul",
        "env-nul",
        "env-not-utf8",
        "env-1mib-value",
        "env-200kib-value",
        "env-unparsable-line",
        "env-port-not-a-number",
        "concurrency-superscript-two",
        "concurrency-huge",
        "grace-nan",
        "grace-inf",
        "nproc-huge",
        "world-huge",
        "log-dir-under-a-file",
        "monitor-address-not-ours",
        "tail-bad-ipv6",
        "tail-port-out-of-range",
        "tail-level-superscript-two",
        "name-not-utf8",
        "hosts-not-utf8",
        "ssh-user-not-utf8",
        "tail-source-not-utf8",
    ],
)
def test_bad_input_is_one_line_and_its_exit_code(
    tmp_path: Path, tag: str, files: dict[str, bytes], args: list[str], code: int, says: str
) -> None:
    """No traceback: one line on stderr naming what is wrong, the documented code, nothing run."""
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        (tmp_path / name).chmod(0o755)
    out = corral(*args, cwd=tmp_path, tag=tag)
    assert "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("corral") and "error: " in out.stderr, out.stderr
    assert says in out.stderr, out.stderr
    assert out.returncode == code, out.stderr
    assert out.stdout == ""
    assert not (tmp_path / "started").exists()


def test_a_monitor_port_in_use_is_a_bad_argument(tmp_path: Path, tag: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        out = corral("run", "--monitor", address, "--", "touch", "started", cwd=tmp_path, tag=tag)
    assert out.stderr.endswith(
        f"cannot listen on {address!r}: Address already in use (see corral run --help)\n"
    ), out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.returncode == 2
    assert not (tmp_path / "started").exists()


# -- fuzzing: whatever the input, no traceback --------------------------------------------

#: Text that cannot start a new line of a Procfile or a .env file, nor end a name.
_ONE_LINE = st.characters(
    exclude_categories=["Cs"], exclude_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029:"
)
#: A name as a user might type it, or not.
_NAMES = st.one_of(
    st.text(_ONE_LINE, max_size=220),
    st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,120}", fullmatch=True),
)
#: An argument as the command gets it: any bytes but NUL (decoded as Python decodes argv).
_ARGUMENTS = st.binary(max_size=120).map(
    lambda b: b.replace(b"\0", b"").decode("utf-8", "surrogateescape")
)
_PROCFILE_LINES = st.one_of(
    st.builds(
        lambda name, sep, command: f"{name}{sep}{command}",
        _NAMES,
        st.sampled_from([":", ": ", " :\t", "::"]),
        st.text(max_size=40),
    ),
    st.text(max_size=80),
)
_ENV_LINES = st.one_of(
    st.builds(
        lambda export, key, quote, value: f"{export}{key}={quote}{value}{quote}",
        st.sampled_from(["", "export "]),
        _NAMES,
        st.sampled_from(["", "'", '"']),
        st.text(max_size=60),
    ),
    st.text(max_size=80),
)


def _file(lines: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """Files of such lines, sometimes with bytes that are not UTF-8, or any bytes at all."""
    text = st.lists(lines, max_size=12).map(lambda ls: "\n".join(ls).encode())
    spoilt = st.tuples(text, st.binary(min_size=1, max_size=4)).map(lambda t: t[0] + t[1])
    return st.one_of(text, spoilt, st.binary(max_size=400))


def _one_line(error: click.ClickException) -> str:
    message = error.format_message()
    assert message and len(message.splitlines()) == 1, repr(message)
    return message


@pytest.mark.slow
@pytest.mark.timeout(120)  # 300 examples; over 30 s under a load of 15 (its worker timed out)
@settings(max_examples=300, deadline=None)
@given(_file(_PROCFILE_LINES))
def test_fuzz_procfile_parsing(data: bytes) -> None:
    """Any Procfile: its processes, each startable under its copies' names, or one line."""
    try:
        processes = _procfile.parse_procfile(data, "Procfile")
    except _procfile.ProcfileError as error:
        _one_line(error)
        return
    assert processes
    for name, command in processes.items():
        assert "\0" not in command and "\n" not in command
        # A name the runner takes for every copy (NAME.1 to NAME.MAX_COPIES).
        assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", name), name
        assert len(f"{name}.{_group.MAX_COPIES}") <= 100


@pytest.mark.slow
@pytest.mark.timeout(120)  # 300 examples, each a corral process
@settings(max_examples=300, deadline=None)
@given(_file(_ENV_LINES))
def test_fuzz_env_file_parsing(data: bytes) -> None:
    """Any .env file: variables any program can be started with, or one line."""
    try:
        env = _procfile.parse_env_file(data, ".env")
    except _procfile.EnvFileError as error:
        _one_line(error)
        return
    for key, value in env.items():
        assert key and "=" not in key and "\0" not in key + value
        assert len(f"{key}={value}".encode()) < _procfile.MAX_VARIABLE


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.one_of(_NAMES, _ARGUMENTS))
def test_fuzz_run_names(name: str) -> None:
    """``--name``: accepted only if the runner takes it, and every valid one; else one line."""
    try:
        _group.run_name(name)
    except click.BadParameter as error:
        _one_line(error)
        if _group.is_text(name):  # printable text: refused only as the runner refuses it
            with pytest.raises(ValueError):
                open_runner(name=name)
    else:
        open_runner(name=name)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.text(max_size=60), st.from_regex(r"(ws|http)s?://[^/]*/\?token=.*")),
    st.one_of(st.just("*"), st.text(max_size=20)),
)
def test_fuzz_tail_urls(url: str, source: str) -> None:
    try:
        _tail._urlsplit(url, source, 20)
    except click.BadParameter as error:
        _one_line(error)


@pytest.mark.slow
@pytest.mark.timeout(120)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    procfile=st.lists(
        st.one_of(_NAMES.map(lambda name: f"{name}: true"), st.text(_ONE_LINE, max_size=40)),
        max_size=4,
    ),
    spoil=st.sampled_from([b"", b"\xff", b"\0"]),
    env=_file(_ENV_LINES),
    name=st.one_of(st.just("up"), _NAMES.filter(lambda n: "\0" not in n), _ARGUMENTS),
)
def test_fuzz_corral_up_never_shows_a_traceback(
    tag: str, procfile: list[str], spoil: bytes, env: bytes, name: str
) -> None:
    """The real command, on fuzzed Procfiles (whose commands are all ``true``), .env and names."""
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)
        (cwd / "Procfile").write_bytes("\n".join(procfile).encode() + spoil)
        (cwd / ".env").write_bytes(env)
        out = corral("up", "--name", name, cwd=cwd, tag=tag)
    assert "Traceback" not in out.stderr, out.stderr
    if out.returncode != 0:
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.splitlines()) == 1, out.stderr
        assert out.stderr.startswith("corral"), out.stderr


# -- corral run: output --------------------------------------------------------------------


def test_run_every_line_prefixed_with_torchrun_environment(tmp_path: Path, tag: str) -> None:
    script = (
        'echo "env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK '
        '$MASTER_ADDR $MASTER_PORT"; echo "second $RANK"; echo "to stderr $RANK" >&2'
    )
    out = corral("run", "-n", "3", "--", *sh(script), cwd=tmp_path, tag=tag)
    assert out.returncode == 0, out.stderr
    lines = shown(out)
    # Not a terminal: plain lines, no colour, no status table, nothing unprefixed.
    assert "\x1b" not in out.stdout + out.stderr
    assert [line for line in lines if not PREFIXED.fullmatch(line)] == []
    ports = set()
    for rank in range(3):
        got = messages(lines, f"agent-0.worker-{rank}")
        assert len(got) == 3, lines
        env = got[0].split()
        assert env[:7] == ["env", str(rank), str(rank), "3", "3", "0", "127.0.0.1"], got
        ports.add(env[7])
        assert sorted(got[1:]) == [f"second {rank}", f"to stderr {rank}"]
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    # Each worker's lines show its global rank (on one host: its local rank).
    for match in map(PREFIXED.fullmatch, lines):
        assert match is not None
        if match["source"].startswith("agent-"):
            assert match["rank"] == match["source"].rsplit("-", 1)[1], match.group(0)
        else:
            assert match["rank"] is None, match.group(0)


def test_run_no_prefix(tmp_path: Path, tag: str) -> None:
    script = 'echo "out $RANK"; echo "err $RANK" >&2'
    out = corral("run", "-n", "2", "--no-prefix", "--", *sh(script), cwd=tmp_path, tag=tag)
    assert out.returncode == 0, out.stderr
    assert sorted(shown(out)) == ["err 0", "err 1", "out 0", "out 1"]


def test_run_log_dir_and_name(tmp_path: Path, tag: str) -> None:
    script = 'echo "out $RANK"; echo "err $RANK" >&2'
    logs = tmp_path / "logs"
    out = corral(
        "run",
        "-n",
        "2",
        "--name",
        "job",
        "--log-dir",
        str(logs),
        "--",
        *sh(script),
        cwd=tmp_path,
        tag=tag,
    )
    assert out.returncode == 0, out.stderr
    [folder] = list(logs.iterdir())
    assert folder.name.endswith("-job")
    names = sorted(p.name for p in folder.iterdir())
    assert "combined.log" in names
    for rank in range(2):
        text = (folder / f"job.agent-0.worker-{rank}.log").read_text()
        assert f"[stdout] out {rank}" in text
        assert f"[stderr] err {rank}" in text
    combined = (folder / "combined.log").read_text()
    assert "job.agent-0.worker-1 [stdout] out 1" in combined
    assert "exited with code 0" in combined  # lifecycle records too


# -- corral run: exit codes and restarts ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "code", "failed"),
    [
        ('echo "ok $RANK"', 0, None),
        ('[ $RANK = 1 ] && exit 3; echo "up $RANK"; exec sleep 30', 3, "1 exited with code 3"),
        ("[ $RANK = 0 ] && kill -KILL $$; exec sleep 30", 137, "0 was killed by SIGKILL"),
        ("[ $RANK = 2 ] && kill -TERM $$; exec sleep 30", 143, "2 was killed by SIGTERM"),
    ],
    ids=["all-succeed", "exit-3", "sigkill", "sigterm"],
)
def test_run_exit_code_is_the_first_failures(
    tmp_path: Path, tag: str, script: str, code: int, failed: str | None
) -> None:
    """The workers that were stopped because of the failure do not decide the code."""
    started = time.monotonic()
    out = corral("run", "-n", "3", "--grace", "10", "--", *sh(script), cwd=tmp_path, tag=tag)
    assert out.returncode == code, out.stderr
    assert time.monotonic() - started < 10  # the others were stopped, not waited for
    lines = out.stdout.splitlines()
    assert [line for line in lines if not PREFIXED.fullmatch(line)] == []
    if failed is None:
        assert out.stderr == ""
    else:
        rank, _, how = failed.partition(" ")
        assert any(how.removeprefix("was ") in m for m in messages(lines, "run")), lines
        # On stderr: which rank, where, how it ended; it wrote nothing to stderr.
        assert out.stderr.splitlines() == [
            f"corral: rank {rank} (local rank {rank} on host localhost) {how} "
            "(it wrote nothing to stderr)"
        ]


@pytest.mark.slow
def test_run_restart_on_failure_restarts_the_whole_group(tmp_path: Path, tag: str) -> None:
    """Rank 1 fails on its first run while rank 0 is still up: both are started again."""
    script = (
        'echo "start $RANK $$"; '
        "[ $RANK = 1 ] && [ ! -e failed ] && { touch failed; exit 7; }; "
        "[ $RANK = 0 ] && [ ! -e waited ] && { touch waited; exec sleep 30; }; "
        'echo "done $RANK"'
    )
    out = corral(
        "run",
        "-n",
        "2",
        "--restart",
        "on-failure",
        "--max-restarts",
        "2",
        "--",
        *sh(script),
        cwd=tmp_path,
        tag=tag,
    )
    assert out.returncode == 0, out.stderr
    lines = shown(out)
    for rank in range(2):
        got = messages(lines, f"agent-0.worker-{rank}")
        starts = [m for m in got if m.startswith("start")]
        assert len(starts) == 2, got
        assert len({m.split()[2] for m in starts}) == 2  # two different pids
        assert got[-1] == f"done {rank}"
    restarting = [m for m in messages(lines, "run") if "restarting the worker group" in m]
    assert len(restarting) == 1, lines
    assert "restart 1 of 2" in restarting[0]
    assert "exited with code 7" in restarting[0]


@pytest.mark.slow
def test_run_max_restarts_spent_exits_with_the_code(tmp_path: Path, tag: str) -> None:
    # Neither rank fails before both have said their try: a rank that failed first would have
    # the other stopped for the restart, maybe before it echoed.  Rank 1 tells rank 0 through
    # a FIFO (each open waits for the other end), in each of the two runs.
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    script = (
        'echo "try $RANK"; '
        f'if [ "$RANK" = 0 ]; then read go < {gate}; else echo go > {gate}; fi; '
        "exit 9"
    )
    out = corral(
        "run",
        "-n",
        "2",
        "--restart",
        "on-failure",
        "--max-restarts",
        "1",
        "--",
        *sh(script),
        cwd=tmp_path,
        tag=tag,
    )
    assert out.returncode == 9, out.stderr
    lines = shown(out)
    for rank in range(2):
        assert messages(lines, f"agent-0.worker-{rank}") == [f"try {rank}"] * 2
    assert len([m for m in messages(lines, "run") if "restarting" in m]) == 1


# -- Ctrl-C ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "sig", "code"),
    [("run", signal.SIGINT, 130), ("run", signal.SIGTERM, 143), ("up", signal.SIGINT, 130)],
    ids=["run-ctrl-c", "run-sigterm", "up-ctrl-c"],
)
def test_ctrl_c_stops_every_worker_and_their_children(
    tmp_path: Path, tag: str, command: str, sig: signal.Signals, code: int
) -> None:
    """The signal goes to the command's process group, as a terminal's Ctrl-C does.

    Every worker has a child of its own in the background, which a
    non-interactive sh starts with SIGINT ignored: the grace is the whole
    group's, so a Ctrl-C waits the grace for it, then kills it; SIGTERM it
    obeys.  Nothing may survive.
    """
    grace = 3
    script = "sleep 60 & echo ready; wait"
    if command == "run":
        argv = corral_argv("run", "-n", "4", "--grace", str(grace), "--", *sh(script))
    else:
        (tmp_path / "Procfile").write_text(f"web: {script}\nworker: {script}\n")
        argv = corral_argv("up", "-c", "web=2,worker=2", "--grace", str(grace))
    running = Streaming(argv, cwd=tmp_path, env=environ(tag))
    try:
        running.until(lambda lines: sum(line.endswith("| ready") for line in lines) == 4)
        pids = tagged_pids(tag)
        assert len(pids) >= 1 + 4 + 4, pids  # corral, the workers, their children
        started = time.monotonic()
        os.killpg(running.proc.pid, sig)
        assert running.finish() == code, running.lines
        took = time.monotonic() - started
        if sig == signal.SIGINT:  # the background sleeps ignore it: the grace, then SIGKILL
            assert took >= grace - 0.5, took
        assert took < grace + 10, took  # nothing waits beyond the grace
        assert wait_gone(pids, 5) == []
        assert tagged_pids(tag) == []
    finally:
        running.close()


@pytest.mark.slow
def test_ctrl_c_during_the_restart_backoff(tmp_path: Path, tag: str) -> None:
    argv = corral_argv("run", "-n", "2", "--restart", "on-failure", "--", *sh("exit 3"))
    running = Streaming(argv, cwd=tmp_path, env=environ(tag))
    try:
        # The third restart waits about 4 s (3.2 to 4.8 with the jitter), as its line says.
        running.until(lambda lines: any("(restart 3 of 3)" in x for x in lines))
        said = time.monotonic()
        [line] = [x for x in running.lines if "(restart 3 of 3)" in x]
        backoff = float(re.search(r"restarting the worker group in ([\d.]+) s", line)[1])
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.finish() == 130, running.lines
        # Over before the backoff that began before its line was read would be: not waited out.
        assert time.monotonic() - said < backoff, (backoff, running.lines)
    finally:
        running.close()


# -- a closed stdout (| head) -----------------------------------------------------------

#: A worker that writes as fast as it can.
CHATTY = 'i=0; while :; do echo "line $i"; i=$((i + 1)); done'


def start_piped(argv: list[str], cwd: Path, tag: str, *, stderr_too: bool) -> subprocess.Popen[str]:
    """``argv`` with stdout (and maybe stderr) a pipe the test reads, as ``| head`` would."""
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=environ(tag),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish_piped(proc: subprocess.Popen[str], timeout: float = 15) -> tuple[int, float, str]:
    """Close the test's end of stdout, as ``head`` does once it has its line.

    Returns the exit code, the seconds from the close to the exit, and what
    the command wrote to stderr (when stderr is a pipe of its own).
    """
    assert proc.stdout is not None
    proc.stdout.close()
    started = time.monotonic()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"still running {timeout} s after its stdout was closed")
    elapsed = time.monotonic() - started
    err = proc.stderr.read() if proc.stderr is not None else ""
    return code, elapsed, err


def close_piped(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout-and-stderr"])
@pytest.mark.parametrize("command", ["run", "up"])
def test_a_closed_stdout_stops_everything_as_sigpipe_would(
    tmp_path: Path, tag: str, command: str, stderr_too: bool
) -> None:
    """``corral run ... | head -1`` with chatty workers: exit 141 at once, workers stopped.

    141 is 128 + SIGPIPE, what a program killed by SIGPIPE exits with; but the
    workers are stopped first (they obey the stop signal: well under the
    10 s grace), nothing is written to stderr, and nothing burns CPU on.
    """
    if command == "run":
        argv = corral_argv("run", "-n", "2", "--grace", "10", "--", *sh(CHATTY))
    else:
        (tmp_path / "Procfile").write_text(f"chatty: {CHATTY}\nquiet: echo up; exec sleep 60\n")
        argv = corral_argv("up", "--grace", "10")
    proc = start_piped(argv, tmp_path, tag, stderr_too=stderr_too)
    try:
        assert proc.stdout is not None
        sources = set()
        while len(sources) < 2:  # both have started
            line = proc.stdout.readline().rstrip("\n")
            match = PREFIXED.fullmatch(line)
            assert match, line
            sources.add(match["source"])
        pids = tagged_pids(tag)
        assert len(pids) >= 3, pids  # corral and its workers
        code, elapsed, err = finish_piped(proc)
    finally:
        close_piped(proc)
    assert err == ""
    assert code == 141
    assert elapsed < 5
    assert wait_gone(pids, 5) == []


def test_a_closed_stdout_stops_quiet_workers_too(tmp_path: Path, tag: str) -> None:
    """Workers that say one line and then wait for ever: the reader going stops them.

    Nothing is written after the close, so no write fails: corral notices the
    pipe's reader going by itself, at once.
    """
    make_fifos(tmp_path, 2)
    script = 'echo "ready $RANK"; read x < fifo-$RANK; echo "released $RANK"'
    argv = corral_argv("run", "-n", "2", "--grace", "10", "--", *sh(script))
    proc = start_piped(argv, tmp_path, tag, stderr_too=False)
    try:
        assert proc.stdout is not None
        for _ in range(2):
            assert "| ready" in proc.stdout.readline()
        pids = tagged_pids(tag)
        code, elapsed, err = finish_piped(proc)
    finally:
        close_piped(proc)
    assert err == ""
    assert code == 141
    assert elapsed < 5
    assert wait_gone(pids, 5) == []


@pytest.mark.slow
def test_stdout_on_a_full_disk_stops_everything_with_one_line(tmp_path: Path, tag: str) -> None:
    """``corral run ... > /dev/full``: as ``echo hi > /dev/full``, one line and exit code 1."""
    script = 'echo "first $RANK"; exec sleep 60'
    with open("/dev/full", "w") as full:
        started = time.monotonic()
        out = subprocess.run(
            corral_argv("run", "-n", "2", "--grace", "10", "--", *sh(script)),
            cwd=tmp_path,
            env=environ(tag),
            stdin=subprocess.DEVNULL,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=20,
        )
    assert out.stderr == "corral: error: cannot write to stdout: No space left on device\n"
    assert out.returncode == 1
    assert time.monotonic() - started < 5  # the workers were stopped, not waited for


@pytest.mark.slow
def test_tail_into_a_closed_pipe_ends_with_141(tmp_path: Path, tag: str) -> None:
    """``corral tail URL | head -1`` ends too, and leaves the run it watched alone."""
    argv = corral_argv("run", "--monitor", "127.0.0.1:0", "--", *sh(CHATTY))
    watched = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=environ(tag),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert watched.stderr is not None
        said = watched.stderr.readline()
        match = re.fullmatch(r"corral: monitor at (\S+)\n", said)
        assert match, said
        tail = start_piped(corral_argv("tail", match[1]), tmp_path, tag, stderr_too=False)
        try:
            assert tail.stdout is not None
            assert PREFIXED.fullmatch(tail.stdout.readline().rstrip("\n"))
            code, elapsed, err = finish_piped(tail)
        finally:
            close_piped(tail)
        assert (code, err) == (141, "")
        assert elapsed < 5
        assert watched.poll() is None  # the run goes on
        os.killpg(watched.pid, signal.SIGINT)
        assert watched.wait(15) == 130
    finally:
        close_piped(watched)


# -- the terminal: colours, prefixes, the live status table -------------------------------


def test_terminal_screen_colours_prefixes_and_status_table(tmp_path: Path, tag: str) -> None:
    fifos = make_fifos(tmp_path, 2)
    script = (
        'i=0; while [ $i -lt 20 ]; do echo "line $i of $RANK"; i=$((i + 1)); done; '
        'echo "ready $RANK $$"; read x < fifo-$RANK; echo "done $RANK"'
    )
    log_line = re.compile(
        r"\d\d:\d\d:\d\d \[(?P<rank>[01])\] agent-0\.worker-(?P=rank) \| "
        r"(?P<message>line \d+ of [01]|ready [01] \d+|done [01])"
    )
    term = Terminal(
        corral_argv("run", "-n", "2", "--", *sh(script)), cwd=tmp_path, env=environ(tag)
    )
    try:

        def table_up() -> bool:
            rows = term.table()
            ready = [line for line in term.lines() if " | ready " in line]
            return (
                len(ready) == 2
                and sorted(rows) == ["agent-0.worker-0", "agent-0.worker-1"]
                and all(row["state"] == "running" for row in rows.values())
            )

        term.until("the status table with both workers running", table_up)
        # -- while they wait: the table, pinned under the lines -------------------------
        display = term.display()
        header = next(y for y, line in enumerate(display) if HEADER.fullmatch(line))
        last_log = max(y for y, line in enumerate(display) if log_line.fullmatch(line))
        assert last_log < header, display
        assert [line for line in display[header + 3 :] if line] == [], display
        pids = {}
        for line in term.lines():
            match = log_line.fullmatch(line)
            if match and match["message"].startswith("ready"):
                pids[f"agent-0.worker-{match['rank']}"] = match["message"].split()[2]
        for name, row in term.table().items():
            assert row["pid"] == pids[name]
            assert row["restarts"] == "0"
            assert row["last"] == "-"
        for y in (header + 1, header + 2):
            assert term.screen.buffer[y][0].fg == "green"  # running rows are green
        # Colours on: each source in its colour, the message itself not coloured.
        colours = set()
        for y, line in enumerate(display):
            match = log_line.fullmatch(line)
            if match is None:
                continue
            name = f"agent-0.worker-{match['rank']}"
            column = line.index(name)
            fg = {term.screen.buffer[y][x].fg for x in range(column, column + len(name))}
            assert len(fg) == 1 and fg != {"default"}, (line, fg)
            colours.add((name, fg.pop()))
            message = line.index("| ") + 2
            assert term.screen.buffer[y][message].fg == "default"
        assert len(colours) == 2 and len({c for _, c in colours}) == 2, colours
        # Everything above the table is a whole line (the first ones have scrolled off).
        above = term.lines()[: len(term.screen.history.top) + header]
        assert every_line_whole(above, log_line) == []
        # -- let them finish --------------------------------------------------------------
        for fifo in fifos:
            release(fifo)
        assert term.finish() == 0
    finally:
        term.close()
    lines = term.lines()
    # The summary stays under the lines: each worker, how it ended, how long it ran.
    last = max(y for y, line in enumerate(lines) if log_line.fullmatch(line))
    summary = [line for line in lines[last + 1 :] if line]
    assert len(summary) == 3 and SUMMARY_HEADER.fullmatch(summary[0]), lines[last:]
    ended = [SUMMARY_ROW.fullmatch(line) for line in summary[1:]]
    assert [(m["name"], m["ended"], m["how"]) for m in ended if m] == [
        ("agent-0.worker-0", "exited", "code 0"),
        ("agent-0.worker-1", "exited", "code 0"),
    ], summary
    assert every_line_whole(lines[: last + 1], log_line) == [], lines
    shown_messages = [m["message"] for m in map(log_line.fullmatch, lines) if m]
    expected = [f"line {i} of {r}" for r in range(2) for i in range(20)]
    expected += [f"ready {r} {pids[f'agent-0.worker-{r}']}" for r in range(2)]
    expected += [f"done {r}" for r in range(2)]
    assert sorted(shown_messages) == sorted(expected)
    assert len(term.screen.history.top) > 0  # it did scroll


@pytest.mark.slow
@pytest.mark.parametrize("option", ["--no-color", "--no-status"])
def test_terminal_no_color_and_no_status(tmp_path: Path, tag: str, option: str) -> None:
    """The workers run for 1.2 s: long enough for two redraws of a status table."""
    script = 'echo "ready $RANK"; sleep 1.2; echo "done $RANK"'
    log_line = re.compile(r"\d\d:\d\d:\d\d \[[01]\] agent-0\.worker-[01] \| (ready|done) [01]")
    argv = corral_argv("run", "-n", "2", option, "--", *sh(script))
    term = Terminal(argv, cwd=tmp_path, env=environ(tag))
    try:
        assert term.finish() == 0
    finally:
        term.close()
    lines = [line for line in term.lines() if line]
    if option == "--no-color":  # the summary of the table stays at the end
        assert SUMMARY_HEADER.fullmatch(lines[4]) and len(lines) == 7, lines
        assert all(SUMMARY_ROW.fullmatch(line) for line in lines[5:]), lines
        lines = lines[:4]
    assert every_line_whole(lines, log_line) == [], lines
    assert len(lines) == 4
    if option == "--no-color":
        assert SGR.search(term.raw) is None, bytes(term.raw)
        assert b"last exit" in term.raw  # the table was there, without colours
    else:
        assert b"last exit" not in term.raw
        assert SGR.search(term.raw) is not None  # still coloured


@pytest.mark.slow
def test_terminal_status_table_shows_the_last_exit_after_a_group_restart(
    tmp_path: Path, tag: str
) -> None:
    """Rank 1 failed with code 7 and the group was restarted: its row says so."""
    fifos = make_fifos(tmp_path, 2)
    script = (
        "[ $RANK = 1 ] && [ ! -e failed ] && { touch failed; exit 7; }; "
        'echo "ready $RANK"; read x < fifo-$RANK'
    )
    argv = corral_argv("run", "-n", "2", "--restart", "on-failure", "--", *sh(script))
    term = Terminal(argv, cwd=tmp_path, env=environ(tag))
    try:

        def restarted() -> bool:
            rows = term.table()
            return len(rows) == 2 and all(r["restarts"] == "1" for r in rows.values())

        term.until("the table after the restart", restarted)
        rows = term.table()
        assert rows["agent-0.worker-1"]["last"] == "7", term.display()
        for fifo in fifos:
            release(fifo)
        assert term.finish() == 0
    finally:
        term.close()


#: Rank 0 holds 100 MiB and burns CPU; rank 1 sleeps.
@pytest.mark.slow
@pytest.mark.parametrize("option", [None, "--no-usage"])
def test_terminal_status_table_shows_cpu_and_memory(
    tmp_path: Path, tag: str, option: str | None
) -> None:
    options = [option] if option else []
    argv = corral_argv("run", "-n", "2", *options, "--", *program("costly_or_idle"))
    term = Terminal(argv, cwd=tmp_path, env=environ(tag))
    try:
        if option is None:
            shown: dict[str, re.Match[str]] = {}

            def telling() -> bool:
                # However loaded the machine, a CPU loop gets a few percent of a core.
                nonlocal shown
                rows = shown = term.table()
                busy, idle = rows.get("agent-0.worker-0"), rows.get("agent-0.worker-1")
                if busy is None or idle is None or "-" in (busy["cpu"], busy["mem"]):
                    return False
                held = busy["mem"].endswith("G") or (
                    busy["mem"].endswith("M") and float(busy["mem"][:-1]) >= 100
                )
                return float(busy["cpu"][:-1]) >= 5 and idle["cpu"] == "0.0%" and held

            term.until("the busy worker's and the idle one's figures", telling, timeout=30)
            assert shown["agent-0.worker-1"]["mem"].endswith("M")
        else:
            term.until("the table", lambda: len(term.table()) == 2)
            drawn, since = term.raw.count(b"last exit"), time.monotonic()
            # A sample would have come a second after the start: redraws for 2.5 s.
            term.until(
                "redraws for 2.5 s",
                lambda: time.monotonic() > since + 2.5 and term.raw.count(b"last exit") > drawn + 2,
            )
            rows: dict[str, re.Match[str]] = {}

            def whole() -> bool:  # not a screen caught between a clear and its redraw
                nonlocal rows
                rows = term.table()
                return len(rows) == 2

            term.until("a whole table", whole)
            assert [(r["cpu"], r["mem"]) for r in rows.values()] == [("-", "-")] * 2, rows
    finally:
        term.close()


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_status_table_columns_of_what_each_process_costs(anyio_backend: str) -> None:
    import corral as library  # (``corral`` here runs the command)
    from corral._cli._status import Status

    async with library.open_runner(console=False, usage=False) as r:
        web = await r.start(["sleep", "30"], name="web")
        gib, mib = 1 << 30, 1 << 20
        usage = {
            "web": library.ResourceUsage(web.pid, 99.5, 3 * gib, gpu_memory=2 * gib),
            "agent-1.worker-0": library.ResourceUsage(77, 12.0, 97 * mib, host="node2"),
        }
        wide = [line.decode() for line in Status().render(r.processes, 120, False, 100, usage)]
        plain = [line.decode() for line in Status().render(r.processes, 120, False, 100, {})]
        narrow = [line.decode() for line in Status().render(r.processes, 50, False, 100, usage)]
        r.cancel()
    assert wide[0].split() == [
        "name",
        "state",
        "pid",
        "cpu",
        "mem",
        "gpu",
        "uptime",
        "restarts",
        "last",
        "exit",
    ]
    assert wide[1].split()[:6] == ["web", "running", str(web.pid), "99.5%", "3.0G", "2.0G"]
    # A worker of another host, known by its figures alone.
    assert wide[2].split() == ["agent-1.worker-0", "running", "77", "12.0%", "97M", "-"] + ["-"] * 3
    # No GPU memory anywhere: no gpu column; no figures: dashes.
    assert HEADER.fullmatch(plain[0]) and ROW.fullmatch(plain[1]), plain
    assert ROW.fullmatch(plain[1])["cpu"] == "-"  # type: ignore[index]
    # A narrow terminal goes without the columns it has no room for, figures last.
    assert narrow[0].split() == ["name", "state", "cpu", "mem", "last", "exit"], narrow


@pytest.mark.slow
def test_terminal_status_table_taller_than_the_terminal(tmp_path: Path, tag: str) -> None:
    """12 workers on a 10-row terminal: the table must not leave copies in the scrollback."""
    count = 12
    fifos = make_fifos(tmp_path, count)
    script = 'echo "ready $RANK"; read x < fifo-$RANK; echo "done $RANK"'
    log_line = re.compile(
        r"\d\d:\d\d:\d\d \[\d+\] agent-0\.worker-\d+ \| (ready|done) \d+"
        r"|12 processes in all: 12 exited"  # the summary, too many rows for 10 lines
    )
    argv = corral_argv("run", "-n", str(count), "--", *sh(script))
    term = Terminal(argv, cwd=tmp_path, env=environ(tag), rows=10)
    try:
        term.until("every worker ready", lambda: term.raw.count(b"| ready ") == count)
        drawn = term.raw.count(b"last exit")
        term.until("two more redraws", lambda: term.raw.count(b"last exit") >= drawn + 2)
        for fifo in fifos:
            release(fifo)
        assert term.finish() == 0
    finally:
        term.close()
    lines = term.lines()
    garbage = every_line_whole(lines, log_line)
    assert garbage == [], "\n".join(lines)


# -- corral up ---------------------------------------------------------------------------


PROCFILE = """\
# web serves, worker waits for both web copies, then exits 3
web: echo "web $PORT $GREETING"; touch "ready-$PORT"; exec sleep 30

worker: while [ "$(ls ready-* 2>/dev/null | wc -l)" -lt 2 ]; do sleep 0.01; done; \
echo "worker $PORT $GREETING"; exit 3
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("port_args", "base"),
    [([], 6000), (["-p", "7000"], 6000)],
    ids=["dotenv-port", "dotenv-port-beats-p-as-in-honcho"],
)
def test_up_env_port_and_concurrency(
    tmp_path: Path, tag: str, port_args: list[str], base: int
) -> None:
    (tmp_path / "Procfile").write_text(PROCFILE.replace("\\\n", ""))
    (tmp_path / ".env").write_text('GREETING="hello world"\nPORT=6000\n')
    started = time.monotonic()
    out = corral("up", "-c", "web=2", "--grace", "10", *port_args, cwd=tmp_path, tag=tag)
    assert out.returncode == 3, out.stderr
    assert time.monotonic() - started < 10  # web.1 and web.2 were stopped at once
    lines = shown(out)
    assert messages(lines, "web.1") == [f"web {base} hello world"]
    assert messages(lines, "web.2") == [f"web {base + 1} hello world"]
    assert messages(lines, "worker.1") == [f"worker {base + 100} hello world"]
    assert any("worker.1 exited with code 3" in m for m in messages(lines, "system")), lines
    assert [line for line in out.stdout.splitlines() if not PREFIXED.fullmatch(line)] == []
    assert out.stderr == "corral: worker.1 exited with code 3 (it wrote nothing to stderr)\n"


@pytest.mark.slow
def test_up_env_file_option(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text('web: echo "$A $B"\n')
    (tmp_path / ".env").write_text("A=from-default-env\n")
    (tmp_path / "one.env").write_text("A=one\nB=one\n")
    (tmp_path / "two.env").write_text("B=two\n")
    out = corral("up", "-e", "one.env", "-e", "two.env", cwd=tmp_path, tag=tag)
    assert out.returncode == 0, out.stderr
    assert messages(shown(out), "web.1") == ["one two"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("line", "code"),
    [("exit 0", 0), ("exit 5", 5), ("kill -KILL $$", 137)],
    ids=["success", "exit-5", "sigkill"],
)
def test_up_the_first_exit_stops_the_rest_with_its_code(
    tmp_path: Path, tag: str, line: str, code: int
) -> None:
    (tmp_path / "Procfile").write_text(
        f"server: echo up; exec sleep 30\nonce: while [ ! -e up ]; do sleep 0.01; done; {line}\n"
        "marker: touch up; exec sleep 30\n"
    )
    out = corral("up", "--grace", "10", cwd=tmp_path, tag=tag)
    assert out.returncode == code, out.stderr
    assert any("once.1 exited with code" in m for m in messages(shown(out), "system")), out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("with_path", [False, True])
def test_up_runs_only_the_named_processes(tmp_path: Path, tag: str, with_path: bool) -> None:
    text = "web: echo web up\nclock: touch clock-started; exec sleep 30\nworker: echo worker\n"
    args = ["up"]
    if with_path:
        (tmp_path / "Procfile.dev").write_text(text)
        args.append("Procfile.dev")
    else:
        (tmp_path / "Procfile").write_text(text)
    out = corral(*args, "web", "worker", cwd=tmp_path, tag=tag)
    assert out.returncode == 0, out.stderr
    sources = {m["source"] for m in map(PREFIXED.fullmatch, shown(out)) if m}
    assert sources <= {"web.1", "worker.1", "system"}, sources
    assert "web.1" in sources
    assert not (tmp_path / "clock-started").exists()


@pytest.mark.slow
def test_up_unknown_name_is_an_error_and_starts_nothing(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text("web: touch started; exec sleep 30\n")
    out = corral("up", "web", "nope", cwd=tmp_path, tag=tag)
    assert out.returncode == 2
    assert out.stderr == "corral: error: Procfile has no process named 'nope'\n"
    assert not (tmp_path / "started").exists()


@pytest.mark.slow
def test_up_missing_procfile(tmp_path: Path) -> None:
    out = corral("up", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == "corral: error: cannot read Procfile: No such file or directory\n"


@pytest.mark.slow
def test_up_procfile_syntax_error_names_the_line_and_starts_nothing(
    tmp_path: Path, tag: str
) -> None:
    (tmp_path / "Procfile").write_text(
        "web: touch started; exec sleep 30\n# a comment\n\nthis is not a process line\n"
    )
    out = corral("up", cwd=tmp_path, tag=tag)
    assert out.returncode == 2
    assert out.stderr == (
        "corral: error: Procfile, line 4: expected 'name: command', "
        "got 'this is not a process line'\n"
    )
    assert not (tmp_path / "started").exists()


@pytest.mark.slow
def test_up_with_every_process_at_zero_copies_ends(tmp_path: Path, tag: str) -> None:
    """-c web=0 for the only process: nothing to run is no reason to wait forever."""
    (tmp_path / "Procfile").write_text("web: touch started\n")
    try:
        out = corral("up", "-c", "web=0", cwd=tmp_path, tag=tag, timeout=3)
    except subprocess.TimeoutExpired:
        pytest.fail("corral up -c web=0 was still running after 3 s")
    assert out.returncode in (0, 2), out.stderr
    assert not (tmp_path / "started").exists()


# -- other hosts ---------------------------------------------------------------------------


def ssh_args(hosts: _hosts.SshHosts) -> list[str]:
    args = ["--ssh-user", hosts.user, "--ssh-identity", str(hosts.identity_file)]
    return args + [f"--ssh-option={option}" for option in hosts.ssh_options]


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("fail", [False, True], ids=["ok", "rank-3-exits-6"])
def test_run_on_two_ssh_hosts(
    ssh_hosts: _hosts.SshHosts, tmp_path: Path, tag: str, fail: bool
) -> None:
    a, b = ssh_hosts.addresses
    script = (
        'echo "hello $RANK $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $MASTER_ADDR"; echo "err $RANK" >&2'
    )
    if fail:
        script += '; [ "$RANK" = 3 ] && exit 6; exec sleep 30'
    command = ["env", f"{TAG_VAR}={tag}", *sh(script)]
    out = corral(
        "run",
        "-n",
        "2",
        "--hosts",
        f"{a},{b}",
        *ssh_args(ssh_hosts),
        "--",
        *command,
        cwd=tmp_path,
        tag=tag,
        timeout=50,
    )
    lines, errors = out.stdout.splitlines(), out.stderr.splitlines()
    assert out.returncode == (6 if fail else 0), shown(out)
    assert [line for line in lines if not PREFIXED.fullmatch(line)] == [], lines
    own = [line for line in errors if not PREFIXED.fullmatch(line)]  # corral's own lines
    errors = [line for line in errors if PREFIXED.fullmatch(line)]
    for match in map(PREFIXED.fullmatch, lines + errors):  # the global rank before each worker
        assert match is not None
        worker = re.fullmatch(r"agent-(\d)\.worker-(\d)", match["source"])
        if worker is not None:
            assert match["rank"] == str(2 * int(worker[1]) + int(worker[2])), match.group(0)
    for group in range(2):
        for local in range(2):
            rank = 2 * group + local
            got = messages(lines, f"agent-{group}.worker-{local}")
            err = messages(errors, f"agent-{group}.worker-{local}")
            if fail and rank != 3:
                continue  # it may have been stopped before it spoke
            # stdout lines on stdout, stderr lines on stderr, from the remote hosts too
            assert (got, err) == ([f"hello {rank} {local} {group} 4 {a}"], [f"err {rank}"]), lines
    if fail:
        # Said by the agent of rank 3's host, under its own source.
        said = [m for m in messages(lines, "agent-1") if "exited with code 6" in m]
        assert any(m.startswith("worker-1 (pid") for m in said), "\n".join(lines)
        # Once, under its source: not repeated as a logger name in the message.
        assert not any(m.startswith("agent-1:") for m in messages(lines, "agent-1")), lines
        # And the command says on stderr which worker failed, where, how, and its last words.
        assert own == [
            f"corral: rank 3 (local rank 1 on host {b}) exited with code 6; its last stderr lines:",
            "  err 3",
        ], out.stderr
    else:
        assert own == [], out.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_run_on_an_unreachable_host_says_why(ssh_hosts: _hosts.SshHosts, tmp_path: Path) -> None:
    out = corral(
        "run",
        "--hosts",
        ssh_hosts.unreachable_address,
        *ssh_args(ssh_hosts),
        "--ssh-option=-oConnectTimeout=2",
        "--",
        "true",
        cwd=tmp_path,
        timeout=50,
    )
    assert out.returncode == 1, out.stderr
    last = out.stderr.splitlines()[-1]
    assert last.startswith("corral: error: "), out.stderr
    assert "TaskGroup" not in last, out.stderr
    assert ssh_hosts.unreachable_address in last or "ssh" in last, out.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_run_link_timeout_reaches_the_launch(
    ssh_hosts: _hosts.SshHosts, tmp_path: Path, tag: str
) -> None:
    """A host cut off mid-run is lost after --link-timeout, not after the default 5 s."""
    assert (
        corral("run", "--link-timeout", "2.5", "--", "true", cwd=tmp_path, tag=tag).returncode == 0
    )  # taken for a run on this machine too (where no link is involved)
    link_timeout = 1.0
    host = ssh_hosts.hosts[0]
    argv = corral_argv(
        "run",
        "--hosts",
        host.address,
        "--link-timeout",
        str(link_timeout),
        *ssh_args(ssh_hosts),
        "--",
        "env",
        f"{TAG_VAR}={tag}",
        *sh("echo up; exec sleep 30"),
    )
    run = Streaming(argv, cwd=tmp_path, env=environ(tag, NO_COLOR="1"))
    try:
        run.until(lambda lines: any(line.endswith("| up") for line in lines))
        with host.cut():
            cut = time.monotonic()
            code = run.finish(timeout=20)
            took = time.monotonic() - cut
            # The agent on the other side of the cut stops its worker by itself.
            assert wait_gone(tagged_pids(tag), link_timeout + 5) == []
    finally:
        run.close()
    assert code == 1, run.lines
    assert host.address in run.lines[-1] and "link" in run.lines[-1], run.lines
    assert took < 4.0, f"lost after {took:.1f} s: {run.lines}"  # the default would be >= 5 s


def run_in_salloc(
    cluster: _hosts.SlurmCluster, tmp_path: Path, tag: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.salloc_argv(*corral_argv(*args), ntasks_per_node=2),
        cwd=tmp_path,
        env={**cluster.environ(), TAG_VAR: tag, "OMP_NUM_THREADS": "1"},  # as environ()
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=50,
    )


SLURM_SCRIPT = 'echo "hello $RANK $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $SLURMD_NODENAME"'


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_run_hosts_slurm(slurm_cluster: _hosts.SlurmCluster, tmp_path: Path, tag: str) -> None:
    out = run_in_salloc(
        slurm_cluster, tmp_path, tag, "run", "--hosts", "slurm", "-n", "2", "--", *sh(SLURM_SCRIPT)
    )
    assert out.returncode == 0, out.stderr
    lines = shown(out)
    for group, node in enumerate(("n1", "n2")):
        for local in range(2):
            rank = 2 * group + local
            got = messages(lines, f"agent-{group}.worker-{local}")
            assert got == [f"hello {rank} {local} {group} 4 {node}"], lines
    corral_lines = [line for line in lines if not line.startswith("salloc:")]
    assert [line for line in corral_lines if not PREFIXED.fullmatch(line)] == [], lines
    # The exit code travels back from the allocation's nodes too.
    failing = sh('[ "$RANK" = 2 ] && exit 5; exec sleep 30')
    out = run_in_salloc(
        slurm_cluster, tmp_path, tag, "run", "--hosts", "slurm", "-n", "2", "--", *failing
    )
    assert out.returncode == 5, out.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_run_hosts_slurm_takes_the_workers_per_node_from_the_allocation(
    slurm_cluster: _hosts.SlurmCluster, tmp_path: Path, tag: str
) -> None:
    """Under ``salloc --ntasks-per-node=2``, no -n: two workers per node, as the library does."""
    out = run_in_salloc(
        slurm_cluster, tmp_path, tag, "run", "--hosts", "slurm", "--", *sh(SLURM_SCRIPT)
    )
    assert out.returncode == 0, out.stderr
    hello = [m["message"] for m in map(PREFIXED.fullmatch, shown(out)) if m]
    assert sorted(h.split()[1] for h in hello if h.startswith("hello")) == ["0", "1", "2", "3"]
