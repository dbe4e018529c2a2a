"""The source of the functions a launch sends, so that a worker's traceback shows it.

cloudpickle sends a function defined in ``__main__``, in a notebook cell or by
``exec`` by value: its code, not its source, and under the file name
``<dynamic-code>``.  A traceback in the worker then has no line to show.
:func:`dumps` pickles with cloudpickle, but each code object it sends by value
keeps its file name and carries the lines it spans, as the launcher's
:mod:`linecache` has them (a script's file, a notebook's cell, whatever a tool
registered); :func:`restore_code`, called as the worker unpickles, puts the
file name back and registers the lines in the worker's :mod:`linecache`.  A
traceback there (and :func:`inspect.getsource`) then shows what it would show
on the launcher, and nothing where it would show nothing (code compiled from a
string under ``<string>``).

At most :data:`MAX_SOURCE` bytes of lines travel with one job; the code beyond
it still runs, without its lines.  This module is imported by every worker: it
needs only :mod:`linecache` there (cloudpickle is imported to pickle only).
"""

from __future__ import annotations

import linecache
import types
from collections.abc import Callable
from functools import cache
from typing import Any

__all__ = ["MAX_SOURCE", "dumps", "pickle_job", "restore_code"]

#: The most source text (in bytes, UTF-8) one job carries for its tracebacks.
MAX_SOURCE = 1024 * 1024

#: The file name cloudpickle gives every code object it sends by value.
_DYNAMIC = "<dynamic-code>"


def restore_code(code: types.CodeType, filename: str, lines: dict[int, str]) -> types.CodeType:
    """``code`` under its own ``filename``; ``lines`` (number -> text) added to linecache."""
    if lines:
        # On top of what this host knows of the file (code of it imported here
        # by reference keeps its own lines); the shipped lines win.
        known = list(linecache.getlines(filename))
        known.extend([""] * (max(lines) - len(known)))
        for number, text in lines.items():
            known[number - 1] = text
        # No modification time: linecache.checkcache() leaves such an entry alone.
        linecache.cache[filename] = (sum(map(len, known)), None, known, filename)
    return code.replace(co_filename=filename)


def _line_numbers(code: types.CodeType) -> range:
    """The lines ``code`` spans: from its first (``def``, or a decorator) to its last."""
    last = max((line for _start, _end, line in code.co_lines() if line is not None), default=0)
    return range(code.co_firstlineno, max(last, code.co_firstlineno) + 1)


@cache
def _pickler_type() -> type[Any]:
    import cloudpickle

    class SourcePickler(cloudpickle.Pickler):  # type: ignore[misc]
        """cloudpickle's pickler, with each code object's file name and lines kept."""

        def __init__(self, file: Any) -> None:
            super().__init__(file)
            self.sent: dict[str, set[int]] = {}
            self.budget = MAX_SOURCE

        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is types.CodeType and obj.co_filename != _DYNAMIC:
                return restore_code, (
                    obj.replace(co_filename=_DYNAMIC),  # pickled by cloudpickle, as before
                    obj.co_filename,
                    self._lines(obj),
                )
            return super().reducer_override(obj)

        def _lines(self, code: types.CodeType) -> dict[int, str]:
            every = linecache.getlines(code.co_filename)
            sent = self.sent.setdefault(code.co_filename, set())
            lines: dict[int, str] = {}
            for number in _line_numbers(code):
                if number in sent:
                    continue
                if 1 <= number <= len(every):
                    size = len(every[number - 1].encode("utf-8", "surrogatepass"))
                    if size > self.budget:
                        break
                    self.budget -= size
                    lines[number] = every[number - 1]
                    sent.add(number)
            return lines

    return SourcePickler


def dumps(obj: object) -> bytes:
    """``obj`` pickled by cloudpickle, with the source lines of the code it sends by value."""
    import io

    buffer = io.BytesIO()
    _pickler_type()(buffer).dump(obj)
    return buffer.getvalue()


def pickle_job(func: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """``func`` and ``args`` pickled for the workers (:func:`dumps`); else ``TypeError``."""
    if not callable(func):
        raise TypeError(f"launch needs a callable, not {type(func).__name__}")
    try:
        return dumps((func, args))
    except Exception as exc:
        raise TypeError(
            f"cannot send {func!r} and its arguments to the workers: {exc} "
            "(they travel pickled with cloudpickle)"
        ) from exc
