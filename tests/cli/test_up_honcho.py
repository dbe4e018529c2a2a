"""``corral up`` reads what honcho reads: its Procfile and ``.env`` cases, names, ``-e``, PORT.

The cases are honcho's documented and tested behaviour (its ``using_procfiles``
page and the cases its own test-suite checks), written anew here; where honcho
and foreman disagree, or honcho does something no user relies on, the row says
which reading corral takes (docs/cli.rst and docs/howto/switching.rst list
them).  The command tests run the real ``corral up``: every process writes
what it sees to a file named after itself, then waits until every process has
written its file, so that the first one to exit (which stops the others)
cannot cut another short.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.cli.test_cli import corral, environ, messages, shown

from corral._cli import _procfile

pytestmark = pytest.mark.timeout(30)


# -- .env: the parser ------------------------------------------------------------------------

#: (a line of a .env file, the variables it sets), honcho's reading unless the id says so.
ENV_CASES = [
    ("FOO=bar", {"FOO": "bar"}),
    ("FOO=bar\nBAZ=qux", {"FOO": "bar", "BAZ": "qux"}),
    ("FOO=bar\n", {"FOO": "bar"}),
    ("#commented: command", {}),
    ("# COMMENTED=1\n\n   \n", {}),
    ("MYVAR='hello\"world'", {"MYVAR": 'hello"world'}),
    ('MYVAR="hello\'world"', {"MYVAR": "hello'world"}),
    ("MYVAR='\"surrounded\"'", {"MYVAR": '"surrounded"'}),
    ('MYVAR=\\"escaped\\"', {"MYVAR": '"escaped"'}),
    ("MYVAR=user@domain.com", {"MYVAR": "user@domain.com"}),
    ("MYVAR=~pun|u@|0n$=", {"MYVAR": "~pun|u@|0n$="}),
    (
        "MYVAR=\u22c3\u00f1\u1d09\u2014\u262a\u00f3\u2202\u01dd",
        {"MYVAR": "\u22c3\u00f1\u1d09\u2014\u262a\u00f3\u2202\u01dd"},
    ),
    ("MYVAR='sp ace'", {"MYVAR": "sp ace"}),
    # Escapes: \n and \t are a newline and a tab in single quotes too (honcho, not foreman).
    ("TABS='foo\\tbar'", {"TABS": "foo\tbar"}),
    ("NEWLINES='foo\\nbar'", {"NEWLINES": "foo\nbar"}),
    ("DOLLAR='foo\\$bar'", {"DOLLAR": "foo\\$bar"}),
    ("SQ='a \\\\ b'", {"SQ": "a \\\\ b"}),
    ('DQ="a\\nb\\tc \\\\ \\" \\$x"', {"DQ": 'a\nb\tc \\ " \\$x'}),
    ("UNQ=a\\nb", {"UNQ": "anb"}),
    # No interpolation, in either tool.
    ("DOLLAR=$HOME", {"DOLLAR": "$HOME"}),
    ('BRACE="${HOME}"', {"BRACE": "${HOME}"}),
    ("A=x\nREF=${A}-y", {"A": "x", "REF": "${A}-y"}),
    # Both skip an export line (corral says so: see test_up_export_line_is_skipped_and_said).
    ("export EXPORTED=yes", {}),
    ("EMPTY_DQ=\"\"\nEMPTY_SQ=''", {"EMPTY_DQ": "", "EMPTY_SQ": ""}),
    ("EMPTY=", {"EMPTY": ""}),  # foreman's reading: honcho leaves EMPTY unset
    ("INLINE=value # trailing comment", {"INLINE": "value"}),
    ("HASHIN=val#ue", {"HASHIN": "val#ue"}),  # as sh and foreman: honcho cuts at the '#'
    ('HASHQ="val#ue"', {"HASHQ": "val#ue"}),
    ("SPACED=hello world  again", {"SPACED": "hello world  again"}),  # foreman's reading
    ("  LEADING=lead", {"LEADING": "lead"}),
    ("SPACES_EQ = around", {"SPACES_EQ": "around"}),
    ("EQ=a=b=c", {"EQ": "a=b=c"}),
    ("URL=http://user:pw@host:80/p?q=1&r=2", {"URL": "http://user:pw@host:80/p?q=1&r=2"}),
    ("lower_case=lc", {"lower_case": "lc"}),
    ("CRLF=yes\r\nNEXT=1\r\n", {"CRLF": "yes", "NEXT": "1"}),
    ("A=one\nA=two", {"A": "two"}),
    ("NAME_ALONE", {}),
]


@pytest.mark.parametrize(("text", "expected"), ENV_CASES, ids=[c[0][:30] for c in ENV_CASES])
def test_env_file_cases(text: str, expected: dict[str, str]) -> None:
    assert _procfile.parse_env_file(text.encode(), ".env") == expected


#: (a line honcho skips without a word, the one-line error corral gives instead).
ENV_ERRORS = [
    ("-foo=command", ".env, line 1: '-foo' is not a variable name"),
    ("1DIGIT=bad", ".env, line 1: '1DIGIT' is not a variable name"),
    ("DASH-NAME=bad", ".env, line 1: 'DASH-NAME' is not a variable name"),
    (
        "\u1e40\u1e8e\u1e7e\u1ea0\u1e5a=value",
        ".env, line 1: '\u1e40\u1e8e\u1e7e\u1ea0\u1e5a' is not",
    ),
    ('OK=1\nMULTI="line1\nline2"', '.env, line 2: a " quote is not closed on its line'),
    ("OPEN='x", ".env, line 1: a ' quote is not closed on its line"),
    ("TRAIL=x\\", ".env, line 1: a backslash ends the line"),
    ("not a line", ".env, line 1: cannot parse 'not a line'"),
]


@pytest.mark.parametrize(("text", "says"), ENV_ERRORS, ids=[c[0][:20] for c in ENV_ERRORS])
def test_env_file_lines_honcho_skips_are_errors(text: str, says: str) -> None:
    with pytest.raises(_procfile.EnvFileError) as error:
        _procfile.parse_env_file(text.encode(), ".env")
    assert error.value.format_message().startswith(says)


# -- Procfile: the parser --------------------------------------------------------------------

PROCFILE_CASES = [
    ("web: command", {"web": "command"}),
    ("foo: python foo.py\nbar: python bar.py", {"foo": "python foo.py", "bar": "python bar.py"}),
    ("web: command\n#commented: command\n\n", {"web": "command"}),
    ("-foo_bar: command", {"-foo_bar": "command"}),
    (
        'web: sh -c "echo $FOOBAR" >/dev/null 2>&1',
        {"web": 'sh -c "echo $FOOBAR" >/dev/null 2>&1'},
    ),
    ("worker:echo x\ntabsep:\techo y", {"worker": "echo x", "tabsep": "echo y"}),
    ('colon: echo "a:b:c http://x:80"', {"colon": 'echo "a:b:c http://x:80"'}),
    ("web: a\r\nworker: b\r\n", {"web": "a", "worker": "b"}),
    ("dot.name: command", {"dot.name": "command"}),  # honcho skips it: corral runs it
]


@pytest.mark.parametrize(
    ("text", "expected"), PROCFILE_CASES, ids=[c[0][:20] for c in PROCFILE_CASES]
)
def test_procfile_cases(text: str, expected: dict[str, str]) -> None:
    processes = _procfile.parse_procfile(text, "Procfile")
    assert processes == expected
    assert list(processes) == list(expected)  # in the Procfile's order


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("web: a\n+foo: command", "Procfile, line 2: expected 'name: command'"),
        ("web: a\nweb: b", "Procfile, line 2: the process 'web' is defined twice"),
    ],
    ids=["bad-name", "duplicate"],
)
def test_procfile_lines_honcho_skips_are_errors(text: str, says: str) -> None:
    with pytest.raises(_procfile.ProcfileError) as error:
        _procfile.parse_procfile(text, "Procfile")
    assert error.value.format_message().startswith(says)


# -- the command -----------------------------------------------------------------------------

#: Writes the environment as JSON into ``seen-<process name>``, then waits for ``$WAIT`` files.
DUMP = (
    f"{sys.executable} -c 'import json, os; "
    'open("seen-" + os.environ["CORRAL_PROCESS_NAME"], "w").write(json.dumps(dict(os.environ)))\''
    '; while [ "$(ls seen-* | wc -l)" -lt "$WAIT" ]; do sleep 0.01; done'
)


def up(
    tmp_path: Path, tag: str, *args: str, shell: dict[str, str] | None = None
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Run ``corral up args`` in ``tmp_path``: what each process saw, and the lines shown."""
    out = corral("up", *args, cwd=tmp_path, env=environ(tag, **(shell or {})))
    assert out.returncode == 0, out.stderr
    seen = {
        path.name.removeprefix("seen-"): json.loads(path.read_text())
        for path in tmp_path.glob("seen-*")
    }
    return seen, shown(out)


@pytest.mark.slow
def test_up_process_names_in_ps_honcho_and_corral_variables(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text(f"web: {DUMP}\nworker: {DUMP}\n")
    (tmp_path / ".env").write_text("WAIT=5\nPS=from-env\nHONCHO_PROCESS_NAME=from-env\n")
    seen, _ = up(tmp_path, tag, "-c", "web=2,worker=3")
    assert sorted(seen) == ["web.1", "web.2", "worker.1", "worker.2", "worker.3"]
    for name, env in seen.items():
        assert env["PS"] == env["HONCHO_PROCESS_NAME"] == env["CORRAL_PROCESS_NAME"] == name
    ports = {name: env["PORT"] for name, env in seen.items()}
    assert ports == {
        "web.1": "5000",
        "web.2": "5001",
        "worker.1": "5100",
        "worker.2": "5101",
        "worker.3": "5102",
    }


@pytest.mark.slow
def test_up_name_with_a_leading_dash(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text(f"web: {DUMP}\nworker: {DUMP}\n-dash: {DUMP}\n")
    (tmp_path / ".env").write_text("WAIT=4\n")
    seen, _ = up(tmp_path, tag, "-c", "-dash=2")
    assert {name: env["PORT"] for name, env in seen.items()} == {
        "web.1": "5000",
        "worker.1": "5100",
        "-dash.1": "5200",
        "-dash.2": "5201",
    }
    (tmp_path / ".env").write_text("WAIT=1\n")
    for path in tmp_path.glob("seen-*"):
        path.unlink()
    seen, _ = up(tmp_path, tag, "--", "-dash")
    # As in honcho, only the types started count for PORT.
    assert {name: env["PORT"] for name, env in seen.items()} == {"-dash.1": "5000"}


@pytest.mark.slow
def test_up_env_values_reach_the_processes_as_read(tmp_path: Path, tag: str) -> None:
    cases = [c for c in ENV_CASES if "\n" not in c[0].rstrip("\n") and "export" not in c[0]]
    text = "\n".join(line for line, _ in cases)
    expected: dict[str, str] = {}
    for _, variables in cases:
        expected |= variables
    (tmp_path / "Procfile").write_text(f"web: {DUMP}\n")
    (tmp_path / ".env").write_text(f"WAIT=1\n{text}\nFROM_SHELL=from-the-env-file\n")
    seen, _ = up(tmp_path, tag, shell={"FROM_SHELL": "from-the-shell", "EXPORTED": "shell"})
    env = seen["web.1"]
    assert {k: env.get(k) for k in expected} == expected
    assert env["FROM_SHELL"] == "from-the-env-file"  # .env beats the shell, as in honcho
    assert env["EXPORTED"] == "shell"


@pytest.mark.slow
def test_up_export_line_is_skipped_and_said(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text(f"web: {DUMP}\n")
    (tmp_path / ".env").write_text("WAIT=1\nexport EXPORTED=yes\n")
    seen, lines = up(tmp_path, tag)
    assert "EXPORTED" not in seen["web.1"]
    said = [m for m in messages(lines, "system") if "export" in m]
    assert said == [
        ".env, line 2: an 'export' line is skipped, as honcho and foreman skip it "
        "(write NAME=value to set it)"
    ], lines


@pytest.mark.slow
@pytest.mark.parametrize("spelling", [["-e", "one.env,two.env"], ["-e", " one.env , two.env "]])
def test_up_several_env_files_comma_separated(
    tmp_path: Path, tag: str, spelling: list[str]
) -> None:
    (tmp_path / "Procfile").write_text(f"web: {DUMP}\n")
    (tmp_path / ".env").write_text("WAIT=1\nA=from-default\n")
    (tmp_path / "one.env").write_text("WAIT=1\nA=one\nB=one\n")
    (tmp_path / "two.env").write_text("B=two\n")
    seen, _ = up(tmp_path, tag, *spelling)
    env = seen["web.1"]
    assert (env["A"], env["B"]) == ("one", "two")


@pytest.mark.slow
def test_up_missing_env_file_of_a_list_is_an_error(tmp_path: Path, tag: str) -> None:
    """honcho skips a missing file of ``-e`` silently; corral says which (and starts nothing)."""
    (tmp_path / "Procfile").write_text("web: touch started\n")
    (tmp_path / "one.env").write_text("A=1\n")
    out = corral("up", "-e", "one.env,missing.env", cwd=tmp_path, tag=tag)
    assert out.returncode == 2
    assert out.stderr == "corral: error: the env file missing.env does not exist\n"
    assert not (tmp_path / "started").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dotenv", "shell", "args", "used"),
    [
        ("", {}, [], "Procfile"),
        ("", {"PROCFILE": "Procfile.shell"}, [], "Procfile.shell"),
        ("PROCFILE=Procfile.env\n", {}, [], "Procfile.env"),
        ("PROCFILE=Procfile.env\n", {"PROCFILE": "Procfile.shell"}, [], "Procfile.env"),
        (
            "PROCFILE=Procfile.env\n",
            {"PROCFILE": "Procfile.shell"},
            ["-f", "Procfile.f"],
            "Procfile.f",
        ),
        ("PROCFILE=Procfile.env\n", {}, ["Procfile.f"], "Procfile.f"),
    ],
    ids=["default", "environment", "dotenv", "dotenv-over-environment", "f-over-all", "argument"],
)
def test_up_procfile_variable(
    tmp_path: Path, tag: str, dotenv: str, shell: dict[str, str], args: list[str], used: str
) -> None:
    for name in ("Procfile", "Procfile.shell", "Procfile.env", "Procfile.f"):
        (tmp_path / name).write_text(f"{name.replace('.', '-')}: {DUMP}\n")
    (tmp_path / ".env").write_text(f"WAIT=1\n{dotenv}")
    seen, _ = up(tmp_path, tag, *args, shell=shell)
    assert list(seen) == [f"{used.replace('.', '-')}.1"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dotenv", "shell", "args", "base"),
    [
        ("", {}, [], 5000),
        ("", {"PORT": "7000"}, [], 7000),
        ("", {"PORT": "7000"}, ["-p", "8000"], 8000),
        ("PORT=6000\n", {"PORT": "7000"}, [], 6000),
        ("PORT=6000\n", {"PORT": "7000"}, ["-p", "8000"], 6000),
        ("", {"PORT": "not-a-port"}, ["-p", "8000"], 8000),
    ],
    ids=["default", "environment", "p-over-environment", "dotenv", "dotenv-over-p", "p-only"],
)
def test_up_port_precedence_as_honcho(
    tmp_path: Path, tag: str, dotenv: str, shell: dict[str, str], args: list[str], base: int
) -> None:
    (tmp_path / "Procfile").write_text(f"web: {DUMP}\nworker: {DUMP}\n")
    (tmp_path / ".env").write_text(f"WAIT=2\n{dotenv}")
    seen, lines = up(tmp_path, tag, *args, shell=shell)
    assert (seen["web.1"]["PORT"], seen["worker.1"]["PORT"]) == (str(base), str(base + 100))
    said = [m for m in messages(lines, "system") if "base port" in m]
    if dotenv and args:
        assert said == [
            "PORT=6000 from the .env files is the base port, not -p 8000 (as in honcho)"
        ]
    else:
        assert said == []


@pytest.mark.slow
def test_up_only_the_types_started_count_for_port(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text(f"web: {DUMP}\nworker: {DUMP}\n")
    (tmp_path / ".env").write_text("WAIT=1\n")
    seen, _ = up(tmp_path, tag, "worker")
    assert {name: env["PORT"] for name, env in seen.items()} == {"worker.1": "5000"}


@pytest.mark.slow
def test_up_concurrency_of_an_unknown_type_is_an_error(tmp_path: Path, tag: str) -> None:
    """honcho ignores ``-c nosuch=2``; corral says so and starts nothing."""
    (tmp_path / "Procfile").write_text("web: touch started\n")
    out = corral("up", "-c", "nosuch=2", cwd=tmp_path, tag=tag)
    assert out.returncode == 2
    assert "no process named 'nosuch'" in out.stderr and len(out.stderr.splitlines()) == 1
    assert not (tmp_path / "started").exists()
