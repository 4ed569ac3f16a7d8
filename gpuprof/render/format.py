"""Number formatting shared by the renderers."""

from __future__ import annotations


def seconds(s: float | None) -> str:
    """Human seconds: 21.0 s, 135 ms, 420 µs."""
    if s is None:
        return "not measured"
    a = abs(s)
    if a >= 100:
        return f"{s:,.0f} s"
    if a >= 1:
        return f"{s:.2f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.1f} ms" if a < 0.1 else f"{s * 1e3:.0f} ms"
    if a == 0:
        return "0"
    return f"{s * 1e6:.0f} µs"


def pct(x: float | None, digits: int = 1) -> str:
    return "not measured" if x is None else f"{x * 100:.{digits}f}%"


def count(n: float | None) -> str:
    if n is None:
        return "not measured"
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:,.0f}"


def tokens(n: int | None) -> str:
    return "not measured" if n is None else f"{int(n):,}"
