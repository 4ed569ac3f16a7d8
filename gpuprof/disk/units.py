"""Byte sizes: read what users type ("256Mi", "1GiB", "4096", "1e9") with gpuprof's one grammar
(gpuprof.units.parse_quantity: K/M/G = 10^3/10^6/10^9, Ki/Mi/Gi = 2^10/2^20/2^30, a trailing B or
iB allowed), and name read sizes ("2KiB"). The byte constants live in gpuprof.units (re-exported
here)."""

from __future__ import annotations

from gpuprof.errors import GpuprofError
from gpuprof.units import GiB, KiB, MiB, TiB, parse_quantity

__all__ = ["GiB", "KiB", "MiB", "TiB", "parse_bytes", "size_label"]


def parse_bytes(text: str | int, what: str = "size") -> int:
    """'256Mi' / '256MiB' -> 268435456, '256M' / '256MB' -> 256000000, '4096' -> 4096: a whole
    number of bytes (GpuprofError otherwise)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    shown = str(text).strip()
    value = parse_quantity(shown, what, allow_bytes=True, examples="4096, 64Ki, 256Mi, 1GiB or 1e9")
    if value.denominator != 1:
        raise GpuprofError(f"{what} {shown!r} is not a whole number of bytes ({float(value):,.3f})")
    return int(value)


def size_label(n: int) -> str:
    """Key for a read size in reports and JSON: 2048 -> '2KiB', 1048576 -> '1MiB', 2050 -> '2050B'."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{name}"
    return f"{n}B"

