"""The GPU table: real reported names, dense figures, unknown GPUs stay unknown."""

import pytest

from gpuprof.hardware import GPUS, find_gpu, known_gpu_keys, normalize_dtype, peak_for

# Names as torch.cuda.get_device_name / nvmlDeviceGetName report them.
REAL_NAMES = {
    "NVIDIA H200": "h200",
    "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA GH200 480GB": "gh200",
    "NVIDIA H800": "h800",
    "NVIDIA H20": "h20",
    "NVIDIA B200": "b200",
    "NVIDIA GB200": "gb200",
    "NVIDIA A100-SXM4-80GB": "a100",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A800-SXM4-80GB": "a800",
    "NVIDIA A10G": "a10g",
    "NVIDIA A10": "a10",
    "NVIDIA A40": "a40",
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA RTX 6000 Ada Generation": "rtx6000-ada",
    "NVIDIA L40S": "l40s",
    "NVIDIA L40": "l40",
    "NVIDIA L4": "l4",
    "NVIDIA GeForce RTX 4090": "rtx4090",
    "NVIDIA GeForce RTX 3090": "rtx3090",
    "NVIDIA GeForce RTX 3090 Ti": "rtx3090ti",
    "NVIDIA GeForce RTX 5090": "rtx5090",
    "Tesla T4": "t4",
    "Tesla V100-SXM2-16GB": "v100-16gb",
    "Tesla V100-SXM2-32GB": "v100",
    "Tesla V100-PCIE-16GB": "v100-pcie-16gb",
}


@pytest.mark.parametrize("name,key", sorted(REAL_NAMES.items()))
def test_reported_names_match_their_row(name, key):
    assert find_gpu(name).key == key
    assert find_gpu(name.lower()).key == key
    assert find_gpu(f"  {name}  ").key == key


@pytest.mark.parametrize("name", [
    None, "", "AMD Instinct MI300X", "Quadro RTX 6000", "NVIDIA RTX A4000", "NVIDIA GeForce RTX 4090 D",
    "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA H1000", "CPU (AMD EPYC)", "cpu",
])
def test_unknown_names_stay_unknown(name):
    # No silent fallback: a different part must not borrow another GPU's peak.
    assert find_gpu(name) is None


def test_every_row_reports_its_own_name_and_key():
    for spec in GPUS:
        assert find_gpu(spec.key) is spec
        for r in spec.reported:
            assert find_gpu(r) is spec, r


def test_table_size_sources_unique_keys():
    assert len(GPUS) >= 20
    assert len(set(known_gpu_keys())) == len(GPUS)
    assert all(spec.source for spec in GPUS)
    assert all(spec.memory_gb > 0 and spec.hbm_tb_s > 0 for spec in GPUS)


def test_figures_are_dense_not_sparse():
    for s in GPUS:
        if s.bf16 is not None:
            assert s.tf32 is not None and s.tf32 <= s.bf16 + 1e-9, s.key
            assert s.fp32 <= s.bf16, s.key
        if s.fp8 is not None:
            assert s.fp8 == pytest.approx(2 * s.bf16, rel=0.015), s.key  # L40S sheet: 733 vs 2x362
    # Hopper's headline 1979 bf16 is the sparse figure: the table must hold half of it.
    assert find_gpu("NVIDIA H200").bf16 == 989.5
    assert find_gpu("NVIDIA H100 80GB HBM3").bf16 == pytest.approx(989.4)
    assert find_gpu("NVIDIA A100-SXM4-80GB").bf16 == 312
    assert find_gpu("NVIDIA H200 NVL").bf16 == 835.5
    assert find_gpu("NVIDIA GeForce RTX 4090").bf16 == 165.2  # fp32 accumulate, not 330


def test_facts_table_figures():
    h200 = find_gpu("h200")
    assert (h200.fp32, h200.tf32, h200.fp8, h200.memory_gb, h200.hbm_tb_s) == (67, 494.5, 1979, 141, 4.8)
    assert find_gpu("b200").bf16 == 2250
    assert find_gpu("l40s").bf16 == 362
    assert find_gpu("a100-40gb").hbm_tb_s == pytest.approx(1.555)


def test_peak_for_picks_the_dtype_in_use():
    h200 = find_gpu("h200")
    assert peak_for(h200, "bfloat16") == ("bf16", 989.5)
    assert peak_for(h200, "torch.float16") == ("fp16", 989.5)
    assert peak_for(h200, "fp32", tf32_allowed=False) == ("fp32", 67)
    assert peak_for(h200, "fp32", tf32_allowed=True) == ("tf32", 494.5)
    # No bf16/tf32 units on Volta: None, not another dtype's figure.
    v100 = find_gpu("v100")
    assert peak_for(v100, "bf16") == ("bf16", None)
    assert peak_for(v100, "fp32", tf32_allowed=True) == ("fp32", 15.7)
    assert peak_for(None, "bf16") == ("bf16", None)


def test_normalize_dtype():
    assert normalize_dtype("torch.bfloat16") == "bf16"
    assert normalize_dtype("float8_e4m3fn") == "fp8"
    with pytest.raises(ValueError):
        normalize_dtype("int4")


@pytest.mark.parametrize("name, canonical", [
    ("bf16", "bf16"), ("BF16", "bf16"), ("bfloat16", "bf16"), ("torch.bfloat16", "bf16"),
    ("Torch.BFloat16", "bf16"), ("half", "fp16"), ("float16", "fp16"), ("float", "fp32"),
    ("float32", "fp32"), ("FP32", "fp32"),
])
def test_every_dtype_name_is_accepted_the_same_way(name, canonical):
    from gpuprof.hardware import TRAIN_DTYPES

    assert normalize_dtype(name) == canonical
    assert normalize_dtype(name, allowed=TRAIN_DTYPES) == canonical


@pytest.mark.parametrize("name", ["int8", "tf32", "fp8", ""])
def test_a_dtype_a_step_cannot_run_in_is_the_users_error(name):
    from gpuprof.errors import GpuprofError
    from gpuprof.hardware import TRAIN_DTYPES

    with pytest.raises(GpuprofError, match=r"unknown dtype .*; choose fp32, bf16 or fp16"):
        normalize_dtype(name, allowed=TRAIN_DTYPES)


def test_dtype_tables_cover_the_same_names():
    import torch

    from gpuprof.hardware import ELEMENT_BYTES, TORCH_NAME, TRAIN_DTYPES, torch_dtype

    assert set(TRAIN_DTYPES) <= set(TORCH_NAME) == set(ELEMENT_BYTES)
    for name, attr in TORCH_NAME.items():
        assert torch_dtype(name) is getattr(torch, attr)
        assert torch_dtype(name).itemsize == ELEMENT_BYTES[name]
    assert torch_dtype("torch.bfloat16") is torch.bfloat16 and torch_dtype("half") is torch.float16
