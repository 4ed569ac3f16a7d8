"""Options several verbs share, and the checks every number a user types goes through: one line
and exit 2 (GpuprofError) for a value no run could use, before anything starts."""

from __future__ import annotations

import math
from typing import Optional

from gpuprof.errors import GpuprofError


def positive(option: str, value: Optional[float], *, zero: bool = False) -> None:
    """A finite number above zero (or at least zero with zero=True), when given."""
    if value is None:
        return
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        raise GpuprofError(f"{option} must be {'zero or positive' if zero else 'positive'}, got {value}")


def peak_options(peak_tflops: Optional[float], reported_mfu: Optional[float] = None) -> None:
    """--peak-tflops (what MFU divides by) and --reported-mfu (a percentage the script printed)."""
    positive("--peak-tflops", peak_tflops)
    positive("--reported-mfu", reported_mfu, zero=True)
