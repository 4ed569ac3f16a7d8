"""What tests of the MFU's dtype share: the dtype of compute_mfu's result, and whether
analysis/mfu.py reads it through the one reader (gpuprof.analysis.precision)."""

from __future__ import annotations

from gpuprof.profile import Profile


def mfu_dtype(m) -> str | None:
    """The dtype of compute_mfu's result (a dict, or a typed result with a `dtype`)."""
    return m.get("dtype") if isinstance(m, dict) else getattr(m, "dtype", None)


def mfu_reads_the_measurement() -> bool:
    """analysis/mfu.py takes its dtype from measurements.precision (through
    gpuprof.analysis.precision.run_compute_dtype), not only from run.config.precision."""
    from gpuprof.analysis.mfu import compute_mfu

    prof = Profile(run={"config": {"dtype": "float32", "device": "cpu"}}, steps=[],
                   measurements={"precision": {"compute_dtype": "bf16", "tf32_matmul": False}})
    return mfu_dtype(compute_mfu(prof)) == "bf16"
