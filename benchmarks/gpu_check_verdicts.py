"""gpu_check's verdicts: the thresholds, reading figures out of a profile dict ("not measured"
when absent), the PASS/FAIL judgement of each check, and the Markdown report. Pure: nothing here
runs gpuprof or touches a GPU, so tests/benchmarks/test_gpu_check.py drives it with synthetic
profiles."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

TAIL_CHARS = 4000  # output kept for the report when a run fails

PROBE_SHARE = (0.5, 1.0)  # measured matmul ceiling / datasheet peak (H200 bf16: ~650-800 of 989.5)
DATA_SHARE_TOLERANCE = 0.05  # data share vs the injected truth, absolute
# On the smoke run's shared 2-core VM get_batch's own work (memmap, stack: data time too, not
# part of the slept truth) and late wake-ups weigh more; the suite allows 10 points there too.
SMOKE_DATA_SHARE_TOLERANCE = 0.10
OVERHEAD_LIMIT = 1.02  # timing on/off, median of ABBA pair ratios
SYNC_K, SYNC_J = 3, 2  # .item() and torch.cuda.synchronize() calls per step in sync_counts.py
PHASES = ("data", "h2d", "forward", "backward", "optimizer", "other", "eval")

# The smoke run's built-in loop: the tiny preset made smaller still (seconds on 2 cores).
SMOKE_BUILTIN = ["--device", "cpu", "--model", "tiny", "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
                 "--batch-size", "2", "--block-size", "32", "--grad-accum", "2", "--steps", "3", "--warmup", "1"]
# The fixture's model for the data-delay check (as tests/script/test_script_run.py): the sleep is
# large against each micro-step's own work, and the GPU forward is too short to hide any of it.
FIXTURE_MODEL = ["--n_layer=4", "--n_head=4", "--n_embd=96", "--block_size=64"]


# --------------------------------------------------------------------------------- data types
@dataclass
class Proc:
    """One finished subprocess: what ran, how it ended, its merged stdout+stderr."""

    argv: list[str]
    rc: int | None
    output: str
    wall_s: float
    timed_out: bool = False
    timeout_s: float | None = None

    def tail(self, n: int = TAIL_CHARS) -> str:
        return self.output[-n:]


@dataclass
class Check:
    """The outcome of one check: PASS, FAIL or SKIP, why, and every figure it read."""

    name: str
    status: str = "SKIP"
    reason: str = ""
    figures: dict = field(default_factory=dict)
    runs: list[Proc] = field(default_factory=list)
    wall_s: float = 0.0
    error: str = ""  # a traceback when the check itself broke

    def decide(self, ok: bool, reason: str) -> "Check":
        self.status, self.reason = ("PASS" if ok else "FAIL"), reason
        return self

    def skip(self, reason: str) -> "Check":
        self.status, self.reason = "SKIP", reason
        return self

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.reason}"


@dataclass(frozen=True)
class Missing:
    """A figure the profile does not have, and why ("key missing: a.b", "a.b is null", ...)."""

    why: str

    def __str__(self) -> str:
        return f"not measured ({self.why})"


# --------------------------------------------------------------------- reading a profile dict
def lookup(d, path: str):
    """The value at a dotted path of a profile dict, or Missing saying why it is absent.

    A section that failed after the run is `{"not_measured": reason}`: its reason is kept."""
    cur = d
    for i, part in enumerate(path.split(".")):
        if isinstance(cur, dict) and part not in cur and "not_measured" in cur:
            where = ".".join(path.split(".")[:i])
            return Missing(f"{where} not measured: {cur['not_measured']}")
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return Missing(f"key missing: {path}")
    if cur is None:
        return Missing(f"{path} is null")
    if isinstance(cur, dict) and set(cur) == {"not_measured"}:
        return Missing(f"{path} not measured: {cur['not_measured']}")
    return cur


def _num(p, path: str, problems: list[str]) -> float | None:
    v = lookup(p, path)
    if isinstance(v, Missing):
        problems.append(v.why)
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        problems.append(f"{path} is {v!r}, not a number")
        return None
    return float(v)


def _value(p, path: str, problems: list[str]):
    v = lookup(p, path)
    if isinstance(v, Missing):
        problems.append(v.why)
        return None
    return v


def findings(p) -> list[dict]:
    """The findings of the analysis saved with the profile (schema 2: under `analysis`)."""
    analysis = p.get("analysis") if isinstance(p.get("analysis"), dict) else {}
    return [f for f in (analysis.get("findings") or []) if isinstance(f, dict)]


def finding_ids(p) -> list[str]:
    return [f.get("id") for f in findings(p)]


def run_figures(p) -> dict:
    """The figures of a diagnose run: step, phases, MFU, ceiling, timer, precision, findings."""
    fig = {k: lookup(p, k) for k in (
        "environment.device_name", "run.config.model", "run.config.batch_size", "run.config.block_size",
        "run.config.grad_accum", "run.config.dtype", "run.config.compile", "run.config.precision",
        "analysis.steps.step_s", "analysis.steps.timeline", "analysis.steps.spread", "analysis.steps.tokens_per_s")}
    phases = lookup(p, "analysis.steps.phases")
    if isinstance(phases, dict):
        for ph in [x for x in PHASES if x in phases] + sorted(set(phases) - set(PHASES)):
            fig[f"analysis.steps.phases.{ph}.seconds"] = lookup(p, f"analysis.steps.phases.{ph}.seconds")
            fig[f"analysis.steps.phases.{ph}.share"] = lookup(p, f"analysis.steps.phases.{ph}.share")
    else:
        fig["analysis.steps.phases"] = phases
    for k in ("analysis.mfu.mfu", "analysis.mfu.dtype", "analysis.mfu.peak_tflops", "analysis.mfu.peak_source",
              "analysis.mfu.achieved_tflops", "analysis.mfu.mfu_vs_ceiling", "analysis.mfu.flops_per_step",
              "analysis.mfu.flops_agreement", "measurements.probe.tflops", "measurements.probe.dtype",
              "measurements.probe.size", "measurements.timer.gpu_timeline", "measurements.timer.events_recorded",
              "measurements.timer.events_created_in_steps",
              "measurements.timer.steps_unresolved", "measurements.timer.reasons",
              "measurements.syncs.per_step", "measurements.syncs.calls"):
        fig[k] = lookup(p, k)
    fig["findings"] = ", ".join(i for i in finding_ids(p) if i) or "none"
    return fig


# ----------------------------------------------------------------------- the verdicts (pure)
def judge_gpu_run(p) -> tuple[bool, str]:
    """A diagnose run on CUDA: GPU timeline, every event resolved, MFU in (0, 1], the bf16
    ceiling 50-100% of the datasheet peak, and the probe measured the MFU's dtype."""
    problems: list[str] = impossible_figures(p)
    tl = _value(p, "analysis.steps.timeline", problems)
    if tl is not None and tl != "gpu":
        problems.append(f"timeline is {tl!r}, not 'gpu'")
    gt = _value(p, "measurements.timer.gpu_timeline", problems)
    if gt is not None and gt is not True:
        problems.append(f"measurements.timer.gpu_timeline is {gt!r}")
    unresolved = _value(p, "measurements.timer.steps_unresolved", problems)  # the steps' indices
    if unresolved:
        n = len(unresolved) if isinstance(unresolved, list) else unresolved
        problems.append(f"{n:g} steps with unresolved CUDA events")
    step = _num(p, "analysis.steps.step_s", problems)
    mfu = _num(p, "analysis.mfu.mfu", problems)
    if mfu is not None and not 0 < mfu <= 1:
        problems.append(f"MFU {mfu:.3f} is outside (0, 1]")
    peak = _num(p, "analysis.mfu.peak_tflops", problems)
    ceiling = _num(p, "measurements.probe.tflops", problems)
    share = ceiling / peak if ceiling is not None and peak else None
    if share is not None and not PROBE_SHARE[0] <= share <= PROBE_SHARE[1]:
        problems.append(f"ceiling {ceiling:.0f} TFLOP/s is {share:.0%} of the {peak:g} TFLOP/s peak "
                        f"(expected {PROBE_SHARE[0]:.0%}-{PROBE_SHARE[1]:.0%})")
    mdt = _value(p, "analysis.mfu.dtype", problems)
    pdt = _value(p, "measurements.probe.dtype", problems)
    if mdt is not None and pdt is not None and mdt != pdt:
        problems.append(f"the probe measured {pdt}, the MFU uses {mdt}")
    if problems:
        return False, "; ".join(problems)
    return True, (f"step {step * 1e3:.1f} ms (GPU timeline), MFU {mfu:.1%} of the {mdt} peak {peak:g} TFLOP/s, "
                  f"{mdt} ceiling {ceiling:.0f} TFLOP/s = {share:.0%} of peak")


def impossible_figures(p) -> list[str]:
    """gpuprof's own physical-bounds checker on a profile dict and the analysis saved with it:
    every impossible figure in them."""
    try:
        from gpuprof.analysis.bounds import violations
        from gpuprof.analysis.pipeline import Analysis
        from gpuprof.profile import from_data

        prof = from_data(p)
        stored = p.get("analysis")
        analysis = Analysis.from_dict(stored, prof) if isinstance(stored, dict) else None
        return [f"impossible figure: {v}" for v in violations(prof, analysis)]
    except Exception as exc:  # noqa: BLE001 - a profile the checker cannot read is itself a problem
        return [f"bounds check failed: {exc.__class__.__name__}: {exc}"]


def judge_cpu_run(p) -> tuple[bool, str]:
    """The smoke run's built-in loop on a CPU: host timeline, a step time, shares adding to 1."""
    problems: list[str] = impossible_figures(p)
    tl = _value(p, "analysis.steps.timeline", problems)
    if tl is not None and tl != "host":
        problems.append(f"timeline is {tl!r}, not 'host' on a CPU")
    step = _num(p, "analysis.steps.step_s", problems)
    if step is not None and step <= 0:
        problems.append(f"step_s {step}")
    phases = _value(p, "analysis.steps.phases", problems)
    total = sum(v.get("share", 0.0) for v in phases.values()) if isinstance(phases, dict) else None
    if total is not None and abs(total - 1) > 0.01:
        problems.append(f"phase shares add up to {total:.3f}")
    if not isinstance(lookup(p, "analysis.mfu"), dict):
        problems.append("key missing: analysis.mfu")
    if problems:
        return False, "; ".join(problems)
    return True, (f"cpu smoke: step {step * 1e3:.1f} ms (host timeline), shares sum to {total:.3f}; "
                  "the GPU figures are judged on CUDA only")


_ITER_SLEPT = re.compile(r"^iter (\d+): .*?time ([0-9.]+)ms.*?, slept ([0-9.]+)ms", re.M)


def data_share_truth(output: str, step_indices) -> dict | None:
    """The injected data share from the fixture's own iter lines: slept ÷ iteration time.

    Only the lines of measured steps count (the fixture's iter N line covers step N's
    get_batch calls; the last measured step prints none: the script is stopped in it).
    None when no measured step printed a line."""
    lines = {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in _ITER_SLEPT.finditer(output)}
    used = [i for i in step_indices if i in lines]
    if not used:
        return None
    time_ms = sum(lines[i][0] for i in used)
    slept_ms = sum(lines[i][1] for i in used)
    return {"truth": slept_ms / time_ms if time_ms else None, "lines": len(used),
            "slept_ms_per_iter": slept_ms / len(used), "time_ms_per_iter": time_ms / len(used)}


def judge_data_share(p, truth: dict | None, tolerance: float = DATA_SHARE_TOLERANCE) -> tuple[bool, str]:
    problems: list[str] = []
    share = _num(p, "analysis.steps.phases.data.share", problems)
    if truth is None or truth.get("truth") is None:
        problems.append("no `iter N: ... slept S ms` line from a measured step: no truth to compare")
    if problems:
        return False, "; ".join(problems)
    diff = share - truth["truth"]
    ok = abs(diff) <= tolerance
    return ok, (f"data share {share:.1%} vs injected {truth['truth']:.1%} ({diff * 100:+.1f} points, "
                f"{'within' if ok else 'outside'} ±{tolerance * 100:g}) over {truth['lines']} iter lines")


def judge_tf32(p, tf32_peak: float | None) -> tuple[bool, str]:
    """fp32 with TF32 allowed: the MFU is against the TF32 peak and the probe measured TF32."""
    problems: list[str] = []
    tf32 = _value(p, "run.config.precision.tf32_matmul", problems)
    if tf32 is not None and tf32 is not True:
        problems.append(f"run.config.precision.tf32_matmul is {tf32!r}, the fixture allows TF32")
    mdt = _value(p, "analysis.mfu.dtype", problems)
    if mdt is not None and mdt != "tf32":
        problems.append(f"MFU dtype is {mdt!r}, not 'tf32'")
    peak = _num(p, "analysis.mfu.peak_tflops", problems)
    if tf32_peak is None:
        problems.append("this GPU has no TF32 peak in gpuprof.hardware: nothing to compare")
    elif peak is not None and abs(peak - tf32_peak) > 1e-6:
        problems.append(f"MFU peak {peak:g} TFLOP/s is not the TF32 peak {tf32_peak:g}")
    pdt = _value(p, "measurements.probe.dtype", problems)
    if pdt is not None and pdt != "tf32":
        problems.append(f"the probe measured {pdt!r}, not 'tf32'")
    if problems:
        return False, "; ".join(problems)
    ceiling = lookup(p, "measurements.probe.tflops")
    ceil = f", TF32 ceiling {ceiling:.0f} TFLOP/s" if isinstance(ceiling, (int, float)) else ""
    return True, f"MFU dtype tf32 against the TF32 peak {peak:g} TFLOP/s, probe dtype tf32{ceil}"


def judge_syncs(p, k: int = SYNC_K, j: int = SYNC_J) -> tuple[bool, str]:
    """Exactly k .item() + j synchronize per measured step; the warmup eval's are not counted."""
    problems: list[str] = []
    per_step = _num(p, "measurements.syncs.per_step", problems)
    measured = _num(p, "measurements.syncs.measured_steps", problems)
    calls = _value(p, "measurements.syncs.calls", problems)
    n_sync = None
    if isinstance(calls, dict):
        if "torch.cuda.synchronize" in calls:
            n_sync = calls["torch.cuda.synchronize"]
        else:
            problems.append("key missing: measurements.syncs.calls['torch.cuda.synchronize']")
    elif calls is not None:
        problems.append(f"measurements.syncs.calls is {calls!r}, not a mapping")
    if per_step is not None and abs(per_step - (k + j)) > 1e-9:
        problems.append(f"{per_step:g} syncs per step, expected exactly {k + j} ({k} .item() + {j} synchronize)")
    if measured is not None and measured <= 0:
        problems.append("no measured steps")
    elif measured and n_sync is not None and abs(n_sync / measured - j) > 1e-9:
        problems.append(f"{n_sync} torch.cuda.synchronize calls over {measured:g} steps, expected {j} per step")
    if problems:
        return False, "; ".join(problems)
    return True, (f"{per_step:g} syncs per step = {k} .item() + {j} synchronize, "
                  f"{n_sync} synchronize calls over {measured:g} measured steps")


def judge_h2d(pageable, pinned) -> tuple[bool, str]:
    """`h2d-pageable` fires on the pageable run only; `sync-in-step` not for the blocking copies."""
    problems: list[str] = []
    a, b = finding_ids(pageable), finding_ids(pinned)
    copies = lookup(pageable, "measurements.script.hooks.counts.h2d_pageable")
    if isinstance(copies, (int, float)) and not copies:
        problems.append("no pageable copy seen in the pageable run")
    if "h2d-pageable" not in a:
        problems.append("h2d-pageable did not fire on the pageable run")
    if "h2d-pageable" in b:
        problems.append("h2d-pageable fired on the pinned run")
    if "sync-in-step" in a:
        problems.append("sync-in-step fired on the pageable run (blocking copies counted as syncs)")
    if problems:
        return False, "; ".join(problems)
    return True, "h2d-pageable on the pageable run only; no sync-in-step for its blocking copies"


# NVML summary fields -> the names NvmlSampler records an unreadable read under.
NVML_FIELDS = {
    "gpu_util_pct": ("utilization",), "mem_util_pct": ("utilization",), "mem_used_bytes": ("memory",),
    "sm_clock_mhz": ("sm_clock",), "sm_clock_share": ("sm_clock", "sm_clock_max"),
    "power_w": ("power",), "power_share": ("power", "power_limit"), "temp_c": ("temperature",),
    "pcie_rx_bytes_s": ("pcie_rx",), "pcie_tx_bytes_s": ("pcie_tx",),
}


def normalize_uuid(u) -> str:
    """'GPU-58ee...' / 'MIG-...' / '58EE...' -> '58ee...' (NVML prefixes, torch does not)."""
    s = str(u).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return s


def judge_nvml(p, torch_uuid: str | None) -> tuple[bool, str]:
    """NVML sampled the run's GPU (torch's UUID), and each field was read or named unreadable."""
    problems: list[str] = []
    nv = _value(p, "measurements.nvml", problems)
    if not isinstance(nv, dict):
        return False, "; ".join(problems) or "measurements.nvml is not a mapping"
    if nv.get("available") is not True:
        return False, f"NVML not available: {nv.get('reason')}"
    samples = nv.get("samples") or 0
    if samples <= 0:
        problems.append("no NVML samples")
    summary = nv.get("summary") if isinstance(nv.get("summary"), dict) else {}
    unreadable = nv.get("unreadable") or {}
    silent = []
    for name in list(NVML_FIELDS) + sorted(set(summary) - set(NVML_FIELDS)):
        s = summary.get(name)
        if isinstance(s, dict) and (s.get("n") or 0) > 0:
            continue
        if name in unreadable or any(src in unreadable for src in NVML_FIELDS.get(name, ())):
            continue
        silent.append(name)
    if silent:
        problems.append("neither sampled nor named in measurements.nvml.unreadable: " + ", ".join(silent))
    nvml_uuid = lookup(p, "measurements.nvml.gpus.0.uuid")
    if isinstance(nvml_uuid, Missing):
        problems.append(nvml_uuid.why)
    elif not torch_uuid:
        problems.append("torch gave no device UUID to compare with")
    elif normalize_uuid(nvml_uuid) != normalize_uuid(torch_uuid):
        problems.append(f"NVML sampled {nvml_uuid}, torch's device 0 is {torch_uuid}")
    if problems:
        return False, "; ".join(problems)
    means = []
    for key, label, unit in (("gpu_util_pct", "util", "%"), ("power_w", "power", " W"),
                             ("sm_clock_mhz", "SM", " MHz"), ("temp_c", "temp", " C")):
        s = summary.get(key)
        if isinstance(s, dict) and isinstance(s.get("mean"), (int, float)):
            means.append(f"{label} {s['mean']:.0f}{unit}")
    named = f"; unreadable: {', '.join(sorted(unreadable))}" if unreadable else ""
    return True, (f"{samples} samples of {nvml_uuid} (= torch's device 0)"
                  + (f", mean {', '.join(means)}" if means else "") + named)


_OVERHEAD = {
    "ratio": re.compile(r"ratio on/off \(median of pairs\): wall ([0-9.]+), CPU time ([0-9.]+)"),
    "pairs": re.compile(r"per-pair wall ratios: ([0-9. ]+)"),
    "on_ms": re.compile(r"median step, timing on : ([0-9.]+) ms"),
    "off_ms": re.compile(r"median step, timing off: ([0-9.]+) ms"),
    "timer_us": re.compile(r"timer's own work: ([0-9.]+) µs per step"),
}


def parse_overhead(output: str) -> dict | None:
    """The figures benchmarks/timing_overhead.py prints, or None when its summary is missing."""
    m = _OVERHEAD["ratio"].search(output)
    if not m:
        return None
    out = {"median_ratio": float(m.group(1)), "cpu_time_ratio": float(m.group(2))}
    pairs = _OVERHEAD["pairs"].search(output)
    ratios = [float(x) for x in pairs.group(1).split()] if pairs else []
    out["pair_ratios"] = ratios
    out["spread"] = (max(ratios) - min(ratios)) if ratios else None
    for key in ("on_ms", "off_ms", "timer_us"):
        mm = _OVERHEAD[key].search(output)
        out[key] = float(mm.group(1)) if mm else None
    return out


def judge_overhead(results: dict, limit: float = OVERHEAD_LIMIT) -> tuple[bool, str]:
    """Each config's median on/off pair ratio is at most `limit`."""
    problems, parts = [], []
    for cfg, r in results.items():
        if r is None:
            problems.append(f"{cfg}: no `ratio on/off` line in the benchmark's output")
            continue
        spread = f" (spread {r['spread']:.3f})" if r["spread"] is not None else ""
        parts.append(f"{cfg} {r['median_ratio']:.3f}{spread}")
        if r["median_ratio"] > limit:
            problems.append(f"{cfg}: median on/off ratio {r['median_ratio']:.3f} > {limit}")
    if problems:
        return False, "; ".join(problems + parts)
    return True, "median on/off ratio " + ", ".join(parts) + f" (goal ≤ {limit})"


# --------------------------------------------------------------------------------- the report
# ------------------------------------------------------------------ data parallel on one GPU (NCCL)
INTERRUPT_BOUND_S = 60.0  # SIGINT mid-step -> gpuprof exits with the rank's entry written, at most


def rank_entry(p, rank: int = 0) -> dict | None:
    return next((e for e in (p.get("ranks") or []) if isinstance(e, dict) and e.get("rank") == rank), None)


def judge_fsdp(p) -> tuple[bool, str]:
    """One FSDP2 rank on NCCL, cuda:0: it finished, the sharding was read, every measured step is
    on the GPU timeline, and no post-run part ran the sharded model (each says why). With one
    rank FSDP2 runs no collective: there is no `comm` to judge."""
    problems: list[str] = []
    e = rank_entry(p)
    if e is None:
        return False, "no entry for rank 0 in the profile's ranks"
    if e.get("status") != "ok":
        problems.append(f"rank 0 ended {e.get('status')!r}: {(e.get('error') or {}).get('message')}")
    rp = e.get("profile") or {}
    kind = lookup(rp, "measurements.sharding.kind")
    if kind != "fsdp2":
        problems.append(f"sharding.kind is {kind!r}, expected 'fsdp2'")
    steps = rp.get("steps") or []
    if len(steps) < 3 or any(s.get("gpu_s") is None for s in steps):
        problems.append(f"{len(steps)} measured steps, {sum(s.get('gpu_s') is None for s in steps)} off the GPU timeline")
    for path in ("measurements.microbatch.not_measured", "measurements.probe.precisions.not_measured"):
        why = lookup(rp, path)
        if not isinstance(why, str) or "sharded (FSDP2)" not in why:
            problems.append(f"{path} is {why!r}: the sharded model was not refused")
    if problems:
        return False, "; ".join(problems)
    return True, f"FSDP2 on one GPU: {len(steps)} steps on the GPU timeline; the post-run parts refused the sharded model"


def judge_nccl(p) -> tuple[bool, str]:
    """One NCCL rank with DDP on cuda:0: the all-reduce meter counted every round on CUDA events,
    in flight and exposed measured, no mark failed, busbw not given for one rank, and the rank ran
    with the NCCL settings that keep its entry on a timeout."""
    problems: list[str] = []
    e = rank_entry(p)
    if e is None:
        return False, "no entry for rank 0 in the profile's ranks"
    if e.get("status") != "ok":
        problems.append(f"rank 0 ended {e.get('status')!r}: {(e.get('error') or {}).get('message')}")
    rp = e.get("profile") or {}
    comm = lookup(rp, "measurements.comm")
    if isinstance(comm, Missing):
        return False, comm.why
    expect = {"backend": "nccl", "clock": "cuda events", "world_size": 1, "rounds_per_step": 1,
              "incomplete_rounds": 0, "busbw_Bps": None}
    for k, want in expect.items():
        if comm.get(k) != want:
            problems.append(f"comm.{k} is {comm.get(k)!r}, expected {want!r}")
    if comm.get("mark_errors"):
        problems.append(f"marks failed: {comm['mark_errors']}")
    steps = comm.get("measured_steps")
    if not steps or steps != len(rp.get("steps") or []):
        problems.append(f"comm measured {steps!r} steps of {len(rp.get('steps') or [])}")
    fl, ex = comm.get("in_flight_s"), comm.get("exposed_s")
    if not isinstance(fl, (int, float)) or fl <= 0:
        problems.append(f"in-flight time {fl!r}, expected > 0")
    elif not isinstance(ex, (int, float)) or not 0 <= ex <= fl:
        problems.append(f"exposed {ex!r} s outside [0, in flight {fl:.6f} s]")
    if (e.get("nccl_env") or {}).get("TORCH_NCCL_ASYNC_ERROR_HANDLING") != "2":
        problems.append(f"the rank ran with NCCL env {e.get('nccl_env')!r}, not CleanUpOnly (2)")
    if lookup(rp, "measurements.timer.gpu_timeline") is not True:
        problems.append(f"no GPU timeline: {lookup(rp, 'measurements.timer.reasons')}")
    if problems:
        return False, "; ".join(problems)
    return True, (f"{steps} steps, 1 round each on CUDA events: in flight {fl * 1e3:.3f} ms, exposed "
                  f"{ex * 1e3:.3f} ms; busbw not given for one rank; NCCL CleanUpOnly")


def judge_interrupted_rank(p, rc, wall_s: float, bound_s: float = INTERRUPT_BOUND_S) -> tuple[bool, str]:
    """SIGINT mid-step: exit 130 within the bound, rank 0's entry written "interrupted" with its
    completed steps, no post-run work."""
    problems: list[str] = []
    if rc != 130:
        problems.append(f"exit code {rc}, expected 130")
    if wall_s > bound_s:
        problems.append(f"took {wall_s:.1f} s after the signal, over {bound_s:.0f} s")
    e = rank_entry(p) if p is not None else None
    if e is None:
        return False, "; ".join(problems + ["no entry for rank 0 written"])
    n = len((e.get("profile") or {}).get("steps") or [])
    if e.get("status") != "interrupted":
        problems.append(f"rank 0 ended {e.get('status')!r}, expected 'interrupted'")
    if n < 3:
        problems.append(f"{n} measured steps kept, expected at least 3")
    if problems:
        return False, "; ".join(problems)
    return True, f"exit 130 {wall_s:.1f} s after SIGINT, rank 0 interrupted with {n} measured steps kept"


def judge_cudagraphs(p) -> tuple[bool, str]:
    """torch.compile(mode="reduce-overhead") on the built-in loop: every measured step has a GPU
    timeline (the graph replays sit between the phase events; none was recorded during a
    capture), forward and backward take GPU time, and no sync is counted as the script's."""
    problems: list[str] = []
    timer = lookup(p, "measurements.timer")
    if isinstance(timer, Missing):
        return False, timer.why
    if timer.get("gpu_timeline") is not True or timer.get("steps_unresolved"):
        problems.append(f"GPU timeline incomplete: steps {timer.get('steps_unresolved')} ({timer.get('reasons')})")
    if timer.get("record_error"):
        problems.append(f"an event failed: {timer['record_error']}")
    steps = p.get("steps") or []
    if not steps:
        problems.append("no measured steps")
    for s in steps:
        g = s.get("gpu_phases") or {}
        if not (g.get("forward", 0) > 0 and g.get("backward", 0) > 0):
            problems.append(f"step {s.get('index')}: forward/backward GPU time {g.get('forward')!r}/{g.get('backward')!r}")
            break
    per_step = _num(p, "measurements.syncs.per_step", problems)
    if per_step is not None and per_step != 0:
        problems.append(f"{per_step:g} syncs per step counted as the loop's own (it makes none)")
    if problems:
        return False, "; ".join(problems)
    own = lookup(p, "measurements.syncs.torch_own_in_steps")
    return True, (f"{len(steps)} steps on the GPU timeline, 0 syncs of the loop's own"
                  f" ({own if not isinstance(own, Missing) else 'not measured'} of torch's own in the steps)")


def judge_compute_fixes(p, on_cuda: bool) -> tuple[bool, str]:
    """tests/fixtures/mingpt_train.py with attention by hand, vocabulary 50257 and AdamW not fused:
    each is seen and timed both ways (CUDA events on a GPU), and attention-by-hand is a finding.
    On a GPU the vocabulary and the optimizer may honestly be no finding (padding or fusing not
    faster here): the timings are what is checked, the figures are reported."""
    problems: list[str] = []
    k = lookup(p, "measurements.kernels")
    if isinstance(k, Missing):
        return False, k.why
    att = k.get("attention") or {}
    hand = att.get("by_hand") or []
    if len(hand) != 2:
        problems.append(f"{len(hand)} attention layers by hand seen (the fixture has 2)")
    clock = "CUDA events" if on_cuda else "wall time"
    for part, keys in (("attention", ("by_hand_forward_s", "sdpa_forward_s")), ("vocab", ("vocab_s", "padded_s")),
                       ("optimizer", ("current_s", "fused_s"))):
        t = (k.get(part) or {}).get("timing") or {}
        if any(not isinstance(t.get(x), (int, float)) or t[x] <= 0 for x in keys):
            problems.append(f"{part} not timed: {t.get('not_measured') or t}")
        elif clock not in (t.get("method") or ""):
            problems.append(f"{part} timed without {clock}: {t.get('method')}")
    if "attention-by-hand" not in finding_ids(p):
        problems.append("no attention-by-hand finding")
    bad = impossible_figures(p)
    if bad:
        problems.append("impossible figures: " + "; ".join(bad))
    if problems:
        return False, "; ".join(problems)
    t = att["timing"]
    return True, (f"attention by hand {t['by_hand_forward_s'] + t['by_hand_backward_s']:.4g} s vs SDPA "
                  f"{t['sdpa_forward_s'] + t['sdpa_backward_s']:.4g} s per layer; findings: "
                  + ", ".join(i for i in finding_ids(p) if i in ("attention-by-hand", "vocab-not-padded",
                                                                 "optimizer-not-fused", "optimizer-slow")))


SPAN_TOLERANCE_S = 2e-6  # spans are stored rounded to 0.1 µs


def judge_gpu_spans(p) -> tuple[bool, str]:
    """Per measured step, the GPU spans (in the order the GPU ran them) add up to the GPU phase
    totals and lie inside the step's GPU time, in order and without overlap."""
    problems: list[str] = []
    steps = [s for s in (p.get("steps") or []) if s.get("gpu_phases")]
    if not steps:
        return False, "no step with GPU phases"
    n_spans = 0
    for s in steps:
        spans = (s.get("extra") or {}).get("gpu_spans")
        i = s.get("index")
        if not spans:
            problems.append(f"step {i}: no gpu_spans")
            continue
        n_spans += len(spans)
        tol = SPAN_TOLERANCE_S * (len(spans) + 1)
        sums: dict = {}
        end = 0.0
        for label, start, dur in spans:
            sums[label] = sums.get(label, 0.0) + dur
            if start < end - tol or dur < 0:
                problems.append(f"step {i}: span {label} at {start} overlaps the one before (ends {end})")
            end = start + dur
        if end > (s.get("gpu_s") or 0) + tol:
            problems.append(f"step {i}: spans end at {end:.6f} s, after the step's GPU time {s.get('gpu_s')}")
        for label, total in (s.get("gpu_phases") or {}).items():
            if abs(sums.get(label, 0.0) - total) > tol:
                problems.append(f"step {i}: {label} spans sum to {sums.get(label, 0.0):.7f} s, phase total {total:.7f} s")
    if problems:
        return False, "; ".join(problems[:5])
    return True, f"{len(steps)} steps, {n_spans} GPU spans: each step's spans add up to its phases, in order, inside the step"


def slugify(name: str | None) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'."""
    s = re.sub(r"[^a-z0-9]+", "-", str(name or "").lower()).strip("-")
    return s or "unknown-gpu"


def report_path(folder: Path, day: str, name: str, suffix: int = 1) -> Path:
    base = f"{day}-{slugify(name)}"
    return Path(folder) / (f"{base}.md" if suffix == 1 else f"{base}-{suffix}.md")


def write_report(folder: Path, day: str, name: str, text: str) -> Path:
    """Write the report as DAY-NAME.md, or -2, -3 ... when that exists (never overwrites)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = report_path(folder, day, name, n)
        try:
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
            return path
        except FileExistsError:
            n += 1


def fmt(v) -> str:
    """A figure for the report: 4 significant digits, mappings as compact JSON."""
    if isinstance(v, Missing):
        return str(v)
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str, separators=(", ", ": "))
    return str(v)


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")
