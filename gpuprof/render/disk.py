"""bench-disk output: the terminal report (rich), the JSON text, the progress bar (stderr)."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Iterator

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuprof.disk.units import size_label
from gpuprof.units import EMPTY, gib


def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return EMPTY
    if abs(x) >= 1e6:
        return f"{x / 1e6:.1f}M"
    if abs(x) >= 1e5:
        return f"{x / 1e3:.0f}k"
    if digits == 0 and abs(x) >= 10:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:,.1f}"
    return f"{x:.2g}" if x else "0"


def _ms(x: float | None) -> str:
    if x is None:
        return EMPTY
    return f"{x:.3f}" if x < 1 else f"{x:.2f}"


def _spread(x: float | None) -> str:
    return EMPTY if x is None else f"{x:.0f}%"


def header_lines(r: dict) -> list[str]:
    fsys = r["filesystem"]
    what = (f"test file {gib(r['measured_file_bytes'])}" if r["mode"] == "directory"
            else f"dataset file {gib(r['measured_file_bytes'])}, read-only")
    lines = [f"[bold]bench-disk[/bold] {r['path']}  ({what})",
             f"filesystem  {fsys['type']} ({fsys['kind']}) on {fsys['device']}, mounted at "
             f"{fsys['mountpoint']}; {gib(fsys['free_bytes'])} free"
             + (f"; readahead {fsys['read_ahead_kb']} KiB" if fsys.get("read_ahead_kb")
                else ""),
             f"cold reads  {r['cache_method']}: {r['cache_note']}"]
    below = r.get("below_cache")  # absent in results saved before the check existed
    if below:
        lines.append(f"cache below {below_line(below)}")
    f = r.get("file")
    if f:
        if f["residency_known"]:
            cached = f"{f['resident_fraction']:.0%} in the page cache before the run"
        else:
            cached = "page-cache residency unknown (" + (f["residency_note"] or "") + ")"
        fits = "fits in RAM" if f["fits_in_ram"] else "does NOT fit in RAM"
        lines.append(f"dataset     {gib(f['size_bytes'])}, {cached}; {fits} "
                     f"({gib(f['ram_total_bytes'])} total, "
                     f"{gib(f['ram_available_bytes'])} available)")
    return lines


def below_line(b: dict) -> str:
    """The below-cache check in one line: its status and the figures it rests on."""
    if b["status"] == "not measured":
        return f"not measured ({b['note']})"
    figs = [f"re-read {b['reread_speedup']:.2f}×" if b["reread_speedup"] is not None else None,
            f"last-written quarter {b['tail_speedup']:.2f}×" if b["tail_speedup"] is not None else None]
    return (f"{b['status']} (" + ", ".join(f for f in figs if f)
            + f"; suspected at ≥ {b['threshold']:g}×)")


def _table(title: str, columns: list[str]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              title_style="bold", collapse_padding=True, caption_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right", no_wrap=True)
    return t


def reads_table(r: dict) -> Table:
    s = r["settings"]
    t = _table(f"Reads (median of {s['repeats']} runs)",
               ["", "IOPS", "MB/s", "p50 ms", "p99 ms", "spread", "warm IOPS", "warm MB/s"])
    seq = r["sequential"]
    t.add_row(f"sequential {size_label(seq['block_bytes'])}", "", _num(seq["read_mb_s"]),
              _ms(seq["p50_ms"]), _ms(seq["p99_ms"]), _spread(seq["spread_pct"]), "",
              _num(seq["warm_read_mb_s"]))
    for label, e in r["random"].items():
        for key, name in (("qd1", "QD1"), ("parallel", f"×{e['parallel']['readers']}")):
            c, w = e[key], e[f"warm_{key}"]
            t.add_row(f"random {label} {name}", _num(c["iops"]), _num(c["mb_s"], 1),
                      _ms(c["p50_ms"]), _ms(c["p99_ms"]), _spread(c["spread_pct"]),
                      _num(w["iops"]), _num(w["mb_s"], 1))
    t.caption = (f"cold: page cache bypassed ({r['cache_method']}), {s['duration_s']:g} s "
                 f"per run; warm: from the page cache, {s['warm_duration_s']:g} s per run; "
                 "×N: N parallel readers; spread: (max−min)/median over the runs")
    return t


def loader_table(r: dict) -> Table:
    ld = r["loader"]
    t = _table(f"nanoGPT get_batch (np.memmap, batch {ld['batch_size']}, "
               f"{ld['sample_bytes']:,} B samples)",
               ["", "samples/s", "p50 ms", "p99 ms", "spread", "read/sample", "amplif.",
                "maj.faults"])
    for key in ("cold", "warm"):
        e = ld[key]
        dev = e["device_bytes_per_sample"]
        amp = e["read_amplification"]
        t.add_row(key, _num(e["samples_per_s"]), _ms(e["p50_ms"]), _ms(e["p99_ms"]),
                  _spread(e["spread_pct"]), EMPTY if dev is None else gib(dev),
                  EMPTY if amp is None else f"{_num(amp)}×", _num(e["major_faults_per_sample"], 2))
    t.caption = ("cold: the file is evicted before every sample; amplification = bytes read "
                 "from the device ÷ bytes used (readahead)")
    return t


def print_report(r: dict, console: Console | None = None) -> None:
    """The bench-disk terminal report."""
    console = console or Console()
    for line in header_lines(r):
        console.print(line, highlight=False)
    for w in r["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)
    console.print(reads_table(r))
    console.print(loader_table(r))
    req = r.get("requirement")
    if req:
        style = {"ok": "green", "tight": "yellow"}.get(req["status"], "red")
        console.print(f"[bold]requirement[/bold] (from {req['source']}): "
                      f"[{style}]{req['verdict']}[/{style}]", highlight=False)
        lstyle = {"ok": "green", "tight": "yellow"}.get(req.get("loader_status"), "red")
        console.print(f"            [{lstyle}]{req['loader_verdict']}[/{lstyle}]",
                      highlight=False)
    console.print(f"took {r['elapsed_s']:.1f} s", style="dim", highlight=False)


def _tidy(x):
    """Six significant digits: measurement noise is far above that."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _tidy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_tidy(v) for v in x]
    return x


def to_json(r: dict) -> str:
    """The --json document (keys documented in docs/bench-disk.md)."""
    return json.dumps(_tidy(r), indent=2, ensure_ascii=False)


@contextlib.contextmanager
def progress_bar(enabled: bool | None = None) -> Iterator:
    """Yield a progress callback (what, done, total); a rich bar on stderr if it is a TTY."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield None
        return
    prog = Progress(TextColumn("{task.description:<28}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)
    task = prog.add_task("bench-disk", total=1)
    with prog:
        yield lambda what, done, total: prog.update(task, description=what, completed=done,
                                                    total=total)
