"""The trace's view (gpuprof.report.trace): every name, note, span and mark decided there; the
renderer (gpuprof.render.trace) lays out exactly that and words nothing itself."""

import dataclasses

import pytest

from gpuprof.analysis.findings import Finding
from gpuprof.profile import Profile, StepRecord
from gpuprof.render.trace import render_trace
from gpuprof.report.trace import (LAID_OUT, NO_PROFILE, PHASE_ORDER, RANKS_NOTE, THREAD_NAMES, TID_FINDINGS, TID_PHASES,
                                  TID_STEPS, finding_label, gpu_track_note, rank_name, rank_status, run_name,
                                  step_label, trace_view)
from gpuprof.units import NM


def _laid_out_by_view(doc, view):
    """Every event of the document is one the view holds, under the view's name."""
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {p.pid: p.name for p in view.processes}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    expected = {(p.pid, tid): name for p in view.processes for tid, name in p.threads}
    if view.findings:
        expected[(view.findings_pid, TID_FINDINGS)] = THREAD_NAMES[TID_FINDINGS]
    assert threads == expected
    for p in view.processes:
        xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == p.pid]
        assert sorted((e["tid"], e["name"], e["ts"]) for e in xs) == sorted(
            (s.track, s.name, round(s.start_s * 1e6, 3)) for s in p.spans)
        cs = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == p.pid]
        assert len(cs) == len(p.counters) and {e["name"] for e in cs} == {c.name for c in p.counters}
    inst = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert [e["name"] for e in inst] == [m.name for m in view.findings]
    assert all(e["pid"] == view.findings_pid and e["ts"] == round(view.findings_at_s * 1e6, 3) for e in inst)
    assert doc["otherData"] == view.notes


def test_a_single_runs_view_is_what_the_trace_lays_out(builtin_profile, builtin_analysis):
    p, a = builtin_profile, builtin_analysis
    view = trace_view(p, a)
    _laid_out_by_view(render_trace(p, a), view)
    (proc,) = view.processes
    assert proc.pid == 0 and proc.name == run_name(p) == "gpuprof: built-in loop (tiny)"
    steps = [s for s in proc.spans if s.track == TID_STEPS]
    assert [s.name for s in steps] == [step_label(s.index, True) for s in p.warmup_steps] + [
        step_label(s.index, False) for s in p.steps]
    assert [m.args["id"] for m in view.findings] == [f.id for f in a.findings]
    assert [m.name for m in view.findings] == [finding_label(i, f) for i, f in enumerate(a.findings, 1)]
    assert view.findings_at_s == max(s.start_s + s.wall_s for s in p.steps)
    assert trace_view(p, None).findings == ()


def test_a_merged_views_processes_name_every_rank(merged_profile, merged_analysis):
    merged_profile.ranks.append({"rank": 2, "local_rank": 0, "node_rank": 1, "host": "node-b",
                                 "status": "missing", "error": None, "profile": None})
    view = trace_view(merged_profile, merged_analysis)
    _laid_out_by_view(render_trace(merged_profile, merged_analysis), view)
    assert [p.pid for p in view.processes] == [0, 1, 2]
    assert [p.name for p in view.processes] == [rank_name(r) for r in merged_profile.ranks[:2]] + [
        rank_name(merged_profile.ranks[2]) + NO_PROFILE]
    missing = view.processes[2]
    assert missing.threads == () and missing.spans == () and missing.counters == ()
    assert view.notes["ranks"] == RANKS_NOTE
    assert view.notes["rank1.status"] == rank_status(merged_profile.ranks[1])
    assert view.findings_pid == 0 and len(view.findings) == 1


def test_phases_without_spans_are_laid_out_in_phase_order():
    st = StepRecord(index=0, wall_s=0.06, phases={"backward": 0.03, "forward": 0.01, "data": 0.02}, tokens=8,
                    micro_steps=1, start_s=1.0)
    view = trace_view(Profile(run={"mode": "builtin", "config": {}}, steps=[st]), None)
    phases = [s for s in view.processes[0].spans if s.track == TID_PHASES]
    assert [s.name for s in phases] == [p for p in PHASE_ORDER if p in st.phases]
    assert all(s.args["order"] == LAID_OUT for s in phases)
    assert [s.start_s for s in phases] == pytest.approx([1.0, 1.02, 1.03])
    assert view.notes["gpu_track"] == gpu_track_note(False, [], [])


def test_labels_and_notes():
    assert step_label(3, True) == "warmup step 3" and step_label(4, False) == "step 4"
    f = Finding(id="x", title="t", kind="fix", saving_s=0.09, saving_share=0.1, evidence={})
    assert finding_label(1, f) == "#1 x: saves 90.0 ms/step"
    assert finding_label(2, dataclasses.replace(f, saving_s=None, kind=None)) == "#2 x (finding)"
    assert gpu_track_note(False, [], []).startswith(NM)
    assert gpu_track_note(False, [], ["a", "b"]) == f"{NM}: a; b"
    assert gpu_track_note(True, [], ["ignored"]) is None
    assert "no reason recorded" in gpu_track_note(True, [2], [])
