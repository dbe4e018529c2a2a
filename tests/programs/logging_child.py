"""A child that logs through ``corral.child.connect`` from a thread, then ``os._exit(0)``.

Logger ``app.db``: one DEBUG record ``before start``; then, from a thread named ``db-thread``,
3,000 INFO records ``record N`` and an ERROR ``it broke`` with a ZeroDivisionError's
traceback.  It prints ``stamp TIME`` last and exits without ``logging.shutdown()`` or a
flush: nothing it logged may be lost.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import corral.child

corral.child.connect(logging.DEBUG)
log = logging.getLogger("app.db")
log.debug("before %s", "start", extra={})


def worker() -> None:
    for i in range(3000):
        log.info("record %d", i)
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        log.exception("it broke")


thread = threading.Thread(target=worker, name="db-thread")
thread.start()
thread.join()
print("stamp", time.time(), flush=True)
os._exit(0)
