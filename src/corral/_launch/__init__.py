"""Scale-out: a function or a command on N workers, on this machine or across hosts.

``_plan`` (what a launch's options, :mod:`corral._scaleout`'s light record,
make: hosts, workers, environment, each host's job), ``_context`` (what a
launch needs of its runner: a way to start children, its log service),
``_source`` (the job pickled, with the source lines of the code
it sends by value, for the workers' tracebacks), ``_coordinator`` (every
worker's outcome; when the launch is over),
``_launcher`` (:func:`launch` itself, and a launch on this machine),
``_remote`` (agents on other hosts, started with ssh or srun), ``_workers``
(one host's workers in a runner), ``_agent`` (what the agent on each remote
host does for the launcher; its process, a runner of its own, is
:mod:`corral._runner._agent`), ``_worker`` (``python -m corral._worker``, one worker:
standard library, msgspec and :mod:`corral.child` only), ``_link`` (what goes
over the link between a launcher and its agents), ``_hosts`` (ssh, Slurm,
the environment of remote workers) and ``_torchenv`` (the variables torchrun
gives its workers, and their error files).

Public face: _plan, _context, _launcher, _hosts, _agent, _worker, _torchenv, _link, _workers
"""
