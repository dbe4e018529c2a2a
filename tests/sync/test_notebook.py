"""corral in a real Jupyter kernel: ``corral.launch`` in a cell, and a kernel interrupt.

``jupyter_client`` starts a real IPython kernel (``ipykernel``), in which an
asyncio loop runs in the main thread, as in every notebook; cells are sent to
it and its replies read, as a notebook front end does.  The interrupt is the
front end's: SIGINT to the kernel.  One kernel serves the whole test, on both
of corral's backends, and is always shut down (killed) at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from tests.helpers.processes import TAG_VAR, is_alive, tagged_pids, wait_gone

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

BACKENDS = ["asyncio", "trio"]
#: The grace period the interrupted launch uses, and the bound: stopped within grace + slack.
#: A loaded machine takes its time to deliver the interrupt and reap; the bound stays below the
#: default grace (5 s), which a stop that ignored the launch's grace would wait, and far below
#: a stop that waits for the workers (they ignore SIGTERM: only SIGKILL ends them).
GRACE = 1.0
SLACK = 3.0
#: Seconds a cell may take (a kernel on a loaded machine is slow, not broken).
CELL_TIMEOUT = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # jupyter_client's own loop; the kernel's corral uses both


class Kernel:
    """A kernel and a client talking to it, as a notebook front end."""

    def __init__(self, manager: Any, client: Any) -> None:
        self.manager = manager
        self.client = client

    async def execute(self, code: str) -> str:
        """Send a cell; return its message id (its reply and output come later)."""
        msg_id: str = self.client.execute(code)
        return msg_id

    async def output(
        self, msg_id: str, until: str | None = None, count: int = 1
    ) -> tuple[str, list[dict[str, Any]]]:
        """The cell's streamed text and its errors: up to ``count`` x ``until``, or its end."""
        text = ""
        errors: list[dict[str, Any]] = []
        with anyio.fail_after(CELL_TIMEOUT):
            while True:
                msg = await self.client.get_iopub_msg()
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    text += content["text"]
                    if until is not None and text.count(until) >= count:
                        return text, errors
                elif kind == "execute_result":
                    text += content["data"].get("text/plain", "") + "\n"
                elif kind == "error":
                    errors.append(content)
                elif kind == "status" and content["execution_state"] == "idle":
                    return text, errors

    async def reply(self, msg_id: str) -> dict[str, Any]:
        with anyio.fail_after(CELL_TIMEOUT):
            while True:
                msg = await self.client.get_shell_msg()
                if msg["parent_header"].get("msg_id") == msg_id:
                    content: dict[str, Any] = msg["content"]
                    return content

    async def run(self, code: str) -> tuple[str, list[dict[str, Any]]]:
        msg_id = await self.execute(code)
        text, errors = await self.output(msg_id)
        assert (await self.reply(msg_id))["status"] == ("error" if errors else "ok")
        return text, errors


@pytest.fixture
async def kernel(tmp_path: Path) -> AsyncIterator[Kernel]:
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    # A kernel spec for this very interpreter (the default one runs whatever
    # "python" is first on PATH), over Unix sockets in the test's folder.
    spec = tmp_path / "kernels" / "corral-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "corral test", "language": "python"})
    )
    manager = AsyncKernelManager(
        kernel_name="corral-test",
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]),
        transport="ipc",
        ip=str(tmp_path / "kernel"),
    )
    await manager.start_kernel(env={**os.environ, "NO_COLOR": "1"}, cwd=str(tmp_path))
    pid = manager.provisioner.pid
    client = manager.client()
    try:
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        yield Kernel(manager, client)
    finally:
        client.stop_channels()
        with anyio.move_on_after(20):
            await manager.shutdown_kernel(now=True)
        if is_alive(pid):
            os.kill(pid, 9)
        assert not await anyio.to_thread.run_sync(wait_gone, [pid], 10), "the kernel outlived"
        client.context.term()
        manager.context.term()


LAUNCH_CELL = """
import os, time, corral
def square(offset):
    return int(os.environ["RANK"]) ** 2 + offset
print("results:", list(corral.launch(square, 10, workers_per_host=4, backend={backend!r},
                                     extra_env={{{tag_var!r}: {tag!r}}})))
"""

INTERRUPTED_CELL = """
import signal
def sleeper():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL, at the grace deadline, ends it
    print("ready", flush=True)
    time.sleep(1000)
corral.launch(sleeper, workers_per_host=4, grace={grace}, backend={backend!r},
              extra_env={{{tag_var!r}: {tag!r}}})
"""


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_launch_in_a_notebook_cell_and_a_kernel_interrupt(kernel: Kernel, tag: str) -> None:
    text, errors = await kernel.run("import asyncio; asyncio.get_running_loop()")
    assert not errors and "running=True" in text  # a loop runs where the cells run

    for backend in BACKENDS:
        values = {"backend": backend, "tag_var": TAG_VAR, "tag": tag, "grace": GRACE}
        # 1. A launch of four workers, in a cell.
        text, errors = await kernel.run(LAUNCH_CELL.format(**values))
        assert not errors, errors
        assert "results: [10, 11, 14, 19]" in text, text
        assert not tagged_pids(tag)

        # 2. A cell interrupted in the middle of its launch.
        msg_id = await kernel.execute(INTERRUPTED_CELL.format(**values))
        text, _ = await kernel.output(msg_id, until="| ready", count=4)
        workers = tagged_pids(tag)
        assert len(workers) == 4, text
        interrupted = time.monotonic()
        await kernel.manager.interrupt_kernel()
        reply = await kernel.reply(msg_id)
        elapsed = time.monotonic() - interrupted
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        assert elapsed < GRACE + SLACK, f"the interrupt took {elapsed:.2f} s"
        assert not wait_gone(workers, 0), "a worker outlived the interrupted cell"
        _, errors = await kernel.output(msg_id)
        assert [e["ename"] for e in errors] == ["KeyboardInterrupt"]  # what the cell shows

        # 3. The kernel is still usable.
        text, errors = await kernel.run("print(6 * 7)")
        assert not errors and text.strip() == "42"


FAILING_CELL = """
import corral
def fails_in_a_cell(n):
    doubled = n * 2
    raise ValueError(f"the cell gave up at {{doubled}}")  # this line, in the worker's traceback
try:
    corral.launch(fails_in_a_cell, 5, workers_per_host=2, backend={backend!r},
                  extra_env={{{tag_var!r}: {tag!r}}})
except ValueError as exc:
    print(exc.__cause__.text)
"""


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_worker_traceback_shows_the_lines_of_the_cell(kernel: Kernel, tag: str) -> None:
    """The function is defined in a cell: the worker's traceback quotes the cell, as IPython."""
    for backend in BACKENDS:
        values = {"backend": backend, "tag_var": TAG_VAR, "tag": tag}
        text, errors = await kernel.run(FAILING_CELL.format(**values))
        assert not errors, errors
        assert "<dynamic-code>" not in text, text
        frame = next(line for line in text.splitlines() if "in fails_in_a_cell" in line)
        assert "ipykernel_" in frame, text  # the cell's name, as IPython gave it
        quoted = text.splitlines()[text.splitlines().index(frame) + 1]
        assert quoted.strip() == (
            'raise ValueError(f"the cell gave up at {doubled}")  '
            "# this line, in the worker's traceback"
        ), text
        assert "ValueError: the cell gave up at 10" in text
        assert not tagged_pids(tag)
