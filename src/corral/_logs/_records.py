"""The one factory of :class:`logging.LogRecord` objects for records from children.

``logging.LogRecord.__init__`` looks up the current thread, process and
more on every call, and splits the caller's path; for a line of child output
or a record that came over the wire, those fields are fixed or known.  So
records are made as a copy of a template dictionary, several times faster.

Every record corral makes carries two attributes of its own:
``corral_source``, the dotted source (``<runner>.<process>``, or
``<runner>`` for the runner's own lifecycle records), and ``corral_stream``
(``"stdout"``, ``"stderr"``, ``"logging"`` or ``None``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._wire import Record

__all__ = [
    "believable",
    "format_message",
    "level_number",
    "make_record",
    "source_of",
    "wire_message",
]

_PROBE: Final = logging.LogRecord("corral", logging.INFO, "", 0, "", None, None)
_TEMPLATE: Final = dict(_PROBE.__dict__)
_TEMPLATE.update(
    pathname="",
    filename="",
    module="",
    lineno=0,
    funcName=None,
    thread=None,
    threadName=None,
    taskName=None,
)
#: When the logging module was loaded, in :func:`time.time` seconds, as
#: every LogRecord's ``relativeCreated`` counts from it.
_LOGGING_START: Final = _PROBE.created - _PROBE.relativeCreated / 1000
_LEVEL_NAMES: dict[int, str] = {}


def _level_name(level: int) -> str:
    name = _LEVEL_NAMES.get(level)
    if name is None:
        name = logging.getLevelName(level)
        if len(_LEVEL_NAMES) < 256:
            _LEVEL_NAMES[level] = name
    return name


def make_record(
    name: str,
    level: int,
    msg: str,
    *,
    created: float | None = None,
    source: str | None = None,
    stream: str | None = None,
    pid: int | None = None,
    levelname: str | None = None,
) -> logging.LogRecord:
    """A :class:`logging.LogRecord` with these fields, the rest as for a bare message."""
    record = logging.LogRecord.__new__(logging.LogRecord)
    fields = record.__dict__
    fields.update(_TEMPLATE)
    if created is None:
        created = time.time()
    fields["name"] = name
    fields["msg"] = msg
    fields["levelno"] = level
    fields["levelname"] = levelname if levelname is not None else _level_name(level)
    fields["created"] = created
    fields["msecs"] = (created - int(created)) * 1000
    fields["relativeCreated"] = (created - _LOGGING_START) * 1000
    fields["corral_source"] = source if source is not None else name
    fields["corral_stream"] = stream
    if pid is not None:
        fields["process"] = pid
    return record


def source_of(record: logging.LogRecord) -> str:
    """The source a record came from (its logger name when it has none)."""
    source = getattr(record, "corral_source", None)
    return source if isinstance(source, str) else record.name


MAX_ABS_CREATED: Final = 1e11  # about the year 5138: further is nonsense


def believable(created: float) -> float:
    """A sender's time stamp, or the arrival time if it is nonsense."""
    if abs(created) < MAX_ABS_CREATED:  # NaN and the infinities are not
        return created
    return time.time()


def wire_message(rec: Record) -> str:
    """The text of a record from the wire, as the files and the console show it."""
    message = f"{rec.name}: {rec.msg}" if rec.name else rec.msg
    if rec.exc_text:
        message = f"{message}\n{rec.exc_text}"
    if rec.stack_info:
        message = f"{message}\n{rec.stack_info}"
    return message


def format_message(record: logging.LogRecord) -> str:
    message = record.getMessage()
    if getattr(record, "corral_stream", None) == "logging":
        message = f"{record.name}: {message}"
    if record.exc_text:
        message = f"{message}\n{record.exc_text}"
    elif record.exc_info:
        message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
    if record.stack_info:
        message = f"{message}\n{record.stack_info}"
    return message


def level_number(name: str) -> int:
    """The number of a level named ``name`` (``"warning"``, ``"INFO"``); 0 if there is none."""
    value = logging.getLevelName(name.upper())
    return value if isinstance(value, int) else 0
