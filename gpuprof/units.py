"""How a figure is written in words: seconds, shares, bytes, rates, ratios.

Shared vocabulary, next to the Profile: the rules write their `because` sentences with these and
the renderers print their tables with them, so one figure reads the same everywhere on a page
(gpuprof.render.format re-exports them for the renderers)."""

from __future__ import annotations

NM = "not measured"


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


def pct(x: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: 0.271 -> 27.1%."""
    return NM if x is None else f"{x * 100:.{digits}f}%"


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


def nbytes(x: float | None) -> str:
    """Bytes, decimal units, three significant figures: 11.0 MB, 1.07 GB, 339 MB."""
    if x is None:
        return NM
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= div:
            v = x / div
            return f"{v:.0f} {unit}" if abs(v) >= 100 else f"{v:.1f} {unit}" if abs(v) >= 10 else f"{v:.2f} {unit}"
    return f"{x:.0f} B"


def gib(x: float | None) -> str:
    """Bytes in binary units, as memory capacities are quoted: 132 GiB, 23.5 GiB, 10.5 MiB."""
    if x is None:
        return NM
    v = x / 2**30
    if abs(v) < 1:
        return f"{x / 2**20:.3g} MiB"
    return f"{v:.0f} GiB" if abs(v) >= 100 else f"{v:.1f} GiB" if abs(v) >= 10 else f"{v:.2f} GiB"


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
            out.append(p if p[-1] in ".!?)" else p + ".")
    return " ".join(out)


# Evidence keys that name the step itself: the report prints the step once, labelled with its
# statistic, so a finding's evidence never prints it a second time (possibly as another statistic).
STEP_KEYS = ("step_s", "mean_step_s", "typical_step_s")


def _label(key: str, suffixes: tuple[str, ...]) -> str:
    for suffix in suffixes:
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ").strip()


def evidence_value(key: str, value) -> str | None:
    """One evidence figure in words, its unit inferred from the key (None: nothing to show).

    `_s` seconds, `_bytes_s` a rate, `_bytes` bytes, `share`/`_frac`/`mfu` a fraction as a
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
        return nbytes(value)
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
