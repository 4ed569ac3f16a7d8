"""Options several verbs share, and the checks every number a user types goes through: one line
and exit 2 (GpuprofError) for a value no run could use, before anything starts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from gpuprof.errors import GpuprofError

# Options several verbs take, declared once so that they read the same in every --help.
FORCE_HELP = ("Let an output replace an existing file that is not gpuprof's own file of that kind "
              "(never the script, an input or a file the run opened).")
GPU = typer.Option(None, "--gpu", help="GPU name or key for the peak (overrides detection), e.g. h200.")
PEAK_TFLOPS = typer.Option(None, "--peak-tflops", help="Peak TFLOP/s to compute MFU against (overrides the table).")
REPORTED_MFU = typer.Option(None, "--reported-mfu", help="An MFU % the script printed, to check against the true one.")
DISK_REPORT = typer.Option(None, "--disk-report", help="A `gpuprof bench-disk --json` result for the data's storage.")
WRITE = typer.Option(None, "--write", help="Write the corrected config (nanoGPT `key = value` format) here (an "
                                           "existing file only with --force).")
FORCE = typer.Option(False, "--force", help=FORCE_HELP)
TRACE = typer.Option(None, "--trace", help="Also write a Chrome trace-event JSON here (opens in ui.perfetto.dev "
                                           "and chrome://tracing).")
HTML = typer.Option(None, "--html", help="Also write a self-contained HTML report here (no network requests).")
DETAILS = typer.Option(False, "--details", help="Show everything: the MFU table, the GPU and host samplers, "
                                                "user-code attribution.")


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


def load_disk_report(path: Optional[Path]) -> Optional[dict]:
    """A bench-disk JSON result, validated enough for the storage rule to read it."""
    import json

    from gpuprof.files import read_user_text

    if path is None:
        return None
    try:
        data = json.loads(read_user_text(path))
    except json.JSONDecodeError as exc:
        raise GpuprofError(f"{path}: not a bench-disk JSON result ({exc.__class__.__name__})") from None
    if not isinstance(data, dict) or "random" not in data or "loader" not in data:
        raise GpuprofError(f"{path}: not a bench-disk JSON result (no random/loader sections)")
    return data
