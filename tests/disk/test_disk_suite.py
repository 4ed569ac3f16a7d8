"""A whole bench-disk run, small: cold reads really reach the device, warm ones don't."""

import os

import pytest

from gpuprof.disk import below, bench, fs, suite, target
from gpuprof.units import MiB

TINY = dict(size_bytes=4 * MiB, duration_s=0.02, repeats=2, readers=2, block_size=64,
            batch_size=2, seed=0)


@pytest.fixture
def disk_dir(tmp_path):
    if fs.filesystem_info(str(tmp_path)).kind == "memory":
        pytest.skip("tmp is a memory filesystem: nothing is cold")
    return str(tmp_path)


def _check_cold_and_warm(r):
    # With fadvise, a cold run re-reads pages it cached itself earlier in the run: on this
    # 1,024-page file a sizeable share. O_DIRECT reads always reach the device.
    share = 0.9 if r["cache_method"] == "O_DIRECT" else 0.5
    for label, e in r["random"].items():
        cold, warm = e["qd1"], e["warm_qd1"]
        if cold["device_bytes_per_read"] is not None:
            # a cold read fetched its own bytes from the device; a warm one nothing of its own.
            # The counters are the whole device's: another process's reads during a warm run
            # land there too (CI saw 0.94 bytes per warm 128-byte read), so a warm read is
            # held to a small fraction of what a cold one fetched, not to exactly zero.
            assert cold["device_bytes_per_read"] >= cold["read_bytes"] * share, label
            assert warm["device_bytes_per_read"] <= cold["device_bytes_per_read"] * 0.05, label
        assert warm["iops"] > cold["iops"], label
    ld = r["loader"]
    # below 1 when an eviction races the readahead the previous sample left in flight
    assert ld["cold"]["major_faults_per_sample"] >= 0.5
    assert ld["warm"]["major_faults_per_sample"] == 0
    if ld["cold"]["read_amplification"] is not None:
        assert ld["cold"]["read_amplification"] >= 4096 / ld["sample_bytes"] * 0.9
    assert r["warm_resident_fraction"] == pytest.approx(1.0)


def test_o_direct_or_default_method(disk_dir):
    r = suite.run_bench(disk_dir, suite.BenchConfig(**TINY))
    assert r["cache_method"] in ("O_DIRECT", "fadvise")
    _check_cold_and_warm(r)
    assert len(r["sequential"]["read_mb_s_runs"]) == 2


def test_fadvise_fallback_is_cold_too(disk_dir, monkeypatch):
    monkeypatch.setattr(fs, "_direct_alignment", lambda p: (None, "O_DIRECT refused"))
    r = suite.run_bench(disk_dir, suite.BenchConfig(**TINY))
    assert r["cache_method"] == "fadvise"
    assert "posix_fadvise DONTNEED" in r["cache_note"]
    assert r["random"]["128B"]["qd1"]["read_bytes"] == 128  # no O_DIRECT rounding
    _check_cold_and_warm(r)


def test_progress_reports_every_step(disk_dir):
    seen = []
    suite.run_bench(disk_dir, suite.BenchConfig(**TINY),
                    progress=lambda what, done, total: seen.append((what, done, total)))
    total = seen[-1][2]
    assert seen[-1] == ("done", total, total)
    # 6 cold + 6 warm measurements, twice, the below-cache check and the cache fill
    assert total == 2 * 12 + 2
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen)


def _fast_rereads(read_at, offsets, budget_s, clock, between=None):
    """below.measure_pairs as a cache below answers it: every re-read 3x faster."""
    first = [[60e-6] * 4 for _ in offsets]
    return first, [[20e-6] * 4 for _ in offsets]


def test_default_size_is_half_the_free_space_when_short(disk_dir, monkeypatch):
    real = fs.filesystem_info

    def short_of_space(path):
        info = real(path)
        info.free_bytes = 10 * MiB + 123
        return info

    monkeypatch.setattr(fs, "filesystem_info", short_of_space)
    monkeypatch.setattr(target, "AUTO_WARM_BYTES", 2 * MiB)
    cfg = suite.BenchConfig(**{**TINY, "size_bytes": None, "duration_s": 0.01})
    r = suite.run_bench(disk_dir, cfg)
    assert r["measured_file_bytes"] == 5 * MiB
    assert r["settings"]["size_bytes"] == 5 * MiB and r["settings"]["size_auto"] is True
    assert r["settings"]["warm_bytes"] == 2 * MiB  # auto: the warm runs' own default
    assert any("5.00 MiB, not 1.00 GiB" in w and "10.0 MiB free" in w for w in r["warnings"])
    assert os.listdir(disk_dir) == []


def test_below_cache_is_checked_and_a_suspected_one_is_said(disk_dir, monkeypatch):
    r = suite.run_bench(disk_dir, suite.BenchConfig(**TINY))
    bc = r["below_cache"]
    # this machine's own answer is not asserted: only that the check ran, on the cold method
    assert bc["method"] == r["cache_method"] and bc["read_bytes"] == 4096
    assert bc["pairs"] >= below.REGIONS and bc["status"] in ("not seen", "suspected",
                                                              "not measured")
    monkeypatch.setattr(below, "measure_pairs", _fast_rereads)
    r = suite.run_bench(disk_dir, suite.BenchConfig(**TINY))
    assert r["below_cache"]["status"] == "suspected"
    assert r["below_cache"]["reread_speedup"] == pytest.approx(3.0)
    assert any(w.startswith("a cache below this machine answers re-reads") and "3.0×" in w
               for w in r["warnings"])


def test_no_below_cache_check_when_nothing_bypasses_the_page_cache(disk_dir, monkeypatch):
    monkeypatch.setattr(fs, "choose_cache_bypass",
                        lambda p, info: fs.CacheBypass("none", 1, "nothing works"))
    r = suite.run_bench(disk_dir, suite.BenchConfig(**TINY))
    assert r["below_cache"]["status"] == "not measured" and r["below_cache"]["pairs"] == 0
    assert "nothing works" in r["below_cache"]["note"]


def test_cold_sequential_runs_read_each_byte_once(disk_dir, monkeypatch):
    calls = []
    real = bench.read_sequential

    def spy(fd, span, block, duration_s, clock=None, on_wrap=None, first_block=0,
            max_blocks=None):
        r = real(fd, span, block, duration_s, clock, on_wrap, first_block, max_blocks)
        calls.append((first_block, max_blocks, r.ops))
        return r

    monkeypatch.setattr(bench, "read_sequential", spy)
    r = suite.run_bench(disk_dir, suite.BenchConfig(**{**TINY, "repeats": 3, "duration_s": 0.01}))
    cold = [c for c in calls if c[1] is not None]
    # 4 MiB in 1 MiB blocks, 3 runs: one block each, at blocks 0, 1 and 2
    assert [(f, m) for f, m, _ in cold] == [(0, 1), (1, 1), (2, 1)]
    assert all(ops <= m for _, m, ops in cold)
    s = r["sequential"]
    assert s["share_bytes"] == MiB and s["read_once"] is True
    assert s["runs_ended_by_share"] == sum(ops == m for _, m, ops in cold)
