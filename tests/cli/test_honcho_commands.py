"""honcho's other commands: ``check``, ``run`` (``corral exec``), ``export``, and ``start``'s lines.

The exported files are read by the programs they are for: ``systemd-analyze
verify`` (Debian's ``systemd`` package, .ci/apt-packages.txt) for the units,
supervisord's own parser (the ``supervisor`` package of the test extras) for
its configuration.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli.test_cli import (
    PREFIXED,
    SGR,
    Terminal,
    corral,
    environ,
    messages,
    shown,
)
from tests.helpers.commands import corral_argv

pytestmark = pytest.mark.timeout(30)

PY = sys.executable


# -- corral up: honcho's lines ---------------------------------------------------------------


@pytest.mark.slow
def test_up_says_started_and_stopped_as_honcho_with_aligned_names(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text(
        "web: echo from web; touch up; exec sleep 30\n"
        "long_name_worker: while [ ! -e up ]; do sleep 0.01; done; echo quiet words\n"
    )
    out = corral(
        "up", "--no-colour", "-q", "long_name_worker", "--log-dir", "logs", cwd=tmp_path, tag=tag
    )
    assert out.returncode == 0, out.stderr
    lines = shown(out)
    prefixed = [line for line in lines if PREFIXED.fullmatch(line)]
    # One column for every name, "system" for corral's own lines, as honcho prints them.
    assert {line.index(" | ") for line in prefixed} == {9 + len("long_name_worker.1")}, lines
    said = messages(lines, "system")
    pids = {
        m[1]: int(m[2])
        for m in map(re.compile(r"(\S+) started \(pid=(\d+)\)").fullmatch, said)
        if m
    }
    assert sorted(pids) == ["long_name_worker.1", "web.1"], said
    assert "long_name_worker.1 stopped (rc=0)" in said
    assert "web.1 stopped (rc=-15)" in said  # stopped by corral, as honcho's SIGTERM
    assert said.index("long_name_worker.1 stopped (rc=0)") < said.index("web.1 stopped (rc=-15)")
    # -q: the quiet process's lines are kept off the console, not out of the files.
    assert messages(lines, "web.1") == ["from web"]
    assert messages(lines, "long_name_worker.1") == []
    [folder] = (tmp_path / "logs").iterdir()
    assert "quiet words" in (folder / "up.long_name_worker.1.log").read_text()


def test_up_no_colour_is_honchos_spelling_of_no_color(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text("web: echo plain\n")
    term = Terminal(
        corral_argv("up", "--no-colour", "--no-status"), cwd=tmp_path, env=environ(tag), cols=100
    )
    try:
        assert term.finish() == 0
    finally:
        term.close()
    assert b"| plain" in term.raw and SGR.search(bytes(term.raw)) is None, bytes(term.raw)


@pytest.mark.parametrize("bad", ["web=x", "nobody"])
def test_up_quiet_of_an_unknown_process_is_a_usage_error(
    tmp_path: Path, tag: str, bad: str
) -> None:
    (tmp_path / "Procfile").write_text("web: touch started\n")
    out = corral("up", "-q", bad, cwd=tmp_path, tag=tag)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "--quiet" in out.stderr and not (tmp_path / "started").exists()


# -- corral check ----------------------------------------------------------------------------


def test_check_says_what_up_would_run_and_starts_nothing(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text("web: touch started\nworker: touch started\n")
    (tmp_path / ".env").write_text("A=1\nexport B=2\n")
    out = corral("check", "-c", "web=2", cwd=tmp_path, tag=tag)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "Procfile is valid: web, worker (3 processes: web.1, web.2, worker.1); "
        "1 variables from .env\n"
    )
    assert "an 'export' line is skipped" in out.stderr
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize(
    ("procfile", "args", "says"),
    [
        ("web: ok\nnot a process\n", [], "Procfile, line 2: expected 'name: command'"),
        ("web: ok\n", ["worker"], "Procfile has no process named 'worker'"),
        ("web: ok\n", ["-c", "db=2"], "no process named 'db'"),
        ("web: ok\n", ["-e", "missing.env"], "the env file missing.env does not exist"),
    ],
    ids=["syntax", "unknown-name", "unknown-concurrency", "missing-env"],
)
def test_check_of_a_bad_procfile_is_one_line_and_exit_2(
    tmp_path: Path, tag: str, procfile: str, args: list[str], says: str
) -> None:
    (tmp_path / "Procfile").write_text(procfile)
    out = corral("check", *args, cwd=tmp_path, tag=tag)
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    assert says in out.stderr


# -- corral exec (honcho run) ----------------------------------------------------------------

SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ))); raise SystemExit(3)"


@pytest.mark.slow
def test_exec_runs_one_command_with_the_env_files_and_nothing_else(
    tmp_path: Path, tag: str
) -> None:
    import json

    (tmp_path / ".env").write_text("A=from-env\nB='two words'\n")
    (tmp_path / "more.env").write_text("B=more\n")
    out = corral("exec", "--", PY, "-c", SHOW_ENV, cwd=tmp_path, tag=tag)
    assert out.returncode == 3, out.stderr  # its exit code is corral's
    env = json.loads(out.stdout)
    assert (env["A"], env["B"]) == ("from-env", "two words")
    # This shell's environment and the .env file's: none of corral run's or corral up's own
    # variables (PORT, PS, RANK, MASTER_ADDR, CORRAL_*...).
    assert set(env) - set(environ(tag)) == {"A", "B"}, env
    out = corral("exec", "-e", ".env,more.env", PY, "-c", SHOW_ENV, cwd=tmp_path, tag=tag)
    assert json.loads(out.stdout)["B"] == "more"


def test_exec_of_a_missing_command_is_127_in_one_line(tmp_path: Path, tag: str) -> None:
    out = corral("exec", "no-such-command-here", cwd=tmp_path, tag=tag)
    assert out.returncode == 127
    assert out.stderr == (
        "corral: error: cannot run 'no-such-command-here': No such file or directory\n"
    )


# -- corral export ---------------------------------------------------------------------------

#: Commands and values that each format must escape: quotes, $, %, backslashes.
TRICKY_PROCFILE = (
    "web: echo \"hi $PORT\" 'single' 100% \\\\ done; exec sleep 1\n"
    "worker.fast: python3 -c \"print('%(ENV_HOME)s ${X}')\"\n"
)
TRICKY_ENV = 'PLAIN=1\nSPACES="two words, a comma"\nPCT=100%\nDQ=\'say "hi" now\'\nDOLLAR=$HOME\n'


def tricky_app(tmp_path: Path) -> Path:
    app = tmp_path / "shop"
    app.mkdir()
    (app / "Procfile").write_text(TRICKY_PROCFILE)
    (app / ".env").write_text(TRICKY_ENV)
    return app


def test_export_systemd_units_pass_systemd_analyze_verify(tmp_path: Path, tag: str) -> None:
    app = tricky_app(tmp_path)
    out = corral("export", "systemd", str(tmp_path / "units"), "-c", "web=2", cwd=app, tag=tag)
    assert out.returncode == 0, out.stderr
    names = sorted(Path(line).name for line in out.stdout.splitlines())
    assert names == [
        "shop-web-1.service",
        "shop-web-2.service",
        "shop-web.target",
        "shop-worker.fast-1.service",
        "shop-worker.fast.target",
        "shop.target",
    ]
    units = sorted(str(p) for p in (tmp_path / "units").iterdir())
    verified = subprocess.run(
        ["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=30
    )
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr
    text = (tmp_path / "units" / "shop-web-2.service").read_text()
    assert "PartOf=shop-web.target" in text
    assert 'Environment="PORT=5001"' in text and 'Environment="PS=web.2"' in text
    assert 'Environment="PCT=100%%"' in text and 'Environment="DOLLAR=$HOME"' in text
    assert 'ExecStart=/bin/sh -c "echo \\"hi $$PORT\\" \'single\' 100%% \\\\\\\\ done;' in text
    assert (
        "Wants=shop-web-1.service shop-web-2.service"
        in (tmp_path / "units" / "shop-web.target").read_text()
    )


def supervisord_programs(config: Path) -> dict[str, object]:
    """What supervisord makes of ``config`` (included as /etc/supervisor/conf.d's files are)."""
    from supervisor.options import ServerOptions

    main = config.parent / "supervisord.conf"
    main.write_text(f"[supervisord]\n[include]\nfiles = {config}\n")
    options = ServerOptions()
    options.configfile = str(main)
    options.process_config(do_usage=False)
    return {
        group.name: {p.name: p for p in group.process_configs}
        for group in options.process_group_configs
    }


def test_export_supervisord_config_is_read_by_supervisord(tmp_path: Path, tag: str) -> None:
    app = tricky_app(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    out = corral(
        "export",
        "supervisord",
        str(tmp_path / "conf"),
        "-l",
        str(logs),
        "-a",
        "shop",
        cwd=app,
        tag=tag,
    )
    assert out.returncode == 0, out.stderr
    [config] = (tmp_path / "conf").iterdir()
    groups = supervisord_programs(config)
    programs = groups["shop"]
    assert isinstance(programs, dict)
    assert sorted(programs) == ["shop-web-1", "shop-worker.fast-1"]
    commands = dict(line.split(": ", 1) for line in TRICKY_PROCFILE.splitlines())
    env = {"PLAIN": "1", "SPACES": "two words, a comma", "PCT": "100%", "DQ": 'say "hi" now'}
    env["DOLLAR"] = "$HOME"
    for kind, name, port in [("web", "web.1", 5000), ("worker.fast", "worker.fast.1", 5100)]:
        program = programs[f"shop-{kind}-1"]
        # The very command of the Procfile, run by the shell, as corral up runs it.
        assert shlex.split(program.command) == ["/bin/sh", "-c", commands[kind]]
        assert program.environment == {
            **env,
            "PORT": str(port),
            **dict.fromkeys(("PS", "HONCHO_PROCESS_NAME", "CORRAL_PROCESS_NAME"), name),
        }
        assert program.directory == str(app)
        assert program.stopasgroup and program.killasgroup
        assert program.stdout_logfile == str(logs / f"{name}.log")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("A='both \" and '\"'\"' quotes'", "supervisord cannot take the value of A"),
        ('A="ends with a quote\\""', "supervisord cannot take the value of A"),
        ('A="a\\nb"', "supervisord cannot take a line break in the value of A"),
    ],
    ids=["both-quotes", "quote-at-the-end", "line-break"],
)
def test_export_of_a_value_supervisord_cannot_take_is_one_line(
    tmp_path: Path, tag: str, value: str, says: str
) -> None:
    (tmp_path / "Procfile").write_text("web: true\n")
    (tmp_path / ".env").write_text(value + "\n")
    out = corral("export", "supervisord", str(tmp_path / "conf"), cwd=tmp_path, tag=tag)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.splitlines()) == 1 and says in out.stderr, out.stderr
    assert not (tmp_path / "conf").exists()  # nothing written
