"""The Chrome/Perfetto trace export decided once: every process (one per rank of a merged
profile), its tracks' names, its steps and phases as spans in seconds on its own clock, its
samplers' counter points, the findings' instant marks, and the notes that say what is not drawn
and why. gpuprof.render.trace turns this into trace-event JSON; nothing here writes an event.

What goes in (docs/export.md, "The trace"): per process (a single run is pid 0; a merged
distributed profile has one pid per rank) a host track of steps (warmup steps marked) and one of
their phases; a GPU track from the CUDA event times when the profile has them; the NVML and host
sampler timelines as counter tracks; the findings with their saving. Phases, not kernels: a few
spans per step.

Clocks. Host times are seconds since the run's PhaseTimer was created (StepRecord.start_s). The
samplers put their timestamps on that same clock (measure/sampling.py: `_SamplerThread.align
(timer)`), so their counters sit on the steps' axis; a host sample is a rate over the interval
between two samples, stored at the interval's midpoint. A step's host phases are its measured
spans (every micro-step's, in the order they ran: StepRecord.extra["spans"]); a profile without
spans that agree with its totals (older, or a script's sampled data attribution) gets its phases
laid out in PHASE_ORDER from the step's start, marked `"order": "laid out"`: the lengths are
measured, that order is not. CUDA events give durations, not host-clock times: a GPU step is
placed at the earliest time the host clock allows (see `_gpu_spans`). Ranks each keep their own
timer's clock: they are not aligned with each other. Everything not measured is said in the
notes, never invented."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.profile import Profile, StepRecord, checked_ranks, rank_profile
from gpuprof.report.words import saving_text
from gpuprof.sections import SamplerSection, Sections
from gpuprof.stats import PHASES
from gpuprof.units import NM, UNKNOWN, finite, seconds

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
MEASURED, LAID_OUT = "measured", "laid out"  # a phase span's `order`: as it ran, or placed by PHASE_ORDER
NO_NVML = "no NVML sampler in this run: a CPU run, or --no-samplers"
NO_HOST = "no host sampler in this run"
NO_GPU_TIMES = "no CUDA event times (a CPU run has no GPU timeline)"
RANKS_NOTE = ("one process per rank, each on its own timer's clock: ranks are NOT aligned with each other "
              "(no shared clock is recorded)")
NO_PROFILE = ": no profile"  # after a rank's process name when it left no profile
FINDINGS_SCOPE = "g"  # the findings hold for the whole run: a global instant


@dataclass(frozen=True)
class Span:
    """A step or a phase on one track: its name, its categories, its start and length in seconds
    on its process's clock, and what the event carries."""

    track: int
    name: str
    cat: str
    start_s: float
    dur_s: float
    args: dict


@dataclass(frozen=True)
class CounterPoint:
    """One sample of a counter track: its figures by series label (those not measured left out)."""

    name: str
    t_s: float
    values: dict


@dataclass(frozen=True)
class FindingMark:
    """A finding as an instant mark: its label and what it carries."""

    name: str
    args: dict


@dataclass(frozen=True)
class TraceProcess:
    """One process of the trace (the run, or a rank): its name, the tracks it uses (tid, name) in
    track order (none for a rank that left no profile), its spans and its counter points."""

    pid: int
    name: str
    threads: tuple[tuple[int, str], ...]
    spans: tuple[Span, ...] = ()
    counters: tuple[CounterPoint, ...] = ()


@dataclass(frozen=True)
class TraceView:
    """The trace decided: its processes, the findings' marks (on `findings_pid`'s findings track at
    `findings_at_s`, the end of the last measured step) and the notes, key by key."""

    processes: tuple[TraceProcess, ...]
    findings: tuple[FindingMark, ...]
    findings_pid: int | None
    findings_at_s: float
    notes: dict[str, str]


def step_label(index: int, warm: bool) -> str:
    return f"warmup step {index}" if warm else f"step {index}"


def _laid_out(phases: dict[str, float]) -> list[tuple[str, float]]:
    known = [(p, phases[p]) for p in PHASE_ORDER if phases.get(p, 0.0) > 0]
    return known + [(p, s) for p, s in sorted(phases.items()) if p not in PHASE_ORDER and s > 0]


def _host_spans(steps: list[tuple[StepRecord, bool]]) -> list[Span]:
    out = []
    for st, warm in steps:
        cat = "warmup" if warm else "measured"
        out.append(Span(TID_STEPS, step_label(st.index, warm), f"step,{cat}", st.start_s, st.wall_s,
                        {"index": st.index, "warmup": warm, "wall_s": st.wall_s, "tokens": st.tokens,
                         "micro_steps": st.micro_steps, "gpu_s": st.gpu_s}))
        spans = st.measured_spans()
        if spans:  # measured: every micro-step's spans in the order they ran
            for phase, start, sec in spans:
                out.append(Span(TID_PHASES, phase, f"phase,{cat}", st.start_s + start, sec,
                                {"step": st.index, "warmup": warm, "seconds": sec, "order": MEASURED}))
            continue
        t = st.start_s
        for phase, sec in _laid_out(st.phases):
            out.append(Span(TID_PHASES, phase, f"phase,{cat}", t, sec,
                            {"step": st.index, "warmup": warm, "seconds": sec, "order": LAID_OUT}))
            t += sec
    return out


def _gpu_spans(steps: list[tuple[StepRecord, bool]]) -> list[Span]:
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
        out.append(Span(TID_GPU_STEPS, step_label(st.index, warm), f"gpu,step,{cat}", start, st.gpu_s,
                        {"index": st.index, "warmup": warm, "gpu_s": st.gpu_s, "wall_s": st.wall_s,
                         "idle_exposed": st.idle_exposed}))
        spans = st.measured_spans(gpu=True)
        if spans:  # the CUDA events' spans, every micro-step, in the order the GPU ran them
            for phase, s0, sec in spans:
                out.append(Span(TID_GPU_PHASES, phase, f"gpu,phase,{cat}", start + s0, sec,
                                {"step": st.index, "warmup": warm, "seconds": sec, "order": MEASURED}))
        else:
            t = start
            for phase, sec in _laid_out(st.gpu_phases):
                out.append(Span(TID_GPU_PHASES, phase, f"gpu,phase,{cat}", t, sec,
                                {"step": st.index, "warmup": warm, "seconds": sec, "order": LAID_OUT}))
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


def _counters(tl: dict, groups, prefix: str = "") -> list[CounterPoint]:
    out = []
    for name, series in groups:
        for i, t in enumerate(tl["t_s"]):
            values = {}
            for key, label in series:
                vals = tl.get(key)
                v = vals[i] if isinstance(vals, list) else None
                if finite(v) is not None:
                    values[label] = v
            if values:
                out.append(CounterPoint(prefix + name, t, values))
    return out


def _available(sec: SamplerSection, key: str, notes: dict, absent: str) -> bool:
    """Whether a sampler section can be drawn; notes[key] says why not."""
    if not sec.present:
        notes[key] = f"{NM} ({absent})"
    elif not sec.available:
        notes[key] = f"{NM}: {sec.reason or sec.not_measured}"
    else:
        return True
    return False


def omitted(why: str) -> str:
    """The note of a sampler whose stored timeline cannot be placed."""
    return f"counters omitted: {why}"


def _sampler_counters(sections: Sections, notes: dict, who: str) -> list[CounterPoint]:
    out = []
    nv = sections.nvml
    if _available(nv, f"{who}nvml", notes, NO_NVML):
        for g in nv.gpus:
            why = _timeline_ok(g.timeline)
            prefix = f"{g.name or 'GPU'}: " if len(nv.gpus) > 1 else ""
            if why:
                notes[f"{who}nvml"] = omitted(why)
            else:
                out += _counters(g.timeline, NVML_COUNTERS, prefix)
    hs = sections.host
    if _available(hs, f"{who}host", notes, NO_HOST):
        why = _timeline_ok(hs.timeline)
        if why:
            notes[f"{who}host"] = omitted(why)
        else:
            out += _counters(hs.timeline, HOST_COUNTERS)
    return out


def gpu_track_note(drawn: bool, unresolved: list, reasons: list) -> str | None:
    """What the notes say of the GPU track: why there is none, or which steps it lacks."""
    why = "; ".join(reasons)
    if not drawn:
        return f"{NM}: {why}" if why else f"{NM}: {NO_GPU_TIMES}"
    if unresolved:
        return (f"steps {unresolved} have no GPU span (their CUDA events could not be read: "
                f"{why or 'no reason recorded'})")
    return None


def _process(pid: int, prof: Profile, name: str, notes: dict, who: str) -> TraceProcess:
    steps = sorted([(s, True) for s in prof.warmup_steps] + [(s, False) for s in prof.steps],
                   key=lambda x: x[0].start_s)
    host, gpu = _host_spans(steps), _gpu_spans(steps)
    sections = prof.sections
    timer = sections.timer
    note = gpu_track_note(bool(gpu), timer.steps_unresolved, timer.reasons)
    if note is not None:
        notes[f"{who}gpu_track"] = note
    counters = _sampler_counters(sections, notes, who)
    used = sorted({s.track for s in host + gpu} | ({TID_COUNTERS} if counters else set()) | {TID_STEPS})
    return TraceProcess(pid, name, tuple((tid, THREAD_NAMES[tid]) for tid in used), tuple(host + gpu),
                        tuple(counters))


def end_of_measured_s(prof: Profile) -> float:
    """Where the findings are marked: the end of the last measured step (0 without one)."""
    return max((s.start_s + s.wall_s for s in prof.steps), default=0.0)


def run_name(prof: Profile) -> str:
    """A single run's process name: the script's command line, or the built-in loop's model."""
    cmd = prof.run.get("command")
    if prof.run.get("mode") == "script" and cmd:
        return "gpuprof: " + " ".join(str(c) for c in cmd)
    return f"gpuprof: built-in loop ({prof.run.get('config', {}).get('model') or UNKNOWN})"


def rank_name(entry: dict) -> str:
    """A rank's process name: its rank, host, local rank and how it ended."""
    return (f"rank {entry['rank']} ({entry.get('host') or UNKNOWN}, local {entry.get('local_rank')}, "
            f"{entry.get('status') or UNKNOWN})")


def rank_status(entry: dict) -> str:
    """How a rank ended, with its error's message when it failed with one."""
    err = entry.get("error")
    return (entry.get("status") or UNKNOWN) + (f": {err.get('message') or err}" if isinstance(err, dict) else "")


def finding_label(rank: int, f) -> str:
    return (f"#{rank} {f.id}: saves {seconds(f.saving_s)}/step" if f.saving_s is not None
            else f"#{rank} {f.id} ({f.kind or 'finding'})")


def _marks(findings: list) -> tuple[FindingMark, ...]:
    return tuple(FindingMark(finding_label(i, f),
                             {"rank": i, "id": f.id, "title": f.title, "kind": f.kind, "saving_s": f.saving_s,
                              "saving_share": f.saving_share, "saves": saving_text(f), "fix": f.fix,
                              "note": f.note})
                 for i, f in enumerate(findings, 1))


def _notes(profile: Profile) -> dict[str, str]:
    return {
        "tool": f"{profile.tool.get('name', 'gpuprof')} {profile.tool.get('version', '')}".strip(),
        "clock": "microseconds since each process's PhaseTimer was created (StepRecord.start_s)",
        "phase_layout": ("host phases are the measured spans of every micro-step in the order they ran "
                         f"(args.order = {MEASURED}); a step without them (an older profile, a script's "
                         "sampled data attribution) has its phase totals laid out contiguously in the "
                         "order " + ", ".join(PHASE_ORDER) + f" (args.order = {LAID_OUT})"),
        "micro_steps": "host spans show each micro-step; the GPU track keeps phase totals per step",
        "gpu_placement": ("CUDA events give durations only: a GPU step is placed at max(host start, "
                          "previous GPU step's end), the earliest the host clock allows"),
        "counters": ("sampler timestamps are on the same timer clock (aligned at sampler start); "
                     "a host figure is a rate over one sampling interval, stored at its midpoint"),
        "findings": "instant events at the end of the last measured step: they hold for the whole run",
        "not_included": "kernels, CUDA streams, Python stacks, memory allocations",
    }


def trace_view(profile: Profile, analysis) -> TraceView:
    """The trace of a profile and its analysis (None: no findings). A malformed `ranks` list is a
    one-line GpuprofError (profile.checked_ranks)."""
    findings = list(analysis.findings) if analysis is not None else []
    notes = _notes(profile)
    ranks = checked_ranks(profile)
    if not ranks:
        procs = (_process(0, profile, run_name(profile), notes, ""),)
        return TraceView(procs, _marks(findings), 0, end_of_measured_s(profile), notes)
    notes["ranks"] = RANKS_NOTE
    procs, first, end = [], None, 0.0
    for r in sorted(ranks, key=lambda r: r["rank"]):
        pid, who = r["rank"], f"rank{r['rank']}."
        notes[f"{who}status"] = rank_status(r)
        if r.get("profile") is None:
            procs.append(TraceProcess(pid, rank_name(r) + NO_PROFILE, ()))
            continue
        rp = rank_profile(r)
        procs.append(_process(pid, rp, rank_name(r), notes, who))
        first = pid if first is None else first
        end = max(end, end_of_measured_s(rp))
    return TraceView(tuple(procs), _marks(findings) if first is not None else (), first, end, notes)
