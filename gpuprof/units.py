"""How a figure is written in words: seconds, shares, bytes, rates, ratios.

Shared vocabulary, next to the Profile: the rules write their `because` sentences with these and
the renderers print their tables with them (importing them from here), so one figure reads the
same everywhere on a page. Also what users type: parse_quantity, the one grammar of counts and
sizes (K/M/G decimal, Ki/Mi/Gi binary)."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from gpuprof.errors import GpuprofError

NM = "not measured"
EMPTY = "—"  # a table cell with no figure: not taken there, or not applicable (its caption says which)
NA = "not applicable"  # a figure that cannot exist here (no datasheet peak, no TF32 on a CPU), in words
UNKNOWN = "?"  # a name or label that was not recorded (a host, a status, a backend, a file)

# Byte units, defined once. Memory (GPU memory, RAM, a process's memory) is quoted in binary
# units and written by `gib`; data, disk and transfer sizes in decimal units, by `nbytes`.
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12


def seconds(s: float | None) -> str:
    """Human seconds: 21.0 s, 135 ms, 4.2 ms, 420 µs."""
    if s is None:
        return NM
    a = abs(s)
    if a == 0:
        return "0"
    # Each threshold is where the rounded figure would reach the next unit: 0.99999 s is
    # "1.00 s", never "1000 ms".
    if a >= 99.995:
        return f"{s:,.0f} s"
    if a >= 0.9995:
        return f"{s:.2f} s"
    if a >= 0.09995:
        return f"{s * 1e3:.0f} ms"
    if a >= 0.0009995:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def signed_seconds(s: float | None) -> str:
    """A change in seconds, signed when it grew: +12.0 ms, -3.1 ms, 0."""
    if s is None:
        return NM
    return ("+" if s > 0 else "") + seconds(s)


def seconds_range(low: float, high: float) -> str:
    """An interval of seconds: "18.0–41.0 ms" (one unit), "850 ms–1.20 s", "-5.0 ms to 12.0 ms"."""
    a, b = seconds(low), seconds(high)
    if low < 0:
        return f"{a} to {b}"
    num, _, unit = a.rpartition(" ")
    return f"{num}–{b}" if num and b.endswith(" " + unit) else f"{a}–{b}"


def interval_text(low: float, high: float, level: float, rounds: int | None, unit: str = "rounds") -> str:
    """A saving's interval in words: "18.0–41.0 ms, 93%, 8 rounds" (the coverage the interval
    achieves, and the paired rounds it comes from; `unit` "pairs of your loop's steps" for the
    script's own steps)."""
    return f"{seconds_range(low, high)}, {level:.0%}" + (f", {rounds} {unit}" if rounds else "")


def duration(s: float) -> str:
    """A long wait, in the unit people plan in: 75 s, 8.3 min, 10.3 h, 4.2 days."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def finite(x) -> float | None:
    """x as a float when it is a finite number (not a bool, NaN, inf, None or a string), else None."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def pct(x: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: 0.271 -> 27.1%."""
    return NM if x is None else f"{x * 100:.{digits}f}%"


def pct_range(low: float, high: float, digits: int = 1) -> str:
    """Two fractions as a percentage range: 0.352, 0.468 -> 35.2–46.8%."""
    return f"{low * 100:.{digits}f}\u2013{high * 100:.{digits}f}%"


def count(n: float | None) -> str:
    """A large count: 921.1K, 1.6B."""
    if n is None:
        return NM
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:,.0f}"


def tokens(n: int | None) -> str:
    return NM if n is None else f"{int(n):,}"


def _three_figures(x: float, units) -> str:
    for unit, div in units:
        if abs(x) >= div:
            v = x / div
            return f"{v:.0f} {unit}" if abs(v) >= 100 else f"{v:.1f} {unit}" if abs(v) >= 10 else f"{v:.2f} {unit}"
    return f"{x:.0f} B"


def nbytes(x: float | None) -> str:
    """Data, disk and transfer sizes: decimal units, three significant figures: 11.0 MB,
    1.07 GB, 339 MB."""
    return NM if x is None else _three_figures(x, (("TB", TB), ("GB", GB), ("MB", MB), ("kB", KB)))


def gib(x: float | None) -> str:
    """Memory (GPU memory, RAM, a process's memory): binary units as capacities are quoted,
    three significant figures: 132 GiB, 23.5 GiB, 1.00 GiB, 10.5 MiB, 1.50 KiB."""
    return NM if x is None else _three_figures(x, (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)))


def bytes_per_s(x: float | None) -> str:
    """A transfer rate: 42.4 MB/s, 24.0 GB/s."""
    if x is None:
        return NM
    for unit, div in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f} {unit}"
    return f"{x:.0f} B/s"


def flops_rate(tflops: float | None) -> str:
    """A compute rate given in TFLOP/s: 989.5 TFLOP/s, or 60.0 GFLOP/s below one TFLOP/s."""
    if tflops is None:
        return NM
    return f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GFLOP/s"


def times(x: float | None) -> str:
    """A ratio, two decimals: 1.93×."""
    return NM if x is None else f"{x:.2f}×"


def number(x: float | None) -> str:
    """A figure with no known unit: three significant figures, thousands separated."""
    if x is None:
        return NM
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def join_notes(*parts: str) -> str:
    """Sentences joined into one note, each ended with a full stop (no "…computing saving capped")."""
    out = []
    for p in parts:
        p = (p or "").strip()
        if p:
            out.append(p if p[-1] in ".!?" or p.endswith((".)", "!)", "?)")) else p + ".")
    return " ".join(out)


# Evidence keys that name the step itself: the report prints the step once, labelled with its
# statistic, so a finding's evidence never prints it a second time (possibly as another statistic).
STEP_KEYS = ("step_s", "mean_step_s", "typical_step_s")


# Words in a `…bytes` evidence key that make it a memory figure (binary units, `gib`).
_MEMORY_KEYS = ("memory", "mem_", "allocated", "capacity", "rss", "ram_")


def _label(key: str, suffixes: tuple[str, ...]) -> str:
    for suffix in suffixes:
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ").strip()


def evidence_value(key: str, value) -> str | None:
    """One evidence figure in words, its unit inferred from the key (None: nothing to show).

    `_s` seconds, `_bytes_s` a rate, `_bytes` bytes (memory in binary units), `share`/`_frac`/`mfu` a fraction as a
    percentage, `_pct` already a percentage, `ratio`/`times_`/`headroom` a ratio (2 decimals ×),
    `_tflops` a compute rate; anything else three significant figures."""
    if value is None:
        return None  # not measured: the rule had no figure
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        parts = [f"{k} {evidence_value(key, v)}" for k, v in value.items() if evidence_value(key, v) is not None]
        return ", ".join(parts) or None
    if isinstance(value, (list, tuple)):
        parts = [evidence_value(key, v) for v in value]
        return ", ".join(p for p in parts if p) or None
    if not isinstance(value, (int, float)):
        return str(value)
    k = key.lower()
    if k.endswith(("_bytes_s", "bytes_per_s")):
        return bytes_per_s(value)
    if k.endswith(("_gb_s", "_mb_s")):
        return bytes_per_s(value * (1e9 if k.endswith("_gb_s") else 1e6))
    if k.endswith("gflop_s"):
        return flops_rate(value / 1e3)
    if k.endswith("_per_s"):
        return f"{number(value)}/s"
    if k.endswith("_ms"):
        return seconds(value / 1e3)
    if k.endswith("_s"):
        return seconds(value)
    if k.endswith("bytes"):
        return gib(value) if any(w in k for w in _MEMORY_KEYS) else nbytes(value)
    if k.endswith("_pct"):
        return f"{value:.1f}%"
    if k.endswith(("share", "_frac", "_fraction")) or k == "used" or k.startswith("mfu"):
        return pct(value)
    if "ratio" in k or k.startswith("times_") or "headroom" in k or k.endswith("_x"):
        return times(value)
    if k.endswith("tflops"):
        return flops_rate(value)
    return number(value)


def evidence_words(evidence: dict) -> str:
    """A finding's evidence dict as a sentence of labelled figures with units, for a finding
    whose rule wrote no `because` (an older saved profile, a new rule): "data exposed 1.20 s;
    share of the step 26.8%; timeline host". Never `key=value`, never a bare float."""
    parts = []
    for key, value in (evidence or {}).items():
        if key in STEP_KEYS:
            continue
        text = evidence_value(key, value)
        if text is None:
            continue
        if key == "share":
            label = "share of the step"
        else:
            label = _label(key, ("_bytes_s", "_gb_s", "_mb_s", "_gflop_s", "_bytes", "_pct", "_ms", "_s"))
        parts.append(f"{label} {text}")
    return "; ".join(parts)


# -- what users type: one grammar for every count and size ----------------------------------
# The rule every help text states. M is 10^6 here as in every figure gpuprof prints (count(),
# nbytes(), "1M tokens"), and as 1e6 is; the binary multiples have their own names.
SUFFIX_RULE = "K/M/G = 10^3/10^6/10^9, Ki/Mi/Gi = 2^10/2^20/2^30"
_SCALE = {
    "": 1,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
_NUMBER = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)(?:e(?P<exp>[+-]?\d+))?\s*(?P<suffix>[a-z]*)$")
_POWER = re.compile(r"^(?P<base>\d+)\s*(?:\^|\*\*)\s*(?P<exp>\d+)$")


def parse_quantity(text, what: str = "value", *, allow_bytes: bool = False,
                   examples: str = "524288, 0.5Mi, 1M, 2^20 or 1e6") -> Fraction:
    """A count or size as people type it, read exactly (a Fraction, never a float):

    - integers with optional `_` or `,` separators: `524288`, `1_048_576`, `1,048,576`
    - decimals and scientific notation: `0.5`, `1e6`, `5.24288e5`
    - powers: `2^20` or `2**20` (integer base and exponent)
    - decimal suffixes, case-insensitive: K = 10^3, M = 10^6, G = 10^9, T = 10^12
    - binary suffixes, case-insensitive: Ki = 2^10, Mi = 2^20, Gi = 2^30, Ti = 2^40
    - counts: B = 10^9 (a billion: `1B` tokens); sizes (`allow_bytes`): a trailing B or iB is
      the unit, so `256MiB` = `256Mi` = 2^28 and `1MB` = `1M` = 10^6 bytes.

    Callers check the range and whether it must be whole. GpuprofError (one line) when it
    cannot be read."""
    shown = str(text).strip()
    s = shown.lower().replace("_", "").replace(",", "")
    m = _POWER.match(s)
    if m:
        base, exp = int(m["base"]), int(m["exp"])
        if exp > 64:
            raise GpuprofError(f"{what} {shown!r} is too large")
        return Fraction(base) ** exp
    m = _NUMBER.match(s)
    suffix = m["suffix"] if m else ""
    if m and allow_bytes and suffix.endswith("b"):
        suffix = suffix[:-1]
    scale = _SCALE.get(suffix, 10**9 if suffix == "b" and not allow_bytes else None)
    if not m or scale is None:
        raise GpuprofError(f"cannot read {what} {shown!r}; use e.g. {examples} ({SUFFIX_RULE})")
    exp = int(m["exp"] or 0)
    if abs(exp) > 30:
        raise GpuprofError(f"{what} {shown!r} is out of range")
    return Fraction(m["num"]) * Fraction(10) ** exp * scale
