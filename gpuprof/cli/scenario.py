"""`gpuprof scenario list|run`: situations with a known bottleneck and their expected diagnosis."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from gpuprof import scenarios as S
from gpuprof.units import EMPTY
from gpuprof.cli.app import app, guarded
from gpuprof.errors import GpuprofError, ScenarioMismatch

scenario_app = typer.Typer(help="Runnable situations whose diagnosis is known.", no_args_is_help=True)
app.add_typer(scenario_app, name="scenario")


@scenario_app.command("list")
@guarded
def list_(folder: Optional[str] = typer.Option(None, help="Scenarios folder (default: ./scenarios).")):
    """List the scenarios with their device and expected top finding."""
    t = Table(title="scenarios")
    for col in ("name", "kind", "device", "expected top finding", "description"):
        t.add_column(col)
    for sc in S.discover(folder):
        t.add_row(sc.name, sc.kind, sc.device if sc.kind == "run" else EMPTY, sc.expect["top"],
                  _short(sc.description))
    Console().print(t)


@scenario_app.command("run")
@guarded
def run(
    name: Optional[str] = typer.Argument(None, help="A scenario name or a path to its TOML."),
    all_: bool = typer.Option(False, "--all", help="Run every scenario (CUDA ones are skipped without a GPU)."),
    folder: Optional[str] = typer.Option(None, help="Scenarios folder (default: ./scenarios)."),
):
    """Run scenarios and check the diagnosis; exit 1 on any mismatch."""
    from gpuprof.render.terminal import findings_table

    if all_ == (name is not None):
        raise GpuprofError("give one scenario NAME or --all")
    todo = S.discover(folder) if all_ else [S.resolve(name, folder)]
    console = Console()
    failed = []
    for sc in todo:
        console.rule(f"[bold]{sc.name}[/bold]")
        console.print(sc.description)
        res = S.run(sc)
        if res.skipped:
            console.print(f"[yellow]skipped:[/yellow] {res.skipped}")
            continue
        console.print(findings_table(res.findings[:4]))
        for what, ok, detail in res.checks:
            mark = "[green]✓[/green]" if ok else "[red]✗[/red]"
            console.print(f"{mark} {what}: {detail}")
        console.print("[green]MATCH[/green]" if res.passed else "[red]MISMATCH[/red]")
        if not res.passed:
            failed.append(sc.name)
    if failed:
        raise ScenarioMismatch(f"{len(failed)} scenario(s) did not match: {', '.join(failed)}")


def _short(text: str, n: int = 70) -> str:
    first = text.split(". ")[0].split(": ")[0]
    return first if len(first) <= n else first[: n - 1] + "…"
