"""``python -m corral._worker``: one worker of a launch (:mod:`corral._launch._worker`).

A stable entry point: agents start their workers by this name, whatever the
package's layout.  It loads nothing of the launcher (no AnyIO).
"""

import sys

if __name__ == "__main__":
    from ._launch._worker import main

    sys.exit(main())
