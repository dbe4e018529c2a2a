"""The ``corral`` command: ``corral run``, ``corral up``, ``corral tail`` and ``corral status``.

``_main`` (the group with its commands, and :func:`main`, the console
script), ``_group`` (the group and what its commands share), ``_io`` (its
stdout, its one-line errors, exit codes), ``_loop`` (the runner loop and the
status table of ``run`` and ``up``), ``_run``, ``_up`` (with ``_procfile``),
``_tail`` and ``_snapshot`` (``corral status``), one module per command;
``__main__`` for ``python -m corral._cli``.

Public face: _main
"""
