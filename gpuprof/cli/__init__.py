"""Command-line entry point: `gpuprof VERB ...`. Each verb lives in its own module here."""

from gpuprof.cli.app import app

# Importing a command module registers its verb on `app`, in the order `gpuprof --help` lists them.
from gpuprof.cli import diagnose as _diagnose  # noqa: F401,E402
from gpuprof.cli import attach as _attach  # noqa: F401,E402
from gpuprof.cli import watch as _watch  # noqa: F401,E402
from gpuprof.cli import analyze as _analyze  # noqa: F401,E402
from gpuprof.cli import disk as _disk  # noqa: F401,E402
from gpuprof.cli import recommend as _recommend  # noqa: F401,E402
from gpuprof.cli import compare as _compare  # noqa: F401,E402
from gpuprof.cli import export as _export  # noqa: F401,E402
from gpuprof.cli import merge as _merge  # noqa: F401,E402
from gpuprof.cli import scenario as _scenario  # noqa: F401,E402


def main(argv: list[str] | None = None) -> None:
    """`gpuprof ...`: every usage error is one line on stderr and exit 2 (click's own boxed
    usage message is for --help, not for a mistyped option)."""
    import sys

    import typer

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
