"""A runner with the default console that runs the children it is given, then ends.

``console_runner.py BACKEND CHILDREN``: CHILDREN is a JSON list of ``[NAME, ARGV]``; every
child starts at once, and the runner's block waits for them all.
"""

from __future__ import annotations

import json
import sys

import anyio

import corral


async def main(children: list[tuple[str, list[str]]]) -> None:
    async with corral.open_runner() as r:
        for name, argv in children:
            await r.start(argv, name=name)


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[2]), backend=sys.argv[1])
