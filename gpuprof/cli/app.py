"""The Typer application object and the error guard every command uses.

Typer lives only in gpuprof/cli/. Commands parse options, call the library, and hand the
result to a renderer. Library code raises GpuprofError; `guarded` turns it into one line on
stderr and the error's exit code (2 for bad input).
"""

from __future__ import annotations

import functools
import sys

import typer

from gpuprof.errors import GpuprofError

app = typer.Typer(
    name="gpuprof",
    help="Why is my GPT training step slow? Measured phases, true MFU, ranked fixes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    # a group even with one verb loaded (gpuprof.cli.main(only=...)): `gpuprof attach PID` parses the same
    pass


def fail(message: str, code: int = 2) -> None:
    """Print one line to stderr and exit with `code`."""
    typer.echo(f"gpuprof: error: {message}", err=True)
    raise typer.Exit(code)


def guarded(fn):
    """Decorator for command functions: GpuprofError -> one line + exit code; Ctrl-C -> 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GpuprofError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            typer.echo("gpuprof: interrupted", err=True)
            raise typer.Exit(130)

    return wrapper


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
