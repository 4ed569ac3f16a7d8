"""Command-line entry point: `gpuprof VERB ...`. Each verb lives in its own module here.

Importing a verb's module registers it on `app` (gpuprof.cli.app). All are loaded, in the order
`gpuprof --help` lists them, when `app` or main() is first used; main(only=VERB) loads that verb
alone (`gpuprof attach`: every module it does not need is CPU taken from the job it watches)."""

import importlib

import gpuprof.cli.app  # noqa: E402 - loaded here, so that the name `app` below is the Typer object

del app  # the submodule's attribute: `from gpuprof.cli import app` goes through __getattr__ (every verb)

VERBS = ("diagnose", "attach", "watch", "analyze", "disk", "recommend", "compare", "export", "merge", "scenario")


def load(only: str | None = None):
    """Register the verbs (all, or the module `only`) on the app; return the app."""
    for name in VERBS if only is None else (only,):
        importlib.import_module(f"gpuprof.cli.{name}")
    from gpuprof.cli.app import app as _app

    return _app


def __getattr__(name: str):
    if name == "app":  # `from gpuprof.cli import app`: the whole command, every verb on it
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None, only: str | None = None) -> None:
    """`gpuprof ...`: every usage error is one line on stderr and exit 2 (click's own boxed
    usage message is for --help, not for a mistyped option). only: the one verb's module to load."""
    import sys

    import typer

    app = load(only)

    errors = typer.main._click.exceptions
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="gpuprof", standalone_mode=False)
    except errors.NoArgsIsHelpError as exc:  # `gpuprof` or a group alone: the help (printed as it was made)
        if exc.format_message().strip():
            typer.echo(exc.format_message())
        code = 0
    except errors.UsageError as exc:
        path = exc.ctx.command_path if exc.ctx is not None else "gpuprof"
        typer.echo(f"gpuprof: error: {exc.format_message()} (`{path} --help` lists the options)", err=True)
        code = exc.exit_code
    except errors.ClickException as exc:
        typer.echo(f"gpuprof: error: {exc.format_message()}", err=True)
        code = exc.exit_code
    except typer.Abort:
        typer.echo("gpuprof: interrupted", err=True)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
