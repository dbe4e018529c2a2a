"""A plain script that uses corral's blocking face (``corral.launch``, ``open_runner_sync``).

``sync_script.py SCENARIO BACKEND TAG [ARG]``, every process it starts tagged
``CORRAL_TEST_TAG=TAG``; it takes Ctrl-C back if it was started with SIGINT ignored:

``launch``
    launches ``work(10)`` on 4 workers (each prints ``rank R of 4``, returns 10 + R) and
    prints ``result [10, 11, 12, 13]``.
``launch-interrupted``
    launches 4 workers that ignore SIGTERM, print ``ready`` and sleep (grace 1 s); on Ctrl-C
    it says ``caught KeyboardInterrupt`` on stderr and re-raises.
``runner-interrupted``
    a blocking runner (grace 1 s) with a child that ignores SIGTERM and one that does not,
    both ``ready``; then (ARG ``call``) a call of the runner, or (ARG ``body``) the body's own
    ``time.sleep``, waits; on Ctrl-C as above.
``loop-thread-interrupted``
    a blocking runner's call waits while a thread sends SIGINT to the runner's loop thread
    (once the child opened the FIFO named by ARG); on the KeyboardInterrupt as above.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import corral

# A test run under nohup or '&' may have SIGINT ignored: Ctrl-C must mean Ctrl-C here.
signal.signal(signal.SIGINT, signal.default_int_handler)
scenario, backend, tag = sys.argv[1:4]
env = {"CORRAL_TEST_TAG": tag}


def work(base: int) -> int:
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}")
    return base + int(os.environ["RANK"])


def stubborn() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # so that only SIGKILL, at grace, ends it
    print("ready", flush=True)
    time.sleep(1000)


def runner_interrupted(where: str) -> None:
    with corral.open_runner_sync(backend=backend, grace=1.0) as r:
        # A child that ignores SIGTERM: it goes at the grace deadline.
        stubborn_sh = "trap '' TERM; echo ready; while :; do sleep 1; done"
        r.start(["sh", "-c", stubborn_sh], extra_env=env)
        p = r.start(["sh", "-c", "echo ready; exec sleep 1000"], extra_env=env)
        for _ in p.logs():
            break  # its first line is there: both children run
        if where == "call":
            r.run(["sleep", "1000"], extra_env=env)
        else:
            time.sleep(1000)  # the body's own code, not a call of the runner


def loop_thread_interrupted(fifo: str) -> None:
    def interrupt_the_loop_thread() -> None:
        with open(fifo) as f:  # opens once the child of r.run opened it: the call is under way
            f.read()
        loop = next(t for t in threading.enumerate() if t.name.startswith("corral-script-loop"))
        assert loop.ident is not None
        signal.pthread_kill(loop.ident, signal.SIGINT)  # as the kernel may pick any thread

    with corral.open_runner_sync(name="script", backend=backend, grace=1.0) as r:
        threading.Thread(target=interrupt_the_loop_thread, daemon=True).start()
        r.run(["sh", "-c", f"echo > {fifo}; exec sleep 1000"], extra_env=env)


if scenario == "launch":
    result = corral.launch(work, 10, workers_per_host=4, backend=backend, extra_env=env)
    print("result", list(result), flush=True)
else:
    try:
        if scenario == "launch-interrupted":
            corral.launch(stubborn, workers_per_host=4, grace=1.0, backend=backend, extra_env=env)
        elif scenario == "runner-interrupted":
            runner_interrupted(sys.argv[4])
        elif scenario == "loop-thread-interrupted":
            loop_thread_interrupted(sys.argv[4])
        else:
            sys.exit(f"no scenario {scenario!r}")
    except KeyboardInterrupt:
        print("caught KeyboardInterrupt", file=sys.stderr, flush=True)
        raise
