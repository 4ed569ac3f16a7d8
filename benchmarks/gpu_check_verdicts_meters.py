"""gpu_check's verdicts on gpuprof's meters against a known truth: the data share against the
sleep the fixture injects, the sync counts against the calls a script makes, the pageable-copy
finding, NVML's samples against torch's device, and the phase timer's own overhead.

Pure: nothing here runs gpuprof or touches a GPU (tests/benchmarks/test_gpu_check.py drives it
with synthetic profiles and canned output)."""

from __future__ import annotations

import re

from gpu_check_profile import Missing, _num, _value, finding_ids, lookup

DATA_SHARE_TOLERANCE = 0.05  # data share vs the injected truth, absolute
# On the smoke run's shared 2-core VM get_batch's own work (memmap, stack: data time too, not
# part of the slept truth) and late wake-ups weigh more; the suite allows 10 points there too.
SMOKE_DATA_SHARE_TOLERANCE = 0.10
OVERHEAD_LIMIT = 1.02  # timing on/off, median of ABBA pair ratios
SYNC_K, SYNC_J = 3, 2  # .item() and torch.cuda.synchronize() calls per step in sync_counts.py


_ITER_SLEPT = re.compile(r"^iter (\d+): .*?time ([0-9.]+)ms.*?, slept ([0-9.]+)ms", re.M)


def iter_times(output: str) -> dict[int, float]:
    """iter N -> its `time` in ms, from the fixture's lines with `slept`."""
    return {int(m.group(1)): float(m.group(2)) for m in _ITER_SLEPT.finditer(output)}


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
