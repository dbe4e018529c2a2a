"""A worker that writes down its environment and whether it leads its own session.

``env_probe.py NAME``: writes ``$PROBE_OUT/NAME-RANK.json`` (every variable) and
``$PROBE_OUT/NAME-RANK.json.session`` (``True`` if it is its session's leader).
"""

from __future__ import annotations

import json
import os
import sys

out = os.path.join(os.environ["PROBE_OUT"], f"{sys.argv[1]}-{os.environ['RANK']}.json")
with open(out, "w") as f:
    json.dump(dict(os.environ), f)
with open(out + ".session", "w") as f:
    f.write(str(os.getsid(0) == os.getpid()))
