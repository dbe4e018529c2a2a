"""What corral needs from Linux and from each event loop, in one place.

``_platform``: spawning into a new process group, pidfds, an exit status read
without reaping, ``/proc``, ``RLIMIT_NOFILE``.  ``_backend``: the few facts of
the running loop AnyIO has no API for (callbacks from a signal handler, the
loop's liveness, Trio's KeyboardInterrupt protection, asyncio's native
cancellation).  ``_contain``: what a runner's children leave behind (a
descendant that left its process group), found through a cgroup of the
runner's own (``_cgroup``) or as a child subreaper, and stopped.
``_childenv``: the ``CORRAL_*`` environment a child is started with (the
child side imports it, so it is standard library only).  ``_proc``: what a
process tree costs (CPU, resident memory, GPU memory), read from ``/proc``.
``_lifeline``: a helper process that kills every child if the launcher dies.
A port to another Unix replaces this folder.

Public face: _platform, _backend, _childenv, _contain, _proc, _lifeline
"""
