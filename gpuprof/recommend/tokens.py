"""Token counts as people type them: `524288`, `0.5M`, `1M`, `1Mi`, `2^20`, `1e6`.

The grammar is gpuprof's one (gpuprof.units.parse_quantity), read exactly (never floats):

- plain integers, with optional `_` or `,` separators: `524288`, `1_048_576`, `1,048,576`
- scientific notation: `1e6` = 1,000,000, `5.24288e5` = 524,288
- powers: `2^20` or `2**20` = 1,048,576 (any integer base and exponent)
- decimal (SI) suffixes, case-insensitive: `K` = 10^3, `M` = 10^6, `G` or `B` = 10^9,
  `T` = 10^12. So `1M` is 1,000,000 and `0.5M` is 500,000 — not 2^20 / 2^19.
- binary (IEC) suffixes, case-insensitive: `Ki` = 2^10, `Mi` = 2^20, `Gi` = 2^30, `Ti` = 2^40.
  So `1Mi` is 1,048,576 and `0.5Mi` is 524,288.

Why `M` is decimal: it is what the letter means everywhere else, and it agrees with `1e6`.
nanoGPT users who say "1M tokens" usually mean 2^20 = 16 × 1024 × 64; with the default ±5%
tolerance a 1,000,000 target still admits 1,048,576 (+4.86%), and power-of-two configs are
preferred, so `1M` lands on the same configs. Every output prints the exact count.

A value must come out as a whole, positive number of tokens (`1.5` or `0.0000001M` is an error),
at most 2^50.
"""

from __future__ import annotations

from fractions import Fraction

from gpuprof.errors import GpuprofError
from gpuprof.units import parse_quantity

# Far beyond any optimizer step (GPT-3 trained at 3.2M tokens per step); past it the planner's
# float arithmetic would overflow.
MAX_TOKENS = 2**50


def parse_tokens(text: str | int) -> int:
    """Parse a token count; raise GpuprofError with a one-line reason if it is not one."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = Fraction(text)
        shown = str(text)
    else:
        shown = str(text).strip()
        value = parse_quantity(shown, "target tokens")
    if value.denominator != 1:
        raise GpuprofError(f"target {shown!r} is not a whole number of tokens ({float(value):,.3f})")
    if value <= 0:
        raise GpuprofError(f"target tokens must be positive, got {shown!r}")
    if value > MAX_TOKENS:
        raise GpuprofError(f"target {shown!r} is out of range: at most 2^50 ({MAX_TOKENS:,}) tokens "
                           f"per optimizer step")
    return int(value)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def describe_tokens(n: int) -> str:
    """Exact count plus a readable form: '1,048,576 (2^20)', '1,000,000 (1M)', '786,432'."""
    extra = ""
    if is_power_of_two(n) and n >= 1024:
        extra = f" (2^{n.bit_length() - 1})"
    elif n % 10**6 == 0:
        extra = f" ({n // 10**6}M)"
    elif n % 2**20 == 0:
        extra = f" ({n // 2**20}Mi)"
    return f"{n:,}{extra}"
