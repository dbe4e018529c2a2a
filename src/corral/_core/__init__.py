"""The core: one child process and its supervision, the floor everything else stands on.

What it takes to start one child and never lose it: the start options
checked once (``_options``; ``_stdio``, what its streams are connected to),
the spawn (``_spawn``: its descriptors, its environment), the loop side of
its pipes (``_pipes``), the start-up report (``_handshake``), the
supervisor that watches it until it is reaped (``_supervisor``, one run of
it at a time: ``_run``), the :class:`Process` handle its owner holds
(``_process``), the fan-out of stop signals to every child (``_signals``),
the loop token (``_token``) and what each child costs (``_usage``).

It knows nothing of runners, launches or monitors: those stand on it (the
runner, :mod:`corral._runner`, is the floor on top that puts them together).

Public face: _options, _stdio, _process, _token, _spawn, _supervisor, _signals, _usage, _run,
_pipes, _stop
"""
