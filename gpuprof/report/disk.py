"""bench-disk's terminal report decided once, from its result (gpuprof.disk.suite.run_bench, with
the requirement of gpuprof.disk.requirement.assess): the header's facts (the file measured, the
filesystem, how reads were made cold, the cache-below check, the dataset's residency and whether
it fits in RAM), the warnings, the reads and loader tables (titles, columns, every cell, captions),
the requirement's two verdicts with their tones, and the time taken. gpuprof.render.disk lays it
out; nothing here prints. A result saved before a check existed (no `below_cache`) shows none."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.disk.units import size_label
from gpuprof.report.details import BAD, GOOD, PLAIN, WARN
from gpuprof.units import EMPTY, NM, gib

TITLE = "bench-disk"
WARNING = "warning:"
REQUIREMENT = "requirement"
PROGRESS_START = "bench-disk"  # the progress bar's first line, before the first part reports
_TONE = {"ok": GOOD, "tight": WARN}  # a requirement's status; any other is BAD


@dataclass(frozen=True)
class Fact:
    """A header line: its label (the renderer aligns them) and what it says."""

    label: str
    text: str


@dataclass(frozen=True)
class DiskTable:
    title: str
    columns: tuple[str, ...]  # the first is the row labels'
    rows: tuple[tuple[str, ...], ...]
    caption: str


@dataclass(frozen=True)
class Verdict:
    """A requirement line: what it is measured against (`lead`, said plainly) and its verdict,
    said in its tone."""

    text: str
    tone: str = PLAIN
    lead: str = ""


@dataclass(frozen=True)
class DiskView:
    title: str
    subject: str  # the path and what was read there
    facts: tuple[Fact, ...]
    warnings: tuple[str, ...]
    tables: tuple[DiskTable, ...]
    requirement: tuple[Verdict, ...]  # the disk's verdict, then the loader's; () without a requirement
    took: str


def num(x: float | None, digits: int = 0) -> str:
    """A rate or count in a table cell: k/M above 10^5, commas, small ones to two figures."""
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


def ms(x: float | None) -> str:
    if x is None:
        return EMPTY
    return f"{x:.3f}" if x < 1 else f"{x:.2f}"


def spread(x: float | None) -> str:
    return EMPTY if x is None else f"{x:.0f}%"


def below_line(b: dict) -> str:
    """The below-cache check in one line: its status and the figures it rests on."""
    if b["status"] == NM:
        return f"{NM} ({b['note']})"
    figs = [f"re-read {b['reread_speedup']:.2f}×" if b["reread_speedup"] is not None else None,
            f"last-written quarter {b['tail_speedup']:.2f}×" if b["tail_speedup"] is not None else None]
    return (f"{b['status']} (" + ", ".join(f for f in figs if f)
            + f"; suspected at ≥ {b['threshold']:g}×)")


def dataset_line(f: dict) -> str:
    """The dataset file: its size, how much of it was in the page cache, whether it fits in RAM."""
    if f["residency_known"]:
        cached = f"{f['resident_fraction']:.0%} in the page cache before the run"
    else:
        cached = "page-cache residency unknown (" + (f["residency_note"] or "") + ")"
    fits = "fits in RAM" if f["fits_in_ram"] else "does NOT fit in RAM"
    return (f"{gib(f['size_bytes'])}, {cached}; {fits} ({gib(f['ram_total_bytes'])} total, "
            f"{gib(f['ram_available_bytes'])} available)")


def subject(r: dict) -> str:
    what = (f"test file {gib(r['measured_file_bytes'])}" if r["mode"] == "directory"
            else f"dataset file {gib(r['measured_file_bytes'])}, read-only")
    return f"{r['path']}  ({what})"


def facts(r: dict) -> tuple[Fact, ...]:
    fsys = r["filesystem"]
    out = [Fact("filesystem", f"{fsys['type']} ({fsys['kind']}) on {fsys['device']}, mounted at "
                              f"{fsys['mountpoint']}; {gib(fsys['free_bytes'])} free"
                + (f"; readahead {fsys['read_ahead_kb']} KiB" if fsys.get("read_ahead_kb") else "")
                + (f"; a virtual disk ({fsys.get('block_driver') or fsys.get('block_model')})"
                   if fsys.get("virtual_disk") else "")),
           Fact("cold reads", f"{r['cache_method']}: {r['cache_note']}")]
    below = r.get("below_cache")  # absent in results saved before the check existed
    if below:
        out.append(Fact("cache below", below_line(below)))
    if r.get("file"):
        out.append(Fact("dataset", dataset_line(r["file"])))
    return tuple(out)


def reads_table(r: dict) -> DiskTable:
    s = r["settings"]
    seq = r["sequential"]
    rows = [(f"sequential {size_label(seq['block_bytes'])}", "", num(seq["read_mb_s"]), ms(seq["p50_ms"]),
             ms(seq["p99_ms"]), spread(seq["spread_pct"]), "", num(seq["warm_read_mb_s"]))]
    for label, e in r["random"].items():
        for key, name in (("qd1", "QD1"), ("parallel", f"×{e['parallel']['readers']}")):
            c, w = e[key], e[f"warm_{key}"]
            rows.append((f"random {label} {name}", num(c["iops"]), num(c["mb_s"], 1), ms(c["p50_ms"]),
                         ms(c["p99_ms"]), spread(c["spread_pct"]), num(w["iops"]), num(w["mb_s"], 1)))
    return DiskTable(f"Reads (median of {s['repeats']} runs)",
                     ("", "IOPS", "MB/s", "p50 ms", "p99 ms", "spread", "warm IOPS", "warm MB/s"), tuple(rows),
                     f"cold: page cache bypassed ({r['cache_method']}), {s['duration_s']:g} s "
                     f"per run; warm: from the page cache, {s['warm_duration_s']:g} s per run; "
                     "×N: N parallel readers; spread: (max−min)/median over the runs")


def loader_table(r: dict) -> DiskTable:
    ld = r["loader"]
    rows = []
    for key in ("cold", "warm"):
        e = ld[key]
        dev, amp = e["device_bytes_per_sample"], e["read_amplification"]
        rows.append((key, num(e["samples_per_s"]), ms(e["p50_ms"]), ms(e["p99_ms"]), spread(e["spread_pct"]),
                     EMPTY if dev is None else gib(dev), EMPTY if amp is None else f"{num(amp)}×",
                     num(e["major_faults_per_sample"], 2)))
    return DiskTable(f"nanoGPT get_batch (np.memmap, batch {ld['batch_size']}, {ld['sample_bytes']:,} B samples)",
                     ("", "samples/s", "p50 ms", "p99 ms", "spread", "read/sample", "amplif.", "maj.faults"),
                     tuple(rows),
                     "cold: the file is evicted before every sample; amplification = bytes read "
                     "from the device ÷ bytes used (readahead)")


def requirement(req: dict | None) -> tuple[Verdict, ...]:
    """The disk's verdict against what the loop needs (and where that came from), then the loader's."""
    if not req:
        return ()
    return (Verdict(req["verdict"], _TONE.get(req["status"], BAD), f"(from {req['source']}): "),
            Verdict(req["loader_verdict"], _TONE.get(req.get("loader_status"), BAD)))


def disk_view(r: dict) -> DiskView:
    """The report of one bench-disk result."""
    return DiskView(TITLE, subject(r), facts(r), tuple(r["warnings"]), (reads_table(r), loader_table(r)),
                    requirement(r.get("requirement")), f"took {r['elapsed_s']:.1f} s")
