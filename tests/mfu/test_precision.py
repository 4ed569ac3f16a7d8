"""What a step computes in, as observed: TF32 through either torch API (read without tripping the
"mix of the legacy and new APIs" error), the weights' dtype, autocast; and the MFU peak and the
ceiling probe always in that one dtype."""

import pytest
import torch

from gpuprof.analysis.findings import Context
from gpuprof.analysis.mfu import compute_mfu
from gpuprof.analysis.rules import gpu
from gpuprof.measure.precision import matmul_tf32_state, read_precision
from gpuprof.profile import Profile, StepRecord


@pytest.fixture
def restore_tf32():
    yield
    torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.cuda.matmul.allow_tf32 = False


def test_tf32_read_through_the_new_api_without_raising(fake_cuda, restore_tf32):
    # A script on torch 2.13's new API. The legacy flag is set off first: torch only refuses the
    # legacy read when the two disagree, and an earlier test in this process may have set it on.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError):
        torch.backends.cuda.matmul.allow_tf32  # what gpuprof used to read
    model = torch.nn.Linear(4, 4)
    p = read_precision(model, None, "cuda:0")
    assert p["tf32_matmul"] is True and p["compute_dtype"] == "tf32" and p["allow_tf32"] is None
    assert p["tf32_source"] == "torch.backends.cuda.matmul.fp32_precision"


def test_tf32_set_the_nanogpt_way_is_seen(fake_cuda, restore_tf32):
    torch.backends.cuda.matmul.allow_tf32 = True
    state = matmul_tf32_state()
    assert state["tf32_matmul"] is True and state["allow_tf32"] is True
    torch.backends.cuda.matmul.allow_tf32 = False
    assert read_precision(torch.nn.Linear(4, 4), None, "cuda:0")["compute_dtype"] == "fp32"


def test_weights_cast_to_bf16_run_bf16_without_autocast(fake_cuda):
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    assert read_precision(model, None, "cuda:0")["compute_dtype"] == "bf16"
    assert read_precision(torch.nn.Linear(4, 4), torch.float16, "cuda:0")["compute_dtype"] == "fp16"


def test_tf32_flag_on_a_gpu_without_tf32_is_fp32(monkeypatch, restore_tf32):
    from fakes.cuda import FakeCuda

    FakeCuda(name="Tesla V100-SXM2-16GB", capability=(7, 0)).install(monkeypatch)
    torch.backends.cuda.matmul.allow_tf32 = True
    p = read_precision(torch.nn.Linear(4, 4), None, "cuda:0")
    assert p["compute_dtype"] == "fp32" and "compute capability < 8.0" in p["tf32_note"]


def _h200_profile(precision: dict, probe: dict | None = None) -> Profile:
    steps = [StepRecord(i, 2.0, {"forward": 0.7, "backward": 1.3}, tokens=65536, micro_steps=4,
                        gpu_s=2.0, gpu_phases={"forward": 0.7, "backward": 1.3}) for i in range(3)]
    cfg = {"device": "cuda:0", "dtype": "fp32", "tokens_per_step": 65536, "precision": precision,
           "model_dims": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304, "block_size": 1024}}
    return Profile(run={"mode": "script", "config": cfg}, steps=steps,
                   environment={"device": "cuda:0", "device_name": "NVIDIA H200"},
                   measurements={"probe": probe} if probe else {})


def test_nanogpt_fp32_with_allow_tf32_is_measured_against_tf32_on_an_h200():
    # nanoGPT sets allow_tf32 = True; dtype=float32 then runs TF32 on an H200: the MFU is against
    # 494.5 TFLOP/s, not fp32's 67 (7.4x overstated before), and no-tensor-cores does not fire.
    prof = _h200_profile({"autocast_dtype": None, "param_dtype": "float32", "tf32_matmul": True,
                          "compute_dtype": "tf32"}, probe={"tflops": 400.0, "dtype": "tf32"})
    m = compute_mfu(prof)
    assert m.dtype == "tf32" and m.peak_tflops == 494.5
    assert m.mfu_vs_ceiling == pytest.approx(m.achieved_tflops / 400.0)
    from gpuprof.hardware import find_gpu

    assert gpu.no_tensor_cores(Context(profile=prof, stats=prof.stats, mfu=m, gpu=find_gpu("NVIDIA H200"))) == []


def test_a_ceiling_in_another_dtype_is_never_the_denominator():
    prof = _h200_profile({"compute_dtype": "tf32", "tf32_matmul": True}, probe={"tflops": 55.0, "dtype": "fp32"})
    m = compute_mfu(prof)
    assert m.ceiling_tflops is None and m.mfu_vs_ceiling is None
    assert any("measured in fp32" in w for w in m.warnings)


def test_fp32_without_tf32_still_fires_no_tensor_cores():
    prof = _h200_profile({"compute_dtype": "fp32", "tf32_matmul": False})
    m = compute_mfu(prof)
    assert m.dtype == "fp32" and m.peak_tflops == 67
    from gpuprof.hardware import find_gpu

    (f,) = gpu.no_tensor_cores(Context(profile=prof, stats=prof.stats, mfu=m, gpu=find_gpu("NVIDIA H200")))
    assert f.id == "no-tensor-cores"


def test_autocast_to_float32_is_fp32_math_so_tf32_applies(fake_cuda, restore_tf32):
    # nanoGPT's dtype='float32' on CUDA: torch.amp.autocast('cuda', dtype=torch.float32) stays on
    torch.backends.cuda.matmul.allow_tf32 = True
    p = read_precision(torch.nn.Linear(4, 4), torch.float32, "cuda:0")
    assert p["compute_dtype"] == "tf32" and p["autocast_dtype"] == "float32"


def test_tf32_switch_keeps_the_legacy_api_readable(restore_tf32):
    # Writing the new API would make every later legacy read raise (torch's compiler reads it).
    from gpuprof.measure.precision import tf32_matmul

    torch.backends.cuda.matmul.allow_tf32 = False
    with tf32_matmul(True):
        assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"  # still readable: no API mix


def test_bf16_is_preferred_over_an_equally_fast_fp16():
    from gpuprof.hardware import pick_faster

    assert pick_faster({"tf32": 0.4, "bf16": 0.70, "fp16": 0.72}, "tf32") == "bf16"
    assert pick_faster({"tf32": 0.4, "bf16": 0.50, "fp16": 0.90}, "tf32") == "fp16"
    assert pick_faster({"bf16": 0.01, "fp16": 0.1, "fp32": 0.014}, "bf16") == "fp16"  # a V100
    assert pick_faster({"fp32": 0.08, "bf16": 0.1}, "fp32") is None


def _accelerate_like(model):
    """What accelerate does to an HF model for bf16 mixed precision: forward wrapped in autocast
    at the instance level, invisible to a hook at the call's entry."""
    import types

    inner = type(model).forward

    def forward(self, *a, **k):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return inner(self, *a, **k)

    model.forward = types.MethodType(forward, model)
    return model


def test_autocast_inside_forward_is_seen_in_the_matmul_output():
    from gpuprof.measure.precision import MatmulDtypeWatch, with_observed_matmul

    model = _accelerate_like(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)))
    entry = read_precision(model, None, "cpu")  # what a hook at the forward's entry sees
    assert entry["compute_dtype"] == "fp32"
    watch = MatmulDtypeWatch(model)
    assert not model[0]._forward_hooks  # nothing on the user's layer until a training forward arms it
    watch.arm()  # what TrainingHooks does at an outermost training forward's start...
    model(torch.randn(2, 8)).sum().backward()
    watch.disarm()  # ... and at its end
    assert watch.dtype == "bfloat16" and watch.layer == "0" and watch.done
    assert not model[0]._forward_hooks
    prec = with_observed_matmul(entry, watch.dtype, watch.layer, "cpu")
    assert prec["compute_dtype"] == "bf16" and "inside the model's forward" in prec["autocast_note"]


def test_timing_another_dtype_bypasses_an_instance_forward_wrapper():
    from gpuprof.measure.precisions import time_steps_paired

    model = _accelerate_like(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)))
    seen = []
    model[0].register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    time_steps_paired(model, (torch.randn(4, 8),), "cpu", "fp32", "fp16", 5.0)
    # the class forward ran, without the wrapper's bf16: each way in its own dtype
    assert seen and set(seen) == {torch.float32, torch.float16}
    assert "forward" in vars(model)  # and the wrapper is back
