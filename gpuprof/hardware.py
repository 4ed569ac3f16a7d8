"""GPU facts as data: dense peak TFLOP/s by dtype, memory, bandwidth, and the source of each row.

Names are matched against what torch (`torch.cuda.get_device_name`) and NVML report. An unknown
GPU gets no peak: callers must say "not measured" / fall back to a measured ceiling, never to
another GPU's figures. All peaks are dense: vendor headline numbers for Ampere and later often
quote 2:4 sparsity, which doubles them, and MFU is never computed against those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuprof.errors import GpuprofError
from gpuprof.measure.cuda import is_cuda
from gpuprof.units import GB

# Where the figures come from. Each row names one; docs/mfu.md lists them.
SRC_HOPPER = "NVIDIA H100/H200 Tensor Core GPU datasheets (dense = sparse/2)"
SRC_GH200 = "NVIDIA GH200 Grace Hopper Superchip datasheet (dense = sparse/2)"
SRC_H20 = "NVIDIA H20 product brief as tabulated by vendors (dense)"
SRC_BLACKWELL = "NVIDIA HGX B100/B200 and GB200 NVL72 datasheets, per GPU (dense = sparse/2)"
SRC_A100 = "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4)"
SRC_A800 = "NVIDIA A800 datasheet (A100 compute, reduced NVLink)"
SRC_AMPERE_DC = "NVIDIA A10/A30/A40 datasheets (dense = sparse/2)"
SRC_AMPERE_PRO = "NVIDIA RTX A6000 datasheet + GA102 whitepaper (fp32-accumulate tensor rate)"
SRC_AMPERE_GEFORCE = "NVIDIA GA102 whitepaper, GeForce fp32-accumulate tensor rate (as llm.c mfu.h)"
SRC_ADA_DC = "NVIDIA L4/L40/L40S datasheets (dense = sparse/2)"
SRC_ADA_PRO = "NVIDIA RTX 6000 Ada datasheet (dense = sparse/2)"
SRC_ADA_GEFORCE = "NVIDIA Ada (AD102/AD103) whitepaper, fp32-accumulate tensor rate (as llm.c mfu.h)"
SRC_BLACKWELL_GEFORCE = "NVIDIA RTX Blackwell (GB202) whitepaper, fp32-accumulate tensor rate"
SRC_TURING = "NVIDIA T4 datasheet (as Lightning fabric/utilities/throughput.py)"
SRC_VOLTA = "NVIDIA V100 datasheet (as Lightning fabric/utilities/throughput.py)"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. Peaks are dense (no 2:4 sparsity), in TFLOP/s; None = no such unit.

    fp32 is the non-tensor (CUDA core) rate; tf32/bf16/fp16/fp8 are tensor-core rates with fp32
    accumulation (GeForce cards run fp16-accumulate at twice that, which PyTorch does not use)."""

    key: str  # short id users type: --gpu h200
    name: str  # canonical marketing name
    patterns: tuple[str, ...]  # regexes matched (case-insensitive) against reported names
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None
    memory_gb: float  # decimal GB as in datasheets
    hbm_tb_s: float  # memory bandwidth, TB/s (HBM or GDDR)
    source: str
    tensor_cores: bool = True
    notes: str = ""
    reported: tuple[str, ...] = ()  # names torch/NVML report for this GPU (documentation + tests)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GB)

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak for a compute dtype: fp32, tf32, bf16, fp16, fp8."""
        return getattr(self, normalize_dtype(dtype))


def _g(key, name, patterns, fp32, tf32, bf16, fp16, fp8, mem, bw, source, *, reported=(), notes="",
       tensor_cores=True) -> GpuSpec:
    return GpuSpec(key, name, tuple(patterns), fp32, tf32, bf16, fp16, fp8, mem, bw, source,
                   tensor_cores=tensor_cores, notes=notes, reported=tuple(reported))


# Order matters: the first row whose pattern matches wins, so specific names (H200 NVL, H100
# PCIe, A100 PCIe 40GB) come before their family's generic pattern.
GPUS: list[GpuSpec] = [
    # --- Hopper -----------------------------------------------------------------------------
    _g("h200-nvl", "NVIDIA H200 NVL", [r"\bh200\s*nvl\b"], 60, 417.5, 835.5, 835.5, 1670.5, 141, 4.8,
       SRC_HOPPER, reported=["NVIDIA H200 NVL"]),
    _g("h200", "NVIDIA H200 SXM", [r"\bh200\b"], 67, 494.5, 989.5, 989.5, 1979, 141, 4.8, SRC_HOPPER,
       reported=["NVIDIA H200", "NVIDIA H200 141GB HBM3e"]),
    _g("gh200-144g", "NVIDIA GH200 144GB HBM3e", [r"\bgh200\b.*144"], 67, 494.5, 989.5, 989.5, 1979,
       144, 4.9, SRC_GH200, reported=["NVIDIA GH200 144G HBM3e"]),
    _g("gh200", "NVIDIA GH200 96GB", [r"\bgh200\b"], 67, 494.5, 989.5, 989.5, 1979, 96, 4.0, SRC_GH200,
       reported=["NVIDIA GH200 480GB"], notes="480GB is CPU+GPU memory; the GPU has 96 GB HBM3"),
    _g("h100-nvl", "NVIDIA H100 NVL", [r"\bh100\s*nvl\b"], 60, 417.5, 835.5, 835.5, 1670.5, 94, 3.9,
       SRC_HOPPER, reported=["NVIDIA H100 NVL"]),
    _g("h100-pcie", "NVIDIA H100 PCIe", [r"\bh100\b.*pcie", r"\bh100\b.*hbm2e"], 51.2, 378, 756, 756,
       1513, 80, 2.0, SRC_HOPPER, reported=["NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM2e"]),
    _g("h100", "NVIDIA H100 SXM", [r"\bh100\b"], 67, 494.7, 989.4, 989.4, 1979, 80, 3.35, SRC_HOPPER,
       reported=["NVIDIA H100 80GB HBM3", "NVIDIA H100"]),
    _g("h800-pcie", "NVIDIA H800 PCIe", [r"\bh800\b.*pcie"], 51.2, 378, 756, 756, 1513, 80, 2.0,
       SRC_HOPPER, reported=["NVIDIA H800 PCIe"], notes="H100 PCIe compute, reduced interconnect"),
    _g("h800", "NVIDIA H800 SXM", [r"\bh800\b"], 67, 494.7, 989.4, 989.4, 1979, 80, 3.35, SRC_HOPPER,
       reported=["NVIDIA H800"], notes="H100 SXM tensor compute, reduced NVLink and FP64"),
    _g("h20", "NVIDIA H20", [r"\bh20\b"], 44, 74, 148, 148, 296, 96, 4.0, SRC_H20,
       reported=["NVIDIA H20"]),
    # --- Blackwell ----------------------------------------------------------------------------
    _g("gb200", "NVIDIA GB200 (per GPU)", [r"\bgb200\b"], 90, 1250, 2500, 2500, 5000, 186, 8.0,
       SRC_BLACKWELL, reported=["NVIDIA GB200"], notes="NVL72 figures divided by 72 GPUs"),
    _g("b200", "NVIDIA B200", [r"\bb200\b"], 80, 1125, 2250, 2250, 4500, 180, 8.0, SRC_BLACKWELL,
       reported=["NVIDIA B200"]),
    _g("b100", "NVIDIA B100", [r"\bb100\b"], 60, 875, 1750, 1750, 3500, 192, 8.0, SRC_BLACKWELL,
       reported=["NVIDIA B100"]),
    # --- Ampere data center -------------------------------------------------------------------
    _g("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", [r"\ba100\b.*pcie.*40\s*gb", r"\ba100\b.*40\s*gb.*pcie"],
       19.5, 156, 312, 312, None, 40, 1.555, SRC_A100, reported=["NVIDIA A100-PCIE-40GB"]),
    _g("a100-pcie", "NVIDIA A100 PCIe 80GB", [r"\ba100\b.*pcie"], 19.5, 156, 312, 312, None, 80, 1.935,
       SRC_A100, reported=["NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"]),
    _g("a100-40gb", "NVIDIA A100 SXM4 40GB", [r"\ba100\b.*40\s*gb"], 19.5, 156, 312, 312, None, 40, 1.555,
       SRC_A100, reported=["NVIDIA A100-SXM4-40GB"]),
    _g("a100", "NVIDIA A100 SXM4 80GB", [r"\ba100\b"], 19.5, 156, 312, 312, None, 80, 2.039, SRC_A100,
       reported=["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM-80GB"]),
    _g("a800-pcie", "NVIDIA A800 PCIe 80GB", [r"\ba800\b.*pcie"], 19.5, 156, 312, 312, None, 80, 1.935,
       SRC_A800, reported=["NVIDIA A800 80GB PCIe"]),
    _g("a800", "NVIDIA A800 SXM4 80GB", [r"\ba800\b"], 19.5, 156, 312, 312, None, 80, 2.039, SRC_A800,
       reported=["NVIDIA A800-SXM4-80GB"]),
    _g("a30", "NVIDIA A30", [r"\ba30\b"], 10.3, 82, 165, 165, None, 24, 0.933, SRC_AMPERE_DC,
       reported=["NVIDIA A30"]),
    _g("a10g", "NVIDIA A10G", [r"\ba10g\b"], 31.2, 62.5, 125, 125, None, 24, 0.6, SRC_AMPERE_DC,
       reported=["NVIDIA A10G"], notes="AWS part without its own datasheet; A10 figures (as Lightning)"),
    _g("a10", "NVIDIA A10", [r"\ba10\b"], 31.2, 62.5, 125, 125, None, 24, 0.6, SRC_AMPERE_DC,
       reported=["NVIDIA A10"]),
    _g("a40", "NVIDIA A40", [r"\ba40\b"], 37.4, 74.8, 149.7, 149.7, None, 48, 0.696, SRC_AMPERE_DC,
       reported=["NVIDIA A40"]),
    _g("rtx-a6000", "NVIDIA RTX A6000", [r"\brtx\s*a6000\b"], 38.7, 77.4, 154.8, 154.8, None, 48, 0.768,
       SRC_AMPERE_PRO, reported=["NVIDIA RTX A6000"]),
    # --- Ada ----------------------------------------------------------------------------------
    _g("rtx6000-ada", "NVIDIA RTX 6000 Ada Generation", [r"\brtx\s*6000\s*ada\b"], 91.1, 182.1, 364.2,
       364.2, 728.5, 48, 0.96, SRC_ADA_PRO, reported=["NVIDIA RTX 6000 Ada Generation"]),
    _g("l40s", "NVIDIA L40S", [r"\bl40s\b"], 91.6, 183, 362, 362, 733, 48, 0.864, SRC_ADA_DC,
       reported=["NVIDIA L40S"]),
    _g("l40", "NVIDIA L40", [r"\bl40\b"], 90.5, 90.5, 181, 181, 362, 48, 0.864, SRC_ADA_DC,
       reported=["NVIDIA L40"]),
    _g("l4", "NVIDIA L4", [r"\bl4\b"], 30.3, 60, 121, 121, 242, 24, 0.3, SRC_ADA_DC,
       reported=["NVIDIA L4"]),
    # --- GeForce (fp32-accumulate tensor rates; fp16-accumulate is 2x but not what torch uses)
    _g("rtx5090", "NVIDIA GeForce RTX 5090", [r"\brtx\s*5090\b(?!\s*d\b)"], 104.8, 104.8, 209.5, 209.5,
       419, 32, 1.792, SRC_BLACKWELL_GEFORCE, reported=["NVIDIA GeForce RTX 5090"]),
    _g("rtx4090", "NVIDIA GeForce RTX 4090", [r"\brtx\s*4090\b(?!\s*d\b)"], 82.6, 82.6, 165.2, 165.2,
       330.3, 24, 1.008, SRC_ADA_GEFORCE, reported=["NVIDIA GeForce RTX 4090"]),
    _g("rtx4080", "NVIDIA GeForce RTX 4080", [r"\brtx\s*4080\b(?!\s*super)"], 48.7, 48.7, 97.5, 97.5,
       194.9, 16, 0.717, SRC_ADA_GEFORCE, reported=["NVIDIA GeForce RTX 4080"]),
    _g("rtx3090ti", "NVIDIA GeForce RTX 3090 Ti", [r"\brtx\s*3090\s*ti\b"], 40, 40, 80, 80, None, 24,
       1.008, SRC_AMPERE_GEFORCE, reported=["NVIDIA GeForce RTX 3090 Ti"]),
    _g("rtx3090", "NVIDIA GeForce RTX 3090", [r"\brtx\s*3090\b(?!\s*ti)"], 35.6, 35.6, 71, 71, None, 24,
       0.936, SRC_AMPERE_GEFORCE, reported=["NVIDIA GeForce RTX 3090"]),
    # --- Turing / Volta: no bf16 or tf32 tensor cores ------------------------------------------
    _g("t4", "NVIDIA T4", [r"\bt4\b"], 8.1, None, None, 65, None, 16, 0.32, SRC_TURING,
       reported=["Tesla T4"]),
    _g("v100s", "NVIDIA V100S PCIe 32GB", [r"\bv100s\b"], 16.4, None, None, 130, None, 32, 1.134,
       SRC_VOLTA, reported=["Tesla V100S-PCIE-32GB"]),
    _g("v100-pcie-16gb", "NVIDIA V100 PCIe 16GB", [r"\bv100\b.*pcie.*16\s*gb"], 14, None, None, 112, None,
       16, 0.9, SRC_VOLTA, reported=["Tesla V100-PCIE-16GB"]),
    _g("v100-pcie", "NVIDIA V100 PCIe 32GB", [r"\bv100\b.*pcie"], 14, None, None, 112, None, 32, 0.9,
       SRC_VOLTA, reported=["Tesla V100-PCIE-32GB"]),
    _g("v100-16gb", "NVIDIA V100 SXM2 16GB", [r"\bv100\b.*16\s*gb"], 15.7, None, None, 125, None, 16, 0.9,
       SRC_VOLTA, reported=["Tesla V100-SXM2-16GB"]),
    _g("v100", "NVIDIA V100 SXM2 32GB", [r"\bv100\b"], 15.7, None, None, 125, None, 32, 0.9, SRC_VOLTA,
       reported=["Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB-LS"]),
]

# -- dtype names: the one map from what users, configs and torch write to gpuprof's names -----
_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "32": "fp32",
    "tf32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "16": "fp16",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
}
# The dtypes a training step is run in (--dtype, nanoGPT's `dtype`); tf32 is fp32 with TF32
# matmuls allowed, fp8 is only a peak in the GPU table.
TRAIN_DTYPES = ("fp32", "bf16", "fp16")
HALF_DTYPES = ("bf16", "fp16")  # the ones run under autocast
# gpuprof's name -> torch's attribute name, which is also nanoGPT's `dtype` value.
TORCH_NAME = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Bytes per element of a tensor held in that dtype (TF32 stores fp32 tensors).
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


def _choices(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def normalize_dtype(dtype, allowed=None) -> str:
    """'bfloat16' / 'torch.bfloat16' / 'BF16' / 'bf16' -> 'bf16' (case- and `torch.`-insensitive).

    Without `allowed`, an unknown name raises ValueError. With `allowed` (e.g. TRAIN_DTYPES), a
    name that is unknown or not among them is the user's error: GpuprofError "unknown dtype
    'int8'; choose fp32, bf16 or fp16"."""
    d = _DTYPE_ALIASES.get(str(dtype).lower().replace("torch.", "").strip())
    if allowed is not None:
        if d not in allowed:
            raise GpuprofError(f"unknown dtype {dtype!r}; choose {_choices(allowed)}")
        return d
    if d is None:
        raise ValueError(f"unknown dtype {dtype!r}")
    return d


def torch_dtype(name):
    """The torch.dtype for a dtype name ('bf16', 'bfloat16', 'torch.bfloat16' -> torch.bfloat16).
    Imports torch on first use, so this module stays importable without it."""
    import torch

    return getattr(torch, TORCH_NAME[normalize_dtype(name)])


# Names that look like a table row but are a different part: a slice of a GPU (MIG), a laptop
# or cut-down variant. Their peak is not the full card's, so they stay unknown.
_NOT_THE_FULL_CARD = re.compile(r"\bmig\b|laptop|mobile|max-q|\b\d+g\.\d+gb\b")


def find_gpu(name: str | None) -> GpuSpec | None:
    """The spec for a reported GPU name or a short key (`h200`), or None when unknown.

    Rows are ordered so that more specific names (H200 NVL, H100 PCIe) match before the
    generic family pattern. MIG slices and laptop variants are unknown on purpose."""
    if not name:
        return None
    text = " ".join(str(name).strip().lower().split())
    for spec in GPUS:
        if text == spec.key or text == spec.name.lower():
            return spec
    if _NOT_THE_FULL_CARD.search(text):
        return None
    for spec in GPUS:
        if any(re.search(p, text) for p in spec.patterns):
            return spec
    return None


def peak_for(spec: GpuSpec | None, dtype: str | None, tf32_allowed: bool = False) -> tuple[str, float | None]:
    """(dtype that sets the peak, dense TFLOP/s or None) for the dtype the matmuls run in.

    fp32 with TF32 allowed (`torch.backends.cuda.matmul.allow_tf32`, or float32 matmul precision
    'high'/'medium') runs on tensor cores at the tf32 rate; without it, the fp32 CUDA-core rate.
    None when the GPU is unknown or has no unit for that dtype (bf16 on a V100)."""
    d = normalize_dtype(dtype or "fp32")
    if d == "fp32" and tf32_allowed and (spec is None or spec.tf32 is not None):
        d = "tf32"
    if spec is None:
        return d, None
    return d, spec.peak_tflops(d)


def known_gpu_keys() -> list[str]:
    """The short keys `--gpu` accepts, in table order."""
    return [g.key for g in GPUS]


def observed_compute_dtype(autocast_dtype: str | None, param_dtype: str | None, tf32: bool | None,
                           device: str | None) -> str:
    """The dtype a step's matmuls run in, from what was observed: the autocast dtype; else the
    weights' dtype when they are half precision (a model cast with .to(torch.bfloat16) runs bf16
    without autocast); else fp32, which CUDA runs as TF32 when TF32 matmuls are allowed. Both the
    MFU's peak and the ceiling probe take their dtype from here, so they always agree."""
    if autocast_dtype and normalize_dtype(autocast_dtype) != "fp32":
        return normalize_dtype(autocast_dtype)
    # autocast(dtype=torch.float32) -- nanoGPT's dtype='float32' on CUDA -- changes nothing:
    # the matmuls run as fp32 tensors would, TF32 included
    if param_dtype:
        try:
            d = normalize_dtype(param_dtype)
        except ValueError:
            d = "fp32"
        if d in HALF_DTYPES:
            return d
    if tf32 and is_cuda(device or ""):
        return "tf32"
    return "fp32"


# What a GPT training step reaches of the datasheet's dense peak (FACTS.md: llm.c GPT-2 on an H100
# ≈40-46%; the best dense matmul ≈80%). Two named uses, because the question differs:
EXPECTED_MFU = (0.4, 0.6)  # diagnose: the step time a well-tuned step of this run would take
PLANNED_MFU = (0.30, 0.40, 0.50)  # recommend, nothing measured: low, central, high for a config not yet run
BEST_ACHIEVABLE_MFU = 0.8  # the best dense matmul reaches ~80% of the datasheet

MARKED_FASTER = 1.5  # another precision at least this much faster is worth switching to


# On a CPU, a half-precision run whose matmuls are not markedly slower than fp32's may still run
# its step slower: autocast's casts and the half-precision norms and softmax can cost more than the
# matmuls save (Zen 4 with avx512_bf16: bf16 matmuls at the model's shapes ~2x fp32, whole bf16
# steps ~1.5x slower). fp32 is then timed too when its matmuls run within this factor of the run's.
# On CUDA the non-matmul ops are memory-bound and half precision halves their bytes: not timed.
RUNNER_UP_WITHIN = 4.0
FULL_PRECISIONS = ("tf32", "fp32")


def runner_up(rates: dict, current: str, within: float = RUNNER_UP_WITHIN) -> str | None:
    """The full precision to time beside a half-precision `current` when no dtype multiplies
    markedly faster (pick_faster is None): the faster of tf32/fp32 whose measured rate is within
    `within` of the run's. None for a full-precision run or when none is that close."""
    now = rates.get(current)
    if not now or current in FULL_PRECISIONS:
        return None
    close = {d: rates[d] for d in FULL_PRECISIONS if rates.get(d) and rates[d] * within >= now}
    return max(close, key=close.get) if close else None


def pick_faster(rates: dict, current: str, marked: float = MARKED_FASTER) -> str | None:
    """The dtype to switch to from `current`, given measured rates (TFLOP/s by dtype): the fastest
    one at least `marked` times faster, except that bf16 wins over fp16 within 10% of it (same
    tensor-core peak on Ampere and later, and no loss scaling to manage). None if none is."""
    now = rates.get(current)
    if not now:
        return None
    faster = {d: r for d, r in rates.items() if d != current and r and r >= marked * now}
    if not faster:
        return None
    best = max(faster, key=faster.get)
    if best == "fp16" and faster.get("bf16", 0) >= 0.9 * faster["fp16"]:
        return "bf16"
    return best


# -- Interconnects: the link a data-parallel all-reduce runs over ---------------------------
# Per GPU, each direction (nccl-tests' bus bandwidth is comparable to this figure: "busbw ...
# reflects the speed of the hardware bottleneck"). Bidirectional headline = 2 × this.
SRC_NVLINK = "NVIDIA H100/H200 SXM and A100 SXM datasheets (NVLink per GPU, bidirectional / 2)"
SRC_NVLINK5 = "NVIDIA HGX B200 datasheet (NVLink 5 per GPU, bidirectional / 2)"
SRC_PCIE = "PCI-SIG: x16 per direction (Gen4 16 GT/s ≈ 32 GB/s, Gen5 32 GT/s ≈ 64 GB/s)"
SRC_IB = "NVIDIA ConnectX-7 / InfiniBand NDR 400 Gb/s per port"


@dataclass(frozen=True)
class LinkSpec:
    key: str
    name: str
    per_direction_gb_s: float  # decimal GB/s, per GPU, one direction
    source: str


LINKS = {
    "nvlink5": LinkSpec("nvlink5", "NVLink 5 (18 links, B200: 1.8 TB/s bidirectional)", 900.0, SRC_NVLINK5),
    "nvlink4": LinkSpec("nvlink4", "NVLink 4 (18 links, H100/H200 SXM: 900 GB/s bidirectional)", 450.0, SRC_NVLINK),
    "nvlink3": LinkSpec("nvlink3", "NVLink 3 (12 links, A100 SXM: 600 GB/s bidirectional)", 300.0, SRC_NVLINK),
    "pcie5x16": LinkSpec("pcie5x16", "PCIe Gen5 x16", 64.0, SRC_PCIE),
    "pcie4x16": LinkSpec("pcie4x16", "PCIe Gen4 x16", 32.0, SRC_PCIE),
    "ib-ndr": LinkSpec("ib-ndr", "InfiniBand NDR 400 Gb/s (one port)", 50.0, SRC_IB),
}
# NVML's nvmlNvlinkVersion_t (what nvmlDeviceGetNvLinkVersion returns: an enum, not the NVLink
# generation: 4 = NVLINK_VERSION_3_0, 5 = 3_1 (A100), 6 = 4_0 (H100/H200), 7 = 5_0 (B200)) ->
# (row, the full card's link count: fewer active links, proportionally less bandwidth).
NVLINK_BY_NVML_VERSION = {4: ("nvlink3", 12), 5: ("nvlink3", 12), 6: ("nvlink4", 18), 7: ("nvlink5", 18)}
NVLINK_NAMES = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}


def link_for(nvml_nvlink_version: int | None, nvlink_active: int, pcie_gen: int | None,
             pcie_width: int | None) -> tuple[LinkSpec | None, float | None]:
    """(the link, its per-GPU per-direction GB/s) for what NVML reports (the nvmlNvlinkVersion_t
    enum, the active link count, the PCIe generation and width), or (None, None) where the table
    has no row. NVLink bandwidth scales with the active link count; PCIe rows are x16."""
    if nvlink_active and nvml_nvlink_version in NVLINK_BY_NVML_VERSION:
        key, full = NVLINK_BY_NVML_VERSION[nvml_nvlink_version]
        spec = LINKS[key]
        return spec, spec.per_direction_gb_s * min(nvlink_active, full) / full
    if pcie_gen in (4, 5) and pcie_width:
        spec = LINKS[f"pcie{pcie_gen}x16"]
        return spec, spec.per_direction_gb_s * min(pcie_width, 16) / 16
    return None, None
