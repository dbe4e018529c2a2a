"""What corral needs from the system, and the clear error when it is missing.

corral waits for every child on a pidfd (``pidfd_open``, Linux 5.3 and
later).  An older kernel has no such call (``ENOSYS``), and a seccomp filter
(a container's profile, a sandbox) may forbid it (``EPERM``, or ``ENOSYS``
too).  These tests take the call away for real: a launcher in a subprocess
installs a seccomp filter that makes ``pidfd_open`` fail, then opens a
runner, which must raise one :class:`corral.CorralError` that says what is
missing, and start nothing.
"""

from __future__ import annotations

import errno
import platform
import subprocess
import sys
import textwrap

import pytest
from tests.helpers.processes import TAG_VAR, tagged_pids

# A classic seccomp BPF program, installed with prctl through ctypes:
#   load the system call number; if it is pidfd_open's, fail with ERRNO, else
#   allow.  pidfd_open is number 434 on every architecture (the unified table).
WITHOUT_PIDFD = textwrap.dedent(
    """
    import ctypes, os, struct, sys

    import anyio

    import corral

    PIDFD_OPEN = 434
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    RET_ERRNO, RET_ALLOW = 0x00050000, 0x7FFF0000


    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


    def forbid(number, error):
        def op(code, jt, jf, k):
            return struct.pack("HBBI", code, jt, jf, k)

        code = b"".join([
            op(0x20, 0, 0, 0),  # BPF_LD | BPF_W | BPF_ABS: seccomp_data.nr
            op(0x15, 0, 1, number),  # BPF_JMP | BPF_JEQ | BPF_K
            op(0x06, 0, 0, RET_ERRNO | error),  # BPF_RET | BPF_K
            op(0x06, 0, 0, RET_ALLOW),
        ])
        buffer = ctypes.create_string_buffer(code, len(code))
        program = Program(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


    backend, error, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    forbid(PIDFD_OPEN, error)
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:
        print("pidfd_open:", exc.errno, flush=True)


    async def main():
        async with corral.open_runner(console=False) as r:
            await r.run(["sleep", "1000"], extra_env={%(tag_var)r: tag})


    try:
        anyio.run(main, backend=backend)
    except corral.CorralError as exc:
        print("CorralError:", exc, flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64"), reason="the filter knows these two"
)
@pytest.mark.parametrize("error", [errno.ENOSYS, errno.EPERM], ids=["ENOSYS", "EPERM"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_without_pidfd_open_the_runner_says_what_is_missing(
    backend: str, error: int, tag: str
) -> None:
    script = WITHOUT_PIDFD % {"tag_var": TAG_VAR}
    out = subprocess.run(
        [sys.executable, "-c", script, backend, str(error), tag],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr == ""
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert lines["pidfd_open"] == str(error)  # the filter works: the call is gone
    message = lines["CorralError"]
    assert "pidfd_open" in message
    assert errno.errorcode[error] in message
    assert "Linux 5.3" in message
    assert "seccomp" in message
    assert tagged_pids(tag) == []
