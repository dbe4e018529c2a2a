"""The ``corral`` command: run N workers or a Procfile, with the library's guarantees.

``corral run`` is torchrun's job (N copies of a command per host, with
``RANK``, ``WORLD_SIZE``... and prefixed output, and torchrun's restart of
the whole group on a failure), ``corral up`` is honcho's and foreman's (the
processes of a Procfile, any exit stops all), and both show a live status
table on a terminal.  The lines go to stdout, as the processes' own output
would; corral's own errors go to stderr.  Underneath is
one runner with ``handle_signals=True``: Ctrl-C reaches every process group
at once, and nothing outlives the command.

Exit codes follow the shell's: 0 when everything succeeded, otherwise the
first failure's exit code (128 + N for a signal N), 130 after Ctrl-C, 143
after SIGTERM, 141 when stdout is closed under it (``| head``: what SIGPIPE
would give, once the processes are stopped), 127 for a command that is not
found and 126 for one that cannot be executed, 2 for bad arguments and bad
input files, 1 when corral itself fails (a host that cannot be reached).
Each error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from ._group import cli
from ._io import say
from ._run import run
from ._snapshot import status
from ._tail import tail
from ._up import up

__all__ = ["cli", "main"]

cli.add_command(run)
cli.add_command(up)
cli.add_command(tail)
cli.add_command(status)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script: ``corral``.  Bad usage is one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="corral", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        sys.exit(2)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "corral"
        say(f"{command}: error: {exc.format_message()} (see {command} --help)")
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        say(f"corral: error: {exc.format_message()}")
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    sys.exit(0)
