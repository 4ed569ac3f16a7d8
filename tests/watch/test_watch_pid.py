"""`gpuprof watch --pid PID`: attach's recordings back to back, each a window, through the same
figures and change test as an in-process watch. First with attach replaced by recordings built
here (steps and phases we choose: the rule is exercised exactly), then a real target sampled by
py-spy from outside, whose loader slows down at an iteration it prints."""

import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gpuprof.attach.run import AttachResult
from gpuprof.errors import GpuprofError, InterruptedEmpty
from gpuprof.profile import Profile, StepRecord
from gpuprof.watch.events import read_events
from gpuprof.watch.pid import check_every, nvml_of, watch_pid
from gpuprof.watch.windows import Every

from ddp_helpers import gpuprof_here

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TARGET = FIXTURES / "attach_target.py"


class Counters:
    """WindowCounters' interface, no process read: the figures a window's host section holds."""

    def __init__(self):
        self.reads = 0

    def start(self):
        pass

    def read(self):
        self.reads += 1
        return {"seconds": 2.0, "own_cpu_cores": 1.0, "read_bytes_s": 0.0, "children": 0, "children_started": 0}


def _recording(step_s, data_s, n, seed, *, files=(), nvml=None):
    rng = np.random.default_rng(seed)
    steps = []
    for i in range(n):
        d = data_s * (1 + 0.02 * rng.standard_normal())
        c = (step_s - data_s) * (1 + 0.02 * rng.standard_normal())
        steps.append(StepRecord(index=i, wall_s=d + c, phases={"data": d, "forward": c / 3, "backward": 2 * c / 3},
                                tokens=0, micro_steps=2))
    p = Profile(run={"mode": "attach"}, steps=steps, environment={})
    p.measurements["attach"] = {"sampler": {"samples": 200 * n, "expected_samples": 200 * n, "quality": {}},
                                "process": {"files": [{"path": f, "fs_type": "nfs", "fs_kind": "network"} for f in files]}}
    p.measurements["nvml"] = nvml or {"available": False, "reason": "no GPU (a test)"}
    return p


class FakeAttach:
    """attach()'s signature; hands out the recordings given, in order; then the target has ended."""

    def __init__(self, recordings):
        self.recordings = list(recordings)
        self.calls = []

    def __call__(self, pids, duration_s, **kw):
        self.calls.append((pids, duration_s, kw))
        r = self.recordings.pop(0)
        if isinstance(r, Exception):
            raise r
        return AttachResult([r], False, [pids[0]] if not self.recordings else [])

    def alive(self, pid):
        return bool(self.recordings)


def _watch(recordings, **kw):
    fake = FakeAttach(recordings)
    events = []
    result = watch_pid(4242, Every(seconds=2.0), [events.append], attach_fn=fake, alive=fake.alive,
                       counters=Counters(), **kw)
    return result, events, fake


def test_a_slower_loader_is_one_change_naming_data_and_the_new_files():
    before = [_recording(0.080, 0.030, 25, s) for s in range(3)]
    after = [_recording(0.180, 0.130, 11, 10 + s, files=("/mnt/nfs/shard-07.bin",)) for s in range(1)] + \
            [_recording(0.180, 0.130, 11, 20 + s) for s in range(2)]
    result, events, fake = _watch(before + after)
    assert result.ended == "finished" and result.last_profile is after[-1]
    # windows follow each other: no idle baseline before each (attach's cost baseline, attach/cost.py)
    assert all(kw["cost_before_s"] == 0.0 for _, _, kw in fake.calls)
    windows = [e for e in events if e["kind"] == "window"]
    assert [w["window"] for w in windows] == [1, 2, 3, 4, 5, 6]
    assert [w["steps"] for w in windows][:4] == [[0, 24], [25, 49], [50, 74], [75, 85]]
    assert all(w["mfu"] is None and "token" in w["mfu_not_measured"] for w in windows)
    changes = [e for e in events if e["kind"] == "change"]
    assert len(changes) == 1
    c = changes[0]
    assert c["phase"] == "data" and c["direction"] == "slower" and abs(c["at_step"] - 75) <= 1
    assert c["before_s"] == pytest.approx(0.080, rel=0.05) and c["after_s"] == pytest.approx(0.180, rel=0.05)
    storage = next(x for x in c["causes"] if x["kind"] == "storage")
    assert storage["evidence"]["new_files"][0]["path"] == "/mnt/nfs/shard-07.bin"
    assert storage["evidence"]["new_files"][0]["fstype"] == "nfs"
    assert events[-1]["kind"] == "end" and events[-1]["ended"] == "finished"
    assert [call[1] for call in fake.calls] == [2.0] * 6  # each window one recording of --every


def test_a_window_without_a_complete_step_is_an_event_not_the_end():
    recs = [_recording(0.05, 0.01, 20, 1), GpuprofError("process 4242: no complete training step in 2.0 s"),
            _recording(0.05, 0.01, 20, 2)]
    result, events, _ = _watch(recs)
    windows = [e for e in events if e["kind"] == "window"]
    assert [w["n_steps"] for w in windows] == [20, 0, 20]
    assert "no complete training step" in windows[1]["no_steps"]
    assert windows[2]["steps"] == [20, 39]  # numbered on from the steps seen
    assert result.windows_without_steps == 1 and result.recorder.windows == 3


def test_ctrl_c_before_any_step_is_interrupted():
    result, events, _ = _watch([InterruptedEmpty("interrupted: no complete step")])
    assert result.ended == "interrupted" and result.last_profile is None
    assert events[-1] == {**events[-1], "kind": "end", "ended": "interrupted"}


def test_every_must_be_a_duration_of_a_second_or_more():
    with pytest.raises(GpuprofError, match="give a duration"):
        check_every(Every(steps=100))
    with pytest.raises(GpuprofError, match="at least 1 s"):
        check_every(Every(seconds=0.5))


def test_the_gpu_figures_come_from_attachs_nvml_section():
    section = {"available": True, "samples": 20, "throttle_share": {"hw_thermal_slowdown": 0.5},
               "summary": {"gpu_util_pct": {"mean": 97.0, "max": 100.0}, "sm_clock_mhz": {"mean": 1755.0},
                           "temp_c": {"mean": 70.0, "max": 83.0}, "mem_used_bytes": {"mean": 1.0, "max": 8e10}}}
    got = nvml_of(section)
    assert got["gpu_util_pct"] == 97.0 and got["sm_clock_mhz"] == 1755.0 and got["temp_c"] == 83.0
    assert got["mem_used_bytes"] == 8e10 and got["throttle_share"] == {"hw_thermal_slowdown": 0.5}
    assert got["power_w"] is None  # not in the section: not measured, not zero
    assert nvml_of({"available": False, "reason": "no driver"}) == {"not_measured": "no driver"}


# -- a real target, from outside --------------------------------------------------------------------

LINE = re.compile(r"^iter (\d+): time ([0-9.]+) ms, data ([0-9.]+) ms")


def test_a_running_loop_whose_loader_slows_is_watched_from_outside(tmp_path, one_many_process_test):
    # ~50 ms steps, then ~150 ms: the watch starts a few steps in (in this process: no start-up of its
    # own; py-spy's); three windows of ~2 s (1.5 s of samples and py-spy starting) before the
    # slowdown, four after it
    slow_from = 120
    proc = subprocess.Popen([sys.executable, str(TARGET), "--data_s", "0.01", "--slow_from", str(slow_from),
                             "--slow_data_s", "0.05", "--iters", str(slow_from + 60), "--hidden", "512"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[tuple[int, float, float]] = []
    arrived: list[float] = []  # when each line came (Unix time)

    def read():
        for line in proc.stdout:
            m = LINE.match(line)
            if m:
                lines.append((int(m[1]), float(m[2]) / 1000, float(m[3]) / 1000))
                arrived.append(time.time())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        end = time.monotonic() + 120
        while len(lines) < 3:
            assert proc.poll() is None and time.monotonic() < end, "the target did not start stepping"
            time.sleep(0.05)
        ev_path = tmp_path / "ev.jsonl"
        r = gpuprof_here("watch", "--pid", proc.pid, "--every", "1.5s", "--rate", "400", "--events", ev_path,
                         "--json")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=5)
    assert r.returncode == 0, r.stderr[-2000:]
    profile = json.loads(r.stdout)
    assert profile["run"]["mode"] == "attach" and profile["measurements"]["watch"]["pid"] == proc.pid
    events = read_events(ev_path)
    assert events[0]["kind"] == "header" and events[0]["pid"] == proc.pid and events[-1]["kind"] == "end"
    windows = [e for e in events if e["kind"] == "window" and e.get("n_steps")]
    assert len(windows) >= 4
    changes = [e for e in events if e["kind"] == "change"]
    assert len(changes) == 1, ([(c["at_step"], c["before_s"], c["after_s"]) for c in changes],
                               [(w["window"], w["n_steps"], w.get("step_s"), w["t_s"]) for w in windows], lines[-1])
    c = changes[0]
    assert c["phase"] == "data" and c["direction"] == "slower"

    def inside(w):  # the loop's own step times that ended inside the window
        end = w["time_unix"]
        start = end - (w["t_s"][1] - w["t_s"][0])
        return [t for (_, t, _), at in zip(lines, arrived) if start + t <= at <= end]

    # the windows wholly on each side of the change, against the loop's own steps in the same
    # seconds: in one CI run, with the suite loading the VM, watch read 91 ms where the loop's median
    # over all its steps before the slowdown (windows or not) was 69 ms
    before = statistics.median(t for w in windows if w["steps"][1] < c["at_step"] for t in inside(w))
    after = statistics.median(t for w in windows if w["steps"][0] >= c["at_step"] and not w.get("partial")
                              for t in inside(w))
    # from outside, a split can land up to a window early and mix fast steps into "after" (docs/
    # watch.md: +8%/+10% quiet, -23% once with the suite loading the VM); the windows wholly on
    # each side, against the loop's own steps in the same seconds (up to 18% off seen with the suite
    # loading the VM)
    assert c["before_s"] == pytest.approx(before, rel=0.30), (c["before_s"], before)
    assert c["after_s"] == pytest.approx(after, rel=0.30), (c["after_s"], after)

    def own(w):  # the loop's own median step over the iterations that ended inside the window
        steps = inside(w)
        # at least 3 (a median): a loaded CI run's last whole window held 3 of the loop's ~170-ms
        # steps (2026-12-07), where a quiet one holds ~9
        assert len(steps) >= 3, (w["window"], len(steps))
        return statistics.median(steps)

    for w in (windows[0], [w for w in windows if not w.get("partial")][-1]):
        assert w["step_s"] == pytest.approx(own(w), rel=0.25), (w["window"], w["step_s"], own(w))
    # the data phase grew by the injected sleep (2 micro-steps x 50 ms): the mechanism, with a margin
    # that holds beside the suite's other worker (a CI run read 74 ms, 2026-12-07); how close sampled
    # phases come to the truth on a quiet machine is benchmarks/attach_accuracy.py's (5 points)
    assert c["phase_after_s"] - c["phase_before_s"] == pytest.approx(0.100, rel=0.5), (
        c["phases_before"], c["phases_after"], c["at_step"], [(w["window"], w["steps"], w["sampler"]) for w in windows])
