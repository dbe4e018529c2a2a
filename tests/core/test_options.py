"""The options of a start and of a launch are spelled once, and every signature shows them."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

import corral
from corral._core._options import ProcessOptions, StartOptions
from corral._launch._options import LaunchOptions, LaunchSpec


@pytest.mark.parametrize(
    ("keywords", "spec"),
    [(StartOptions, ProcessOptions), (LaunchOptions, LaunchSpec)],
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


def test_the_signatures_show_every_keyword_with_its_default() -> None:
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
