"""The ``corral`` command: its console script (:func:`main`), and ``python -m corral._cli``.

Its first step makes Ctrl-C the command's own (see :mod:`corral._cli._io`), so that a
Ctrl-C at any instant of the imports that follow ends it with 130 and one line.
"""

from typing import NoReturn

from ._io import take_ctrl_c

take_ctrl_c()


def main() -> NoReturn:
    """The console script: ``corral``."""
    from ._main import main as command

    command()


if __name__ == "__main__":
    main()
