"""Every place where a benchmark reaches into corral's private parts, and why.

The benchmarks use corral's public API.  What it does not offer (yet) is here, in
one module, so that a change of corral's internals is fixed in one place; each
entry says what a public replacement would be.
"""

from __future__ import annotations

from typing import Any

#: ``python -m`` target of the ``corral`` command, for when the console script is not
#: installed beside the interpreter (``bench/cli.py``): the package ``corral._cli`` and
#: its ``__main__``.  Public replacement: a ``corral/__main__.py`` (``python -m corral``).
CLI_MODULE = "corral._cli"


def monitor_clients(runner: Any) -> int:
    """How many clients the runner's monitor has attached (``bench/monitor.py``).

    Reads ``Runner._monitor`` (a ``corral._monitor._server.Monitor``) and its
    ``clients()``: corral has no public count of the monitor's clients (neither
    ``Runner.add_observer``, which sees processes, nor the monitor's messages give
    one).  Public replacement: such a count on the runner or in the monitor's status
    message.
    """
    monitor = runner._monitor
    assert monitor is not None, "the runner has no monitor"
    return len(monitor.clients())
