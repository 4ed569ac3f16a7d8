"""A Profile as Chrome trace-event JSON, the format Perfetto (ui.perfetto.dev) and chrome://tracing
open: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}. Builds, never writes.

What goes in (docs/trace.md): per process (a single run is pid 0; a merged distributed profile
has one pid per rank) a host track of steps (an "X" event each, warmup steps marked) and one of
their phases; a GPU track from the CUDA event times when the profile has them; the NVML and host
sampler timelines as counter ("C") tracks; the findings as instant ("i") events with their
saving. Phases, not kernels: a few events per step.

Clocks. Host times are seconds since the run's PhaseTimer was created (StepRecord.start_s), in
microseconds here. The samplers put their timestamps on that same clock (measure/sampling.py:
`_SamplerThread.align(timer)`), so their counters sit on the steps' axis; a host sample is a
rate over the interval between two samples, stored at the interval's midpoint. A step's host
phases are its measured spans (every micro-step's, in the order they ran: StepRecord.extra
["spans"]); a profile without spans that agree with its totals (older, or a script's sampled data
attribution) gets its phases laid out in PHASE_ORDER from the step's start, marked
`"order": "laid out"`: the lengths are measured, that order is not. CUDA
events give durations, not host-clock times: a GPU step is placed at the earliest time the host
clock allows (see `_gpu_track`). Ranks each keep their own timer's clock: they are not aligned
with each other. Everything not measured is said in otherData, never invented.
"""

from __future__ import annotations

import json

from gpuprof.profile import Profile, StepRecord, checked_ranks, rank_profile
from gpuprof.report.words import saving_text
from gpuprof.sections import SamplerSection, Sections
from gpuprof.stats import PHASES
from gpuprof.units import finite, seconds

# Layout order of a step's phases (the loop's own order per micro-step is forward, data, h2d,
# backward, then optimizer; the aggregate per step cannot say which came when).
PHASE_ORDER = tuple(PHASES)
TID_COUNTERS, TID_STEPS, TID_PHASES, TID_GPU_STEPS, TID_GPU_PHASES, TID_FINDINGS = 0, 1, 2, 3, 4, 5
THREAD_NAMES = {TID_COUNTERS: "samplers (counters)", TID_STEPS: "host: steps",
                TID_PHASES: "host: phases", TID_GPU_STEPS: "GPU: steps (CUDA events)",
                TID_GPU_PHASES: "GPU: phases (CUDA events)", TID_FINDINGS: "findings"}
# (counter track name, [(timeline key, series label)]) per sampler.
NVML_COUNTERS = [("GPU utilization %", [("gpu_util_pct", "SM busy"), ("mem_util_pct", "memory busy")]),
                 ("GPU memory used (bytes)", [("mem_used_bytes", "used")]),
                 ("GPU SM clock (MHz)", [("sm_clock_mhz", "SM clock")]),
                 ("GPU power (W)", [("power_w", "power")]),
                 ("GPU temperature (°C)", [("temp_c", "temperature")]),
                 ("PCIe (bytes/s)", [("pcie_rx_bytes_s", "rx"), ("pcie_tx_bytes_s", "tx")])]
HOST_COUNTERS = [("host CPU %", [("cpu_pct", "machine"), ("cpu_pct_max_core", "busiest core")]),
                 ("host CPU (cores)", [("own_cpu_cores", "this run"), ("others_cpu_cores", "others")]),
                 ("host RSS (bytes)", [("rss_bytes", "RSS")]),
                 ("host reads (bytes/s)", [("read_bytes_s", "process"), ("disk_read_bytes_s", "data disk")]),
                 ("host major faults/s", [("major_faults_s", "major faults")])]


def _us(s: float) -> float:
    """Seconds → trace microseconds, kept to the nanosecond (the timer's own resolution)."""
    return round(s * 1e6, 3)


def _meta(pid: int, tid: int, name: str, args: dict) -> dict:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _x(name: str, cat: str, ts: float, dur: float, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": max(0.0, dur), "pid": pid,
            "tid": tid, "args": args}


def _laid_out(phases: dict[str, float]) -> list[tuple[str, float]]:
    known = [(p, phases[p]) for p in PHASE_ORDER if phases.get(p, 0.0) > 0]
    return known + [(p, s) for p, s in sorted(phases.items()) if p not in PHASE_ORDER and s > 0]


def _host_track(pid: int, steps: list[tuple[StepRecord, bool]]) -> list[dict]:
    out = []
    for st, warm in steps:
        cat = "warmup" if warm else "measured"
        label = f"warmup step {st.index}" if warm else f"step {st.index}"
        out.append(_x(label, f"step,{cat}", _us(st.start_s), _us(st.wall_s), pid, TID_STEPS,
                      {"index": st.index, "warmup": warm, "wall_s": st.wall_s, "tokens": st.tokens,
                       "micro_steps": st.micro_steps, "gpu_s": st.gpu_s}))
        spans = st.measured_spans()
        if spans:  # measured: every micro-step's spans in the order they ran
            for phase, start, sec in spans:
                out.append(_x(phase, f"phase,{cat}", _us(st.start_s + start), _us(sec), pid, TID_PHASES,
                              {"step": st.index, "warmup": warm, "seconds": sec, "order": "measured"}))
            continue
        t = st.start_s
        for phase, sec in _laid_out(st.phases):
            out.append(_x(phase, f"phase,{cat}", _us(t), _us(sec), pid, TID_PHASES,
                          {"step": st.index, "warmup": warm, "seconds": sec, "order": "laid out"}))
            t += sec
    return out


def _gpu_track(pid: int, steps: list[tuple[StepRecord, bool]]) -> list[dict]:
    """GPU spans from CUDA event durations. A step's start event is recorded by the host at
    start_s and reached by the GPU once all earlier work is done, so the step is placed at
    max(host start, the previous GPU step's end): the earliest the host clock allows; the real
    start can be later by launch latency or work queued before the first step."""
    out, prev_end = [], None
    for st, warm in steps:
        if st.gpu_s is None or st.gpu_phases is None:
            prev_end = None  # an unread step breaks the chain: restart from the host clock
            continue
        start = st.start_s if prev_end is None else max(st.start_s, prev_end)
        cat = "warmup" if warm else "measured"
        label = f"warmup step {st.index}" if warm else f"step {st.index}"
        out.append(_x(label, f"gpu,step,{cat}", _us(start), _us(st.gpu_s), pid, TID_GPU_STEPS,
                      {"index": st.index, "warmup": warm, "gpu_s": st.gpu_s, "wall_s": st.wall_s,
                       "idle_exposed": st.idle_exposed}))
        spans = st.measured_spans(gpu=True)
        if spans:  # the CUDA events' spans, every micro-step, in the order the GPU ran them
            for phase, s0, sec in spans:
                out.append(_x(phase, f"gpu,phase,{cat}", _us(start + s0), _us(sec), pid, TID_GPU_PHASES,
                              {"step": st.index, "warmup": warm, "seconds": sec, "order": "measured"}))
        else:
            t = start
            for phase, sec in _laid_out(st.gpu_phases):
                out.append(_x(phase, f"gpu,phase,{cat}", _us(t), _us(sec), pid, TID_GPU_PHASES,
                              {"step": st.index, "warmup": warm, "seconds": sec, "order": "laid out"}))
                t += sec
        prev_end = start + st.gpu_s
    return out


def _timeline_ok(tl) -> str | None:
    """Why a stored sampler timeline cannot be placed, or None when it can."""
    if not isinstance(tl, dict) or not isinstance(tl.get("t_s"), list):
        return "no timeline stored"
    ts = tl["t_s"]
    if any(not isinstance(t, (int, float)) or isinstance(t, bool) for t in ts):
        return "timeline times are not numbers"
    if any(b < a for a, b in zip(ts, ts[1:])):
        return "timeline times go backwards"
    if any(isinstance(v, list) and len(v) != len(ts) for k, v in tl.items() if k != "t_s"):
        return "timeline series and times differ in length"
    return None


def _counters(pid: int, tl: dict, groups, prefix: str = "") -> list[dict]:
    out = []
    for name, series in groups:
        for i, t in enumerate(tl["t_s"]):
            args = {}
            for key, label in series:
                vals = tl.get(key)
                v = vals[i] if isinstance(vals, list) else None
                if finite(v) is not None:
                    args[label] = v
            if args:
                out.append({"name": prefix + name, "ph": "C", "ts": _us(t), "pid": pid,
                            "tid": TID_COUNTERS, "args": args})
    return out


def _available(sec: SamplerSection, key: str, notes: dict, absent: str) -> bool:
    """Whether a sampler section can be drawn; notes[key] says why not."""
    if not sec.present:
        notes[key] = f"not measured ({absent})"
    elif not sec.available:
        notes[key] = f"not measured: {sec.reason or sec.not_measured}"
    else:
        return True
    return False


def _sampler_tracks(pid: int, sections: Sections, notes: dict, who: str) -> list[dict]:
    out = []
    nv = sections.nvml
    if _available(nv, f"{who}nvml", notes, "no NVML sampler in this run: a CPU run, or --no-samplers"):
        for g in nv.gpus:
            why = _timeline_ok(g.timeline)
            prefix = f"{g.name or 'GPU'}: " if len(nv.gpus) > 1 else ""
            if why:
                notes[f"{who}nvml"] = f"counters omitted: {why}"
            else:
                out += _counters(pid, g.timeline, NVML_COUNTERS, prefix)
    hs = sections.host
    if _available(hs, f"{who}host", notes, "no host sampler in this run"):
        why = _timeline_ok(hs.timeline)
        if why:
            notes[f"{who}host"] = f"counters omitted: {why}"
        else:
            out += _counters(pid, hs.timeline, HOST_COUNTERS)
    return out


def _finding_events(pid: int, ts: float, findings: list, scope: str) -> list[dict]:
    out = [_meta(pid, TID_FINDINGS, "thread_name", {"name": THREAD_NAMES[TID_FINDINGS]}),
           _meta(pid, TID_FINDINGS, "thread_sort_index", {"sort_index": TID_FINDINGS})] if findings else []
    for i, f in enumerate(findings, 1):
        label = (f"#{i} {f.id}: saves {seconds(f.saving_s)}/step" if f.saving_s is not None
                 else f"#{i} {f.id} ({f.kind or 'finding'})")
        out.append({"name": label, "cat": "finding", "ph": "i", "s": scope, "ts": ts, "pid": pid,
                    "tid": TID_FINDINGS,
                    "args": {"rank": i, "id": f.id, "title": f.title, "kind": f.kind,
                             "saving_s": f.saving_s, "saving_share": f.saving_share,
                             "saves": saving_text(f), "fix": f.fix, "note": f.note}})
    return out


def _process(pid: int, prof: Profile, name: str, notes: dict, who: str) -> list[dict]:
    steps = sorted([(s, True) for s in prof.warmup_steps] + [(s, False) for s in prof.steps],
                   key=lambda x: x[0].start_s)
    events = [_meta(pid, 0, "process_name", {"name": name}),
              _meta(pid, 0, "process_sort_index", {"sort_index": pid})]
    body = _host_track(pid, steps)
    gpu = _gpu_track(pid, steps)
    sections = prof.sections
    timer = sections.timer
    why = "; ".join(timer.reasons)
    if not gpu:
        notes[f"{who}gpu_track"] = (f"not measured: {why}" if why
                                    else "not measured: no CUDA event times (a CPU run has no GPU timeline)")
    elif timer.steps_unresolved:
        notes[f"{who}gpu_track"] = (f"steps {timer.steps_unresolved} have no GPU span (their CUDA "
                                    f"events could not be read: {why or 'no reason recorded'})")
    body += gpu + _sampler_tracks(pid, sections, notes, who)
    used = sorted({e["tid"] for e in body} | {TID_STEPS})
    for tid in used:
        events.append(_meta(pid, tid, "thread_name", {"name": THREAD_NAMES[tid]}))
        events.append(_meta(pid, tid, "thread_sort_index", {"sort_index": tid}))
    return events + body


def _end_of_measured(prof: Profile) -> float:
    return _us(max((s.start_s + s.wall_s for s in prof.steps), default=0.0))


def _run_name(prof: Profile) -> str:
    cmd = prof.run.get("command")
    if prof.run.get("mode") == "script" and cmd:
        return "gpuprof: " + " ".join(str(c) for c in cmd)
    return f"gpuprof: built-in loop ({prof.run.get('config', {}).get('model') or '?'})"


def render_trace(profile: Profile, analysis) -> dict:
    """The trace-event document of a profile and its analysis (its findings as instant events).
    Timestamps in microseconds on each process's timer clock."""
    findings = list(analysis.findings) if analysis is not None else []
    notes: dict = {
        "tool": f"{profile.tool.get('name', 'gpuprof')} {profile.tool.get('version', '')}".strip(),
        "clock": "microseconds since each process's PhaseTimer was created (StepRecord.start_s)",
        "phase_layout": ("host phases are the measured spans of every micro-step in the order they ran "
                         "(args.order = measured); a step without them (an older profile, a script's "
                         "sampled data attribution) has its phase totals laid out contiguously in the "
                         "order " + ", ".join(PHASE_ORDER) + " (args.order = laid out)"),
        "micro_steps": "host spans show each micro-step; the GPU track keeps phase totals per step",
        "gpu_placement": ("CUDA events give durations only: a GPU step is placed at max(host start, "
                          "previous GPU step's end), the earliest the host clock allows"),
        "counters": ("sampler timestamps are on the same timer clock (aligned at sampler start); "
                     "a host figure is a rate over one sampling interval, stored at its midpoint"),
        "findings": "instant events at the end of the last measured step: they hold for the whole run",
        "not_included": "kernels, CUDA streams, Python stacks, memory allocations",
    }
    events: list[dict] = []
    ranks = checked_ranks(profile)
    if not ranks:
        events += _process(0, profile, _run_name(profile), notes, "")
        events += _finding_events(0, _end_of_measured(profile), findings, "g")
    else:
        notes["ranks"] = ("one process per rank, each on its own timer's clock: ranks are NOT "
                          "aligned with each other (no shared clock is recorded)")
        first, end = None, 0.0
        for r in sorted(ranks, key=lambda r: r["rank"]):
            pid, status = r["rank"], r.get("status") or "?"
            who = f"rank{pid}."
            notes[f"{who}status"] = status + (f": {r['error'].get('message') or r['error']}"
                                              if isinstance(r.get("error"), dict) else "")
            name = f"rank {pid} ({r.get('host') or '?'}, local {r.get('local_rank')}, {status})"
            if r.get("profile") is None:
                events += [_meta(pid, 0, "process_name", {"name": name + ": no profile"}),
                           _meta(pid, 0, "process_sort_index", {"sort_index": pid})]
                continue
            rp = rank_profile(r)
            events += _process(pid, rp, name, notes, who)
            first = pid if first is None else first
            end = max(end, _end_of_measured(rp))
        if first is not None:
            events += _finding_events(first, end, findings, "g")
    return {"traceEvents": _ordered(events), "displayTimeUnit": "ms",
            "otherData": {k: str(v) for k, v in notes.items()}}


def _ordered(events: list[dict]) -> list[dict]:
    """Metadata first, then per (pid, tid) in time order (viewers sort anyway; readers of the
    file and the tests see every track monotonic)."""
    meta = [e for e in events if e["ph"] == "M"]
    rest = sorted((e for e in events if e["ph"] != "M"), key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return meta + rest


def trace_json(profile: Profile, analysis) -> str:
    """render_trace as compact JSON text (one event per line keeps it diffable and small)."""
    doc = render_trace(profile, analysis)
    lines = ",\n".join(json.dumps(e, separators=(",", ":"), ensure_ascii=False) for e in doc["traceEvents"])
    return ('{"traceEvents":[\n' + lines + '\n],"displayTimeUnit":"ms","otherData":'
            + json.dumps(doc["otherData"], indent=1, ensure_ascii=False) + "}\n")
