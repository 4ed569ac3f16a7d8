"""The Chrome trace-event export: valid against the format, totals equal to the profile's, counters
on the steps' clock, one process per rank, nothing invented where nothing was measured."""

import dataclasses
import json
import math
from collections import defaultdict

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.analysis.pipeline import analyze
from gpuprof.render.trace import render_trace, trace_json
from gpuprof.report.trace import (NO_GPU_TIMES, NO_NVML, RANKS_NOTE, TID_GPU_PHASES, TID_GPU_STEPS, TID_PHASES,
                                  TID_STEPS, gpu_track_note, omitted)
from gpuprof.units import NM

# The phase types this exporter may use, and what each needs (the trace-event format document:
# "Trace Event Format", Google, the JSON Object Format and the event descriptions).
ALLOWED_PH = {"X", "C", "i", "M"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def validate(doc: dict) -> None:
    """Assert the document is trace-event JSON Perfetto and chrome://tracing load."""
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] in ("ms", "ns")
    assert all(isinstance(v, str) for v in doc["otherData"].values())
    last_x: dict = {}
    last_c: dict = {}
    for e in doc["traceEvents"]:
        for key in ("name", "ph", "ts", "pid", "tid"):
            assert key in e, (key, e)
        assert e["ph"] in ALLOWED_PH, e
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"])
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            track = (e["pid"], e["tid"])
            assert e["ts"] >= last_x.get(track, -math.inf), f"X events go back in time on {track}"
            last_x[track] = e["ts"]
        elif e["ph"] == "C":
            assert isinstance(e["args"], dict) and e["args"], e
            assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in e["args"].values()), e
            track = (e["pid"], e["name"])
            assert e["ts"] >= last_c.get(track, -math.inf), f"counter {track} goes back in time"
            last_c[track] = e["ts"]
        elif e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
        elif e["ph"] == "M":
            assert e["name"] in METADATA and isinstance(e["args"], dict)
    # The text is valid JSON (no NaN) and says the same as the dict.
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text) == doc


def _x(doc, tid, cat_part, pid=0):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["tid"] == tid
            and cat_part in e["cat"].split(",")]


def _phase_totals(events) -> dict:
    totals = defaultdict(float)
    for e in events:
        totals[e["name"]] += e["dur"]
    return totals


def test_builtin_run_trace_is_valid_and_its_totals_are_the_profiles(builtin_profile):
    p = builtin_profile
    doc = render_trace(p, analyze(p))
    validate(doc)
    assert json.loads(trace_json(p, analyze(p))) == doc
    steps = _x(doc, TID_STEPS, "measured")
    assert [e["args"]["index"] for e in steps] == [s.index for s in p.steps]
    assert len(_x(doc, TID_STEPS, "warmup")) == len(p.warmup_steps) == 1
    totals = _phase_totals(_x(doc, TID_PHASES, "measured"))
    for phase in {ph for st in p.steps for ph in st.phases}:  # every measured step's host phases, drawn
        assert totals.get(phase, 0.0) == pytest.approx(sum(st.phases.get(phase, 0.0) for st in p.steps) * 1e6,
                                                       abs=1.0), phase
    for st, ev in zip(p.steps, steps):  # each step in place on the timer's clock
        assert ev["ts"] == pytest.approx(st.start_s * 1e6, abs=0.001)
        assert ev["dur"] == pytest.approx(st.wall_s * 1e6, abs=0.001)
        inside = [e for e in _x(doc, TID_PHASES, "measured") if e["args"]["step"] == st.index]
        spans = st.measured_spans()  # the built-in loop's spans, every micro-step, as they ran
        assert spans and all(e["args"]["order"] == "measured" for e in inside)
        assert [e["name"] for e in inside] == [sp[0] for sp in spans]
        assert [e["name"] for e in inside].count("forward") == st.micro_steps  # one per micro-step
        assert inside[0]["ts"] == pytest.approx(ev["ts"], abs=1.0)
        assert inside[-1]["ts"] + inside[-1]["dur"] == pytest.approx(ev["ts"] + ev["dur"], abs=1.0)


def test_cpu_run_has_no_gpu_track_and_says_so(builtin_profile):
    doc = render_trace(builtin_profile, analyze(builtin_profile))
    assert not [e for e in doc["traceEvents"] if e["tid"] in (TID_GPU_STEPS, TID_GPU_PHASES)]
    assert doc["otherData"]["gpu_track"] == f"{NM}: {NO_GPU_TIMES}"
    assert doc["otherData"]["nvml"] == f"{NM} ({NO_NVML})"
    assert not [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"].startswith("GPU")]


def test_host_counters_are_the_sampler_timeline_on_the_steps_clock(builtin_profile):
    p = builtin_profile
    tl = p.measurements["host"]["timeline"]
    doc = render_trace(p, analyze(p))
    cpu = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "host CPU %"]
    expected = [(t, v) for t, v in zip(tl["t_s"], tl["cpu_pct"]) if v is not None]
    assert len(cpu) == len(expected) > 0
    for e, (t, v) in zip(cpu, expected):
        assert e["ts"] == pytest.approx(t * 1e6, abs=0.001) and e["args"]["machine"] == v
    # The sampler ran through the steps on their clock: a sample lies within the sampler's own
    # largest gap between consecutive samples of the measured window. The sampler covers the
    # run with back-to-back intervals, each sample at its interval's midpoint, and the run stops
    # it only after a sample whose interval starts after the steps ended (conftest's
    # SampledThrough), so the first sample after the window is at most one gap past it (or, when
    # none fell before it, half the first interval past the sampler's start, before the steps).
    # A gap is measured, not assumed: a thread that wakes late on a busy or slow machine widens
    # it. A timeline on another clock is off by a constant, which moves no gap: it lands outside.
    ts = [e["ts"] for e in cpu]
    gap = max((b - a for a, b in zip(ts, ts[1:])), default=0.0)
    rounding = 100.0  # µs: the timeline's times are rounded to 0.1 ms
    lo = min(s.start_s for s in p.steps) * 1e6
    hi = max(s.start_s + s.wall_s for s in p.steps) * 1e6
    assert len(ts) >= 2 and any(lo - gap - rounding <= t <= hi + gap + rounding for t in ts), (
        f"no host sample within the largest gap ({gap / 1e3:.1f} ms) of the measured steps "
        f"({lo / 1e3:.1f}-{hi / 1e3:.1f} ms): {[round(t / 1e3, 1) for t in ts]}")


def test_findings_are_instant_events_with_their_saving(builtin_profile, builtin_analysis):
    p, a = builtin_profile, builtin_analysis
    doc = render_trace(p, a)
    inst = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert len(inst) == len(a.findings) > 0
    for e, f in zip(inst, a.findings):
        assert e["args"]["id"] == f.id and e["args"]["saving_s"] == f.saving_s
        assert e["ts"] == pytest.approx(max(s.start_s + s.wall_s for s in p.steps) * 1e6, abs=0.001)
    no_findings = dataclasses.replace(a, findings=())
    assert render_trace(p, no_findings)["traceEvents"] == [e for e in doc["traceEvents"] if e["tid"] != 5]


def test_gpu_track_follows_the_cuda_event_durations(merged_profile):
    from gpuprof.profile import Profile

    rank0 = Profile.from_dict(merged_profile.ranks[0]["profile"])
    doc = render_trace(rank0, analyze(rank0))
    validate(doc)
    gsteps = _x(doc, TID_GPU_STEPS, "measured")
    assert [e["dur"] for e in gsteps] == [pytest.approx(s.gpu_s * 1e6, abs=0.001) for s in rank0.steps]
    # Placed at max(host start, previous GPU end): the GPU (0.42 s/step) falls behind the host
    # (a step every 0.40 s), so from the second step on a GPU step starts where the last ended.
    assert gsteps[0]["ts"] == pytest.approx(rank0.steps[0].start_s * 1e6)
    for prev, cur in zip(gsteps, gsteps[1:]):
        assert cur["ts"] == pytest.approx(prev["ts"] + prev["dur"], abs=0.001)
    totals = _phase_totals(_x(doc, TID_GPU_PHASES, "measured"))
    for phase in {ph for st in rank0.steps for ph in st.gpu_phases}:
        assert totals[phase] == pytest.approx(sum(st.gpu_phases.get(phase, 0.0) for st in rank0.steps) * 1e6,
                                              abs=1.0)
    util = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "GPU utilization %"]
    assert [e["args"]["SM busy"] for e in util] == rank0.measurements["nvml"]["gpus"][0]["timeline"]["gpu_util_pct"]
    # A series NVML could not read (power: all None) makes no counter rather than zeros.
    assert not [e for e in doc["traceEvents"] if e["name"] == "GPU power (W)"]


def test_merged_profile_is_one_process_per_rank(merged_profile, merged_analysis):
    doc = render_trace(merged_profile, merged_analysis)
    validate(doc)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert set(names) == {0, 1}
    assert "rank 1" in names[1] and "failed" in names[1] and "node-a" in names[1]
    for r in merged_profile.ranks:
        n = len(r["profile"]["steps"])
        assert len(_x(doc, TID_STEPS, "measured", pid=r["rank"])) == n
    assert doc["otherData"]["ranks"] == RANKS_NOTE
    assert "NCCL <b>timeout</b>" in doc["otherData"]["rank1.status"]
    inst = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert len(inst) == 1 and inst[0]["pid"] == 0 and inst[0]["s"] == "g"
    assert inst[0]["args"]["saving_s"] == 0.09


def test_a_missing_rank_is_a_named_empty_process(merged_profile, merged_analysis):
    merged_profile.ranks.append({"rank": 2, "local_rank": 0, "node_rank": 1, "host": "node-b",
                                 "status": "missing", "error": None, "profile": None})
    doc = render_trace(merged_profile, merged_analysis)
    validate(doc)
    mine = [e for e in doc["traceEvents"] if e["pid"] == 2]
    assert {e["ph"] for e in mine} == {"M"}
    assert any("missing" in e["args"].get("name", "") for e in mine)


@pytest.mark.parametrize("ranks, message", [
    ([{"rank": "zero", "profile": None}], "non-negative integer rank"),
    ([{"rank": 0, "profile": None}, {"rank": 0, "profile": None}], "appears twice"),
    ([{"rank": 0, "status": "ok", "profile": {"steps": [{"index": 0}]}}], "rank 0: not a gpuprof profile"),
])
def test_malformed_ranks_are_one_line_errors(merged_profile, merged_analysis, ranks, message):
    merged_profile.ranks = ranks
    with pytest.raises(GpuprofError, match=message):
        render_trace(merged_profile, merged_analysis)


def test_unread_gpu_steps_and_malformed_timelines_are_said_not_drawn(merged_profile):
    from gpuprof.profile import Profile

    rank0 = Profile.from_dict(merged_profile.ranks[0]["profile"])
    rank0.steps[1].gpu_s = rank0.steps[1].gpu_phases = None
    rank0.measurements["timer"] = {"gpu_timeline": False, "steps_unresolved": [2],
                                   "reasons": ["CUDA error: an illegal memory access"]}
    tl = rank0.measurements["nvml"]["gpus"][0]["timeline"]
    tl["gpu_util_pct"] = tl["gpu_util_pct"][:-1]  # one value short: cannot be placed
    doc = render_trace(rank0, analyze(rank0))
    validate(doc)
    assert [e["args"]["index"] for e in _x(doc, TID_GPU_STEPS, "measured")] == [1, 3]
    assert doc["otherData"]["gpu_track"] == gpu_track_note(True, [2], ["CUDA error: an illegal memory access"])
    assert doc["otherData"]["nvml"] == omitted("timeline series and times differ in length")
    assert not [e for e in doc["traceEvents"] if e["ph"] == "C"]


def test_gpu_phases_follow_the_measured_gpu_spans():
    """A step with GPU spans from its CUDA events draws them in the order the GPU ran them."""
    from gpuprof.profile import Profile, StepRecord

    phases = {"forward": 0.01, "data": 0.02, "backward": 0.03}
    st = StepRecord(index=0, wall_s=0.06, phases=dict(phases), tokens=8, micro_steps=1,
                    gpu_s=0.06, gpu_phases={"forward": 0.01, "data": 0.02, "backward": 0.03},
                    extra={"gpu_spans": [["forward", 0.0, 0.01], ["data", 0.01, 0.02], ["backward", 0.03, 0.03]]})
    p = Profile(run={"mode": "builtin", "config": {}}, steps=[st])
    doc = render_trace(p, analyze(p))
    validate(doc)
    gpu = [e for e in doc["traceEvents"] if e["tid"] == TID_GPU_PHASES and e["ph"] == "X"]
    assert [e["name"] for e in gpu] == ["forward", "data", "backward"]
    assert [e["args"]["order"] for e in gpu] == ["measured"] * 3
    assert [e["ts"] for e in gpu] == [0.0, 10000.0, 30000.0]
