"""Is a cache below this machine answering the "cold" reads? Paired 4 KiB reads say.

O_DIRECT (or eviction) keeps this machine's page cache out of a cold read, not a cache below
it: a VM host's page cache under a virtual disk, a RAID controller's memory, an NFS or SAN
server's RAM. Such a cache holds what was written or read recently; a small test file fits in
it and then reads faster than the disk will deliver a dataset that does not.

Two signs, measured before any other cold read, with reads at random 4 KiB-aligned offsets
spread over the file (REGIONS equal regions, visited round-robin so a drift of a noisy
machine hits them all alike):
  re-read   each block is read twice in a row; a read cache below answers the second read:
            median first-read latency ÷ median re-read latency ≥ SUSPECT_RATIO.
  recency   (a test file just written, in offset order) a write-back cache below holds the
            last-written bytes: median first-read latency in the first-written quarter ÷ in
            the last-written quarter ≥ SUSPECT_RATIO.
A cache that holds the whole file and answers every read alike shows neither sign: that is
why the default test file is larger (target.AUTO_TEST_FILE_BYTES). Timing goes through an
injectable clock and `read_at`, so tests drive this with a simulated cache.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from gpuprof.disk.units import size_label
from gpuprof.stats import median
from gpuprof.units import NM

Clock = Callable[[], float]
SUSPECT_RATIO = 1.5  # this VM: re-read ÷ first read 0.97-1.03 (no cache below), see docs
REGIONS = 8
PER_REGION = 32  # at most 256 pairs: ~35 ms at 65 µs a read
MIN_PAIRS = 16  # fewer pairs (or fewer than MIN_PAIRS // 2 per quarter): that sign is unmeasured


def probe_offsets(size: int, read_size: int, align: int, seed: int | None,
                  regions: int = REGIONS, per_region: int = PER_REGION) -> list[list[int]]:
    """Per region of [0, size), up to `per_region` distinct `align`-aligned offsets in random
    order, each read lying wholly inside its region (so no block is read first twice)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(regions):
        lo, hi = i * size // regions, (i + 1) * size // regions
        first, last = -(-lo // align), (hi - read_size) // align
        if last < first:
            out.append([])
            continue
        n = min(per_region, last - first + 1)
        picks = first + rng.choice(last - first + 1, size=n, replace=False)
        out.append([int(s) * align for s in picks])
    return out


def measure_pairs(read_at: Callable[[int], None], offsets: list[list[int]], budget_s: float,
                  clock: Clock, between: Callable[[int], None] | None = None
                  ) -> tuple[list[list[float]], list[list[float]]]:
    """Read each offset, then at once again; per region the (first, re-read) latencies.

    Round-robin over the regions; stops after the round in which `budget_s` ran out.
    `between(offset)` runs untimed between the two reads: with buffered reads it evicts the
    block, so the second read is not this machine's page cache.
    """
    first: list[list[float]] = [[] for _ in offsets]
    again: list[list[float]] = [[] for _ in offsets]
    start = clock()
    for j in range(max((len(o) for o in offsets), default=0)):
        for i, offs in enumerate(offsets):
            if j >= len(offs):
                continue
            t0 = clock()
            read_at(offs[j])
            t1 = clock()
            if between is not None:
                between(offs[j])
            t2 = clock()
            read_at(offs[j])
            t3 = clock()
            first[i].append(t1 - t0)
            again[i].append(t3 - t2)
        if clock() - start >= budget_s:
            break
    return first, again


def _ms(values: list[float]) -> float | None:
    return median(np.asarray(values)) * 1e3 if values else None


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return slow / fast if slow is not None and fast else None


def judge(first: list[list[float]], again: list[list[float]], recency: bool,
          read_bytes: int, method: str) -> dict:
    """The `below_cache` result: the figures and which signs were seen.

    recency: whether the file was just written in offset order (our test file), so its
    quarters differ in how recently they were written.
    """
    f = [x for r in first for x in r]
    a = [x for r in again for x in r]
    q = max(1, len(first) // 4)
    head = [x for r in first[:q] for x in r]
    tail = [x for r in first[-q:] for x in r]
    enough = len(f) >= MIN_PAIRS
    quarters = recency and min(len(head), len(tail)) >= MIN_PAIRS // 2
    out = {
        "method": method, "read_bytes": read_bytes, "pairs": len(f),
        "first_p50_ms": _ms(f) if enough else None,
        "reread_p50_ms": _ms(a) if enough else None,
        "reread_speedup": _ratio(_ms(f), _ms(a)) if enough else None,
        "head_p50_ms": _ms(head) if quarters else None,
        "tail_p50_ms": _ms(tail) if quarters else None,
        "tail_speedup": _ratio(_ms(head), _ms(tail)) if quarters else None,
        "threshold": SUSPECT_RATIO,
    }
    signs = []
    if out["reread_speedup"] is not None and out["reread_speedup"] >= SUSPECT_RATIO:
        signs.append("re-read")
    if out["tail_speedup"] is not None and out["tail_speedup"] >= SUSPECT_RATIO:
        signs.append("recency")
    measured = out["reread_speedup"] is not None or out["tail_speedup"] is not None
    out.update(status="suspected" if signs else ("not seen" if measured else NM),
               signs=signs, note=None if measured else
               f"too few pairs ({len(f)}) in the time allowed to judge")
    return out


def warnings(r: dict) -> list[str]:
    """One sentence, with its figures, per sign seen in a `below_cache` result."""
    out = []
    if "re-read" in r["signs"]:
        out.append(
            f"a cache below this machine answers re-reads: a {size_label(r['read_bytes'])} "
            f"block read again at once took {r['reread_p50_ms']:.3f} ms, "
            f"{r['reread_speedup']:.1f}× faster than its first read ({r['first_p50_ms']:.3f} ms; "
            f"medians of {r['pairs']} pairs, {r['method']}). Cold figures count its hits "
            "wherever a run reads a block twice; a dataset larger than that cache reads at "
            "the first-read speed")
    if "recency" in r["signs"]:
        out.append(
            f"the last-written quarter of the test file read {r['tail_speedup']:.1f}× faster "
            f"than the first-written ({r['tail_p50_ms']:.3f} vs {r['head_p50_ms']:.3f} ms, "
            "median first reads): a write-back cache below this machine holds recently "
            "written data, so cold figures on this test file are partly that cache; measure "
            "the dataset file itself, or give a larger --size")
    return out


def not_checked(why: str) -> dict:
    """The `below_cache` result when no check could run (e.g. nothing bypasses the cache)."""
    return {"method": None, "read_bytes": None, "pairs": 0, "first_p50_ms": None,
            "reread_p50_ms": None, "reread_speedup": None, "head_p50_ms": None,
            "tail_p50_ms": None, "tail_speedup": None, "threshold": SUSPECT_RATIO,
            "status": NM, "signs": [], "note": why}
