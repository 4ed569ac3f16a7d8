"""NVML and host samplers: NVML through the contract fake (tests/fakes/nvml.py), per-phase summaries from
synthetic samples. Samples are taken by the test on a fake clock (mfu/fake_time.py), or counted: no
assertion here depends on how fast the machine runs."""

import sys
import time
import types
from collections import namedtuple

import pytest
from fakes.nvml import FakeNvml
from mfu.fake_time import FakeTime, wait_until

from gpuprof.measure.host import HostSampler, disk_for_path
from gpuprof.measure.nvml import NvmlSampler, decode_throttle, resolve_nvml_handle
from gpuprof.measure.sampling import PhaseLookup, _SamplerThread, per_phase
from gpuprof.measure.timer import PhaseTimer
from gpuprof.profile import StepRecord


def _live(fake: FakeNvml) -> FakeNvml:
    """The fake after nvmlInit: resolve_nvml_handle is only ever called on a started library."""
    fake.nvmlInit()
    return fake


def _ctx(device="cuda:0", timer=None, profile=None):
    return types.SimpleNamespace(device=device, timer=timer or PhaseTimer(), profile=profile, config={})


def _synthetic_run(clock=None):
    """A timer with spans (ns since origin) and a profile: one warmup step 0-1 s, two measured
    steps 1-2 s and 2-3 s, each 40% data then 60% forward. clock: the timer's (a FakeTime's ns)."""
    timer = PhaseTimer(clock=clock) if clock is not None else PhaseTimer()
    s = 10**9
    timer.spans = [(0, s, "forward"),
                   (1 * s, int(1.4 * s), "data"), (int(1.4 * s), 2 * s, "forward"),
                   (2 * s, int(2.4 * s), "data"), (int(2.4 * s), 3 * s, "forward")]
    mk = lambda i, start: StepRecord(index=i, wall_s=1.0, phases={}, start_s=start)  # noqa: E731
    profile = types.SimpleNamespace(steps=[mk(1, 1.0), mk(2, 2.0)], warmup_steps=[mk(0, 0.0)], run={})
    return timer, profile


def test_phase_lookup_and_per_phase_from_synthetic_samples():
    timer, profile = _synthetic_run()
    lookup = PhaseLookup.from_ctx(_ctx(timer=timer, profile=profile))
    s = 10**9
    samples = [(int(0.5 * s), {"u": 10}),      # warmup
               (int(1.1 * s), {"u": 0}), (int(1.3 * s), {"u": 20}),   # data
               (int(1.5 * s), {"u": 100}), (int(2.5 * s), {"u": 90}),  # forward
               (int(2.2 * s), {"u": None}),   # data, unreadable
               (int(3.5 * s), {"u": 5})]      # after the loop
    ph = per_phase(samples, lookup, ["u"])
    assert ph["data"] == {"samples": 3, "u": 10.0}
    assert ph["forward"] == {"samples": 2, "u": 95.0}
    assert ph["warmup"]["samples"] == 1 and ph["outside"]["samples"] == 1


def test_nvml_sampler_with_fake_summarises_per_phase():
    fake, clock = FakeNvml(), FakeTime()
    timer, profile = _synthetic_run(clock.ns)  # the sampler's timestamps are the timer's seconds
    smp = NvmlSampler(interval_s=0.1, nvml=fake, uuid_of=None, env={}, pcie_every=1, clock=clock.ns,
                      threaded=False)
    ctx = _ctx(timer=timer)
    smp.start(ctx)
    assert smp.sample_count == 0  # no thread: only the test's samples
    for t in (1.1, 1.2, 1.5, 1.9, 2.1, 2.6):
        clock.t_ns = int(t * 10**9)
        fake.util = 5 if (t % 1) < 0.4 else 95
        smp.sample_now()
    ctx.profile = profile
    out = smp.stop(ctx)
    assert out["available"] and fake.shutdown
    assert out["samples"] == 6 and out["errors"] == 0 and out["late_ticks"] == 0
    g = out["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["sm_clock_max_mhz"] == 1980 and g["power_limit_w"] == 700
    assert g["timeline"]["t_s"] == [1.1, 1.2, 1.5, 1.9, 2.1, 2.6]  # on the timer's clock
    assert out["phases"]["data"]["gpu_util_pct"] == 5 and out["phases"]["data"]["samples"] == 3
    assert out["phases"]["forward"]["gpu_util_pct"] == 95 and out["phases"]["forward"]["samples"] == 3
    assert out["summary"]["sm_clock_share"]["mean"] == pytest.approx(0.5)
    assert out["summary"]["power_share"]["mean"] == pytest.approx(0.5)
    assert out["summary"]["pcie_rx_bytes_s"]["mean"] == 1000 * 1024
    assert set(out["throttle_share"]) == {"sw_power_cap", "hw_thermal_slowdown"}
    assert out["cost"]["thread_cpu_s"] == 0 and out["cost"]["duration_s"] == pytest.approx(2.6)
    assert "share_of_one_core" in out["cost"]


def test_nvml_pcie_is_read_every_pcie_every_ticks():
    fake, clock = FakeNvml(), FakeTime()
    smp = NvmlSampler(interval_s=0.1, nvml=fake, uuid_of=None, env={}, pcie_every=3, clock=clock.ns,
                      threaded=False)
    ctx = _ctx(timer=PhaseTimer(clock=clock.ns))
    smp.start(ctx)
    for _ in range(7):
        clock.advance(0.1)
        smp.sample_now()
    out = smp.stop(ctx)
    tl = out["gpus"][0]["timeline"]
    assert out["samples"] == 7 and tl["t_s"] == pytest.approx([0.1 * (i + 1) for i in range(7)])
    assert [v is not None for v in tl["pcie_rx_bytes_s"]] == [True, False, False, True, False, False, True]
    assert out["summary"]["pcie_rx_bytes_s"]["n"] == 3


def test_nvml_field_failures_are_reported_and_the_rest_is_read():
    fake, clock = FakeNvml(fail={"power", "temperature"}), FakeTime()
    smp = NvmlSampler(interval_s=0.1, nvml=fake, uuid_of=None, env={}, clock=clock.ns, threaded=False)
    ctx = _ctx(timer=PhaseTimer(clock=clock.ns))
    smp.start(ctx)
    for _ in range(5):
        clock.advance(0.1)
        smp.sample_now()
    out = smp.stop(ctx)
    assert out["available"] and out["errors"] == 0 and out["samples"] == 5
    assert "power" in out["unreadable"] and "temperature" in out["unreadable"]
    assert out["summary"]["power_w"] is None and out["summary"]["gpu_util_pct"]["mean"] == 80
    assert out["summary"]["gpu_util_pct"]["n"] == 5
    assert fake.calls["power"] == 1  # NotSupported: asked once, then never again
    assert fake.calls["temperature"] == 3  # other errors: given up after 3 in a row


def test_nvml_sampler_thread_samples_until_stopped():
    """The production path: a real thread on the real clock. Counted, not timed: the test waits
    until the thread has taken three samples (the first comes at once), then stops it."""
    fake = FakeNvml()
    smp = NvmlSampler(interval_s=0.01, nvml=fake, uuid_of=None, env={})
    ctx = _ctx()
    smp.start(ctx)
    assert wait_until(lambda: smp.sample_count >= 3), "the sampler thread took fewer than 3 samples in 60 s"
    out = smp.stop(ctx)
    assert out["available"] and out["errors"] == 0 and fake.shutdown
    assert out["samples"] >= 3 and out["summary"]["mem_used_bytes"]["n"] == out["samples"]
    assert out["cost"]["thread_cpu_s"] > 0 and out["cost"]["cpu_s_per_sample"] > 0
    assert not smp._thread.thread.is_alive()


def test_nvml_absent_driver_missing_and_cpu_runs_go_on(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    smp = NvmlSampler(uuid_of=None)
    smp.start(_ctx())
    out = smp.stop(_ctx())
    assert out["available"] is False and "not installed" in out["reason"]

    smp = NvmlSampler(nvml=FakeNvml(fail_init=True), uuid_of=None)
    smp.start(_ctx())
    out = smp.stop(_ctx())
    assert out["available"] is False and "Driver Not Loaded" in out["reason"]

    smp = NvmlSampler(nvml=FakeNvml(), uuid_of=None)
    smp.start(_ctx(device="cpu"))
    assert smp.stop(_ctx(device="cpu"))["available"] is False

    smp = NvmlSampler(nvml=FakeNvml(), uuid_of=None, env={"CUDA_VISIBLE_DEVICES": "7"})
    smp.start(_ctx())
    out = smp.stop(_ctx())
    assert out["available"] is False and "cannot find" in out["reason"]


@pytest.mark.parametrize("env,device,expect", [
    ({}, "cuda", 0),
    ({}, "cuda:1", 1),
    ({"CUDA_VISIBLE_DEVICES": "1"}, "cuda:0", 1),
    ({"CUDA_VISIBLE_DEVICES": "1,0"}, "cuda:1", 0),
    ({"CUDA_VISIBLE_DEVICES": "GPU-bbbb-2222"}, "cuda:0", 1),
    ({"CUDA_VISIBLE_DEVICES": " GPU-bbbb "}, "cuda", 1),  # CUDA accepts unique UUID prefixes
])
def test_cuda_visible_devices_mapping(env, device, expect):
    h, desc = resolve_nvml_handle(_live(FakeNvml()), device, env)
    assert h == expect
    assert desc["visible_index"] == (int(device.split(":")[1]) if ":" in device else 0)


def test_cuda_visible_devices_errors_and_torch_uuid():
    with pytest.raises(LookupError):
        resolve_nvml_handle(_live(FakeNvml()), "cuda:1", {"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(LookupError):
        resolve_nvml_handle(_live(FakeNvml(uuids=("GPU-ab1", "GPU-ab2"))), "cuda", {"CUDA_VISIBLE_DEVICES": "GPU-ab"})
    h, desc = resolve_nvml_handle(_live(FakeNvml()), "cuda:0", {"CUDA_VISIBLE_DEVICES": "0"}, uuid="GPU-bbbb-2222")
    assert h == 1 and desc["via"] == "torch uuid"
    # a UUID NVML does not know is not guessed from the env: that GPU may not be the run's
    with pytest.raises(LookupError, match="GPU-unknown"):
        resolve_nvml_handle(_live(FakeNvml()), "cuda:0", {"CUDA_VISIBLE_DEVICES": "1"}, uuid="GPU-unknown")


def test_sampler_thread_never_raises():
    # The loop, on a fake clock: every tick raises, every one is counted, and the loop goes on.
    calls = []

    def tick(t):
        calls.append(t)
        raise RuntimeError("boom")

    clock = FakeTime(until_s=0.05)
    th = _SamplerThread(0.005, tick, clock.ns, wait=clock.wait)
    th.start(PhaseTimer(clock=clock.ns))
    th.thread.join(timeout=60)  # a real thread on the fake clock: it runs to the fake time's end
    th.stop()
    assert th.errors == len(calls) == 10 and th.ticks == 0 and "boom" in th.last_error
    assert calls == [i * 5_000_000 for i in range(10)]  # at once, then every 5 ms until 50 ms
    assert not th.thread.is_alive()


def test_sampler_thread_on_the_real_clock_survives_a_raising_tick():
    """The production path: a real thread waiting on the real clock. Counted: the test waits until
    two ticks have raised and checks the thread is still sampling, then stops it."""
    def tick(t):
        raise RuntimeError("boom")

    th = _SamplerThread(0.005, tick, time.perf_counter_ns)
    th.start(PhaseTimer())
    try:
        assert wait_until(lambda: th.errors >= 2), "fewer than 2 ticks in 60 s"
        assert th.thread.is_alive() and "boom" in th.last_error
    finally:
        th.stop()
    assert not th.thread.is_alive() and th.ticks == 0 and th.errors >= 2


def test_sampler_thread_counts_late_ticks_and_resynchronises():
    def run(late_s):
        ticks = []
        clock = FakeTime(until_s=0.1, late_s=late_s)
        th = _SamplerThread(0.01, ticks.append, clock.ns, wait=clock.wait, threaded=False)
        th.start(PhaseTimer(clock=clock.ns))
        th.run()
        return th, [t / 1e6 for t in ticks]

    # The 4th wait returns 7 ms late (a starved thread): that tick is late, the next keeps the rhythm.
    th, ms = run({3: 0.007})
    assert ms == pytest.approx([0, 10, 20, 30, 47, 50, 60, 70, 80, 90])
    assert th.late == 1 and th.ticks == 10 and th.errors == 0
    # 35 ms late: more than an interval behind, the rhythm restarts from then (no burst of ticks).
    th, ms = run({3: 0.035})
    assert ms == pytest.approx([0, 10, 20, 30, 75, 85, 95])
    assert th.ticks == 7 and th.errors == 0


def test_decode_throttle():
    assert decode_throttle(0) == []
    assert decode_throttle(0x1 | 0x80) == ["gpu_idle", "hw_power_brake_slowdown"]


def _half_busy(until, slice_s: float = 0.0005, timeout_s: float = 60.0) -> None:
    """Alternate `slice_s` of Python work and `slice_s` of sleep until `until()` holds: half a core
    on any machine (the work runs for a time, not a count of operations). A training step spends
    most of its time in torch's C++ code, which releases the GIL; a pure-Python spin without the
    sleeps would starve the sampler thread of it."""
    deadline = time.perf_counter() + timeout_s
    while not until() and time.perf_counter() < deadline:
        end = time.perf_counter() + slice_s
        while time.perf_counter() < end:
            sum(i * i for i in range(50))
        time.sleep(slice_s)


def test_host_sampler_real_psutil_short_run(tmp_path):
    data = tmp_path / "train.bin"
    data.write_bytes(b"\0" * 4096)
    timer = PhaseTimer()
    smp = HostSampler(interval_s=0.01, data_path=str(data))
    ctx = _ctx(device="cpu", timer=timer)
    # One step, all forward, that lasts until the sampler has 5 samples: every one of them lies
    # inside it (a sample is drawn at the middle of its interval, which starts after start()).
    timer.start_step()
    timer.switch("forward")
    smp.start(ctx)
    cpu0, t0 = time.process_time(), time.perf_counter()
    _half_busy(lambda: smp.sample_count >= 5)
    cpu1, t1 = time.process_time(), time.perf_counter()
    timer.end_step()
    ctx.profile = types.SimpleNamespace(steps=timer.steps(), warmup_steps=[], run={})
    out = smp.stop(ctx)
    assert out["available"] and out["samples"] >= 5, out["samples"]
    assert out["phases"]["forward"]["samples"] >= 5 and out["summary"]["proc_cpu_pct"]["n"] >= 5
    assert out["summary"]["rss_bytes"]["min"] > 0
    # The loop keeps this process half busy: the sampler reads what the process's own CPU clock
    # read over the same time (its samples cover it, up to the last sampling interval).
    reference = (cpu1 - cpu0) / (t1 - t0) * 100.0
    assert out["summary"]["proc_cpu_pct"]["mean"] > 10
    assert out["summary"]["proc_cpu_pct"]["mean"] == pytest.approx(reference, abs=15.0)
    # Every CPU figure within its bound: no core above 100%, this run within the machine's cores.
    assert out["summary"]["cpu_pct_max_core"]["max"] <= 100.0
    assert out["summary"]["proc_cpu_pct"]["max"] <= 100.0 * out["cpu_count"]
    assert out["summary"]["own_cpu_cores"]["max"] <= out["cpu_count"]
    # A sample costs the thread a small part of its 10 ms interval, here or on a 3x slower CPU.
    assert out["cost"]["thread_cpu_s"] > 0 and out["cost"]["cpu_s_per_sample"] < 0.05
    assert out["data_path"] == str(data) and (out["disk"] or out["disk_reason"])


def test_host_sampler_with_failing_psutil_goes_on():
    class BadProc:
        def __init__(self, pid):
            pass

        def cpu_times(self):
            return types.SimpleNamespace(user=0.0, system=0.0, children_user=0.0, children_system=0.0)

        def children(self, recursive=False):
            return []

        def memory_info(self):
            return types.SimpleNamespace(rss=1000)

        def io_counters(self):
            raise PermissionError("denied")

    clock = [0]
    per_core = [[0.0, 0.0], [0.0, 0.0]]  # busy, idle seconds of each core

    core_times = namedtuple("scputimes", "user nice system idle iowait")

    def cpu_times(percpu=False):
        return [core_times(b, 0.0, 0.0, i, 0.0) for b, i in per_core]

    fake_ps = types.SimpleNamespace(Process=BadProc, cpu_times=cpu_times,
                                    disk_io_counters=lambda perdisk=False: {})
    smp = HostSampler(interval_s=60, psutil_mod=fake_ps, clock=lambda: clock[0], threaded=False)
    ctx = _ctx(device="cpu", timer=PhaseTimer(clock=lambda: clock[0]))
    smp.start(ctx)  # no thread: the samples come from the test
    clock[0] = 60 * 10**9
    per_core[0] = [6.0, 54.0]  # 10% and 30% busy over the minute
    per_core[1] = [18.0, 42.0]
    smp.sample_now()
    out = smp.stop(ctx)
    assert out["available"] and "io_counters" in out["unreadable"]
    assert out["samples"] == out["ticks"] == 1 and out["timeline"]["t_s"] == [30.0]  # the minute's middle
    assert out["summary"]["cpu_pct"]["mean"] == pytest.approx(20.0)
    assert out["summary"]["cpu_pct_max_core"]["max"] == pytest.approx(30.0)
    assert out["summary"]["cpu_busy_cores"]["mean"] == pytest.approx(0.4)
    assert out["summary"]["others_cpu_cores"]["mean"] == pytest.approx(0.4)  # this process used none
    assert out["summary"]["read_bytes_s"] is None


def test_disk_for_path_reasons(tmp_path):
    assert disk_for_path(None)[0] is None
    assert "cannot stat" in disk_for_path(str(tmp_path / "missing"))[1]
