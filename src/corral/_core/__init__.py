"""The core: a runner owns child processes as a nursery owns tasks.

``_runner`` (the :class:`Runner`, its public API), ``_process`` (the
:class:`Process` handle and its supervisor), ``_stdio`` (what a child's
streams are connected to), ``_spawn`` (one child's options checked, its
descriptors and environment made), ``_handshake`` (the start-up report),
``_signals`` (signals fanned out to every child), ``_lifeline`` (a helper
that kills every child if the launcher dies) and ``_token`` (the loop token).

Public face: _runner, _process, _stdio, _token
"""
