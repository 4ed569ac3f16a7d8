"""gpu-throttled fires on NVML's slowdown reasons only: never on a power cap or a clock below max
boost alone, which is how a healthy busy datacenter GPU runs."""

import types

import pytest
from fakes.nvml import FakeNvml
from mfu.fake_time import FakeTime

from gpuprof.analysis.findings import Context
from gpuprof.analysis.rules import machine
from gpuprof.measure.nvml import NvmlSampler
from gpuprof.measure.timer import PhaseTimer
from gpuprof.profile import StepRecord

PHASES = {"forward": 0.3, "backward": 0.6, "optimizer": 0.1}


def _findings(profile_factory, throttle_share, clock=None):
    phases = {p: {"sm_clock_share": clock} for p in PHASES} if clock is not None else {}
    nvml = {"available": True, "throttle_share": throttle_share, "phases": phases}
    p = profile_factory(PHASES, device="cuda", measurements={"nvml": nvml})
    return machine.gpu_throttled(Context(profile=p, stats=p.stats))


def test_power_cap_and_clock_below_boost_alone_do_not_fire(profile_factory):
    # an H200 at its 700 W limit: sw_power_cap in every sample, SM clock 70% of max boost
    assert _findings(profile_factory, {"sw_power_cap": 1.0}, clock=0.7) == []
    assert _findings(profile_factory, {"gpu_idle": 0.3, "applications_clocks_setting": 1.0}, clock=0.7) == []
    # clock-event reasons unreadable (e.g. a MIG instance): the clock alone proves nothing
    assert _findings(profile_factory, None, clock=0.5) == []


@pytest.mark.parametrize("reason", ["sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown",
                                    "hw_power_brake_slowdown"])
def test_each_slowdown_reason_fires_from_20_percent_of_samples(profile_factory, reason):
    (f,) = _findings(profile_factory, {reason: 0.2}, clock=0.95)
    assert f.id == "gpu-throttled" and reason in f.title and f.evidence["slowdown_share"] == {reason: 0.2}
    assert _findings(profile_factory, {reason: 0.19}, clock=0.5) == []


def test_saving_is_an_upper_bound_from_the_compute_clock(profile_factory):
    (f,) = _findings(profile_factory, {"hw_thermal_slowdown": 0.5, "sw_power_cap": 0.9}, clock=0.8)
    assert f.saving_s == pytest.approx(1.0 * 0.2)  # forward+backward+optimizer × (1 − 0.8)
    assert f.saving_s / sum(PHASES.values()) == pytest.approx(0.2)  # its share: the engine's with_share
    assert f.claims == pytest.approx({"forward": 0.06, "backward": 0.12, "optimizer": 0.02})
    assert "upper bound" in f.note and "power limit in 90% of samples" in f.note
    assert "sw_power_cap" not in f.title and f.evidence["power_cap_share"] == 0.9
    assert f.evidence["sm_clock_share_compute"] == 0.8


def test_slowdown_without_a_clock_reading_has_no_saving(profile_factory):
    (f,) = _findings(profile_factory, {"sw_thermal_slowdown": 0.6})
    assert f.saving_s is None and f.saving_share is None and f.claims == {}
    assert "no SM clock was read" in f.note
    (f,) = _findings(profile_factory, {"sw_thermal_slowdown": 0.6}, clock=1.0)
    assert f.saving_s is None and "stayed at max boost" in f.note


def _sampled(profile_factory, mask):
    """The rule on what the NVML sampler made of a fake GPU at half its max clock (990/1980 MHz).

    No sampling thread: the sampler is driven on a clock the test moves (threaded=False), so its
    samples are exactly the test's four, at 0.1-0.4 s inside the one measured step, on any machine."""
    fake, clock = FakeNvml(throttle_mask=mask), FakeTime()
    smp = NvmlSampler(interval_s=0.1, nvml=fake, uuid_of=lambda dev: "GPU-aaaa-1111", env={}, clock=clock.ns,
                      threaded=False)
    timer = PhaseTimer(clock=clock.ns)
    timer.spans = [(0, 10**9, "forward")]  # one measured step, 0-1 s, all forward
    ctx = types.SimpleNamespace(device="cuda:0", timer=timer, profile=None, config={})
    smp.start(ctx)
    for _ in range(4):
        clock.advance(0.1)
        smp.sample_now()
    ctx.profile = types.SimpleNamespace(steps=[StepRecord(index=0, wall_s=1.0, phases={}, start_s=0.0)],
                                        warmup_steps=[], run={})
    out = smp.stop(ctx)
    assert out["samples"] == 4 and out["gpus"][0]["timeline"]["t_s"] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    fwd = out["phases"]["forward"]
    assert fwd["samples"] == 4 and fwd["sm_clock_share"] == pytest.approx(0.5)
    p = profile_factory(PHASES, device="cuda", measurements={"nvml": out})
    return machine.gpu_throttled(Context(profile=p, stats=p.stats))


def test_sampled_power_cap_does_not_fire_and_thermal_does(profile_factory):
    assert _sampled(profile_factory, 0x4) == []  # sw_power_cap only, clock at 50% of boost
    (f,) = _sampled(profile_factory, 0x4 | 0x20)  # + sw_thermal_slowdown
    assert "sw_thermal_slowdown 100% of samples" in f.title and f.saving_s == pytest.approx(0.5)
