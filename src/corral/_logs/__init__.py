"""The log path: every line and record of every child, on its way to the handlers.

In the order a line travels: ``_wire`` (the frame format of log connections)
and ``_child_logging`` (the child's handler) are the child side, standard
library and msgspec only; then ``_records`` (the factory of
:class:`logging.LogRecord` objects and the formatting helpers), ``_chunks``
(what producers queue: :class:`Chunk` and its :class:`StreamState`; a
child's pipes are read into them by :mod:`corral._core._pipes`), ``_server``
(the runner's log socket),
``_collector`` (the bounded hand-off to one worker thread), ``_router``
(blocks into lines and records, routed as ``_route``'s records say:
a light module, which the runner's keywords name), ``_sinks`` and ``_console``
(corral's own destinations: files, the console; ``_terminal`` is what the
console lets through to a terminal), ``_sources`` (sources,
their backlogs, live tails) and ``_hub`` (one runner's log service, which
owns the rest).

Public face: _wire, _child_logging, _records, _chunks, _collector, _route, _router, _sinks,
_console, _sources, _hub, _terminal
"""
