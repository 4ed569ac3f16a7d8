"""What a run's matmuls computed in, read from its profile: the one reader the MFU and the rules
share (the derivation itself is gpuprof.hardware.observed_compute_dtype, which the measuring side uses too).

A run measured by gpuprof recorded what it observed (measurements.precision, read through
`Sections.precision`; run.config.precision in files written before it was a measurement): the
autocast dtype, the weights' dtype, the TF32 state and the compute dtype derived from them — the
same one the ceiling probe measured. An older profile without that record: the dtype the run
claimed (its autocast dtype, else its `dtype` setting) and its TF32 flags, through the same
derivation. Pure: imports only the shared vocabulary (hardware, sections)."""

from __future__ import annotations

from gpuprof.hardware import normalize_dtype, observed_compute_dtype
from gpuprof.sections import PrecisionSection, Sections


def _parts(source, measurements) -> tuple[dict, PrecisionSection]:
    """(the run config, its precision record) of a Profile, or of a run config dict and the
    measurements beside it."""
    if isinstance(source, dict):
        config = source
        return config, Sections.from_measurements(measurements or {}, config).precision
    config = getattr(source, "config", None) or (getattr(source, "run", None) or {}).get("config") or {}
    return config, Sections.of(source).precision


def _claim(config: dict) -> str | None:
    """The dtype an older profile's config claims: its autocast dtype, else its `dtype` setting
    (names gpuprof does not know skipped); None when it claims none."""
    for value in (config.get("autocast_dtype"), config.get("dtype")):
        if value:
            try:
                return normalize_dtype(value)
            except ValueError:
                continue
    return None


def _claimed(config: dict) -> tuple[str, bool]:
    """An older profile's (dtype, TF32 allowed): the autocast dtype it recorded, else its `dtype`
    setting (none known: fp32), through hardware.observed_compute_dtype without a weights' dtype
    (those files did not record one). The one place the config's copies of the precision facts
    (autocast_dtype, tf32_matmul, allow_tf32) are read."""
    tf32 = bool(config.get("tf32_matmul") or config.get("allow_tf32"))
    claim = _claim(config)
    d = observed_compute_dtype(claim, None, tf32, str(config.get("device") or ""))
    if d == "tf32" and claim != "tf32":  # fp32 run as TF32: the flag says it, as the record's form
        d = "fp32"
    return d, tf32


def _recorded(prec: PrecisionSection) -> str | None:
    """The record's compute dtype, normalized; None without one gpuprof knows."""
    try:
        return normalize_dtype(prec.compute_dtype) if prec.compute_dtype else None
    except ValueError:  # not a dtype gpuprof knows: read as an older profile
        return None


def compute_dtype_known(source, measurements: dict | None = None) -> bool:
    """Whether the run recorded a compute dtype, or (an older profile) claimed one: else the fp32
    the readers below give is their default, not something the run said."""
    config, prec = _parts(source, measurements)
    return _recorded(prec) is not None or _claim(config) is not None


# Two readers because two consumers name the same fact differently: the MFU's peak (peak_for) takes
# TF32 as fp32 plus a flag, the precision probe's rates are keyed "tf32".
def run_compute_dtype(source, measurements: dict | None = None) -> tuple[str, bool]:
    """(the dtype the matmuls ran in, TF32 allowed) of a run: `source` is a Profile, or a run
    config with its `measurements`. The recorded "tf32" reads as ("fp32", True): fp32 tensors
    with TF32 matmuls, as gpuprof.hardware.peak_for takes them."""
    config, prec = _parts(source, measurements)
    d = _recorded(prec)
    if d is None:
        return _claimed(config)
    return ("fp32", True) if d == "tf32" else (d, bool(prec.tf32_matmul))


def compute_dtype_name(source, measurements: dict | None = None) -> str:
    """The compute dtype as the precision probe names it (measurements.probe.precisions): "tf32"
    for fp32 with TF32 matmuls on CUDA, else the dtype of run_compute_dtype."""
    config, prec = _parts(source, measurements)
    d = _recorded(prec)
    if d is not None:
        return d
    dtype, tf32 = _claimed(config)
    if dtype != "fp32":
        return dtype
    device = config.get("device") or (getattr(source, "environment", None) or {}).get("device")
    return observed_compute_dtype(None, None, tf32, str(device or ""))  # "tf32" on CUDA with the flag
