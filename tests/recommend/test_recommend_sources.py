"""Which source wins: explicit options > config files > profile > defaults; GPU resolution."""

import os

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.recommend.sources import resolve

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
PROFILE = os.path.join(FIXTURES, "tiny_cpu_b4x4.gpuprof.json")
H200_CFG = os.path.join(FIXTURES, "h200_b16_accum64.py")


def no_cuda():
    return None


def test_defaults_are_gpt2_preset():
    inp = resolve(gpu="h200", detect=no_cuda)
    assert (inp.model.n_layer, inp.model.n_embd, inp.model.vocab_size) == (12, 768, 50304)
    assert inp.dtype == "bf16" and inp.compile is True and inp.current is None
    assert inp.capacity_bytes == 141 * 10**9


def test_config_over_profile_and_explicit_over_config():
    inp = resolve(config_files=[H200_CFG], profile_path=PROFILE, memory_gb=16, detect=no_cuda)
    assert inp.model.n_embd == 768 and inp.model.block_size == 1024  # config beats profile
    assert inp.current == (16, 64) and inp.dtype == "bf16"
    inp = resolve(config_files=[H200_CFG], profile_path=PROFILE, memory_gb=16, batch_size=32,
                  block_size=512, dtype="fp32", compile=False, detect=no_cuda)
    assert inp.current == (32, 64) and inp.model.block_size == 512
    assert inp.dtype == "fp32" and inp.compile is False


@pytest.mark.parametrize("name, canonical", [("half", "fp16"), ("BF16", "bf16"), ("torch.float32", "fp32")])
def test_dtype_names_are_accepted_as_everywhere(name, canonical):
    assert resolve(gpu="h200", dtype=name, detect=no_cuda).dtype == canonical


def test_profile_alone_gives_model_and_current():
    inp = resolve(profile_path=PROFILE, memory_gb=16, detect=no_cuda)
    assert inp.model.n_embd == 128 and inp.model.block_size == 64
    assert inp.current == (4, 4) and inp.dtype == "fp32" and inp.compile is False


def test_later_config_files_win(tmp_path):
    extra = tmp_path / "bigger.py"
    extra.write_text("batch_size = 32\ngradient_accumulation_steps = 32\n")
    inp = resolve(config_files=[H200_CFG, extra], gpu="h200", detect=no_cuda)
    assert inp.current == (32, 32)


def test_init_from_preset_uses_pretrained_dims(tmp_path):
    cfg = tmp_path / "ft.py"
    cfg.write_text("init_from = 'gpt2-medium'\nn_layer = 2\nbatch_size = 1\n")
    inp = resolve(config_files=[cfg], gpu="h100", detect=no_cuda)
    assert inp.model.n_layer == 24 and inp.model.vocab_size == 50257 and inp.model.bias  # from_pretrained: unpadded


def test_world_size_divides_nanogpt_accum():
    inp = resolve(config_files=[os.path.join(FIXTURES, "nanogpt_train_gpt2.py")], gpu="a100",
                  world_size=8, detect=no_cuda)
    assert inp.current == (12, 5)
    with pytest.raises(GpuprofError, match="divisible by the world size"):
        resolve(config_files=[H200_CFG], gpu="h200", world_size=3, detect=no_cuda)


def test_gpu_sources():
    assert resolve(detect=lambda: ("NVIDIA H100 80GB HBM3", 85_000_000_000)).capacity_bytes \
        == 85_000_000_000
    assert resolve(gpu="h100", memory_gb=40, detect=no_cuda).capacity_bytes == 40 * 10**9
    with pytest.raises(GpuprofError, match="no GPU given or detected"):
        resolve(detect=no_cuda)
    with pytest.raises(GpuprofError, match="unknown GPU"):
        resolve(gpu="voodoo2", detect=no_cuda)
