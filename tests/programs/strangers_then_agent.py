"""A stand-in for a host's Python that sets strangers on the launch listener, then the agent.

``strangers_then_agent.py LAUNCHER_PID FLOOD PEERS -- ARGV...`` (behind ``as_python``): for
``-m corral._agent`` it reads the agent's configuration, and PEERS strangers announce a 1 GiB
first frame and push up to FLOOD bytes, while PEERS others announce a small frame and trickle
a byte every 50 ms; meanwhile it samples the launcher's resident size.  It reports on stderr,
as one JSON line, the growth (KiB), what each flooder sent and how long each trickler was
kept, then runs the real agent.  Anything else is the real interpreter at once.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import threading
import time

ours = sys.argv[1 : sys.argv.index("--")]
argv = sys.argv[sys.argv.index("--") + 1 :]
if argv != ["-m", "corral._agent"]:  # the agent's workers: the real thing
    os.execv(sys.executable, [sys.executable, *argv])
launcher, flood_bytes, peers = (int(word) for word in ours)
raw = sys.stdin.buffer.readline()
cfg = json.loads(base64.b64decode(raw))
address = (cfg["address"], cfg["port"])


def rss() -> int:
    with open(f"/proc/{launcher}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


base = rss()
flood_sent: list[int] = []
trickle_held: list[float] = []


def flood() -> None:
    sent = 0
    try:
        with socket.create_connection(address, timeout=20) as s:
            s.sendall((1 << 30).to_bytes(4, "big"))
            chunk = bytes(65536)
            while sent < flood_bytes:
                s.sendall(chunk)
                sent += len(chunk)
    except OSError:
        pass
    flood_sent.append(sent)


def trickle() -> None:
    with socket.create_connection(address, timeout=20) as s:
        s.sendall((1000).to_bytes(4, "big"))
        started = time.monotonic()
        s.settimeout(0.05)
        try:
            while time.monotonic() - started < 15:
                try:
                    if s.recv(1) == b"":
                        break  # closed by the launcher
                except TimeoutError:
                    s.send(b"\x00")
        except OSError:
            pass
        trickle_held.append(time.monotonic() - started)


threads = [threading.Thread(target=f) for f in [flood] * peers + [trickle] * peers]
for t in threads:
    t.start()
peak = base
while any(t.is_alive() for t in threads):
    peak = max(peak, rss())
    threads[0].join(0.005)
for t in threads:
    t.join()
peak = max(peak, rss())
report = {"growth_kib": peak - base, "flood_sent": flood_sent, "trickle_held": trickle_held}
print(json.dumps(report), file=sys.stderr, flush=True)
os.environ["CORRAL_AGENT_CONFIG"] = raw.decode().strip()
os.execv(sys.executable, [sys.executable, *argv])
