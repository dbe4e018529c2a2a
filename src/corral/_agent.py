"""``python -m corral._agent``: a launch's agent on another host (:mod:`corral._launch._agent`).

A stable entry point: launchers start their agents by this name, whatever
the package's layout.  It reads the configuration first, with the light
link module alone (msgspec, no event loop library): an agent whose ssh
client is gone already (a Ctrl-C during the launch's start) exits at once
instead of after the launcher's import, which takes a good part of a second
on a busy host.
"""

import sys

if __name__ == "__main__":
    from ._launch import _link

    config = _link.read_config()
    if config is None:
        print("corral agent: no configuration on stdin", file=sys.stderr)
        sys.exit(2)
    if config.watch_stdin and _link.stdin_closed():
        print("corral agent: its ssh client is gone (standard input closed)", file=sys.stderr)
        sys.exit(1)
    from ._runner._agent import main

    sys.exit(main(config))
