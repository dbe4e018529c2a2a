"""corral from synchronous code: :func:`launch` and :func:`open_runner_sync`.

A script, a notebook cell or a synchronous library function cannot ``async
with`` a runner, and must not call :func:`anyio.run` where an event loop runs
already (a Jupyter kernel runs one in its main thread; so does a synchronous
function called from inside ``asyncio.run``).  So a blocking runner runs its
own event loop on a helper thread, always, whatever the calling thread is
doing; it is built on the public runner alone:

* The helper thread runs ``anyio.run`` of one *host* task, which enters an
  ordinary :class:`~corral.Runner` and, inside it, a task group for the
  calls: the portal between the two threads.  Each blocking call becomes a
  task of that group, handed over with :meth:`LoopToken.run_sync_soon` and
  answered through a :class:`concurrent.futures.Future`, so it runs *inside
  the runner's scope*: when a child fails, or the runner is cancelled, the
  call is cancelled with everything else, as the body of ``async with``
  would be, and the runner's error comes out of the call once every child
  is stopped.  (AnyIO's own ``BlockingPortal`` cannot be used: its calls go
  through ``trio.from_thread``, which refuses to run in a thread where a
  Trio loop runs, as in a synchronous function called from ``trio.run``.)
* The thread comes from a one-thread :class:`~concurrent.futures.ThreadPoolExecutor`:
  it is not a daemon, so an interpreter that exits while a runner is
  still stopping waits for that (bounded) stop instead of cutting it short.
  It is joined when the runner closes.
* Python delivers signals to the main thread only, and a runner entered on
  another thread takes no signal handler.  Ctrl-C therefore surfaces as
  :class:`KeyboardInterrupt` in the blocked calling thread (the kernel's
  interrupt in Jupyter is the same SIGINT).  The runner then cancels its
  scope (the stop signal to every child's group, its grace period,
  SIGKILL, reaping), waits for that at most the longest grace period in use
  plus one second, and re-raises.  A second Ctrl-C during that wait kills
  every child at once.
* A blocking runner belongs to the thread that opened it, as a runner
  belongs to its loop: from any other thread (its own loop's included) its
  methods raise :class:`~corral.WrongLoopError` at once; after it closed
  they raise :class:`~corral.CorralError`.  Nothing ever waits on a loop
  that is gone.

``_portal`` (the helper thread, its loop and the calls handed to it),
``_handles`` (the blocking process and log tail) and ``_runner`` (the
blocking runner and the two functions) are built on the public runner:
they import only names of ``corral.__all__``, each from its home.

Public face: _runner, _handles
"""
