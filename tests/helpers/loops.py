"""Which event loop a test runs on: both where the loop is the subject, else one.

``tests/conftest.py``'s ``anyio_backend`` fixture runs every AnyIO test on asyncio and on
Trio.  That is right where what a test proves can differ by loop: the runner, the supervisor,
signals, the loop token, cancellation, the monitor's two servers, a launcher's own side.
Elsewhere (the log path's router, sinks, console and wire run on a worker thread whatever the
loop; the agents of a launch always run on asyncio; option checks run before any loop) the
second run proves nothing new and costs as much as the first.  Such a module says so at its
top, and keeps one end-to-end case on the other loop::

    from tests.helpers.loops import BOTH_LOOPS, OTHER_LOOP, one_loop

    anyio_backend = one_loop()  # the fixture, for this module: asyncio only


    @OTHER_LOOP  # the one end-to-end case on Trio
    async def test_a_flood_end_to_end() -> None: ...


    @BOTH_LOOPS  # this one's subject is a wait on the loop
    async def test_a_bounded_stop() -> None: ...

``tests/project/test_suite.py`` checks that every module that uses ``one_loop`` keeps a case on
the other loop.  CONTRIBUTING.md ("Which loop a test runs on") states the rule.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

__all__ = ["BOTH_LOOPS", "DEFAULT", "OTHER", "OTHER_LOOP", "one_loop"]

#: The loop of a module that runs on one: what most applications run.
DEFAULT = "asyncio"
#: The loop of each such module's end-to-end case.
OTHER = "trio"

#: A test of a one-loop module that runs on the other loop (its end-to-end case).
OTHER_LOOP = pytest.mark.parametrize("anyio_backend", [OTHER])
#: A test of a one-loop module whose subject can differ by loop: it runs on both.
BOTH_LOOPS = pytest.mark.parametrize("anyio_backend", [DEFAULT, OTHER])


def one_loop(backend: str = DEFAULT) -> Callable[[], str]:
    """The ``anyio_backend`` fixture of a module whose tests run on ``backend`` only."""

    @pytest.fixture(scope="module", name="anyio_backend")
    def fixture() -> str:
        return backend

    return fixture
