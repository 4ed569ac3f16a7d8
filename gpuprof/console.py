"""The `gpuprof` command's entry point: before anything heavy is imported, `gpuprof attach` lowers
the priority of its own main thread (gpuprof.attach.gentle), so that gpuprof's imports, polling and
analysis take no CPU from the running job it observes while that job computes. Then the CLI
(gpuprof.cli.main). (`watch --pid` keeps its priority: its windows are analysed while the job runs,
and at the lowest priority they fell behind the job on a host it fills.)"""

import sys


def _attaches(argv: list[str]) -> bool:
    return next((a for a in argv if not a.startswith("-")), None) == "attach"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    only = None
    if _attaches(args):
        from gpuprof.attach.gentle import be_gentle

        be_gentle()
        if args[:1] == ["attach"]:  # its module alone: the other verbs' imports are CPU the target would lose
            only = "attach"  # (`gpuprof --help attach` and the like keep the whole command)
    from gpuprof.cli import main as cli_main

    cli_main(argv, only=only)
