"""`gpuprof bench-disk` through Typer: bad input is one line + exit 2; --json keys."""

import json
import os

import pytest
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.report.disk import disk_view
from gpuprof.units import MiB

FAST = ["--size", "2Mi", "--duration", "0.01", "--readers", "2", "--batch-size", "2",
        "--block-size", "64", "--seed", "0"]


def _invoke(*args):
    return CliRunner().invoke(app, ["bench-disk", *args])


def _one_line_error(result):
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprof: error:"), result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def dataset(tmp_path):
    p = tmp_path / "train.bin"
    with open(p, "wb") as f:
        f.write(os.urandom(2 * MiB))
        os.fsync(f.fileno())
    return str(p)


def test_nonexistent_path(tmp_path):
    line = _one_line_error(_invoke(str(tmp_path / "nope"), *FAST))
    assert "no such file or directory" in line


def test_file_too_small(tmp_path):
    p = tmp_path / "small.bin"
    p.write_bytes(b"\0" * 1000)
    assert "too small" in _one_line_error(_invoke(str(p), *FAST))


def test_not_a_regular_file():
    assert "not a directory or a regular file" in _one_line_error(_invoke(os.devnull))


@pytest.mark.parametrize("args,msg", [
    (["--size", "lots"], "cannot read --size 'lots'; use e.g. 4096, 64Ki, 256Mi, 1GiB or 1e9 "
                         "(K/M/G = 10^3/10^6/10^9, Ki/Mi/Gi = 2^10/2^20/2^30)"),
    (["--size", "1.5"], "--size '1.5' is not a whole number of bytes"),
    (["--size", "64K"], "too small"),
    (["--repeats", "1"], "at least 2"),
    (["--duration", "0"], "above 0"),
    (["--readers", "0"], "between 1 and 256"),
    (["--step-s", "2"], "--batch-size"),
    (["--tokens-per-sec", "-1"], "positive"),
    (["--profile", "absent.json"], "no such file"),
])
def test_bad_options(tmp_path, args, msg):
    assert msg in _one_line_error(_invoke(str(tmp_path), *args))
    assert os.listdir(tmp_path) == []


def test_profile_without_the_fields(tmp_path):
    prof = tmp_path / "run.gpuprof.json"
    from gpuprof.profile import Profile

    prof.write_text(Profile(run={"config": {}}, steps=[]).to_json())  # a profile without a block_size
    line = _one_line_error(_invoke(str(tmp_path), "--profile", str(prof)))
    assert "block_size" in line


def test_json_keys_and_requirement(dataset):
    r = _invoke(dataset, *FAST, "--json", "--tokens-per-sec", "64000")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["schema"] == "gpuprof.bench-disk/1"
    assert d["mode"] == "file" and d["cache_method"] in ("O_DIRECT", "fadvise", "none")
    assert {"type", "mountpoint", "device", "kind", "free_bytes"} <= set(d["filesystem"])
    assert d["sequential"]["read_mb_s"] > 0
    assert d["settings"]["read_sizes"] == ["128B", "4KiB"]  # block 64 x 2 bytes, and 4 KiB
    for size in ("128B", "4KiB"):
        e = d["random"][size]
        for mode in ("qd1", "parallel", "warm_qd1", "warm_parallel"):
            assert e[mode]["iops"] > 0 and len(e[mode]["iops_runs"]) == 2
        assert e["qd1"]["p99_ms"] >= e["qd1"]["p50_ms"] > 0
        assert e["parallel"]["readers"] == 2
    assert d["loader"]["sample_bytes"] == 130
    assert d["loader"]["cold"]["samples_per_s"] > 0
    assert d["file"]["size_bytes"] == 2 * MiB
    req = d["requirement"]
    assert req["samples_per_s"] == pytest.approx(1000) and req["bytes_per_read"] == 130
    assert req["headroom"] == pytest.approx(d["random"]["128B"]["qd1"]["iops"] / 1000, rel=1e-4)
    assert req["verdict"].startswith("needs 0.13 MB/s, 1,000 reads/s")


def test_terminal_report(tmp_path):
    r = _invoke(str(tmp_path), *FAST, "--batch-size", "4", "--grad-accum", "2",
                "--step-s", "0.5")
    assert r.exit_code == 0, r.output
    out = r.stdout
    for text in ("bench-disk", "filesystem", "random 128B QD1", "random 4KiB ×2",
                 "sequential 1MiB", "get_batch", "requirement", "headroom"):
        assert text in out, text
    assert os.listdir(tmp_path) == []


def test_size_options_state_the_suffix_rule_and_the_default_is_auto():
    import typer.main

    from gpuprof.units import SUFFIX_RULE

    cmd = typer.main.get_command(app).commands["bench-disk"]
    opts = {p.name: p for p in cmd.params}
    assert opts["size"].default == "auto"
    assert "1 GiB" in opts["size"].help and "256 MiB" in opts["size"].help
    for name in ("size", "sample_bytes"):
        assert SUFFIX_RULE in opts[name].help, name


def test_size_auto_and_a_suspected_cache_reaches_the_report(tmp_path, monkeypatch):
    from gpuprof.disk import below, target

    monkeypatch.setattr(target, "AUTO_TEST_FILE_BYTES", 3 * MiB)  # no 1 GiB file in a test

    def fast_rereads(read_at, offsets, budget_s, clock, between=None):
        return [[60e-6] * 4 for _ in offsets], [[20e-6] * 4 for _ in offsets]

    monkeypatch.setattr(below, "measure_pairs", fast_rereads)
    fast = [a for a in FAST if a not in ("--size", "2Mi")]
    r = _invoke(str(tmp_path), *fast, "--size", "AUTO", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    (f,) = [f for f in disk_view(d).facts if f.label == "cache below"]
    assert d["measured_file_bytes"] == 3 * MiB and d["settings"]["size_auto"] is True
    assert d["below_cache"]["signs"] == ["re-read"]
    r = _invoke(str(tmp_path), *fast)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "test file 3.00 MiB" in text
    assert "a cache below this machine answers re-reads" in text and "3.0× faster" in text
    assert d["below_cache"]["status"] == "suspected" and d["below_cache"]["reread_speedup"] == 3.0
    assert " ".join(f"{f.label} {f.text}".split()) in text  # the view's line, as the JSON run measured it
    assert os.listdir(tmp_path) == []
