"""One bench-disk run: the filesystem facts, the cold and warm measurements, one dict.

The result dict is what `--json` prints; its keys are stable and documented in
docs/bench-disk.md. Cold measurements bypass the page cache (O_DIRECT, else fadvise
eviction); warm ones read the same way through a filled page cache.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from gpuprof.disk import below, bench, fs, target
from gpuprof.disk.bench import TOKEN_BYTES, RunResult
from gpuprof.disk.units import KiB, MiB, size_label
from gpuprof.errors import GpuprofError

SCHEMA = "gpuprof.bench-disk/1"
Progress = Callable[[str, int, int], None]  # (what runs now, steps done, steps in all)


@dataclass
class BenchConfig:
    """What to measure. duration_s is per cold run; warm runs take half as long.

    size_bytes None is --size auto: target.test_file_size for a test file, the first
    target.AUTO_WARM_BYTES of a dataset file for the warm runs.
    """

    size_bytes: int | None = None
    duration_s: float = 0.5
    repeats: int = 2
    readers: int = 8
    block_size: int = 1024
    sample_bytes: int | None = None  # default block_size * 2
    batch_size: int = 12
    seed: int | None = None
    seq_block: int = MiB

    def read_sizes(self) -> list[int]:
        """Random read sizes: the loader's sample size and 4 KiB (deduplicated, in order)."""
        sample = self.sample_bytes or self.block_size * TOKEN_BYTES
        return list(dict.fromkeys([sample, 4 * KiB]))

    def min_file_bytes(self) -> int:
        return max(self.seq_block, 4 * max(self.read_sizes()),
                   4 * (self.block_size + 1) * TOKEN_BYTES)

    def validate(self) -> None:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):  # nan too
            raise GpuprofError(f"--duration must be above 0 seconds, got {self.duration_s}")
        if self.repeats < 2:
            raise GpuprofError("--repeats must be at least 2 (median and spread need two runs)")
        if not 1 <= self.readers <= 256:
            raise GpuprofError("--readers must be between 1 and 256")
        if self.block_size < 1 or self.batch_size < 1:
            raise GpuprofError("--block-size and --batch-size must be at least 1")
        if self.sample_bytes is not None and self.sample_bytes < 1:
            raise GpuprofError("--sample-bytes must be at least 1")
        if self.size_bytes is not None and self.size_bytes < 1:
            raise GpuprofError("--size must be above 0")


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def offset_alignment(read_size: int, min_align: int) -> int:
    """Offsets are multiples of the largest power of two dividing the read size, capped at
    4 KiB (fio's blockalign=bs for 2k/4k reads) and at least what O_DIRECT requires."""
    a = read_size & -read_size
    return max(min(a, 4 * KiB), min_align)


def _stats(runs: list[RunResult], key: str, value: Callable[[RunResult], float]) -> dict:
    s = bench.summarize([value(r) for r in runs])
    out = {key: s["median"], f"{key}_runs": s["runs"], "spread_pct": s["spread_pct"]}
    out.update(bench.latency_ms(np.concatenate([r.latencies_s for r in runs])))
    return out


def _random_entry(runs: list[RunResult], read_bytes: int, align: int, readers: int) -> dict:
    out = _stats(runs, "iops", lambda r: r.iops)
    out["mb_s"] = bench.summarize([r.mb_s for r in runs])["median"]
    ops = sum(r.ops for r in runs)
    dev = [r.device_read_bytes for r in runs]
    out.update(read_bytes=read_bytes, offset_align=align, readers=readers, reads=ops,
               # evidence of a cold read: what the device delivered per read (page-rounded
               # with fadvise; about 0 when warm)
               device_bytes_per_read=sum(dev) / ops if ops and None not in dev else None)
    return out


def _loader_entry(runs: list[RunResult], sample: int) -> dict:
    out = _stats(runs, "samples_per_s", lambda r: r.iops)
    ops = sum(r.ops for r in runs)
    dev = [r.device_read_bytes for r in runs]
    per = sum(dev) / ops if ops and None not in dev else None
    faults = sum(r.major_faults or 0 for r in runs) / ops if ops else None
    out.update(samples=ops,
               mb_s=bench.summarize([r.mb_s for r in runs])["median"],
               device_bytes_per_sample=per,
               read_amplification=per / sample if per is not None else None,
               major_faults_per_sample=faults)
    return out


def fresh_file_warning(info: fs.FsInfo) -> str:
    """What a just-written test file on a virtual disk cannot tell (docs/bench-disk.md: on this
    project's VM such a file read sequentially at 1.5-1.7x fio's figure on an older one, in 8 of 8
    paired rounds, with the below-cache check seeing nothing)."""
    what = info.block_driver or info.block_model or "a virtual disk"
    return (f"the test file was just written to a virtual disk ({what}): the host below this machine may "
            f"answer reads of what was just written from its own cache, which a dataset written long ago "
            f"does not get, so these figures are an upper bound; `gpuprof bench-disk DATASET_FILE` reads "
            f"a file as training will")


def run_bench(path: str, cfg: BenchConfig, progress: Progress | None = None,
              clock: bench.Clock = time.perf_counter) -> dict:
    """Measure the storage under `path` (a directory or a dataset file); see module doc."""
    cfg.validate()
    t_begin = time.monotonic()
    mode = target.check_path(path)
    info = fs.filesystem_info(path)
    warnings = [info.warning] if info.warning else []
    report = lambda what, done, total: progress and progress(what, done, total)  # noqa: E731

    file_facts = None
    if mode == "file":
        res = fs.residency(path)
        ram_total, ram_avail = fs.ram_bytes()
        file_facts = {"path": os.path.abspath(path), "size_bytes": res.size_bytes,
                      "resident_bytes": res.resident_bytes,
                      "resident_fraction": res.fraction, "residency_known": res.known,
                      "residency_note": res.reason,
                      "fits_in_ram": res.size_bytes <= ram_total,
                      "fits_in_available_ram": res.size_bytes <= ram_avail,
                      "ram_total_bytes": ram_total, "ram_available_bytes": ram_avail}

    if mode == "directory":  # --size is the test file's size
        size, size_note = target.test_file_size(cfg.size_bytes, info.free_bytes,
                                                cfg.min_file_bytes())
        warnings += [size_note] if size_note else []
        if info.virtual_disk:
            warnings.append(fresh_file_warning(info))
    else:  # --size is how much of the dataset file the warm runs read
        size = cfg.size_bytes or target.AUTO_WARM_BYTES
    report("creating the test file" if mode == "directory" else "probing", 0, 1)
    with target.open_target(path, size, cfg.min_file_bytes(), info.free_bytes,
                            cfg.seed) as tgt:
        bypass = fs.choose_cache_bypass(tgt.path, info)
        if bypass.method == "none" and info.kind != "memory":  # memory fs: warned already
            warnings.append(f"the page cache could not be bypassed ({bypass.note}): cold "
                            "numbers are cache numbers")
        measured = _measure(tgt, cfg, bypass, report, clock)
        if mode == "file":
            measured["warnings"].append(
                "the cold loader run evicted this file from the page cache (posix_fadvise "
                "DONTNEED); the next epoch's first reads are cold")

    sizes = cfg.read_sizes()
    return {
        "schema": SCHEMA,
        "path": os.path.abspath(path),
        "mode": mode,
        "measured_file_bytes": tgt.size_bytes,
        "cache_method": bypass.method,
        "cache_note": bypass.note,
        "filesystem": {"path": os.path.abspath(path), **info.to_dict()},
        "file": file_facts,
        "settings": {**asdict(cfg), "size_bytes": size, "size_auto": cfg.size_bytes is None,
                     "sample_bytes": sizes[0],
                     "read_sizes": [size_label(s) for s in sizes],
                     "warm_duration_s": cfg.duration_s / 2,
                     "warm_bytes": measured["warm_bytes"]},
        "sequential": measured["sequential"],
        "random": measured["random"],
        "loader": measured["loader"],
        "below_cache": measured["below_cache"],
        "warm_resident_fraction": measured["warm_resident_fraction"],
        "warnings": warnings + measured["warnings"],
        "elapsed_s": time.monotonic() - t_begin,
    }


def _measure(tgt: target.Target, cfg: BenchConfig, bypass: fs.CacheBypass, report,
             clock) -> dict:
    direct = bypass.method == "O_DIRECT"
    dio_align = bypass.alignment if direct else 1
    size = tgt.size_bytes
    # Warm reads stay in a region that fits the cache: the first --size bytes (auto: 256 MiB),
    # at most half the free RAM, of the test or dataset file.
    _, ram_avail = fs.ram_bytes()
    region = min(size, cfg.size_bytes or target.AUTO_WARM_BYTES, ram_avail // 2)
    region = max(region, min(size, cfg.min_file_bytes()))
    counter = itertools.count(cfg.seed or 0)
    next_seed = lambda: None if cfg.seed is None else next(counter)  # noqa: E731
    d, wd = cfg.duration_s, cfg.duration_s / 2
    sample = (cfg.block_size + 1) * TOKEN_BYTES
    reads = []  # (label, bytes read per op, offset alignment)
    for s in cfg.read_sizes():
        rb = _round_up(s, dio_align)
        reads.append((size_label(s), rb, offset_alignment(rb, dio_align)))

    bfd = os.open(tgt.path, os.O_RDONLY)  # buffered: warm reads, eviction, fadvise cold
    dfd = os.open(tgt.path, os.O_RDONLY | os.O_DIRECT) if direct else bfd
    try:
        evict = (lambda: fs.evict(bfd))

        def cold_random(rb, al, n):
            if not direct:
                os.posix_fadvise(bfd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead
            return bench.read_random(dfd, size, rb, al, d, readers=n, seed=next_seed(),
                                     clock=clock)

        # Each cold sequential run reads its own share of the file, oldest-written first, so
        # no byte is read twice (a cache below would answer a second read); a run that
        # finishes its share before --duration is a shorter run.
        nblocks = size // cfg.seq_block
        share = max(1, nblocks // cfg.repeats)
        seq_run = itertools.count()

        def cold_sequential():
            if not direct:
                os.posix_fadvise(bfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            return bench.read_sequential(dfd, size, cfg.seq_block, d, clock,
                                         on_wrap=None if direct else evict,
                                         first_block=next(seq_run) * share, max_blocks=share)

        cold = [("sequential", cold_sequential)]
        for label, rb, al in reads:
            cold.append((f"random.{label}.qd1", lambda rb=rb, al=al: cold_random(rb, al, 1)))
            cold.append((f"random.{label}.parallel",
                         lambda rb=rb, al=al: cold_random(rb, al, cfg.readers)))
        cold.append(("loader.cold", lambda: bench.read_loader(
            tgt.path, size, cfg.block_size, cfg.batch_size, d, seed=next_seed(), clock=clock,
            before_sample=evict)))
        warm = [("sequential.warm", lambda: bench.read_sequential(
            bfd, region, cfg.seq_block, wd, clock))]
        for label, rb, al in reads:
            warm.append((f"random.{label}.warm_qd1", lambda rb=rb, al=al: bench.read_random(
                bfd, region, rb, al, wd, readers=1, seed=next_seed(), clock=clock)))
            warm.append((f"random.{label}.warm_parallel", lambda rb=rb, al=al: bench.read_random(
                bfd, region, rb, al, wd, readers=cfg.readers, seed=next_seed(), clock=clock)))
        warm.append(("loader.warm", lambda: bench.read_loader(
            tgt.path, region, cfg.block_size, cfg.batch_size, wd, seed=next_seed(),
            clock=clock)))

        total = cfg.repeats * (len(cold) + len(warm)) + 2
        done = 0
        report("checking for a cache below this machine", done, total)
        if bypass.method == "none":
            below_cache = below.not_checked(f"cold reads are page-cache reads here ({bypass.note})")
        else:
            below_cache = _check_below(tgt, bfd, dfd, direct, dio_align, d, clock, cfg.seed)
        done += 1
        runs: dict[str, list[RunResult]] = {}
        # Round-robin over the repeats so a slow patch of a noisy machine hits every test.
        for _ in range(cfg.repeats):
            for name, fn in cold:
                report(name, done, total)
                if not direct:
                    evict()
                runs.setdefault(name, []).append(fn())
                done += 1
        report("filling the page cache", done, total)
        os.posix_fadvise(bfd, 0, 0, os.POSIX_FADV_NORMAL)
        bench.warm(bfd, region)
        warm_res = fs.residency(tgt.path, 0, region)
        done += 1
        for _ in range(cfg.repeats):
            for name, fn in warm:
                report(name, done, total)
                runs.setdefault(name, []).append(fn())
                done += 1
        report("done", done, total)
    finally:
        if dfd != bfd:
            os.close(dfd)
        os.close(bfd)

    warnings = []
    if warm_res.known and warm_res.fraction is not None and warm_res.fraction < 0.9:
        warnings.append(f"only {warm_res.fraction:.0%} of the warm region stayed in the page "
                        "cache: 'warm' numbers are partly cold (memory pressure?)")
    seq = _stats(runs["sequential"], "read_mb_s", lambda r: r.mb_s)
    seq_warm = bench.summarize([r.mb_s for r in runs["sequential.warm"]])
    seq.update(block_bytes=cfg.seq_block, share_bytes=share * cfg.seq_block,
               read_once=nblocks >= cfg.repeats,
               runs_ended_by_share=sum(r.ops >= share for r in runs["sequential"]),
               warm_read_mb_s=seq_warm["median"],
               warm_read_mb_s_runs=seq_warm["runs"], warm_spread_pct=seq_warm["spread_pct"])
    random = {}
    for label, rb, al in reads:
        random[label] = {
            "qd1": _random_entry(runs[f"random.{label}.qd1"], rb, al, 1),
            "parallel": _random_entry(runs[f"random.{label}.parallel"], rb, al, cfg.readers),
            "warm_qd1": _random_entry(runs[f"random.{label}.warm_qd1"], rb, al, 1),
            "warm_parallel": _random_entry(runs[f"random.{label}.warm_parallel"], rb, al,
                                           cfg.readers),
        }
    loader = {"sample_bytes": sample, "block_size": cfg.block_size,
              "batch_size": cfg.batch_size,
              "cold": _loader_entry(runs["loader.cold"], sample),
              "warm": _loader_entry(runs["loader.warm"], sample)}
    warnings = below.warnings(below_cache) + warnings
    return {"sequential": seq, "random": random, "loader": loader, "warnings": warnings,
            "warm_resident_fraction": warm_res.fraction, "below_cache": below_cache,
            "warm_bytes": region}


def _check_below(tgt: target.Target, bfd: int, dfd: int, direct: bool, dio_align: int,
                 budget_s: float, clock, seed: int | None) -> dict:
    """below.py's paired reads on the file, before any other cold read touches it."""
    rb = _round_up(4 * KiB, dio_align)
    offsets = below.probe_offsets(tgt.size_bytes, rb, offset_alignment(rb, dio_align), seed)
    buf = fs.aligned_buffer(rb)
    view = memoryview(buf)[:rb]

    def read_at(off: int) -> None:
        bench.check_read(os.preadv(dfd, [view], off), rb, off)

    try:
        if not direct:
            os.posix_fadvise(bfd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead
            fs.evict(bfd)
        first, again = below.measure_pairs(
            read_at, offsets, budget_s, clock,
            between=None if direct else (lambda off: fs.evict(bfd, off, rb)))
    finally:
        view.release()
        buf.close()
    return below.judge(first, again, recency=tgt.mode == "directory", read_bytes=rb,
                       method="O_DIRECT" if direct else "fadvise")
