"""How a figure is written, once (gpuprof.units): bytes in exactly two ways — memory in binary
units (`gib`), data, disk and transfer sizes in decimal units (`nbytes`) — and the byte
constants defined in one place."""

import pytest

from gpuprof import units
from gpuprof.units import NM, gib, nbytes


def test_byte_constants():
    assert (units.KiB, units.MiB, units.GiB, units.TiB) == (2**10, 2**20, 2**30, 2**40)
    assert (units.KB, units.MB, units.GB, units.TB) == (10**3, 10**6, 10**9, 10**12)


def test_the_byte_constants_are_the_same_objects_everywhere():
    from gpuprof import hardware
    from gpuprof.disk import units as disk_units

    assert disk_units.KiB is units.KiB and disk_units.MiB is units.MiB and disk_units.GiB is units.GiB
    assert hardware.find_gpu("h200").memory_bytes == 141 * units.GB


@pytest.mark.parametrize("x, want", [
    (2**30, "1.00 GiB"), (80e9, "74.5 GiB"), (12_345_678, "11.8 MiB"), (150e9, "140 GiB"),
    (1536, "1.50 KiB"), (3.5 * 2**40, "3.50 TiB"), (512, "512 B"), (0, "0 B"), (256 * 2**20, "256 MiB"),
    (None, NM),
])
def test_gib_is_memory_in_binary_units_three_figures(x, want):
    assert gib(x) == want


@pytest.mark.parametrize("x, want", [
    (2**30, "1.07 GB"), (80e9, "80.0 GB"), (12_345_678, "12.3 MB"), (141e9, "141 GB"), (1536, "1.54 kB"),
    (512, "512 B"), (None, NM),
])
def test_nbytes_is_data_in_decimal_units_three_figures(x, want):
    assert nbytes(x) == want


def test_evidence_names_memory_in_binary_units_and_data_in_decimal():
    assert units.evidence_value("memory_needed_bytes", 11_009_536) == "10.5 MiB"
    assert units.evidence_value("peak_allocated_bytes", 2**30) == "1.00 GiB"
    assert units.evidence_value("pageable_bytes", 11_009_536) == "11.0 MB"


# -- what users type: one grammar (parse_quantity) for token counts and byte sizes ------------
@pytest.mark.parametrize("text, want", [
    ("1M", 10**6), ("1Mi", 2**20), ("0.5M", 500_000), ("0.5Mi", 2**19), ("1k", 1000), ("1Ki", 1024),
    ("1G", 10**9), ("1Gi", 2**30), ("1T", 10**12), ("1Ti", 2**40), ("1e6", 10**6), ("2^20", 2**20),
    ("2**20", 2**20), ("1_048_576", 2**20), ("1,048,576", 2**20), ("1B", 10**9), (" 64 Ki ", 65_536),
])
def test_parse_quantity_reads_every_form_exactly(text, want):
    assert units.parse_quantity(text) == want


def test_parse_quantity_for_bytes_takes_the_unit():
    from fractions import Fraction

    assert units.parse_quantity("256MiB", allow_bytes=True) == 256 * 2**20
    assert units.parse_quantity("256MB", allow_bytes=True) == 256 * 10**6
    assert units.parse_quantity("1B", allow_bytes=True) == 1  # a byte, not a billion
    assert units.parse_quantity("1.5", allow_bytes=True) == Fraction(3, 2)  # the caller checks wholeness


@pytest.mark.parametrize("text", ["", "abc", "1Q", "-5", "1iB", "1MiB"])
def test_parse_quantity_refuses_in_one_line_stating_the_rule(text):
    from gpuprof.errors import GpuprofError

    with pytest.raises(GpuprofError) as exc:
        units.parse_quantity(text, "--thing")
    assert "cannot read --thing" in str(exc.value) and units.SUFFIX_RULE in str(exc.value)
    assert units.SUFFIX_RULE == "K/M/G = 10^3/10^6/10^9, Ki/Mi/Gi = 2^10/2^20/2^30"


# -- the small formatters, each once --------------------------------------------------------
def test_signed_seconds_duration_and_finite():
    assert units.signed_seconds(0.012) == "+12.0 ms" and units.signed_seconds(-0.0031) == "-3.1 ms"
    assert units.signed_seconds(0) == "0" and units.signed_seconds(None) == NM
    assert [units.duration(s) for s in (75, 500, 37_000, 363_000)] == ["75 s", "8.3 min", "10.3 h", "4.2 days"]
    assert units.finite(3) == 3.0 and isinstance(units.finite(3), float)
    for bad in (True, float("nan"), float("inf"), None, "3", [3]):
        assert units.finite(bad) is None


def test_the_renderers_share_one_not_measured_and_format_reexports_nothing():
    from gpuprof.render import format, html
    from gpuprof.report import compare, details

    assert compare.NM is html.NM is details.NM is NM  # render/mfu.py lays out what report/details words
    assert not hasattr(format, "seconds") and not hasattr(format, "NM") and hasattr(format, "FitTable")


def test_preflight_writes_rates_and_durations_as_the_report_does():
    from gpuprof import preflight

    assert preflight._rate(7.7e8) == units.flops_rate(7.7e-4) == "0.8 GFLOP/s"
    assert preflight._rate(3.958e14) == "395.8 TFLOP/s"
    assert preflight.duration is units.duration


def test_join_notes_ends_each_sentence_once():
    from gpuprof.units import join_notes

    # a sentence that ends in a parenthesis still gets its full stop; one that ended inside it does not
    assert join_notes("saving = f+b × (1 − ratio)", "b2 fits") == "saving = f+b × (1 − ratio). b2 fits."
    assert join_notes("as measured (see above.)", "", None, "done!") == "as measured (see above.) done!"
