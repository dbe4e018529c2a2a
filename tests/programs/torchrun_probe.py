"""A worker that says what torchrun's variables it got: ``env RANK LOCAL_WORLD_SIZE
MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID ARGS...`` on stdout, ``to stderr RANK`` on stderr."""

from __future__ import annotations

import os
import sys

env = os.environ
names = ("RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
print("env", *(env[name] for name in names), *sys.argv[1:])
print("to stderr", env["RANK"], file=sys.stderr)
