"""A stand-in for a host's Python that first opens silent connections to the launch listener.

``silent_then_agent.py PEERS WAIT -- ARGV...`` (behind ``as_python``): for ``-m
corral._agent`` it reads the agent's configuration, opens PEERS connections to the launcher's
listener that never say a word, and waits (3 s at most) until the launcher has closed all but
WAIT of them; it reports on stderr, as one JSON line, how many it closed and after how long,
then runs the real agent (the rest still open, still waiting).  Anything else is the real
interpreter at once.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import sys
import time

ours = sys.argv[1 : sys.argv.index("--")]
argv = sys.argv[sys.argv.index("--") + 1 :]
if argv != ["-m", "corral._agent"]:  # the agent's workers: the real thing
    os.execv(sys.executable, [sys.executable, *argv])
count, wait = (int(word) for word in ours)
raw = sys.stdin.buffer.readline()
cfg = json.loads(base64.b64decode(raw))
address = (cfg["address"], cfg["port"])
peers = [socket.create_connection(address, timeout=10) for _ in range(count)]
began = time.monotonic()
still_open = set(peers)
while len(still_open) > wait and time.monotonic() - began < 3:
    ready, _, _ = select.select(list(still_open), [], [], 0.1)
    for peer in ready:  # readable: closed by the launcher (EOF or a reset)
        try:
            gone = peer.recv(1) == b""
        except OSError:
            gone = True
        if gone:
            still_open.discard(peer)
report = {"closed": count - len(still_open), "after": time.monotonic() - began}
print(json.dumps(report), file=sys.stderr, flush=True)
for peer in still_open:
    peer.set_inheritable(True)  # still waiting while the agent dials
os.environ["CORRAL_AGENT_CONFIG"] = raw.decode().strip()
os.execv(sys.executable, [sys.executable, *argv])
