"""The runner: the scope that puts the whole product together, on top of every other floor.

A :class:`Runner` owns child processes as a nursery owns tasks.  It is the
composition root: it opens the log service (:mod:`corral._logs`), the
lifeline and the containment (:mod:`corral._sys`), starts each child through
the core (:mod:`corral._core`: one child and its supervision), and, when
asked, serves a monitor (:mod:`corral._monitor`) or runs a launch
(:mod:`corral._launch`), loading their code only then.

``_runner`` (the :class:`Runner` and :func:`open_runner`, its public API),
``_options`` (what :func:`open_runner` takes), ``_scope`` (its entry and
exit: the task group and the services that live as long as it),
``_children`` (the registry of its children: names, observers, services at
the end of the block) and ``_agent`` (the agent process of a launch on
another host: a runner of its own serving the launcher).

Public face: _runner, _options, _agent
"""
