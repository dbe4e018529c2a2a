"""A worker that writes a torch error file by hand, as ``@record`` would, and exits 1.

``error_file_writer.py N``: rank 1 writes to ``TORCHELASTIC_ERROR_FILE`` torch's JSON for
``MyErr: boom xxx...`` (N ``x``), whose traceback ends ``line 3, in main`` / ``MyErr: boom``,
and exits 1; the other ranks sleep.
"""

from __future__ import annotations

import json
import os
import sys
import time

if os.environ["RANK"] == "1":
    traceback = 'Traceback (most recent call last):\n  File "w.py", line 3, in main\nMyErr: boom\n'
    doc = {
        "message": {
            "message": "MyErr: boom " + "x" * int(sys.argv[1]),
            "extraInfo": {"py_callstack": traceback, "timestamp": str(int(time.time()))},
        }
    }
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
        json.dump(doc, f)
    sys.exit(1)
time.sleep(60)
