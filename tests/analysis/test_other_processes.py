"""Other processes on the machine: cpu-saturated says who held the cores (this run or others, with
their share), and data-loading-exposed sizes its DataLoader-workers advice by the cores free to
this run. Host figures as the host sampler writes them (cores, over the measured steps)."""

import pytest

from gpuprof.analysis.engine import Context
from gpuprof.analysis.rules import machine, phases


def _host(cores: int, busy: float, own: float, proc: float, others: float | None = None) -> dict:
    """measurements.host with the means of the measured steps: machine busy, this run's CPU (this
    process `proc` + its children), others = busy - own unless given."""
    others = max(0.0, busy - own) if others is None else others
    mean = lambda x: {"mean": x}  # noqa: E731
    return {"host": {"available": True, "cpu_count": cores,
                     "summary": {"cpu_pct": mean(busy / cores * 100), "cpu_busy_cores": mean(busy),
                                 "own_cpu_cores": mean(own), "proc_cpu_pct": mean(proc * 100),
                                 "children_cpu_cores": mean(own - proc), "others_cpu_cores": mean(others)},
                     "phases": {"data": {"samples": 10, "cpu_pct": busy / cores * 100}}}}


def _script_loader(profile_factory, host: dict, device: str = "cpu"):
    """A script with a DataLoader that keeps the step waiting 40% of the time."""
    meas = dict(host, script={"hooks": {"counts": {"dataloader_next": 10}}})
    gpu = {"data": 0.4, "forward": 0.2, "backward": 0.4} if device == "cuda" else None
    p = profile_factory({"data": 0.4, "forward": 0.2, "backward": 0.4}, device=device, gpu_phases=gpu,
                        measurements=meas)
    p.run["mode"] = "script"
    return p


# ------------------------------------------------------------------ cpu-saturated
def test_others_holding_the_cores_are_named_with_their_share_not_the_models_compute(profile_factory):
    p = profile_factory({"forward": 0.4, "backward": 0.6}, measurements=_host(2, busy=1.9, own=0.5, proc=0.5))
    (f,) = machine.cpu_saturated(Context(profile=p, stats=p.stats))
    assert f.id == "cpu-saturated"
    assert "other processes held 1.4 of 2 cores (70%)" in f.title and "this run used 0.5" in f.title
    assert "model's compute" not in f.title + f.fix + f.note
    assert "free the cores" in f.fix and "taskset" in f.fix and "noisy" in f.note
    assert f.kind == "info" and f.saving_s is None  # on a CPU run it ranks after the verdict on the step
    ev = f.evidence
    assert ev["others_cpu_cores"] == pytest.approx(1.4) and ev["others_share"] == pytest.approx(0.7)
    assert ev["own_cpu_cores"] == pytest.approx(0.5) and ev["own_share"] == pytest.approx(0.25)
    assert ev["machine_busy_cores"] == pytest.approx(1.9) and ev["cores"] == 2
    assert ev["cpu_busy_mean"] == pytest.approx(0.95)


def test_this_run_holding_the_cores_on_a_cpu_run_keeps_the_compute_message(profile_factory):
    p = profile_factory({"forward": 0.4, "backward": 0.6}, measurements=_host(2, busy=1.96, own=1.9, proc=1.9))
    (f,) = machine.cpu_saturated(Context(profile=p, stats=p.stats))
    assert "this run used 1.9 of 2 cores" in f.title and "other processes" not in f.title
    assert "the model's compute uses every core" in f.fix and f.kind == "info"
    assert f.evidence["others_share"] == pytest.approx(0.03)


def test_this_run_leading_but_others_notable_are_still_named(profile_factory):
    p = profile_factory({"forward": 0.4, "backward": 0.6}, measurements=_host(4, busy=3.9, own=2.8, proc=2.8))
    (f,) = machine.cpu_saturated(Context(profile=p, stats=p.stats))
    assert "this run used 2.8 of 4 cores; other processes held 1.1 (28%)" in f.title
    assert "model's compute" in f.fix and "other processes held 1.1 of the 4 cores" in f.note


def test_others_on_a_gpu_run_are_named_too(profile_factory):
    p = profile_factory({"forward": 0.4, "backward": 0.6}, device="cuda",
                        gpu_phases={"forward": 0.4, "backward": 0.6},
                        measurements=_host(8, busy=7.8, own=1.2, proc=1.0))
    (f,) = machine.cpu_saturated(Context(profile=p, stats=p.stats))
    assert "other processes held 6.6 of 8 cores (82%)" in f.title and "kernel launches" in f.note
    assert f.kind == "fix"


def test_an_idle_machine_has_no_cpu_finding(profile_factory):
    p = profile_factory({"forward": 1.0}, measurements=_host(2, busy=1.0, own=0.2, proc=0.2))
    assert machine.cpu_saturated(Context(profile=p, stats=p.stats)) == []


# ------------------------------------------------------------------ data-loading-exposed
def test_worker_advice_is_capped_by_the_cores_free_to_this_run(profile_factory):
    # 8 cores, others 3.0, this process 2.5 (plus 0.5 of existing workers): 2.5 free -> 2 workers.
    p = _script_loader(profile_factory, _host(8, busy=6.0, own=3.0, proc=2.5), device="cuda")
    (f,) = phases.data_loading_exposed(Context(profile=p, stats=p.stats))
    assert "num_workers=2," in f.fix and "2.5 of 8 cores were free" in f.fix
    ev = f.evidence
    assert ev["free_cores"] == pytest.approx(2.5) and ev["workers_suggested"] == 2
    assert ev["others_cpu_cores"] == pytest.approx(3.0) and ev["proc_cpu_cores"] == pytest.approx(2.5)
    assert ev["children_cpu_cores"] == pytest.approx(0.5)


def test_no_worker_is_suggested_without_a_free_core_and_the_reason_is_given(profile_factory):
    # The machine: others held 1.4 of 2 cores, this process 0.9: nothing is free.
    p = _script_loader(profile_factory, _host(2, busy=2.0, own=0.6, proc=0.6, others=1.4))
    (f,) = phases.data_loading_exposed(Context(profile=p, stats=p.stats))
    assert "num_workers" not in f.fix and f.evidence["workers_suggested"] == 0
    assert "none was free: of 2 cores, other processes held 1.4 and this process 0.6" in f.fix
    assert "other processes held 1.4 of 2 cores" in f.note and f.confidence == "low"


def test_a_large_free_machine_gets_at_most_one_worker_per_free_core_and_a_start_cap(profile_factory):
    p = _script_loader(profile_factory, _host(64, busy=1.5, own=1.2, proc=1.2), device="cuda")
    (f,) = phases.data_loading_exposed(Context(profile=p, stats=p.stats))
    assert f.evidence["workers_suggested"] == phases.MAX_WORKERS_SUGGESTED <= f.evidence["free_cores"]
    small = _script_loader(profile_factory, _host(2, busy=1.2, own=0.8, proc=0.8), device="cuda")
    (g,) = phases.data_loading_exposed(Context(profile=small, stats=small.stats))
    assert g.evidence["free_cores"] == pytest.approx(0.8) and "num_workers" not in g.fix  # 0.8 < 1 core


def test_builtin_loop_prefetch_note_says_when_no_core_is_free(profile_factory):
    p = profile_factory({"data": 0.4, "forward": 0.2, "backward": 0.4},
                        measurements=_host(2, busy=2.0, own=1.0, proc=1.0))
    (f,) = phases.data_loading_exposed(Context(profile=p, stats=p.stats))
    assert "background thread" in f.fix
    assert "a background loader needs a free core, and none was" in f.note
