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

from ._group import CONTEXT
from ._io import say

__all__ = ["cli", "main"]

_EXAMPLES = """
\b
Examples:
  corral run -n 4 -- python train.py     (4 workers, torchrun's environment)
  corral up                              (the processes of ./Procfile)
  corral tail 'http://127.0.0.1:8765/?token=...'
  corral status 'http://127.0.0.1:8765/?token=...'
"""

#: The commands, by name.
COMMANDS = ("check", "exec", "export", "run", "status", "tail", "up")


class _Commands(click.Group):
    """The group of :data:`COMMANDS`, each imported only when it is used (or listed).

    ``corral up`` loads nothing of ``corral run``'s: a command's first line
    comes sooner for every module it does not import.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "run":
            from ._run import run

            return run
        if cmd_name == "status":
            from ._snapshot import status

            return status
        if cmd_name == "tail":
            from ._tail import tail

            return tail
        if cmd_name == "export":
            from ._export import export

            return export
        if cmd_name in ("up", "check", "exec"):
            from ._up import check, exec_command, up

            return {"up": up, "check": check, "exec": exec_command}[cmd_name]
        return None


@click.group(cls=_Commands, context_settings=CONTEXT, epilog=_EXAMPLES)
@click.version_option(None, "-V", "--version", package_name="corral", message="corral %(version)s")
def cli() -> None:
    """Run processes the structured way: N workers of a command, or a Procfile.

    Every line the processes write is shown with its source (coloured on a
    terminal), optionally kept in a log folder, with a live status table
    under it.  Ctrl-C stops every process (and every process it started) at
    once; nothing outlives the command.
    """


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
