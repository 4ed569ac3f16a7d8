"""A whole bench-disk run, small: cold reads really reach the device, warm ones don't."""

import pytest

from gpuprof.disk import fs, suite
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
            # a cold read fetched its own bytes from the device; a warm one nothing
            assert cold["device_bytes_per_read"] >= cold["read_bytes"] * share, label
            assert warm["device_bytes_per_read"] == 0, label
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
    # 6 cold + 6 warm measurements, twice, and the cache fill
    assert total == 2 * 12 + 1
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen)
