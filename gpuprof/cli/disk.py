"""`gpuprof bench-disk PATH`: can this storage feed the training loop?

Parses options, resolves the loop's demand, runs gpuprof.disk.suite, hands the result to
gpuprof.render.disk. Bad input raises GpuprofError (one line, exit 2) via `guarded`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Optional

import typer
from rich.console import Console

from gpuprof.cli.app import app, guarded
from gpuprof.cli.options import positive
from gpuprof.disk.requirement import DEFAULT_BLOCK_SIZE, assess, resolve_need
from gpuprof.disk.suite import BenchConfig, run_bench
from gpuprof.disk.units import parse_bytes
from gpuprof.render.disk import print_report, progress_bar, to_json


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Let `kill` (SIGTERM) unwind like Ctrl-C, so the test file is removed on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@app.command("bench-disk")
@guarded
def bench_disk(
    path: str = typer.Argument(..., help="A directory (a temporary test file is written "
                               "there) or an existing dataset file (read-only)."),
    size: str = typer.Option("auto", "--size", help="Test file size in a directory (auto: "
                             "1 GiB, less when free space is short, so a cache below the "
                             "machine is less likely to hold it); for a dataset file, how much "
                             "of it the warm runs read (auto: 256 MiB) (K/M/G = "
                             "10^3/10^6/10^9, Ki/Mi/Gi = 2^10/2^20/2^30; a trailing B is "
                             "allowed)."),
    duration: float = typer.Option(0.5, "--duration", help="Seconds per cold run (warm runs "
                                   "take half)."),
    repeats: int = typer.Option(2, "--repeats", help="Runs per measurement (≥ 2): median and "
                                "spread."),
    readers: int = typer.Option(8, "--readers", help="Parallel readers (threads, one read in "
                                "flight each)."),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="Tokens per sample "
                                             f"(default {DEFAULT_BLOCK_SIZE}, or the profile's)."),
    sample_bytes: Optional[str] = typer.Option(None, "--sample-bytes", help="Random read size "
                                               "for the loader pattern (default block_size × 2; "
                                               "K/M/G = 10^3/10^6/10^9, Ki/Mi/Gi = 2^10/2^20/2^30)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Samples per batch "
                                             "(loader test, default 12; and the requirement)."),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum", help="Micro-steps per "
                                             "optimizer step (requirement)."),
    step_s: Optional[float] = typer.Option(None, "--step-s", help="Seconds per optimizer step "
                                           "(requirement, with --batch-size)."),
    tokens_per_sec: Optional[float] = typer.Option(None, "--tokens-per-sec",
                                                   help="Tokens/s the training loop runs at."),
    profile: Optional[str] = typer.Option(None, "--profile", help="A gpuprof profile JSON to "
                                          "take tokens/s and the batch shape from."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed the random offsets."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Can this storage feed the training loop? Cold/warm reads, nanoGPT's loader, headroom."""
    for option, value in (("--block-size", block_size), ("--batch-size", batch_size),
                          ("--grad-accum", grad_accum), ("--step-s", step_s), ("--tokens-per-sec", tokens_per_sec)):
        positive(option, value)
    need = resolve_need(tokens_per_sec=tokens_per_sec, batch_size=batch_size,
                        block_size=block_size, grad_accum=grad_accum, step_s=step_s,
                        profile=profile)
    cfg = BenchConfig(
        size_bytes=None if size.strip().lower() == "auto" else parse_bytes(size, "--size"),
        duration_s=duration,
        repeats=repeats,
        readers=readers,
        block_size=need.block_size if need else (block_size or DEFAULT_BLOCK_SIZE),
        sample_bytes=parse_bytes(sample_bytes, "--sample-bytes") if sample_bytes else None,
        batch_size=batch_size or (need.batch_size if need else None) or 12,
        seed=seed,
    )
    with _sigterm_as_interrupt(), progress_bar() as progress:
        result = run_bench(path, cfg, progress=progress)
    result["requirement"] = assess(need, result) if need else None
    if as_json:
        typer.echo(to_json(result))
    else:
        print_report(result, Console())
