"""`page-faults`: the training thread's kernel time per step, read by the timer around each step
(getrusage of the thread), named as information where it is a real share of the step and the step
takes many page faults; no saving is claimed (an allocator setting read at the process's start
cannot be tried between two steps). The timer's readings, and that glibc's thresholds (one of the
settings it names) remove the faults of blocks under 32 MiB, are tested on this machine's allocator."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from gpuprof.analysis.engine import Context
from gpuprof.analysis.pipeline import analyze
from gpuprof.analysis.rules import host_memory
from gpuprof.measure.os_counters import thread_rusage
from gpuprof.measure.timer import PhaseTimer

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RUSAGE_THREAD is Linux's")

# 2026-12-08's VM, a small GPT's bf16 step: ~3,900 faults, kernel time ~5.2 ms (mean) of ~19 ms
BF16_STEP = {"forward": 0.0048, "backward": 0.0130, "optimizer": 0.0012}


def _with_counts(profile_factory, faults: int, kernel: list[float], device: str = "cpu", phases=BF16_STEP):
    p = profile_factory(phases, n_steps=len(kernel), device=device)
    for s, k in zip(p.steps, kernel):
        s.extra.update(minor_faults=faults, kernel_s=k)
    return p


def test_many_faults_and_a_real_share_in_the_kernel_are_named(profile_factory):
    p = _with_counts(profile_factory, 3900, [0.004, 0.008, 0.004, 0.004, 0.008, 0.004])
    (f,) = host_memory.page_faults(Context(profile=p, stats=p.stats))
    k = (0.004 * 4 + 0.008 * 2) / 6
    # information: what removes the faults depends on the allocations' sizes (glibc's thresholds stop
    # at 32 MiB: the compute-bound scenario's ~33,000 faults a step stayed with them)
    assert f.id == "page-faults" and f.kind == "info" and f.saving_s is None and f.confidence == "low"
    assert f.evidence["kernel_s_per_step"] == pytest.approx(k) and f.evidence["minor_faults_per_step"] == 3900
    assert f.evidence["kernel_share"] == pytest.approx(k / p.stats.step_s)
    assert "3,900 page faults" in f.title and "MALLOC_MMAP_THRESHOLD_=33554432" in f.fix and "libtcmalloc_minimal.so.4" in f.fix
    assert "saves not measured" in f.note and "does not bound it" in f.note
    # within the physical bounds (strict_bounds checks the analysis)
    a = analyze(p)
    assert "page-faults" in [x.id for x in a.findings]


@pytest.mark.parametrize("faults, kernel, device", [
    (100, [0.006] * 6, "cpu"),  # the kernel time is not page faults': too few of them
    (3900, [0.0, 0.0, 0.0, 0.004, 0.0, 0.0], "cpu"),  # 0.67 ms of a 19-ms step: under 5%
    (3900, [0.004, 0.008, 0.004], "cuda"),  # on CUDA the thread's kernel time is the driver's too
    (3900, [0.006, 0.006], "cpu"),  # two steps: too few to average the kernel's ticks over
])
def test_no_finding_without_the_evidence(profile_factory, faults, kernel, device):
    p = _with_counts(profile_factory, faults, kernel, device=device)
    assert host_memory.page_faults(Context(profile=p, stats=p.stats)) == []


def test_a_profile_without_the_counts_reads_as_before(profile_factory):
    p = profile_factory(BF16_STEP, n_steps=6)  # an older profile, or a system without RUSAGE_THREAD
    assert host_memory.page_faults(Context(profile=p, stats=p.stats)) == []


def test_the_timer_records_each_steps_counts_from_the_thread_that_ran_it():
    reads = iter([(10, 1.0), (3910, 1.004), (3910, 1.004), (7000, 1.012)])
    t = PhaseTimer(rusage=lambda: next(reads))
    t.start_step(); t.end_step()
    t.start_step(); t.end_step()
    assert [(s.extra["minor_faults"], s.extra["kernel_s"]) for s in t.steps()] == [(3900, 0.004), (3090, 0.008)]
    # a step another thread closes: not this thread's counts, none recorded
    t2 = PhaseTimer(rusage=lambda: (0, 0.0))
    t2.start_step()
    th = threading.Thread(target=t2.end_step)
    th.start(); th.join()
    assert "minor_faults" not in t2.steps()[0].extra
    # no per-thread usage on this OS: nothing recorded, nothing fails
    t3 = PhaseTimer(rusage=lambda: None)
    t3.start_step(); t3.end_step()
    assert "minor_faults" not in t3.steps()[0].extra


@linux
def test_a_step_that_maps_fresh_memory_counts_its_faults():
    import numpy as np

    assert thread_rusage() is not None
    t = PhaseTimer()
    for _ in range(2):
        t.start_step()
        a = np.ones(6 * 2**20)  # 48 MiB: above glibc's largest mmap threshold, mapped afresh each time
        del a
        t.end_step()
    # at least half its pages, counted as 2-MiB transparent huge pages where the kernel gives them
    # (536 faults for the 48 MiB here; 12,288 pages of 4 KiB without)
    assert all(s.extra["minor_faults"] >= 48 // 2 // 2 and s.extra["kernel_s"] >= 0 for s in t.steps())


SNIPPET = """
import numpy as np
from gpuprof.measure.os_counters import thread_rusage
counts = []
for step in range(6):
    f0 = thread_rusage()[0]
    held = [np.ones(2**17) for _ in range(20)]  # 20 blocks of 1 MiB alive at once, freed at the step's end
    del held
    counts.append(thread_rusage()[0] - f0)
print(sorted(counts[2:])[1])
"""


@linux
def test_the_fix_it_names_removes_the_faults():
    def faults(env: dict) -> int:
        out = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=60,
                             env={**__import__("os").environ, **env}, check=True).stdout
        return int(out.split()[-1])

    default = faults({})
    fixed = faults({"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "2147483648"})
    assert default >= host_memory.FAULTS_MIN and fixed < default / 10, (default, fixed)


def test_an_experiment_whose_ways_differ_in_kernel_time_says_the_fresh_process_may_differ():
    from gpuprof.analysis.rules.experiments import kernel_caveat, on_your_loop, slower_finding
    from gpuprof.sections.experiments import Experiment

    iv = {"estimate": 1.10, "low": 1.05, "high": 1.16, "level": 0.92, "requested": 0.9, "n": 30, "statistic": "sign"}
    base = dict(id="precision:fp32", pairs=30, ratio=1.10, interval=iv, a_median_s=0.0145, b_median_s=0.0160)
    differs = Experiment.from_dict(dict(base, kernel_s={"a": 0.0021, "b": 0.0052}, minor_faults={"a": 2016, "b": 3888}))
    alike = Experiment.from_dict(dict(base, kernel_s={"a": 0.0021, "b": 0.0025}, minor_faults={"a": 2016, "b": 2100}))
    older = Experiment.from_dict(base)  # a profile from before the counts
    # kernel time apart but the faults alike: a GPU driver's time, not the allocator's state
    driver = Experiment.from_dict(dict(base, kernel_s={"a": 0.0021, "b": 0.0052}, minor_faults={"a": 2016, "b": 2100}))
    total = 0.0150
    words = kernel_caveat(differs, total)
    assert "2.1 ms without the fix, 5.2 ms with it (2,016 and 3,888 page faults)" in words
    assert "fresh process may differ" in words
    assert kernel_caveat(alike, total) is None and kernel_caveat(older, total) is None
    assert kernel_caveat(driver, total) is None
    ts = on_your_loop(differs, total)
    assert words in ts.note and ts.evidence["kernel_s_by_way"] == {"a": 0.0021, "b": 0.0052}
    assert words in slower_finding("precision-slower", "no autocast", differs, ts, total).note
    assert "kernel" not in on_your_loop(alike, total).note
