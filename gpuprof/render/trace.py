"""A Profile as Chrome trace-event JSON, the format Perfetto (ui.perfetto.dev) and chrome://tracing
open: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}. Builds, never writes.

Layout only: what goes in, every name and note, and where each span lies are decided by the
report (gpuprof.report.trace.TraceView, docs/export.md); here they become events — metadata
("M") naming each process and track, complete events ("X") for steps and phases, counters ("C")
for the samplers, instants ("i") for the findings — in microseconds on each process's clock.
"""

from __future__ import annotations

import json

from gpuprof.profile import Profile
from gpuprof.report.trace import FINDINGS_SCOPE, THREAD_NAMES, TID_COUNTERS, TID_FINDINGS, TraceProcess, trace_view


def _us(s: float) -> float:
    """Seconds → trace microseconds, kept to the nanosecond (the timer's own resolution)."""
    return round(s * 1e6, 3)


def _meta(pid: int, tid: int, name: str, args: dict) -> dict:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _threads(pid: int, threads) -> list[dict]:
    out = []
    for tid, name in threads:
        out.append(_meta(pid, tid, "thread_name", {"name": name}))
        out.append(_meta(pid, tid, "thread_sort_index", {"sort_index": tid}))
    return out


def _process(p: TraceProcess) -> list[dict]:
    events = [_meta(p.pid, 0, "process_name", {"name": p.name}),
              _meta(p.pid, 0, "process_sort_index", {"sort_index": p.pid})] + _threads(p.pid, p.threads)
    for s in p.spans:
        dur = _us(s.dur_s)
        events.append({"name": s.name, "cat": s.cat, "ph": "X", "ts": _us(s.start_s), "dur": max(0.0, dur),
                       "pid": p.pid, "tid": s.track, "args": s.args})
    for c in p.counters:
        events.append({"name": c.name, "ph": "C", "ts": _us(c.t_s), "pid": p.pid, "tid": TID_COUNTERS,
                       "args": c.values})
    return events


def render_trace(profile: Profile, analysis) -> dict:
    """The trace-event document of a profile and its analysis (its findings as instant events).
    Timestamps in microseconds on each process's timer clock."""
    view = trace_view(profile, analysis)
    events: list[dict] = []
    for p in view.processes:
        events += _process(p)
    if view.findings:
        pid, ts = view.findings_pid, _us(view.findings_at_s)
        events += _threads(pid, ((TID_FINDINGS, THREAD_NAMES[TID_FINDINGS]),))
        events += [{"name": m.name, "cat": "finding", "ph": "i", "s": FINDINGS_SCOPE, "ts": ts, "pid": pid,
                    "tid": TID_FINDINGS, "args": m.args} for m in view.findings]
    return {"traceEvents": _ordered(events), "displayTimeUnit": "ms", "otherData": dict(view.notes)}


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
