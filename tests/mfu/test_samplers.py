"""NVML and host samplers: NVML through the contract fake (tests/fakes/nvml.py), per-phase summaries from
synthetic samples."""

import sys
import time
import types
from collections import namedtuple

import pytest
from fakes.nvml import FakeNvml

from gpuprof.measure.samplers import (HostSampler, NvmlSampler, PhaseLookup, _SamplerThread, decode_throttle,
                                      disk_for_path, per_phase, resolve_nvml_handle)
from gpuprof.measure.timer import PhaseTimer
from gpuprof.profile import StepRecord


def _live(fake: FakeNvml) -> FakeNvml:
    """The fake after nvmlInit: resolve_nvml_handle is only ever called on a started library."""
    fake.nvmlInit()
    return fake


def _ctx(device="cuda:0", timer=None, profile=None):
    return types.SimpleNamespace(device=device, timer=timer or PhaseTimer(), profile=profile, config={})


def _synthetic_run():
    """A timer with spans (ns since origin) and a profile: one warmup step 0-1 s, two measured
    steps 1-2 s and 2-3 s, each 40% data then 60% forward."""
    timer = PhaseTimer()
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
    fake = FakeNvml()
    timer, profile = _synthetic_run()
    smp = NvmlSampler(interval_s=60, nvml=fake, uuid_of=None, env={}, pcie_every=1)
    ctx = _ctx(timer=timer)
    smp.start(ctx)
    time.sleep(0.05)  # the thread's first tick happens at once; the next is 60 s away
    s = 10**9
    for t in (1.1, 1.2, 1.5, 1.9, 2.1, 2.6):
        fake.util = 5 if (t % 1) < 0.4 else 95
        smp._tick(int(t * s))
    ctx.profile = profile
    out = smp.stop(ctx)
    assert out["available"] and fake.shutdown
    assert out["samples"] >= 1 and out["errors"] == 0
    g = out["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["sm_clock_max_mhz"] == 1980 and g["power_limit_w"] == 700
    assert out["phases"]["data"]["gpu_util_pct"] == 5 and out["phases"]["data"]["samples"] == 3
    assert out["phases"]["forward"]["gpu_util_pct"] == 95 and out["phases"]["forward"]["samples"] == 3
    assert out["summary"]["sm_clock_share"]["mean"] == pytest.approx(0.5)
    assert out["summary"]["power_share"]["mean"] == pytest.approx(0.5)
    assert out["summary"]["pcie_rx_bytes_s"]["mean"] == 1000 * 1024
    assert set(out["throttle_share"]) == {"sw_power_cap", "hw_thermal_slowdown"}
    assert out["cost"]["thread_cpu_s"] >= 0 and "share_of_one_core" in out["cost"]


def test_nvml_field_failures_are_reported_and_the_rest_is_read():
    fake = FakeNvml(fail={"power", "temperature"})
    smp = NvmlSampler(interval_s=60, nvml=fake, uuid_of=None, env={})
    ctx = _ctx()
    smp.start(ctx)
    for i in range(5):
        smp._tick(i * 10**8)
    out = smp.stop(ctx)
    assert out["available"] and out["errors"] == 0
    assert "power" in out["unreadable"] and "temperature" in out["unreadable"]
    assert out["summary"]["power_w"] is None and out["summary"]["gpu_util_pct"]["mean"] == 80
    assert fake.calls["power"] == 1  # NotSupported: asked once, then never again
    assert fake.calls["temperature"] == 3  # other errors: given up after 3 in a row


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
    calls = []

    def tick(t):
        calls.append(t)
        raise RuntimeError("boom")

    th = _SamplerThread(0.005, tick, time.perf_counter_ns)
    th.start(PhaseTimer())
    time.sleep(0.05)
    th.stop()
    assert th.errors == len(calls) >= 2 and "boom" in th.last_error
    assert not th.thread.is_alive()


def test_decode_throttle():
    assert decode_throttle(0) == []
    assert decode_throttle(0x1 | 0x80) == ["gpu_idle", "hw_power_brake_slowdown"]


def test_host_sampler_real_psutil_short_run(tmp_path):
    data = tmp_path / "train.bin"
    data.write_bytes(b"\0" * 4096)
    timer = PhaseTimer()
    smp = HostSampler(interval_s=0.01, data_path=str(data))
    ctx = _ctx(device="cpu", timer=timer)
    smp.start(ctx)
    t_end = time.perf_counter() + 0.8  # long enough for samples on a loaded 2-core machine
    timer.start_step()
    while time.perf_counter() < t_end:
        with timer.phase("forward"):
            sum(i * i for i in range(5000))
            # a training step spends most of its time in torch's C++ code, which releases the GIL;
            # a pure-Python spin would starve the sampler thread of it (5 samples/s, not 100)
            time.sleep(0.0005)
    timer.end_step()
    ctx.profile = types.SimpleNamespace(steps=timer.steps(), warmup_steps=[], run={})
    out = smp.stop(ctx)
    assert out["available"] and out["samples"] >= 4
    assert out["summary"]["rss_bytes"]["min"] > 0
    assert out["phases"]["forward"]["samples"] >= 3
    assert out["summary"]["proc_cpu_pct"]["mean"] > 10  # the loop above is busy
    # Every CPU figure within its bound: no core above 100%, this run within the machine's cores.
    assert out["summary"]["cpu_pct_max_core"]["max"] <= 100.0
    assert out["summary"]["proc_cpu_pct"]["max"] <= 100.0 * out["cpu_count"]
    assert out["summary"]["own_cpu_cores"]["max"] <= out["cpu_count"]
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
    smp = HostSampler(interval_s=60, psutil_mod=fake_ps, clock=lambda: clock[0])
    smp._thread.start = lambda *a, **k: None  # ticks come from the test
    ctx = _ctx(device="cpu")
    smp.start(ctx)
    clock[0] = 60 * 10**9
    per_core[0] = [6.0, 54.0]  # 10% and 30% busy over the minute
    per_core[1] = [18.0, 42.0]
    smp._tick(clock[0])
    out = smp.stop(ctx)
    assert out["available"] and "io_counters" in out["unreadable"]
    assert out["summary"]["cpu_pct"]["mean"] == pytest.approx(20.0)
    assert out["summary"]["cpu_pct_max_core"]["max"] == pytest.approx(30.0)
    assert out["summary"]["cpu_busy_cores"]["mean"] == pytest.approx(0.4)
    assert out["summary"]["others_cpu_cores"]["mean"] == pytest.approx(0.4)  # this process used none
    assert out["summary"]["read_bytes_s"] is None


def test_disk_for_path_reasons(tmp_path):
    assert disk_for_path(None)[0] is None
    assert "cannot stat" in disk_for_path(str(tmp_path / "missing"))[1]
