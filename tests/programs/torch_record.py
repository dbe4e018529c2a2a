"""A worker under torch's ``@record``: rank 1 raises ``MyErr("boom from rank 1 x=42")``, which
``@record`` writes to ``TORCHELASTIC_ERROR_FILE``; the other ranks sleep."""

from __future__ import annotations

import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


class MyErr(Exception):
    pass


@record  # type: ignore[misc, unused-ignore]  # (untyped where torch is absent)
def main() -> None:
    if os.environ["RANK"] == "1":
        raise MyErr("boom from rank 1 x=42")
    time.sleep(60)


main()
