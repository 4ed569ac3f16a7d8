"""Which GPU the NVML sampler reads, against a pynvml fake as strict as the real bindings:
MIG instances, torch UUIDs NVML does not know, and the fake's own strictness."""

import types

import pynvml
import pytest
from fakes.cuda import FakeCuda
from fakes.nvml import MIG_BASE, FakeNvml
from mfu.fake_time import FakeTime
from rich.console import Console

from gpuprof.measure.nvml import NvmlSampler, _torch_uuid, resolve_nvml_handle
from gpuprof.measure.timer import PhaseTimer
from gpuprof.render.mfu import samplers_panel

GPU0, GPU1 = "GPU-aaaa-1111", "GPU-bbbb-2222"
MIG_BARE = "5c2e9f10-7a3b-5d4e-9f8a-0123456789ab"  # how torch prints a MIG instance's UUID
MIG = f"MIG-{MIG_BARE}"


def _ctx(device="cuda:0", clock=None):
    timer = PhaseTimer(clock=clock) if clock is not None else PhaseTimer()
    return types.SimpleNamespace(device=device, timer=timer, profile=None, config={})


def _live(fake):
    fake.nvmlInit()
    return fake


def _sample(fake, uuid, env=None, ticks=5):
    """The sampler over `ticks` samples 100 ms apart on a fake clock, taken by the test (no thread)."""
    clock = FakeTime()
    smp = NvmlSampler(interval_s=0.1, nvml=fake, uuid_of=lambda dev: uuid, env=env or {}, pcie_every=1,
                      clock=clock.ns, threaded=False)
    ctx = _ctx(clock=clock.ns)
    smp.start(ctx)
    for _ in range(ticks):
        smp.sample_now()
        clock.advance(0.1)
    return smp.stop(ctx)


def _text(renderable) -> str:
    c = Console(width=200, record=True, color_system=None)
    c.print(renderable)
    return c.export_text()


# ------------------------------------------------------------------ the fake is honest
def test_fake_raises_what_pynvml_raises():
    fake = FakeNvml()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    if getattr(pynvml, "_nvmlLib_refcount", 0) == 0:  # the real bindings, unstarted, agree
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetHandleByUUID("GPU-aaaa")  # a prefix is not a UUID to NVML
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetHandleByUUID("aaaa-1111")  # nor is a UUID without its GPU- prefix
    assert fake.nvmlDeviceGetHandleByUUID(GPU1.encode()) == 1  # pynvml takes str or bytes
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetUUID(7)  # a handle NVML never gave out
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlShutdown()


# ------------------------------------------------------------------ torch's UUID
def test_torch_uuid_is_passed_bare_and_from_an_explicit_index(monkeypatch):
    cuda = FakeCuda(n_devices=2).install(monkeypatch)
    assert _torch_uuid("cuda:1") == cuda.uuids[1]  # not "GPU-" + it: that may be a MIG instance
    cuda.set_device(1)
    # "cuda" is visible index 0 for resolve_nvml_handle, so its UUID is index 0's too
    assert _torch_uuid("cuda") == cuda.uuids[0]


def test_bare_torch_uuid_of_a_mig_instance_resolves_to_the_instance():
    fake = _live(FakeNvml(uuids=(GPU0, GPU1), migs=(MIG,)))
    # no CUDA_VISIBLE_DEVICES: an index fallback would land on GPU 0, the instance's parent
    h, desc = resolve_nvml_handle(fake, "cuda:0", {}, uuid=MIG_BARE)
    assert h == MIG_BASE and desc == {"visible_index": 0, "uuid": MIG, "via": "torch uuid"}
    h, desc = resolve_nvml_handle(fake, "cuda:0", {}, uuid="bbbb-2222")  # a whole GPU, bare
    assert h == 1 and desc["uuid"] == GPU1
    h, desc = resolve_nvml_handle(fake, "cuda:0", {}, uuid=MIG)  # prefixed: used as is
    assert h == MIG_BASE


def test_unknown_torch_uuid_raises_instead_of_reading_another_gpu():
    fake = _live(FakeNvml(uuids=(GPU0, GPU1)))
    with pytest.raises(LookupError) as err:
        resolve_nvml_handle(fake, "cuda:0", {"CUDA_VISIBLE_DEVICES": "1"}, uuid=MIG_BARE)
    msg = str(err.value)
    assert f"GPU-{MIG_BARE}" in msg and f"MIG-{MIG_BARE}" in msg and "Not Found" in msg
    with pytest.raises(LookupError) as err:
        resolve_nvml_handle(fake, "cuda:0", {}, uuid="GPU-cccc-3333")
    assert "MIG-" not in str(err.value)  # a prefixed UUID is tried only as given


def test_unknown_torch_uuid_leaves_the_gpu_not_measured():
    fake = FakeNvml(uuids=(GPU0, GPU1))
    out = _sample(fake, MIG_BARE, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert out["available"] is False
    assert out["reason"].startswith(f"cannot find cuda:0 in NVML: NVML knows no device with torch's UUID {MIG_BARE}")
    assert fake.calls == {} and fake.shutdown  # nothing sampled, NVML closed
    text = _text(samplers_panel({"nvml": out}))
    assert "not measured: cannot find cuda:0 in NVML" in text


def test_without_a_torch_uuid_the_index_path_says_so():
    fake = _live(FakeNvml(uuids=(GPU0, GPU1)))
    h, desc = resolve_nvml_handle(fake, "cuda:0", {"CUDA_VISIBLE_DEVICES": "1"}, uuid=None)
    assert h == 1 and desc["via"] == "CUDA_VISIBLE_DEVICES index" and "uuid" not in desc
    assert "CUDA_DEVICE_ORDER" in desc["note"]  # CUDA's order need not be NVML's
    _, desc = resolve_nvml_handle(fake, "cuda:0", {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert desc["note"] is None
    with pytest.raises(LookupError, match=r"NVML has no GPU 7 \(2 GPUs\)"):
        resolve_nvml_handle(fake, "cuda:0", {"CUDA_VISIBLE_DEVICES": "7"})


# ------------------------------------------------------------------ sampling a MIG instance
def test_mig_instance_reports_mig_and_its_unsupported_fields():
    fake = FakeNvml(uuids=(GPU0, GPU1), migs=(MIG,))
    out = _sample(fake, MIG_BARE, ticks=6)
    assert out["available"] and out["errors"] == 0 and out["samples"] == 6
    g = out["gpus"][0]
    assert g["mig"] is True and g["mig_parent_uuid"] == GPU0 and g["uuid"] == MIG
    assert g["memory_total_bytes"] == 18e9  # the instance's memory, not the parent's 141 GB
    for field in ("utilization", "sm_clock", "power", "sm_clock_max", "power_limit"):
        assert "NotSupported" in out["unreadable"][field], field
    assert fake.calls["utilization"] == fake.calls["sm_clock"] == fake.calls["power"] == 1  # asked once
    assert out["summary"]["gpu_util_pct"] is None and out["summary"]["sm_clock_mhz"] is None
    assert out["summary"]["mem_used_bytes"]["mean"] == 9e9 and out["summary"]["mem_used_bytes"]["n"] == 6


def test_whole_gpu_is_not_mig_and_says_so():
    out = _sample(FakeNvml(), GPU1)
    assert out["gpus"][0]["mig"] is False and "mig_parent_uuid" not in out["gpus"][0]
    out = _sample(FakeNvml(mig_capable=False), GPU1)  # NotSupported: cannot be partitioned at all
    assert out["gpus"][0]["mig"] is False and "mig" not in out["unreadable"]

    class OldBindings(FakeNvml):
        nvmlDeviceIsMigDeviceHandle = property()  # getattr raises AttributeError: no such function

    out = _sample(OldBindings(), GPU1)
    assert out["gpus"][0]["mig"] is None  # NVML cannot tell
