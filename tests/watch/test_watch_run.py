"""`gpuprof watch` in-process on small scripts built here (tests/watch/conftest.py): a loader that
slows down after step N gives one change event within two windows of N naming the data phase,
with before/after within 10% of the script's own step times; a periodic eval gives none, and is
named periodic; memory stays bounded. Each run is a few hundred ms of the script's own sleeps."""

import json
import re
import statistics

import pytest

from gpuprof.watch.events import EventsFile, read_events
from gpuprof.watch.run import WatchOptions, run_watch
from gpuprof.watch.windows import Every


class Out:
    """The script's stdout: its own `iter N: ... time T ms` lines."""

    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        pass

    def times(self) -> dict[int, float]:
        return {int(m[1]): float(m[2]) / 1000 for m in re.finditer(r"iter (\d+): loss \S+, time ([\d.]+)ms", self.text)}


def _watch(script, tmp_path, *args, every=Every(steps=8), **opts):
    events = EventsFile(tmp_path / "ev.jsonl")
    out = Out()
    result, recorder = run_watch(str(script), list(args), WatchOptions(every, samplers=False, post_budget=0, **opts),
                                 events=events, stdout=out)
    return result, recorder, read_events(tmp_path / "ev.jsonl"), out


def test_a_loader_that_slows_after_step_n_is_one_change_naming_data(script, tmp_path):
    # sizes that stand out of this shared 2-core VM's noise (window medians of a 7 ms step wander
    # by several ms when other processes load it): a 10 ms sleep per step, then 40 ms more
    n = 40
    result, recorder, events, out = _watch(script, tmp_path, f"--slow_from={n}", "--max_iters=80",
                                           "--delay=0.01", "--slow_delay=0.04")
    assert result.ended == "finished"
    changes = [e for e in events if e["kind"] == "change"]
    summary = [(e["at_step"], e["before_s"], e["after_s"], e["phase"]) for e in changes]
    # the loader's: the largest; any other is a shift of the level by this shared VM's load
    # (other tests' processes), under a tenth of the step (seen: +/-1 ms on a 12-13 ms step)
    c = max(changes, key=lambda e: abs(e["saving_s"]))
    others = [e for e in changes if e is not c]
    assert all(abs(e["saving_s"]) < 0.1 * e["before_s"] for e in others), summary
    assert abs(c["at_step"] - n) <= 1 and c["phase"] == "data" and c["direction"] == "slower", \
        (summary, c["phases_before"], c["phases_after"])
    window_of_n = next(e["window"] for e in events if e["kind"] == "window" and e["steps"][0] <= n <= e["steps"][1])
    assert window_of_n <= c["window"] <= window_of_n + 2
    own = out.times()
    before = statistics.median(t for i, t in own.items() if 2 <= i < n)
    after = statistics.median(t for i, t in own.items() if i > n)
    assert c["before_s"] == pytest.approx(before, rel=0.10) and c["after_s"] == pytest.approx(after, rel=0.10)
    assert c["saving_s"] == pytest.approx(c["after_s"] - c["before_s"])
    assert c["phase_after_s"] - c["phase_before_s"] == pytest.approx(0.040, rel=0.25)  # the injected sleep
    assert c["at_step"] in [x["at_step"] for x in result.profile.measurements["watch"]["changes"]]
    windows = [e for e in events if e["kind"] == "window"]
    assert [w["window"] for w in windows] == list(range(1, len(windows) + 1))
    assert sum(w["n_steps"] for w in windows) == 78 and windows[0]["steps"][0] == 2  # after 2 warmup steps
    assert all(w["steps"][0] == v["steps"][1] + 1 for v, w in zip(windows, windows[1:]))
    assert windows[-1].get("partial") and events[-1]["kind"] == "end" and events[-1]["ended"] == "finished"
    assert all(abs(sum(p["share"] for p in w["phases"].values()) - 1) < 1e-9 for w in windows)
    assert windows[0]["tokens_per_s"] == pytest.approx(32 / windows[0]["step_s"])
    assert windows[0]["mfu"] is None and "not GPT-shaped" in windows[0]["mfu_not_measured"]  # no FLOP formula


def test_window_mfu_is_the_formula_over_the_peak():
    import types

    from gpuprof.dims import gpt_flops_per_token
    from gpuprof.watch.recorder import Recorder
    from gpuprof.watch.run import mfu_basis

    dims = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "block_size": 32}
    ctx = types.SimpleNamespace(config={"model_dims": dims, "param_count": 30_000}, device="cpu",
                                precision={"compute_dtype": "fp32"})
    assert isinstance(mfu_basis(None, None)(ctx), str)  # a CPU: no datasheet peak, no MFU
    per_token, peak = mfu_basis(None, 2.0)(ctx)  # --peak-tflops 2
    assert per_token == gpt_flops_per_token(dims, 30_000) and peak == 2e12
    rec = Recorder(Every(steps=1), 0)
    rec._basis = (per_token, peak)
    ev = {"tokens_per_s": 1000.0}
    rec._mfu(ev)
    assert ev["mfu"] == pytest.approx(1000.0 * per_token / 2e12)


def test_a_periodic_eval_is_no_change_and_is_named_periodic(script, tmp_path, one_many_process_test):
    # no many-process test beside it (tests/cpu_lock.py), the largest load changes the suite makes:
    # once in a full suite this run's ~13 ms steps moved +11% for 24 steps and back (what ran beside
    # it was not recorded; the message below now says the changes' causes)
    # an eval of 8 batches (80 ms of sleep) every 7 steps of ~13 ms
    delay = 0.01
    result, recorder, events, _ = _watch(script, tmp_path, "--eval_every=7", "--eval_iters=8", f"--delay={delay}",
                                         "--max_iters=80")
    changes = [e for e in events if e["kind"] == "change"]
    assert not any(c["phase"] == "eval" for c in changes)
    # a change here can only be other processes' load on this shared machine: it says so, or it is
    # a shift of the level by at most the step's own compute again plus a tenth of the step (samplers
    # are off here, so contention cannot be named; a process beside it can take the core this ~2.5 ms
    # of compute runs on: seen +0.55 ms on an 11.5 ms step, and +2.52 ms on a 12.5 ms one with the lock
    # held, 2026-12-07). The eval folded into the level would be ~11 ms a step (80 ms every 7): far above.
    assert all(any(k["kind"] == "contention" for k in c["causes"])
               or abs(c["saving_s"]) < 0.1 * c["before_s"] + (c["before_s"] - delay)
               for c in changes), [(c["at_step"], c["before_s"], c["saving_s"], [k["kind"] for k in c["causes"]])
                                   for c in changes]
    periodic = [e for e in events if e["kind"] == "periodic"]
    assert [(p["phase"], p["every_steps"]) for p in periodic] == [("eval", 7)]
    assert result.profile.measurements["watch"]["changes_total"] == len(changes)


def test_memory_is_bounded_the_profile_is_a_sample_of_the_whole_run(script, tmp_path):
    result, recorder, events, _ = _watch(script, tmp_path, "--delay=0.0", "--max_iters=300", every=Every(steps=10),
                                         keep_steps=16)
    prof = result.profile
    assert len(prof.warmup_steps) == 2 and len(prof.steps) == 16
    assert max(s.index for s in prof.steps) > 150  # sampled over the run, not its start
    kept = prof.measurements["watch"]["kept"]
    assert kept["steps_closed"] == 300 and kept["keep_steps"] == 16
    assert len(recorder.recent) <= recorder.recent.maxlen and len(recorder.detector._windows) <= 12
    assert sum(e["n_steps"] for e in events if e["kind"] == "window") == 298
    assert json.dumps(prof.to_dict())  # a whole profile, written as diagnose's
