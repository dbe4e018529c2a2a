"""A training script whose launched function fails: its traceback must show these lines.

``train_fails.py BACKEND TAG_VAR TAG``: launches ``fails(3)`` on two local workers with
``corral.launch`` on BACKEND, each worker tagged ``TAG_VAR=TAG``; ``fails`` raises
``ValueError("main failed with 21")``, which comes out of ``main()`` with the worker's
traceback as its cause.
"""

from __future__ import annotations

import sys

import corral


def fails(scale: int) -> None:
    value = scale * 7
    raise ValueError(f"main failed with {value}")  # shown from the script


def main() -> None:
    backend, tag_var, tag = sys.argv[1:4]
    corral.launch(
        fails, 3, workers_per_host=2, backend=backend, console=False, extra_env={tag_var: tag}
    )


if __name__ == "__main__":
    main()
