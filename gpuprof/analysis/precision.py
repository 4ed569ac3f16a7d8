"""What a run's matmuls computed in, read from its profile: the one reader the MFU and the rules
share (the derivation itself is gpuprof.hardware.compute_dtype, which the measuring side uses too).

A run measured by gpuprof recorded what it observed (measurements.precision, read through
`Sections.precision`; run.config.precision in files written before it was a measurement): the
autocast dtype, the weights' dtype, the TF32 state and the compute dtype derived from them — the
same one the ceiling probe measured. An older profile without that record: the dtype the run
claimed (its autocast dtype, else its `dtype` setting) and its TF32 flags, through the same
derivation. Pure: imports only the shared vocabulary (hardware, sections)."""

from __future__ import annotations

from gpuprof.hardware import compute_dtype, normalize_dtype
from gpuprof.sections import PrecisionSection, Sections


def _parts(source, measurements) -> tuple[dict, PrecisionSection]:
    """(the run config, its precision record) of a Profile, or of a run config dict and the
    measurements beside it."""
    if isinstance(source, dict):
        config = source
        return config, Sections.from_measurements(measurements or {}, config).precision
    config = getattr(source, "config", None) or (getattr(source, "run", None) or {}).get("config") or {}
    return config, Sections.of(source).precision


def _claimed(config: dict) -> tuple[str, bool]:
    """An older profile's (dtype, TF32 allowed): the autocast dtype it recorded, else its `dtype`
    setting (an unknown name: fp32), through hardware.compute_dtype without a weights' dtype
    (those files did not record one)."""
    tf32 = bool(config.get("tf32_matmul") or config.get("allow_tf32"))
    claim = None
    for value in (config.get("autocast_dtype"), config.get("dtype")):
        if value:
            try:
                claim = normalize_dtype(value)
                break
            except ValueError:
                continue
    d = compute_dtype(claim, None, tf32, str(config.get("device") or ""))
    if d == "tf32" and claim != "tf32":  # fp32 run as TF32: the flag says it, as the record's form
        d = "fp32"
    return d, tf32


def run_compute_dtype(source, measurements: dict | None = None) -> tuple[str, bool]:
    """(the dtype the matmuls ran in, TF32 allowed) of a run: `source` is a Profile, or a run
    config with its `measurements`. The recorded "tf32" reads as ("fp32", True): fp32 tensors
    with TF32 matmuls, as gpuprof.hardware.peak_for takes them."""
    config, prec = _parts(source, measurements)
    if prec.compute_dtype:
        try:
            d = normalize_dtype(prec.compute_dtype)
        except ValueError:  # not a dtype gpuprof knows: read as an older profile
            return _claimed(config)
        return ("fp32", True) if d == "tf32" else (d, bool(prec.tf32_matmul))
    return _claimed(config)


def compute_dtype_name(source, measurements: dict | None = None) -> str:
    """The compute dtype as the precision probe names it (measurements.probe.precisions): "tf32"
    for fp32 with TF32 matmuls on CUDA, else the dtype of run_compute_dtype."""
    config, prec = _parts(source, measurements)
    if prec.compute_dtype:
        try:
            return normalize_dtype(prec.compute_dtype)
        except ValueError:
            pass
    dtype, tf32 = _claimed(config)
    if dtype != "fp32":
        return dtype
    device = config.get("device") or (getattr(source, "environment", None) or {}).get("device")
    return compute_dtype(None, None, tf32, str(device or ""))  # "tf32" on CUDA with the flag
