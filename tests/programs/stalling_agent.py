"""A stand-in for a host's Python whose agent stalls in the middle of its start.

``stalling_agent.py PIDFILE HOW -- ARGV...`` (behind ``as_python``): it reads the agent's
configuration, writes its pid to PIDFILE, then, as HOW says: ``silent`` dials the launcher and
says nothing; ``half-hello`` sends half its hello; ``hello-only`` sends the whole hello (it is
authenticated) and then nothing, never Ready; ``cable-pulled`` makes the host's packets vanish
(a half-open link) and runs the real agent, cut off.  Then it lives on until its stdin closes
(the ssh session ends).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys

from corral._launch import _link

pidfile, how = sys.argv[1 : sys.argv.index("--")]
raw = sys.stdin.buffer.readline()
cfg = json.loads(base64.b64decode(raw))
with open(pidfile, "w") as f:
    f.write(str(os.getpid()))
if how == "cable-pulled":  # the host's packets vanish from now on: a half-open link
    subprocess.run(["tc", "qdisc", "add", "dev", "eth0", "root", "blackhole"], check=True)
    os.environ["CORRAL_AGENT_CONFIG"] = raw.decode().strip()
    os.execv(sys.executable, [sys.executable, "-m", "corral._agent"])  # the real agent, cut off
s = socket.create_connection((cfg["address"], cfg["port"]))
hello = _link.encode(_link.AgentHello(_link.LINK_VERSION, cfg["secret"], cfg["index"], "h", 1))
if how == "half-hello":
    s.sendall(hello[: len(hello) // 2])
elif how == "hello-only":
    s.sendall(hello)  # authenticated, and then nothing: never Ready
sys.stdin.buffer.read()
