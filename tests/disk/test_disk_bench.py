"""Read measurements: counts and rates under a fake clock, alignment, loader accounting."""

import os

import numpy as np
import pytest

from gpuprof.disk import bench, fs
from gpuprof.units import KiB, MiB
from gpuprof.errors import GpuprofError

TICK = 1 / 1024  # exact in binary floating point: fake-clock sums stay exact


class FakeClock:
    """Advances one tick per call, so a run's length is set by how often it looks."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        now = self.t
        self.t += TICK
        return now


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "train.bin"
    with open(path, "wb") as f:
        f.write(os.urandom(2 * MiB))
        os.fsync(f.fileno())  # dirty pages cannot be evicted
    return str(path)


def test_random_qd1_counts_and_rates_with_fake_clock(data_file):
    fd = os.open(data_file, os.O_RDONLY)
    try:
        r = bench.read_random(fd, 2 * MiB, 4 * KiB, 4 * KiB, duration_s=10 * TICK, readers=1,
                              seed=1, clock=FakeClock())
    finally:
        os.close(fd)
    # start=0; first check at 1 tick; each read costs 2 ticks and ends at 1+2k ticks;
    # reads go on while the end is before 10 ticks: k = 1..5 -> 5 reads, last ends at 11.
    assert r.ops == 5
    assert r.elapsed_s == 11 * TICK
    assert r.iops == pytest.approx(5 / (11 * TICK))
    assert r.bytes == 5 * 4 * KiB
    assert np.all(r.latencies_s == TICK)
    assert bench.latency_ms(r.latencies_s)["p99_ms"] == pytest.approx(TICK * 1e3)


def test_random_offsets_are_aligned_and_in_bounds():
    rng = np.random.default_rng(0)
    offs = np.array(bench.random_offsets(rng, span=1 * MiB, size=2 * KiB, align=2 * KiB,
                                         count=20000))
    assert np.all(offs % (2 * KiB) == 0)
    assert offs.min() >= 0 and offs.max() + 2 * KiB <= 1 * MiB
    assert offs.max() == 1 * MiB - 2 * KiB  # the last slot is reachable


def test_sequential_wraps_and_excludes_paused_time(data_file):
    fd = os.open(data_file, os.O_RDONLY)
    wraps = []
    clock = FakeClock()

    def on_wrap():
        wraps.append(1)
        clock.t += 100  # a slow eviction must not count as reading time

    try:
        r = bench.read_sequential(fd, 2 * MiB, 1 * MiB, duration_s=20 * TICK, clock=clock,
                                  on_wrap=on_wrap)
    finally:
        os.close(fd)
    # 2 blocks per pass: a wrap before every third, fifth... read; each read is 2 ticks
    assert 8 <= r.ops <= 10 and len(wraps) == (r.ops - 1) // 2
    assert r.elapsed_s <= 22 * TICK  # the 100 s spent in on_wrap are not reading time
    assert r.mb_s == pytest.approx(r.ops * MiB / r.elapsed_s / 1e6)


def test_parallel_readers_really_read(data_file):
    fd = os.open(data_file, os.O_RDONLY)
    try:
        r = bench.read_random(fd, 2 * MiB, 4 * KiB, 4 * KiB, duration_s=0.05, readers=4)
    finally:
        os.close(fd)
    assert r.ops >= 4 and len(r.latencies_s) == r.ops  # every reader read
    assert r.elapsed_s >= 0.05


def test_reader_errors_reach_the_caller(data_file, monkeypatch):
    fd = os.open(data_file, os.O_RDONLY)
    monkeypatch.setattr(bench.os, "preadv", lambda fd, bufs, off: 1)  # a short read
    try:
        with pytest.raises(GpuprofError, match="short read"):
            bench.read_random(fd, 2 * MiB, 4 * KiB, 4 * KiB, duration_s=0.05, readers=3)
        with pytest.raises(GpuprofError, match="short read"):
            bench.read_random(fd, 2 * MiB, 4 * KiB, 4 * KiB, duration_s=0.05, readers=1)
    finally:
        os.close(fd)


def test_loader_warm_reads_nothing_from_device(data_file):
    fd = os.open(data_file, os.O_RDONLY)
    bench.warm(fd, 2 * MiB)
    os.close(fd)
    r = bench.read_loader(data_file, 2 * MiB, block_size=64, batch_size=4, duration_s=0.02,
                          seed=0)
    assert r.ops > 0 and r.ops % 4 == 0
    assert r.bytes == r.ops * 65 * 2
    if r.device_read_bytes is not None:
        assert r.device_read_bytes == 0
    assert r.major_faults == 0


def test_loader_cold_counts_device_bytes_and_faults(data_file):
    if fs.filesystem_info(data_file).kind == "memory":
        pytest.skip("tmp is a memory filesystem: nothing is cold")
    fd = os.open(data_file, os.O_RDONLY)
    try:
        r = bench.read_loader(data_file, 2 * MiB, block_size=64, batch_size=4,
                              duration_s=0.02, seed=0, before_sample=lambda: fs.evict(fd))
    finally:
        os.close(fd)
    # Nearly every sample faults its page in from storage; an eviction can miss pages that
    # the previous sample's readahead still has in flight (locked folios stay).
    assert r.major_faults >= 0.75 * r.ops
    if r.device_read_bytes is not None:
        assert r.device_read_bytes >= 0.75 * r.ops * 4 * KiB


def test_loader_refuses_too_small_span(data_file):
    with pytest.raises(GpuprofError, match="too small"):
        bench.read_loader(data_file, 100, block_size=64, batch_size=1, duration_s=0.01)


def test_summarize_median_and_spread():
    s = bench.summarize([100.0, 80.0, 120.0])
    assert s["median"] == 100.0
    assert s["spread_pct"] == pytest.approx(40.0)
    assert s["runs"] == [100.0, 80.0, 120.0]


def test_sequential_share_starts_at_its_block_and_reads_it_once(data_file, monkeypatch):
    offsets = []
    real = os.preadv

    def spy(fd, bufs, off):
        offsets.append(off)
        return real(fd, bufs, off)

    monkeypatch.setattr(bench.os, "preadv", spy)
    fd = os.open(data_file, os.O_RDONLY)
    try:
        # 8 blocks of 256 KiB; a share of 3 from block 6: 6, 7, then wraps to 0; stops there
        r = bench.read_sequential(fd, 2 * MiB, 256 * KiB, duration_s=1000 * TICK,
                                  clock=FakeClock(), first_block=6, max_blocks=3)
    finally:
        os.close(fd)
    assert offsets == [6 * 256 * KiB, 7 * 256 * KiB, 0]
    assert r.ops == 3 and r.elapsed_s < 1000 * TICK  # ended by its share, not the clock
