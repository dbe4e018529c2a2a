"""The core: a runner owns child processes as a nursery owns tasks.

``_runner`` (the :class:`Runner`, its public API), ``_children`` (how a child
is started, named and observed), ``_scope`` (its entry and
exit: the task group and the services that live as long as it),
``_options`` (what a start takes), ``_process`` (the :class:`Process`
handle), ``_supervisor`` (the machinery behind it: each run's core and
watch, stops, restarts), ``_run`` (one run of a child: its pipes, its
streams), ``_stdio`` (what a child's streams are connected to), ``_spawn``
(one child's options checked, its descriptors and environment made),
``_handshake`` (the start-up report), ``_signals`` (signals fanned out to
every child), ``_lifeline`` (a helper that kills every child if the
launcher dies) and ``_token`` (the loop token).

Public face: _runner, _process, _options, _stdio, _token
"""
