"""``python -m corral._agent``: a launch's agent on another host (:mod:`corral._launch._agent`).

A stable entry point: launchers start their agents by this name, whatever
the package's layout.
"""

import sys

if __name__ == "__main__":
    from ._core._runner import open_runner
    from ._launch._agent import main

    sys.exit(main(open_runner))
