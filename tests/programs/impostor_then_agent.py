"""A stand-in for a remote host's Python that first dials the launch link as impostors.

Run as the host's interpreter (``as_python``): for ``-m corral._agent`` it reads the agent's
configuration on stdin, dials the launcher's link three times (a wrong secret; the right one
with another protocol version; garbage), says on stderr what the launcher did with each
(``bad-secret refused``...), then runs the real agent with that configuration.  Anything
else (the agent's workers) is the real interpreter at once.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys

from corral._launch import _link

if sys.argv[1:] != ["-m", "corral._agent"]:  # the agent's workers: the real thing
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
raw = sys.stdin.buffer.readline()
cfg = json.loads(base64.b64decode(raw))


def attempt(what: str, frame: bytes) -> None:
    with socket.create_connection((cfg["address"], cfg["port"]), timeout=20) as s:
        s.sendall(frame)
        s.settimeout(20)
        answer = s.recv(100)
        print(what, "refused" if answer == b"" else "answered", file=sys.stderr, flush=True)


index, pid = cfg["index"], os.getpid()
wrong_secret = _link.AgentHello(_link.LINK_VERSION, "not the secret", index, "impostor", pid)
attempt("bad-secret", _link.encode(wrong_secret))
wrong_version = _link.AgentHello(_link.LINK_VERSION + 1, cfg["secret"], index, "impostor", pid)
attempt("bad-version", _link.encode(wrong_version))
attempt("garbage", b"\x00\x00\x00\x05hello")
os.environ["CORRAL_AGENT_CONFIG"] = raw.decode().strip()
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
