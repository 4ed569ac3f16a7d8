"""One median and one quantile for the whole tool (gpuprof.stats): numpy's linear interpolation,
None values skipped, None for no values; every layer that reports a p10/p50/p90/p99 uses it."""

import numpy as np
import pytest

from gpuprof.stats import median, quantile


@pytest.mark.parametrize("xs, q, want", [
    ([1, 2, 3, 4, 10], 0.9, 7.6),
    ([1, 2, 3, 4, 10], 0.1, 1.4),
    ([1, 2, 3, 4], 0.9, 3.7),
    (list(range(1, 11)), 0.9, 9.1),
    ([5.0], 0.9, 5.0),
])
def test_quantile_is_linear_interpolation(xs, q, want):
    assert quantile(xs, q) == pytest.approx(want)
    assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))


def test_median_is_the_mean_of_the_two_middle_values():
    assert median([1, 2, 3, 4]) == 2.5
    assert median([3, 1, 2]) == 2.0
    assert median(x for x in (4, 1, 3)) == 3.0  # any iterable
    assert median(np.array([1.0, 2.0, 4.0, 8.0])) == 3.0


def test_no_values_is_none_and_none_values_are_skipped():
    assert median([]) is None and quantile([], 0.9) is None
    assert median([None, None]) is None
    assert median([None, 1.0, 3.0]) == 2.0


def test_log_p10_p90_are_the_same_quantiles(tmp_path):
    from gpuprof.analysis.logs import analyze_log

    log = tmp_path / "train.log"
    lines = [f"iter {i}: loss 3.0, time {ms:.2f}ms, mfu 10.00%" for i, ms in
             enumerate([900.0, 100.0, 200.0, 300.0, 400.0, 1000.0])]
    log.write_text("\n".join(lines) + "\n")
    r = analyze_log(str(log), gpu="a100")
    steady = [0.1, 0.2, 0.3, 0.4, 1.0]  # iter 0 (compile, first eval) left out
    assert r.step_s_median == pytest.approx(0.3)
    assert r.step_s_p10 == pytest.approx(quantile(steady, 0.1)) == pytest.approx(0.14)
    assert r.step_s_p90 == pytest.approx(quantile(steady, 0.9)) == pytest.approx(0.76)


def test_sampler_p50_p90_are_the_same_quantiles():
    from gpuprof.measure.sampling import stats

    s = stats([10.0, 1.0, None, 3.0, 2.0, 4.0])
    assert (s["min"], s["max"], s["n"]) == (1.0, 10.0, 5)
    assert s["p50"] == 3.0 and s["p90"] == pytest.approx(7.6)
    assert stats([1.0, 2.0, 3.0, 4.0])["p50"] == 2.5  # not the upper middle value
    assert stats([None]) is None


def test_disk_latency_percentiles_are_the_same_quantiles():
    from gpuprof.disk.bench import latency_ms

    lat = np.array([0.001, 0.002, 0.003, 0.004, 0.010])
    out = latency_ms(lat)
    assert out["p50_ms"] == pytest.approx(3.0)
    assert out["p99_ms"] == pytest.approx(float(np.percentile(lat, 99)) * 1e3)
    assert latency_ms(np.array([])) == {"p50_ms": None, "p99_ms": None}
