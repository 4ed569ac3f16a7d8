"""Byte sizes: parse what users type ("256M", "1GiB", "4096") and name read sizes ("2KiB")."""

from __future__ import annotations

import re

from gpuprof.errors import GpuprofError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Suffixes are binary (K = KiB): storage people mean 4 KiB when they say "4k", as fio does.
_UNITS = {"": 1, "b": 1, "k": KiB, "kb": KiB, "kib": KiB, "m": MiB, "mb": MiB, "mib": MiB,
          "g": GiB, "gb": GiB, "gib": GiB, "t": 1024 * GiB, "tb": 1024 * GiB, "tib": 1024 * GiB}


def parse_bytes(text: str | int, what: str = "size") -> int:
    """'256M' -> 268435456. Suffixes K/M/G/T (with or without B/iB) are powers of 1024."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise GpuprofError(f"{what} {text!r} is not a size (examples: 4096, 64M, 1G)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    return int(value)


def size_label(n: int) -> str:
    """Key for a read size in reports and JSON: 2048 -> '2KiB', 1048576 -> '1MiB', 2050 -> '2050B'."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{name}"
    return f"{n}B"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (for prose; JSON keeps raw byte counts)."""
    for unit, name in ((1024 * GiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if abs(n) >= unit:
            return f"{n / unit:.1f} {name}"
    return f"{int(n)} B"
