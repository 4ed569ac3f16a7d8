"""The step's time in the kernel, paging memory in: `page-faults`.

The timer reads the training thread's minor page faults and kernel time around each step
(measure/os_counters.py `thread_rusage`: getrusage RUSAGE_THREAD, StepRecord.extra `minor_faults`,
`kernel_s`). glibc's allocator hands freed blocks above its mmap threshold back to the OS and
trims the top of its heap; the next step's tensors of that size are mapped again and every page
is faulted in and zeroed by the kernel. A CPU training step that allocates its activations anew
each step can spend a third of its time there: on this project's 2-core VM (2026-12-08), a small
GPT's bf16 step took ~3,900 faults and 5.2 ms of kernel time of ~19 ms, and 12.2 ms with the
allocator told to keep its memory (docs/measurements/2026-12-07-loop-experiments.md, series 19).

Information, not a ranked fix: what removes the faults depends on the allocations' sizes, which
are not read. Measured
on the project's VM (2026-12-08, plain runs, docs/measurements/2026-12-07-loop-experiments.md series
19): tcmalloc preloaded (Debian's libtcmalloc-minimal4) took the built-in loop's `compute-bound`
scenario (batch 16 × 256) from ~35,000 faults and 232-236 ms a step to ~17 and 170 ms, and the small
GPT's bf16 step from 19.0 to 10.5 ms (fp32 14.0 → 12.5 ms); glibc's thresholds (the environment
variables below) cover blocks up to 32 MiB only: they removed the small GPT's faults (bf16 → 12.2
ms) and none of the scenario's; jemalloc with its defaults faulted more (~45,000, 247-250 ms).

The kernel time is measured; what a fix saves is not (an environment setting the process reads at
its start cannot be switched on between two steps), and the kernel time does not bound it: a fresh
page's first touch also costs the step outside the kernel (the bf16 step above lost ~6 ms to 5.2 ms
of kernel time). CPU runs only: on a CUDA run the training thread's kernel time is also the
driver's (its ioctls, a synchronize's waits), which page faults would not explain.
"""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.rules.common import on_cuda
from gpuprof.stats import median
from gpuprof.units import pct, seconds

KERNEL_SHARE_MIN = 0.05  # of the typical step
FAULTS_MIN = 256  # minor faults per step (1 MiB of 4-KiB pages)
STEPS_MIN = 3
FIX = ("keep freed memory in the process: start it with tcmalloc preloaded "
       "(LD_PRELOAD=libtcmalloc_minimal.so.4, Debian/Ubuntu package libtcmalloc-minimal4), which keeps blocks "
       "of any size, or with MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=2147483648 in the "
       "environment (glibc then reuses its blocks, up to 32 MiB); then compare the two runs "
       "(`gpuprof compare`)")


def page_faults(ctx: Context) -> list[Finding]:
    """The typical steps' kernel time, where the training thread spent ≥ KERNEL_SHARE_MIN of the
    step in the kernel and took ≥ FAULTS_MIN minor page faults per step (median)."""
    if on_cuda(ctx) or not ctx.stats.step_s:
        return []
    typical = set(ctx.stats.typical)
    faults, kernel = [], []
    for s in ctx.profile.steps:
        ex = s.extra or {}
        if s.index in typical and isinstance(ex.get("minor_faults"), int) and isinstance(ex.get("kernel_s"), (int, float)):
            faults.append(ex["minor_faults"])
            kernel.append(float(ex["kernel_s"]))
    if len(kernel) < STEPS_MIN:
        return []
    step = ctx.stats.step_s
    # A thread's kernel time may be accounted by scheduler tick: one step read 0 s with ~2,000 faults
    # here while others read a few ms; the mean over the steps is the figure.
    k = min(sum(kernel) / len(kernel), step)
    f = median(faults)
    if k < KERNEL_SHARE_MIN * step or f < FAULTS_MIN:
        return []
    ev = {"kernel_s_per_step": k, "kernel_share": k / step, "minor_faults_per_step": f, "steps": len(kernel),
          "source": "getrusage(RUSAGE_THREAD) of the training thread around each step"}
    return [Finding(
        id="page-faults",
        title=f"the step spends {seconds(k)} ({pct(k / step)}) in the kernel, taking {f:,.0f} page faults",
        saving_s=None, evidence=ev, confidence="low", kind="info", fix=FIX,
        because=(f"the training thread took {f:,.0f} minor page faults per step (median) and {seconds(k)} of "
                 f"kernel time per step (mean over {len(kernel)} typical steps), {pct(k / step)} of the step"),
        note=("saves not measured, and the kernel time does not bound it (a fresh page's first touch also costs "
              "the step outside the kernel): the allocator returns freed memory to the OS and the next step "
              "faults it in again; which setting keeps it depends on the blocks' sizes, not read here, and a "
              "setting read at the process's start cannot be tried between two of its steps"),
    )]
