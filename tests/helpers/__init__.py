"""What the tests share, beside the fixtures of ``tests/conftest.py``.

``processes`` (the test tag, :class:`ListHandler`, the process table),
``hosts`` (a pytest plugin: real sshd hosts in network namespaces and a real
Slurm cluster) and ``reaper`` (the session's watchdog, which removes what a
dead session left).
"""
