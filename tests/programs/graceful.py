"""A program that cleans up for a while after a stop signal, and writes down that it did.

    python tests/programs/graceful.py OUT SECONDS

Once its handlers are in place it reports its start (:func:`corral.child.started`,
when it was started with the handshake) and prints ``ready``.  On SIGTERM, SIGINT
or SIGHUP it writes ``cleaning <SIGNAL>`` to OUT and prints it, takes SECONDS
as a clean-up would (a sleep: it is the program under test, not a test
waiting), then appends ``clean`` to OUT and exits 0.  Run under a shell that
does not ``exec`` it (``sh -c 'python graceful.py OUT 1; echo after'``), it is
what a Procfile line without ``exec`` runs: the shell dies at once on the
signal, the program goes on in the same process group.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType


def main(out: str, seconds: float) -> None:
    def clean_up(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        with open(out, "a") as f:
            f.write(f"cleaning {name}\n")
        try:
            print(f"cleaning {name}", flush=True)
        except OSError:
            pass  # nobody reads its output any more (a daemon's, once its parent is gone)
        time.sleep(seconds)
        with open(out, "a") as f:
            f.write("clean\n")
        os._exit(0)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, clean_up)
    if "CORRAL_STARTED_FD" in os.environ:
        import corral.child

        corral.child.started()
    print("ready", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
