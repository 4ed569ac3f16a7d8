"""GPU facts as data: dense peak TFLOP/s by dtype, memory, bandwidth, and the source of each row.

Names are matched against what torch (`torch.cuda.get_device_name`) and NVML report. An unknown
GPU gets no peak: callers must say "not measured" / fall back to a measured ceiling, never to
another GPU's figures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

GIB = 1024**3
GB = 1000**3

SRC_LIGHTNING = "NVIDIA datasheet via Lightning fabric/utilities/throughput.py"
SRC_LLMC = "NVIDIA datasheet via llm.c mfu.h"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. Peaks are dense (no 2:4 sparsity), in TFLOP/s; None = not supported."""

    key: str  # short id users type: --gpu h200
    name: str  # canonical marketing name
    patterns: tuple[str, ...]  # regexes matched (case-insensitive) against reported names
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None
    memory_gb: float  # decimal GB as in datasheets
    hbm_tb_s: float  # memory bandwidth, TB/s
    source: str
    tensor_cores: bool = True
    notes: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GB)

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak for a compute dtype: fp32, tf32, bf16, fp16, fp8."""
        return getattr(self, normalize_dtype(dtype))


GPUS: list[GpuSpec] = [
    GpuSpec("h200-nvl", "NVIDIA H200 NVL", (r"h200\s*nvl",), 60, 417.5, 835.5, 835.5, 1670.5, 141, 4.8, SRC_LIGHTNING),
    GpuSpec("h200", "NVIDIA H200 SXM", (r"\bh200\b",), 67, 494.5, 989.5, 989.5, 1979, 141, 4.8, SRC_LIGHTNING),
    GpuSpec("gh200", "NVIDIA GH200", (r"\bgh200\b",), 67, 494, 989, 989, 1979, 96, 4.0, SRC_LLMC),
    GpuSpec("h100-nvl", "NVIDIA H100 NVL", (r"h100\s*nvl",), 60, 417.5, 835.5, 835.5, 1670.5, 94, 3.9, SRC_LIGHTNING),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe", (r"h100\s*pcie",), 51.2, 378, 756, 756, 1513, 80, 2.0, SRC_LIGHTNING),
    GpuSpec("h100", "NVIDIA H100 SXM", (r"\bh100\b",), 67, 494.7, 989.4, 989.4, 1979, 80, 3.35, SRC_LIGHTNING),
    GpuSpec("b200", "NVIDIA B200", (r"\bb200\b",), 80, 1125, 2250, 2250, 4500, 180, 8.0, SRC_LIGHTNING),
    GpuSpec("a100-40gb", "NVIDIA A100 40GB", (r"a100.*40\s*gb",), 19.5, 156, 312, 312, None, 40, 1.555, SRC_LIGHTNING),
    GpuSpec("a100", "NVIDIA A100 80GB", (r"\ba100\b",), 19.5, 156, 312, 312, None, 80, 2.0, SRC_LIGHTNING),
    GpuSpec("l40s", "NVIDIA L40S", (r"\bl40s\b",), 91.6, 183, 362, 362, 733, 48, 0.864, SRC_LIGHTNING),
    GpuSpec("l4", "NVIDIA L4", (r"\bl4\b",), 30.3, 60, 121, 121, 242, 24, 0.30, SRC_LIGHTNING),
    GpuSpec("a10g", "NVIDIA A10G", (r"\ba10g\b",), 31.2, 62.5, 125, 125, None, 24, 0.6, SRC_LIGHTNING),
    GpuSpec("rtx4090", "NVIDIA GeForce RTX 4090", (r"rtx\s*4090",), 82.6, 82.6, 165.2, 165.2, 330.3, 24, 1.01, SRC_LIGHTNING),
    GpuSpec("rtx3090", "NVIDIA GeForce RTX 3090", (r"rtx\s*3090",), 35.6, 35.6, 71, 71, None, 24, 0.936, SRC_LIGHTNING),
    GpuSpec("v100", "NVIDIA V100 SXM2", (r"\bv100\b",), 15.7, None, None, 125, None, 32, 0.9, SRC_LIGHTNING),
]

_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "32": "fp32",
    "tf32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "16": "fp16",
    "fp8": "fp8", "float8": "fp8",
}


def normalize_dtype(dtype: str) -> str:
    """'bfloat16' / 'torch.bfloat16' / 'bf16' -> 'bf16'. Raises ValueError if unknown."""
    d = str(dtype).lower().replace("torch.", "").strip()
    if d not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return _DTYPE_ALIASES[d]


def find_gpu(name: str | None) -> GpuSpec | None:
    """The spec for a reported GPU name or a short key (`h200`), or None when unknown.

    Rows are ordered so that more specific names (H200 NVL, H100 PCIe) match before the
    generic family pattern."""
    if not name:
        return None
    text = name.strip().lower()
    for spec in GPUS:
        if text == spec.key or text == spec.name.lower():
            return spec
    for spec in GPUS:
        if any(re.search(p, text) for p in spec.patterns):
            return spec
    return None
