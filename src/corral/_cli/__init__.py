"""The ``corral`` command: ``run``, ``up`` (with ``check``, ``exec``, ``export``), ``tail``
and ``status``.

``_main`` (the group, whose commands are imported as they are used, and
:func:`main`, the console script), ``_group`` (what its commands share),
``_io`` (its stdout, its one-line errors, exit codes), ``_loop`` (the runner
loop and the status table of ``run`` and ``up``), ``_run``, ``_up`` (with
``check`` and ``exec``; ``_procfile`` reads what they read), ``_export``,
``_tail`` and ``_snapshot`` (``corral status``); ``__main__`` for ``python
-m corral._cli``.

Public face: _main
"""
