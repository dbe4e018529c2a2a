"""The options of a runner, a start and a launch are spelled once, and every signature shows them.

Each blocking twin takes exactly the keywords of its async twin, but for the
deliberate differences of :data:`TWINS`, each with its reason: a keyword added
to one entry point and not to its twin fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import subprocess
import typing
from pathlib import Path

import msgspec
import pytest

import corral
from corral import _checks
from corral._core._options import ProcessOptions, RestartPolicy, StartOptions
from corral._launch import _link
from corral._launch._link import AgentConfig
from corral._launch._plan import make_plan
from corral._runner._options import RunnerOptions, RunnerSpec
from corral._scaleout import LaunchOptions, LaunchSpec
from corral._sys._platform import PopenArgs


@pytest.mark.parametrize(
    ("keywords", "spec"),
    [(StartOptions, ProcessOptions), (LaunchOptions, LaunchSpec), (RunnerOptions, RunnerSpec)],
)
def test_the_typed_keywords_are_the_fields_with_their_types(
    keywords: type[object], spec: type[object]
) -> None:
    names = [f.name for f in dataclasses.fields(spec)]  # type: ignore[arg-type]
    assert list(keywords.__annotations__) == names
    assert typing.get_type_hints(keywords) == typing.get_type_hints(spec)
    assert keywords.__total__ is False  # type: ignore[attr-defined]


def _keywords(fn: object) -> list[tuple[str, object]]:
    return [
        (p.name, p.default)
        for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


def _fields(spec: type[object]) -> list[tuple[str, object]]:
    return [(f.name, f.default) for f in dataclasses.fields(spec)]  # type: ignore[arg-type]


def test_launch_now_takes_the_runner_s_keywords_and_the_launch_s() -> None:
    hints = typing.get_type_hints(corral.RunnerLaunchOptions)
    launch_hints = typing.get_type_hints(LaunchOptions)
    # corral.launch's own backend= names the event loop or, as torchrunx's, the process group.
    del launch_hints["backend"]
    assert "backend" in inspect.signature(corral.launch).parameters
    assert hints == {**launch_hints, **typing.get_type_hints(RunnerOptions)}
    assert hints["grace"] is float  # the runner's, which the launch inherits
    assert corral.RunnerLaunchOptions.__total__ is False  # type: ignore[attr-defined]


def test_the_signatures_show_every_keyword_with_its_default() -> None:
    assert _keywords(corral.open_runner) == _fields(RunnerSpec)
    assert _keywords(corral.Runner) == _fields(RunnerSpec)
    assert _keywords(corral.Runner.start) == _fields(ProcessOptions)
    assert _keywords(corral.Runner.run) == [("input", None), *_fields(ProcessOptions)]
    assert _keywords(corral.Runner.launch) == _fields(LaunchSpec)
    assert _keywords(corral.Runner.launch_command) == _fields(LaunchSpec)
    start = inspect.signature(corral.Runner.start)
    assert list(start.parameters)[:2] == ["self", "argv"]
    assert start.parameters["stdout"].default is corral.LOG
    assert start.parameters["stdin"].default == corral.DEVNULL
    launch = inspect.signature(corral.Runner.launch)
    assert [p.kind for p in list(launch.parameters.values())[:3]] == [
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.VAR_POSITIONAL,
    ]


@pytest.mark.anyio
async def test_an_unknown_keyword_is_refused_as_python_refuses_it() -> None:
    async with corral.open_runner(console=False) as r:
        for call, what in [
            (lambda: r.start(["true"], text=True), "Runner.start"),  # type: ignore[call-arg]
            (lambda: r.run(["true"], text=True), "Runner.run"),  # type: ignore[call-arg]
            (lambda: r.launch(print, nodes=2), "Runner.launch"),  # type: ignore[call-arg]
            (lambda: r.launch_command(["true"], nodes=2), "Runner.launch_command"),  # type: ignore[call-arg]
        ]:
            with pytest.raises(TypeError) as caught:
                await call()
            word = "text" if "launch" not in what else "nodes"
            assert str(caught.value) == f"{what}() got an unexpected keyword argument {word!r}"
        assert r.processes == ()


#: Each async entry point, its blocking twin, and the keywords only the twin has, with why.
TWINS: list[tuple[object, object, dict[str, str]]] = [
    (
        corral.open_runner,
        corral.open_runner_sync,
        {"backend": "the helper thread's event loop; an async runner runs on its caller's"},
    ),
    (corral.Runner, corral.open_runner_sync, {"backend": "the same"}),
    (corral.Runner.start, corral.SyncRunner.start, {}),
    (corral.Runner.run, corral.SyncRunner.run, {}),
    (corral.Runner.launch, corral.SyncRunner.launch, {}),
    (corral.Runner.launch_command, corral.SyncRunner.launch_command, {}),
    (corral.Process.stop, corral.SyncProcess.stop, {}),
    (corral.Process.logs, corral.SyncProcess.logs, {}),
    (
        corral.Process.wait,
        corral.SyncProcess.wait,
        {"timeout": "as subprocess.Popen.wait; async code bounds a wait with a cancel scope"},
    ),
]


def _type(fn: object, annotation: object) -> object:
    """A parameter's type, evaluated as :func:`typing.get_type_hints` would."""
    if not isinstance(annotation, str):
        return annotation
    return eval(annotation, fn.__globals__)  # type: ignore[attr-defined]


def _parameters(fn: object) -> dict[str, tuple[object, object]]:
    """The keywords ``fn``'s signature shows: name -> (default, type)."""
    return {
        p.name: (p.default, _type(fn, p.annotation))
        for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and p.name != "self"
    }


def _typed_keywords(fn: object) -> dict[str, object]:
    """The keywords a type checker sees ``fn`` take: its own, and its ``**options``' TypedDict's."""
    if isinstance(fn, type):
        fn = fn.__init__  # type: ignore[misc]
    code = fn.__code__  # type: ignore[attr-defined]
    annotations = fn.__annotations__  # type: ignore[attr-defined]
    named = code.co_argcount + code.co_kwonlyargcount
    result = {
        name: _type(fn, annotations.get(name))
        for name in code.co_varnames[code.co_posonlyargcount : named]
        if name != "self"
    }
    if code.co_flags & inspect.CO_VARKEYWORDS:
        options = code.co_varnames[named + bool(code.co_flags & inspect.CO_VARARGS)]
        unpack = _type(fn, annotations.get(options))
        assert typing.get_origin(unpack) is typing.Unpack, (
            f"{fn.__qualname__}(**{options}): not an Unpack of a TypedDict, so typos pass"  # type: ignore[attr-defined]
        )
        (keywords,) = typing.get_args(unpack)
        result.update(typing.get_type_hints(keywords))
    return result


ENTRY_POINTS = sorted(
    {fn for pair in TWINS for fn in pair[:2]} | {corral.launch},  # type: ignore[arg-type]
    key=lambda fn: fn.__qualname__,
)


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=[fn.__qualname__ for fn in ENTRY_POINTS])
def test_the_signature_shows_what_a_type_checker_sees(fn: object) -> None:
    shown = {name: hint for name, (_, hint) in _parameters(fn).items()}
    assert shown == _typed_keywords(fn)


@pytest.mark.parametrize(
    ("async_fn", "sync_fn", "only_sync"),
    TWINS,
    ids=[t[1].__qualname__ for t in TWINS],  # type: ignore[attr-defined]
)
def test_each_blocking_twin_takes_its_async_twin_s_keywords(
    async_fn: object, sync_fn: object, only_sync: dict[str, str]
) -> None:
    theirs = _typed_keywords(sync_fn)
    for name in only_sync:
        assert theirs.pop(name, None) is not None, f"{name} is no longer a difference"
    assert theirs == _typed_keywords(async_fn)
    assert all(only_sync.values()), "every difference has its reason"
    shown = _parameters(sync_fn)
    for name in only_sync:
        shown.pop(name)
    assert shown == _parameters(async_fn), "and with the same defaults"


def test_launch_takes_the_runner_s_keywords_and_the_launch_s() -> None:
    """``corral.launch`` is ``open_runner_sync`` and ``launch`` in one call, ``grace`` once."""
    only_here = {
        "backend": "the event loop, as open_runner_sync's, or (torchrunx's values) the "
        "process group, as Runner.launch's: one keyword for both, since they never collide",
        "hostnames": "torchrunx's spelling of hosts, with torchrunx's meanings",
    }
    for keywords in (_typed_keywords, _parameters):
        theirs: dict[str, object] = keywords(corral.launch)  # type: ignore[assignment]
        for name in only_here:
            theirs.pop(name)
        launchs: dict[str, object] = keywords(corral.Runner.launch)  # type: ignore[assignment]
        launchs.pop("backend")  # corral.launch's own, above
        assert theirs == {**launchs, **keywords(corral.open_runner)}


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: corral.open_runner(grase=1.0), "open_runner"),
        (lambda: corral.Runner(grase=1.0), "Runner"),
        (lambda: corral.open_runner_sync(grase=1.0), "open_runner_sync"),
        (lambda: corral.launch(print, grase=1.0), "launch"),
    ],
    ids=["open_runner", "Runner", "open_runner_sync", "launch"],
)
def test_an_unknown_runner_keyword_is_refused_before_anything_starts(
    call: typing.Callable[[], object], what: str
) -> None:
    with pytest.raises(TypeError) as caught:
        call()
    assert str(caught.value) == f"{what}() got an unexpected keyword argument 'grase'"


# -- a launch's options: one record from the call to the agents ---------------------------------

#: The fields of an agent's configuration that are its own, not options of the launch.
AGENT_OWN = {"secret", "address", "port", "index", "host", "python", "watch_stdin", "usage"}


def test_the_agent_s_configuration_takes_the_launch_s_options_by_their_names() -> None:
    """A field of ``AgentConfig`` is the agent's own, or an option of the launch, same type."""
    launch_hints = typing.get_type_hints(LaunchSpec)
    agent_hints = typing.get_type_hints(AgentConfig)
    options = set(agent_hints) - AGENT_OWN
    assert options <= set(launch_hints), f"neither the agent's own nor options: {options}"
    assert options, "the agent keeps some of the launch's options"
    for name in options:
        assert agent_hints[name] == launch_hints[name], name
    # No default of its own: an option's default is said once, in LaunchSpec.
    defaulted = {f.name for f in msgspec.structs.fields(AgentConfig) if f.required is False}
    assert not defaulted & options, defaulted & options


@pytest.mark.anyio
async def test_each_host_s_job_and_agent_get_the_checked_options() -> None:
    spec = LaunchSpec(
        hosts=["a.invalid", "b.invalid"],
        workers_per_host=[2, 3],
        start_timeout=7,
        link_timeout=3,
        log_level=logging.INFO,
        host_log_dir=Path("/tmp/agent-logs"),
        master_port=29400,
    )
    plan = await make_plan(spec, default_grace=2.5)
    assert (plan.hosts, plan.counts, plan.firsts, plan.world_size) == (
        ["a.invalid", "b.invalid"],
        [2, 3],
        [0, 2],
        5,
    )
    job = plan.job(1, b"", "a.invalid", 1234)
    assert (job.first_rank, job.workers, job.groups, job.world_size) == (2, 3, 2, 5)
    assert (job.grace, job.master_addr, job.master_port) == (2.5, "a.invalid", 29400)
    config = _link.decode_config(plan.agent_config(secret="s", address="x", port=1))
    assert (config.start_timeout, config.link_timeout) == (7.0, 3.0)
    assert (config.log_level, config.host_log_dir) == (logging.INFO, "/tmp/agent-logs")


def test_the_checked_options_are_in_their_checked_form() -> None:
    checked = LaunchSpec(hosts=["a"], forward_env=["X*"], copy_env=["Y"]).checked(2.5)
    assert checked.hosts == ("a",) and checked.forward_env == ("X*",)
    assert checked.copy_env == ("Y",) and checked.grace == 2.5 and checked.ssh == corral.SSH()
    assert checked.checked(1.0) == checked  # checking twice changes nothing
    assert LaunchSpec(grace=0).checked(2.5).grace == 0.0


@pytest.mark.parametrize(
    ("check", "value", "error", "said"),
    [
        (lambda v: _checks.check_seconds(v, "t"), "1", TypeError, "t must be a number of seconds"),
        (lambda v: _checks.check_seconds(v, "t"), True, TypeError, "not bool"),
        (lambda v: _checks.check_seconds(v, "t"), -1, ValueError, "t must be a finite"),
        (lambda v: _checks.check_seconds(v, "t"), float("nan"), ValueError, "finite"),
        (lambda v: _checks.check_seconds(v, "t", positive=True), 0, ValueError, "positive"),
        (lambda v: _checks.check_seconds(v, "t", positive=True), float("inf"), ValueError, "t "),
        (lambda v: _checks.check_host(v, "h"), "", ValueError, "h: '' is not a host name"),
        (lambda v: _checks.check_host(v, "h"), "a\nb", ValueError, "printable UTF-8"),
        (lambda v: _checks.check_host(v, "h"), "a\udcff", ValueError, "printable UTF-8"),
        (lambda v: _checks.check_host(v, "h"), 1, ValueError, "h: 1 is not"),
        (lambda v: _checks.check_port(v, "p"), 0, ValueError, "p must be a TCP port"),
        (lambda v: _checks.check_port(v, "p"), 65536, ValueError, "1 to 65535"),
        (lambda v: _checks.check_port(v, "p"), True, ValueError, "not True"),
        (lambda v: _checks.check_globs(v, "g"), "X*", TypeError, "g must be a sequence of globs"),
        (lambda v: _checks.check_globs(v, "g"), ["X", 3], TypeError, "g: 3 is not a glob"),
        (lambda v: _checks.check_path(v, "d"), 3, TypeError, "d must be a path, not int"),
        (lambda v: _checks.check_path(v, "d"), "a\0b", ValueError, "without NUL"),
        (lambda v: _checks.check_path(v, "d"), "", ValueError, "d must be a path"),
    ],
)
def test_each_check_names_what_it_checks(
    check: typing.Callable[[object], object], value: object, error: type[Exception], said: str
) -> None:
    with pytest.raises(error) as caught:
        check(value)
    assert said in str(caught.value)


def test_each_check_gives_the_value_in_its_checked_form() -> None:
    assert _checks.check_seconds(2, "t") == 2.0 and isinstance(_checks.check_seconds(2, "t"), float)
    assert _checks.check_host("node-1.example", "h") == "node-1.example"
    assert _checks.check_port(29500, "p") == 29500
    assert _checks.check_globs(["A*", "B"], "g") == ("A*", "B")
    assert _checks.check_path(Path("/tmp/x"), "d") == "/tmp/x"


# -- a start is checked in one place: ProcessOptions.checked ----------------------------------


@pytest.mark.parametrize(
    ("options", "error", "said"),
    [
        ({"cwd": 3}, TypeError, "cwd must be a path, not int"),
        ({"pass_fds": "3"}, TypeError, "pass_fds must be a collection"),
        ({"pass_fds": [1]}, ValueError, "use stdin/stdout/stderr for 0-2"),
        ({"pass_fds": [3], "wait_started": True}, ValueError, "may not contain 3 with wait_"),
        ({"umask": "022"}, TypeError, "umask must be an int"),
        ({"umask": True}, TypeError, "umask must be an int"),
        ({"extra_groups": "wheel"}, TypeError, "extra_groups must be a collection"),
        ({"env": ["A=1"]}, TypeError, "env must be a mapping"),
        ({"env": {"A=B": "1"}}, ValueError, "env: 'A=B' is not a valid variable name"),
        ({"extra_env": {"A": 1}}, TypeError, "extra_env['A'] must be a str, not int"),
        ({"extra_env": {"A": "x\0y"}}, ValueError, "extra_env['A'] contains a NUL"),
        ({"stdin": corral.LOG}, TypeError, "stdin cannot be corral.LOG"),
        ({"stdout": subprocess.STDOUT}, ValueError, "subprocess.STDOUT is only for stderr"),
        ({"stderr": object()}, TypeError, "stderr=<object"),
        ({"grace": -1}, ValueError, "grace"),
        ({"stop_signal": 0}, ValueError, "stop_signal"),
        ({"start_timeout": 2}, ValueError, "start_timeout needs wait_started=True"),
        ({"start_timeout": -2, "wait_started": True}, ValueError, "start_timeout"),
        ({"restart": "sometimes"}, ValueError, "expected 'never', 'on-failure' or 'always'"),
        ({"max_restarts": -1}, ValueError, "max_restarts must be an int >= 0"),
        ({"backoff": float("nan")}, ValueError, "backoff"),
        ({"name": "a b"}, ValueError, "process name 'a b' must be 1-100 characters"),
        ({"name": "x" * 101}, ValueError, "must be 1-100 characters"),
    ],
)
def test_every_start_option_is_checked_by_checked(
    options: dict[str, object], error: type[Exception], said: str
) -> None:
    """A pure check: no runner, no spawn."""
    with pytest.raises(error) as caught:
        ProcessOptions(**options).checked(["true"])  # type: ignore[arg-type]
    assert said in str(caught.value)


def test_checked_gives_the_start_in_its_checked_form() -> None:
    spec = ProcessOptions(
        cwd=Path("/tmp"), pass_fds=[7, 5, 7], extra_groups=["a"], env={"A": "1"}, name="web"
    ).checked(("python", "-V"))
    assert spec.argv == ["python", "-V"] and spec.program == "python" and spec.name == "web"
    assert spec.popen == PopenArgs(cwd="/tmp", pass_fds=(5, 7), extra_groups=("a",))
    assert spec.env == {b"A": b"1"} and spec.extra_env is None
    assert (spec.grace, spec.stop_signal) == (None, None)  # the runner's, at the start
    assert spec.policy == RestartPolicy("never", 3, 1.0)
    with pytest.raises(TypeError, match="not a str"):
        ProcessOptions().checked("python -V")


def test_every_popen_style_option_reaches_popen_under_its_own_name() -> None:
    """Adding a Popen-style option is a field of PopenArgs: it reaches Popen as it is."""
    fields = [f.name for f in dataclasses.fields(PopenArgs)]
    popen = inspect.signature(subprocess.Popen).parameters
    assert all(name in popen for name in fields), fields
    assert list(PopenArgs().popen_keywords()) == fields
    # The start options are those fields and corral's: the keywords of Runner.start.
    assert fields == [f.name for f in dataclasses.fields(ProcessOptions)][: len(fields)]
