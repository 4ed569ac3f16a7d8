"""Command-line entry point: `gpuprof VERB ...`. Each verb lives in its own module here."""

from gpuprof.cli.app import app

# Importing a command module registers its verb on `app`.
from gpuprof.cli import compare as _compare  # noqa: F401,E402
from gpuprof.cli import diagnose as _diagnose  # noqa: F401,E402
from gpuprof.cli import disk as _disk  # noqa: F401,E402
from gpuprof.cli import export as _export  # noqa: F401,E402
from gpuprof.cli import merge as _merge  # noqa: F401,E402
from gpuprof.cli import recommend as _recommend  # noqa: F401,E402
from gpuprof.cli import scenario as _scenario  # noqa: F401,E402


def main() -> None:
    app()


__all__ = ["app", "main"]
