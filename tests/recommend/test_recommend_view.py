"""The recommend report's view (gpuprof.report.recommend): its figures, cells and tones, for a
winner, for nothing fitting, for a current config that does not fit, without a throughput model,
with a measured one and without a capacity. The rendered English is the renderer's layout of
these fields; the tests pin the fields."""

import pytest

from gpuprof.dims import param_count, preset_config
from gpuprof.hardware import find_gpu
from gpuprof.recommend.plan import recommend
from gpuprof.recommend.sweep import SweepPoint, SweepResult
from gpuprof.recommend.throughput import ThroughputModel
from gpuprof.report.recommend import (BAD, BEST, CURRENT, GOOD, HEADING, PLAIN, RANGE_SHOWN,
                                      breakdown_view, measured, params_millions, range_shown,
                                      recommend_view, share_of_capacity, spare_bytes, usable_bytes)
from gpuprof.units import EMPTY, NM, nbytes

H200 = find_gpu("h200")
GPT2 = preset_config("gpt2", block_size=1024)
HEADINGS = ("", "batch_size", "accum", "tokens/step", "memory", "of capacity", "fits")


@pytest.fixture(scope="module")
def winner():
    """1M tokens on an H200 (the FLOP model), compiled, against the current 16 × 64."""
    return recommend(GPT2, 1_000_000, H200, "bf16", compile=True, current=(16, 64))


def test_best_row_cells_and_tones(winner):
    rec = winner
    v = recommend_view(rec)
    assert v.title.tone == HEADING
    assert [f.label for f in v.facts] == ["model", "setup", "memory", "speed"]
    assert tuple(c.heading for c in v.columns) == HEADINGS + ("step (est.)", "tokens/s")
    assert [c.words for c in v.columns] == [True, False, False, False, False, False, True, False, False]
    best = v.rows[0]
    assert best.tone == BEST and rec.best is rec.candidates[0]
    assert best.texts == ("★ best", "64", "16", "1,048,576 (2^20)", "49.6 GB", "35%", "yes",
                          "2.28 s (1.83 s-3.04 s)", "459.3K")
    assert best.cells[6].tone == GOOD
    assert all(r.tone == PLAIN and r.texts[0].startswith("#") for r in v.rows[1:-1])
    cur = v.rows[-1]
    assert cur.tone == CURRENT
    assert cur.texts == ("current", "16", "64", "1,048,576 (2^20)", "15.1 GB", "11%", "yes",
                         "2.33 s (1.88 s-3.09 s)", "449.8K")
    # the rows are Recommendation.shown() plus the current config; the rest is counted
    assert len(v.rows) == len(rec.shown()) + 1
    assert str(len(rec.candidates) - len(rec.shown())) in v.hidden
    # rows marked by rank name the candidate at that rank
    for r in v.rows[1:-1]:
        c = rec.candidates[int(r.texts[0][1:]) - 1]
        assert r.texts[1:3] == (str(c.batch_size), str(c.gradient_accumulation_steps))
    # the NO cells: candidates too big for the capacity
    no = [r for r in v.rows if r.texts[6] == "NO"]
    assert no and all(r.cells[6].tone == BAD for r in no)
    assert v.verdict.tone == BEST and v.breakdown is not None
    assert v.notes == tuple(rec.notes)


def test_best_figures_by_their_formulas(winner):
    rec = winner
    b = rec.best
    mem = b.memory
    assert params_millions(rec.model) == param_count(GPT2, False) / 1e6 == pytest.approx(124.475904)
    assert share_of_capacity(mem.total_bytes, rec.capacity_bytes) == mem.total_bytes / 141e9
    assert share_of_capacity(mem.total_bytes, None) is None
    assert mem.capacity_bytes == 141 * 10**9 and mem.margin_bytes == 7_050_000_000  # 5% margin
    assert usable_bytes(mem) == 141 * 10**9 - 7_050_000_000
    assert spare_bytes(mem) == usable_bytes(mem) - mem.total_bytes > 0
    assert range_shown(b)  # the FLOP model's MFU band is far wider than RANGE_SHOWN
    lo, hi = b.step_s_range
    assert hi - lo > RANGE_SHOWN * b.step_s
    assert not measured(rec)


def test_breakdown_terms_add_up_and_verdict(winner):
    bd = recommend_view(winner).breakdown
    mem = winner.best.memory
    assert bd.title.tone == HEADING
    assert [r[0] for r in bd.rows] == [t.name for t in mem.terms] + ["total"]
    assert [r[1] for r in bd.rows] == [nbytes(t.bytes) for t in mem.terms] + ["49.6 GB"]
    assert bd.rows[-1][2] == ""
    assert "loss_backward" in [r[0] for r in bd.rows]
    assert sum(t.bytes for t in mem.terms) == mem.total_bytes
    for figure in ("141 GB", "7.05 GB", "134 GB", nbytes(spare_bytes(mem))):
        assert figure in bd.verdict


def test_details_figures(winner):
    v = recommend_view(winner, written="/tmp/out.py")
    floor = winner.flop_floor_s(winner.best)
    assert floor == pytest.approx(0.906, abs=5e-4)
    assert any("906 ms" in d for d in v.details)  # units.seconds of the floor
    assert any("/tmp/out.py" in d for d in v.details)
    # the current config against the winner (after the why): its step, tokens/s and memory, then the winner's
    vs = v.details[1]
    assert "16 × 64" in vs
    assert [f in vs for f in ("2.33 s", "2.28 s", "449.8K", "459.3K", "15.1 GB", "49.6 GB")] == [True] * 6


def test_nothing_fits():
    rec = recommend(preset_config("gpt2-xl", block_size=1024), 1_000_000, H200, "bf16",
                    compile=True, capacity_bytes=10 * 10**9, current=(4, 4))
    v = recommend_view(rec)
    assert rec.best is None
    assert v.verdict.tone == BAD and v.breakdown is None and v.details == ()
    assert not any(r.tone == BEST for r in v.rows)
    for r in v.rows:
        assert r.texts[6] == "NO" and r.cells[6].tone == BAD
    first = v.rows[0]
    c = rec.candidates[0]
    assert first.texts[:6] == ("#1", "1024", "1", "1,048,576 (2^20)", "3.58 TB", "35797%")
    assert first.texts[5] == f"{c.memory.total_bytes / (10 * 10**9):.0%}"
    assert v.rows[-1].tone == CURRENT and v.rows[-1].texts[:3] == ("current", "4", "4")


def test_current_that_does_not_fit():
    rec = recommend(GPT2, 1_000_000, H200, "bf16", compile=False, current=(128, 8))
    v = recommend_view(rec)
    cur = rec.current
    assert cur.fits is False and rec.best is not None
    assert v.rows[-1].texts[6] == "NO" and v.rows[-1].cells[6].tone == BAD
    assert usable_bytes(cur.memory) == 141 * 10**9 - 7_050_000_000
    vs = v.details[1]  # after the why: the current config against the winner
    assert "128 × 8" in vs
    assert nbytes(cur.memory.total_bytes) in vs and nbytes(usable_bytes(cur.memory)) in vs
    # its breakdown says how much is missing: total − usable
    bd = breakdown_view(cur)
    short = -spare_bytes(cur.memory)
    assert short == cur.memory.total_bytes - usable_bytes(cur.memory) > 0
    assert nbytes(short) in bd.verdict


def test_throughput_not_measured():
    """No GPU peak, profile or measurement: no step times, ranked by fewest micro-steps."""
    rec = recommend(GPT2, 1_000_000, None, "bf16", compile=True, capacity_bytes=80 * 10**9,
                    current=(8, 128))
    v = recommend_view(rec)
    assert rec.throughput is None and not measured(rec)
    assert v.columns[7].heading == "step (est.)"
    assert v.rows[0].tone == BEST
    assert v.rows[0].texts == ("★ best", "64", "16", "1,048,576 (2^20)", "49.6 GB", "62%", "yes",
                               EMPTY, EMPTY)
    for r in v.rows:
        assert r.texts[7:] == (EMPTY, EMPTY)
    assert [f.label for f in v.facts] == ["model", "setup", "memory", "speed"]
    assert not any("FLOP floor" in d or "906 ms" in d for d in v.details)  # no GPU, no floor
    assert rec.flop_floor_s(rec.best) is None


def test_measured_throughput_and_sweep():
    tm = ThroughputModel(0.002, 1e-6, 0.01, "measured", "least squares over 3 sizes")
    sw = SweepResult("cpu", 1024, [SweepPoint(1, 0.01), SweepPoint(2, None, None, "out of memory")],
                     stopped="batch 2 ran out of memory")
    rec = recommend(GPT2, 2**20, None, "bf16", capacity_bytes=80 * 10**9, throughput=tm,
                    tolerance=0.0)
    v = recommend_view(rec, sweep=sw)
    assert measured(rec)
    assert v.columns[7].heading == "step"
    b = rec.best
    assert not range_shown(b)  # no range: the step alone
    # 64 × 16 would be faster but needs 78.6 GB eager, over the 76 GB usable: 32 × 32 wins
    assert (b.batch_size, b.grad_accum) == (32, 32)
    assert next(c for c in rec.candidates if c.batch_size == 64).fits is False
    assert b.step_s == pytest.approx(32 * (0.002 + 1e-6 * 32 * 1024) + 0.01)
    assert v.rows[0].texts[7:] == ("1.12 s", "934.1K")
    assert [f.label for f in v.facts] == ["model", "setup", "memory", "speed", "measure"]
    assert "10.0 ms" in v.facts[-1].text and "out of memory" in v.facts[-1].text


def test_capacity_unknown_reads_not_measured():
    rec = recommend(GPT2, 2**20, None, "bf16")
    v = recommend_view(rec)
    for r in v.rows:
        assert r.texts[5] == EMPTY and r.texts[6] == NM and r.cells[6].tone == PLAIN
    assert v.breakdown.verdict == ""
    assert usable_bytes(rec.best.memory) is None and spare_bytes(rec.best.memory) is None
