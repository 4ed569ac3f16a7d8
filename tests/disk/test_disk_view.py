"""bench-disk's report view (gpuprof.report.disk): every header line, cell, caption and tone is
decided there from the result; the terminal renderer (gpuprof.render.disk) lays out exactly
that."""

import copy
import io

from rich.console import Console

from gpuprof.render.disk import print_report
from gpuprof.report.details import BAD, GOOD, WARN
from gpuprof.report.disk import REQUIREMENT, TITLE, WARNING, below_line, disk_view, num
from gpuprof.units import EMPTY, GiB, MiB

_COLD = {"iops": 12000.0, "mb_s": 1.5, "p50_ms": 0.08, "p99_ms": 0.2, "spread_pct": 7.0}
_WARM = {"iops": 350000.0, "mb_s": 178.0}
RESULT = {
    "path": "/data/train.bin", "mode": "file", "measured_file_bytes": 2 * GiB,
    "filesystem": {"type": "ext4", "kind": "local", "device": "/dev/vda", "mountpoint": "/",
                   "free_bytes": 80 * GiB, "read_ahead_kb": 128},
    "cache_method": "O_DIRECT", "cache_note": "512-byte aligned",
    "below_cache": {"status": "not seen", "reread_speedup": 1.02, "tail_speedup": None, "threshold": 1.5,
                    "note": None},
    "file": {"size_bytes": 2 * GiB, "residency_known": True, "resident_fraction": 0.25, "residency_note": None,
             "fits_in_ram": False, "ram_total_bytes": GiB, "ram_available_bytes": GiB // 2},
    "warnings": ["the cold loader run evicted this file"],
    "settings": {"repeats": 3, "duration_s": 1.0, "warm_duration_s": 0.5},
    "sequential": {"block_bytes": MiB, "read_mb_s": 880.0, "p50_ms": 1.2, "p99_ms": None, "spread_pct": None,
                   "warm_read_mb_s": 5000.0},
    "random": {"4KiB": {"qd1": _COLD, "warm_qd1": _WARM, "parallel": {**_COLD, "readers": 4},
                        "warm_parallel": _WARM}},
    "loader": {"batch_size": 12, "sample_bytes": 2050,
               "cold": {"samples_per_s": 328.0, "p50_ms": 2.9, "p99_ms": 3.2, "spread_pct": 11.0,
                        "device_bytes_per_sample": None, "read_amplification": 16132.0,
                        "major_faults_per_sample": 0.004},
               "warm": {"samples_per_s": 16919.0, "p50_ms": 0.012, "p99_ms": 0.046, "spread_pct": 61.0,
                        "device_bytes_per_sample": 0, "read_amplification": 0.0, "major_faults_per_sample": 0.0}},
    "requirement": {"source": "--tokens-per-sec", "status": "ok", "verdict": "needs 0.13 MB/s (ok)",
                    "loader_status": "too slow", "loader_verdict": "the loader: 0.33× headroom"},
    "elapsed_s": 12.34,
}


def test_the_header_says_what_was_read_and_where():
    v = disk_view(RESULT)
    assert v.title == TITLE and v.subject.startswith("/data/train.bin")
    facts = {f.label: f.text for f in v.facts}
    assert list(facts) == ["filesystem", "cold reads", "cache below", "dataset"]
    assert facts["cache below"] == below_line(RESULT["below_cache"])
    assert "does NOT fit in RAM" in facts["dataset"] and "25% in the page cache" in facts["dataset"]
    r = copy.deepcopy(RESULT)
    del r["below_cache"], r["file"]  # a result saved before the check; a directory's test file
    assert [f.label for f in disk_view(r).facts] == ["filesystem", "cold reads"]
    r["below_cache"] = {"status": "not measured", "note": "no O_DIRECT"}
    r["file"] = dict(RESULT["file"], residency_known=False, residency_note="no mincore", fits_in_ram=True)
    facts = {f.label: f.text for f in disk_view(r).facts}
    assert facts["cache below"] == "not measured (no O_DIRECT)"
    assert "residency unknown (no mincore)" in facts["dataset"] and "; fits in RAM" in facts["dataset"]


def test_tables_hold_every_cell_and_a_missing_figure_is_empty():
    reads, loader = disk_view(RESULT).tables
    assert len(reads.columns) == len(reads.rows[0]) == len(loader.columns) == len(loader.rows[0])
    assert reads.rows[0][:5] == ("sequential 1MiB", "", "880", "1.20", EMPTY)
    assert [row[0] for row in reads.rows[1:]] == ["random 4KiB QD1", "random 4KiB ×4"]
    assert reads.rows[1][6] == num(350000.0) == "350k"
    assert loader.rows[0][5] == EMPTY and loader.rows[0][6] == "16,132×"
    assert "O_DIRECT" in reads.caption and "(readahead)" in loader.caption


def test_the_requirements_tones_follow_its_statuses():
    disk, loader = disk_view(RESULT).requirement
    assert (disk.tone, loader.tone) == (GOOD, BAD) and disk.lead == "(from --tokens-per-sec): "
    r = copy.deepcopy(RESULT)
    r["requirement"].update(status="tight", loader_status=None)
    assert [v.tone for v in disk_view(r).requirement] == [WARN, BAD]
    r["requirement"] = None
    assert disk_view(r).requirement == ()


def test_the_terminal_lays_out_the_view():
    v = disk_view(RESULT)
    buf = io.StringIO()
    print_report(RESULT, Console(file=buf, width=400))
    out = buf.getvalue()
    lines = out.splitlines()
    assert lines[0] == f"{v.title} {v.subject}"
    for f in v.facts:
        assert f"{f.label:<11} {f.text}" in lines
    assert f"{WARNING} {v.warnings[0]}" in lines
    words = " ".join(out.split())  # a caption wraps to its table's width
    for t in v.tables:
        assert t.title in out and t.caption in words and all(c in out for row in t.rows for c in row)
    assert f"{REQUIREMENT:<11} {v.requirement[0].lead}{v.requirement[0].text}" in lines
    assert " " * 12 + v.requirement[1].text in lines
    assert lines[-1] == v.took == "took 12.3 s"


def test_a_path_that_looks_like_markup_is_printed_as_it_is():
    r = copy.deepcopy(RESULT)
    r["path"] = "/data/[bold]run[/bold]/train.bin"
    r["warnings"] = ["a warning about /data/[red]x[/red]"]
    buf = io.StringIO()
    print_report(r, Console(file=buf, width=400))
    out = buf.getvalue()
    assert "/data/[bold]run[/bold]/train.bin" in out and "/data/[red]x[/red]" in out
