"""Every documented target form, read exactly; bad forms are one-line GpuprofErrors."""

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.recommend.tokens import describe_tokens, parse_tokens


@pytest.mark.parametrize("text, expected", [
    ("524288", 524_288),
    ("1_048_576", 1_048_576),
    ("1,048,576", 1_048_576),
    ("0.5M", 500_000),          # decimal: M = 10^6
    ("1M", 1_000_000),
    ("1m", 1_000_000),
    ("1.5M", 1_500_000),
    ("1Mi", 1_048_576),         # binary: Mi = 2^20
    ("0.5Mi", 524_288),
    ("0.5mi", 524_288),
    ("2^20", 1_048_576),
    ("2**19", 524_288),
    ("1e6", 1_000_000),
    ("5.24288e5", 524_288),
    ("1E6", 1_000_000),
    ("64K", 64_000),
    ("64Ki", 65_536),
    ("1G", 10**9),
    ("1B", 10**9),
    ("1Gi", 2**30),
    ("1T", 10**12),
    ("1Ti", 2**40),
    (" 1M ", 1_000_000),
    (".5Mi", 524_288),
    (1048576, 1_048_576),
])
def test_target_forms(text, expected):
    assert parse_tokens(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("", "cannot read"),
    ("abc", "cannot read"),
    ("1Q", "cannot read"),
    ("1.5", "not a whole number"),
    ("0.0000001M", "not a whole number"),
    ("1e-3", "not a whole number"),
    ("0", "must be positive"),
    ("0M", "must be positive"),
    ("-5", "cannot read"),
    ("2^100", "too large"),
    ("1e99", "out of range"),
    ("1MiB", "cannot read"),  # bytes are no unit of tokens
])
def test_bad_targets(text, fragment):
    with pytest.raises(GpuprofError) as exc:
        parse_tokens(text)
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)


def test_an_unreadable_target_states_the_rule():
    with pytest.raises(GpuprofError, match=r"K/M/G = 10\^3/10\^6/10\^9, Ki/Mi/Gi = 2\^10/2\^20/2\^30"):
        parse_tokens("abc")


def test_describe_prints_exact_counts():
    assert describe_tokens(1_048_576) == "1,048,576 (2^20)"
    assert describe_tokens(1_000_000) == "1,000,000 (1M)"
    assert describe_tokens(491_520) == "491,520"
