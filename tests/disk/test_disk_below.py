"""The below-cache check: simulated caches under a fake clock, never the machine's own disk.

A FakeStorage answers `read_at` by advancing a fake clock: DISK_S for a read the device
serves, HIT_S for one a cache below serves. Which reads hit is the situation under test.
"""

import numpy as np
import pytest

from gpuprof.disk import below, target
from gpuprof.units import GiB, KiB, MiB

DISK_S, HIT_S = 60e-6, 20e-6  # 0.060 ms from the device, 0.020 ms from a cache: 3.0x
SIZE = GiB


class FakeStorage:
    """A clock and a disk. read_cache: re-reads hit. cached_from: offsets at or past it hit
    (a write-back cache holding the last-written part). jitter: ± that share of noise."""

    def __init__(self, read_cache=False, cached_from=None, jitter=0.0, seed=0):
        self.t = 0.0
        self.seen = set()
        self.read_cache, self.cached_from = read_cache, cached_from
        self.jitter, self.rng = jitter, np.random.default_rng(seed)
        self.reads = []

    def clock(self):
        return self.t

    def read_at(self, off):
        hit = (self.read_cache and off in self.seen) or (
            self.cached_from is not None and off >= self.cached_from)
        base = HIT_S if hit else DISK_S
        self.t += base * (1 + self.jitter * self.rng.uniform(-1, 1))
        self.seen.add(off)
        self.reads.append(off)


def _run(storage, recency=True, budget_s=1.0, size=SIZE):
    offsets = below.probe_offsets(size, 4 * KiB, 4 * KiB, seed=0)
    first, again = below.measure_pairs(storage.read_at, offsets, budget_s, storage.clock)
    return below.judge(first, again, recency=recency, read_bytes=4 * KiB, method="O_DIRECT")


def test_offsets_are_distinct_aligned_and_inside_their_region():
    offs = below.probe_offsets(SIZE, 4 * KiB, 4 * KiB, seed=1)
    assert [len(o) for o in offs] == [below.PER_REGION] * below.REGIONS
    flat = [x for o in offs for x in o]
    assert len(set(flat)) == len(flat) and all(x % (4 * KiB) == 0 for x in flat)
    for i, o in enumerate(offs):
        lo, hi = i * SIZE // below.REGIONS, (i + 1) * SIZE // below.REGIONS
        assert all(lo <= x and x + 4 * KiB <= hi for x in o), i
    # the smallest file bench-disk accepts (1 MiB): 32 slots of 4 KiB per region, all used
    tiny = below.probe_offsets(MiB, 4 * KiB, 4 * KiB, seed=1)
    assert [len(o) for o in tiny] == [32] * 8
    assert below.probe_offsets(8 * KiB, 4 * KiB, 4 * KiB, seed=1)[0] == []  # too small: none


def test_no_cache_below_is_not_suspected():
    r = _run(FakeStorage())
    assert r["status"] == "not seen" and r["signs"] == []
    assert r["pairs"] == 256
    assert r["first_p50_ms"] == pytest.approx(0.060) and r["reread_speedup"] == pytest.approx(1)
    assert r["tail_speedup"] == pytest.approx(1)
    assert below.warnings(r) == []


def test_noise_alone_is_not_a_cache():
    # ±30 %: the round-to-round swing of this project's VM; medians of pairs stay near 1x
    for seed in range(5):
        r = _run(FakeStorage(jitter=0.3, seed=seed))
        assert r["status"] == "not seen", (seed, r["reread_speedup"], r["tail_speedup"])


def test_a_read_cache_answers_the_re_reads():
    r = _run(FakeStorage(read_cache=True))
    assert r["status"] == "suspected" and r["signs"] == ["re-read"]
    assert r["reread_speedup"] == pytest.approx(3.0)
    assert r["reread_p50_ms"] == pytest.approx(0.020)
    (w,) = below.warnings(r)
    assert "re-reads" in w and "0.020 ms, 3.0× faster" in w and "(0.060 ms" in w
    assert "256 pairs, O_DIRECT" in w


def test_a_write_back_cache_holding_the_last_written_quarter():
    r = _run(FakeStorage(cached_from=SIZE * 3 // 4))
    assert r["signs"] == ["recency"] and r["tail_speedup"] == pytest.approx(3.0)
    assert (r["head_p50_ms"], r["tail_p50_ms"]) == pytest.approx((0.060, 0.020))
    (w,) = below.warnings(r)
    assert "last-written quarter" in w and "3.0× faster" in w and "0.020 vs 0.060 ms" in w
    # a dataset file was not just written in offset order: its quarters are not compared
    r = _run(FakeStorage(cached_from=SIZE * 3 // 4), recency=False)
    assert r["tail_speedup"] is None and r["status"] == "not seen"


def test_a_cache_holding_the_whole_file_shows_no_sign():
    # The check's limit, and why the default test file is large: every read alike is no sign.
    r = _run(FakeStorage(cached_from=0))
    assert r["status"] == "not seen" and r["first_p50_ms"] == pytest.approx(0.020)


def test_budget_ends_after_a_whole_round():
    s = FakeStorage()
    # each pair costs 2 x 60 µs; a round of 8 pairs 0.96 ms: 3 ms ends after the 4th round
    r = _run(s, budget_s=3e-3)
    assert r["pairs"] == 4 * below.REGIONS and r["status"] == "not seen"
    r = _run(FakeStorage(read_cache=True), budget_s=1e-6)  # one round: 8 pairs
    assert r["pairs"] == below.REGIONS and r["status"] == "not measured"
    assert r["reread_speedup"] is None and "too few pairs (8)" in r["note"]


def test_between_runs_untimed_between_the_two_reads():
    s = FakeStorage()
    calls = []

    def evict(off):
        calls.append((off, len(s.reads)))
        s.t += 1.0  # a slow eviction must not count as a read

    offsets = below.probe_offsets(SIZE, 4 * KiB, 4 * KiB, seed=0)
    first, again = below.measure_pairs(s.read_at, offsets, 1e6, s.clock, between=evict)
    assert len(calls) == 256
    assert all(s.reads[n - 1] == off == s.reads[n] for off, n in calls)  # first read, evict, again
    assert max(max(x) for x in first + again) == pytest.approx(DISK_S)


def test_test_file_size_rule():
    # an explicit --size is kept as given, whatever the free space (open_target refuses it)
    assert target.test_file_size(256 * MiB, 10 * MiB, MiB) == (256 * MiB, None)
    assert target.test_file_size(None, 100 * GiB, MiB) == (GiB, None)
    assert target.test_file_size(None, 2 * GiB, MiB) == (GiB, None)
    size, note = target.test_file_size(None, 801 * MiB + 5, MiB)
    assert size == 400 * MiB  # half the free space, whole MiB
    assert "400 MiB, not 1.00 GiB" in note and "801 MiB free" in note
    assert target.test_file_size(None, MiB, 3 * MiB)[0] == 3 * MiB  # floor: then refused
