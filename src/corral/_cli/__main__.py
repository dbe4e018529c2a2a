"""``python -m corral._cli``: the ``corral`` command."""

from ._main import main

if __name__ == "__main__":
    main()
