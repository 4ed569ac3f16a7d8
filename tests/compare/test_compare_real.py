"""compare on real runs of the built-in loop: a data stall injected, then removed."""

import pytest

from gpuprof.analysis.compare import compare
from gpuprof.analysis.pipeline import analyze
from gpuprof.runners.builtin import LoopConfig, LoopFaults, run_builtin
from gpuprof.runners.data import LoaderFaults

TINY = dict(model="tiny", n_layer=1, n_embd=32, batch_size=2, block_size=32, steps=4, warmup=1, device="cpu")
STALL_S = 0.02  # per micro-batch; grad_accum 4 -> 80 ms per step, several times the tiny model's compute


@pytest.fixture(scope="module")
def real_pair():
    """(BEFORE with the stall, its analysis, AFTER without, its analysis)."""
    before = run_builtin(LoopConfig(**TINY), faults=LoopFaults(loader=LoaderFaults(batch_delay_s=STALL_S)))
    after = run_builtin(LoopConfig(**TINY))
    return before, analyze(before), after, analyze(after)


def test_stall_finding_predicted_vs_achieved(real_pair):
    before, before_analysis, after, after_analysis = real_pair
    c = compare(*real_pair)
    o = {x.id: x for x in c.outcomes}["data-loading-exposed"]
    stall = before_analysis.finding("data-loading-exposed")
    data_b = before.stats.seconds("data")
    data_a = after.stats.seconds("data")
    # predicted is BEFORE's own figure; achieved is the drop of the phase it claims, exactly
    assert o.predicted_s == stall.saving_s == pytest.approx(data_b)
    assert o.measured_from == "phases" and o.phases == ["data"]
    assert o.achieved_s == pytest.approx(data_b - data_a)
    assert o.ratio == pytest.approx((data_b - data_a) / data_b)
    # the stall (4 x 20 ms) is most of BEFORE's data time: removing it realises most of the prediction;
    # what remains is the real loading, which a prefetch (the finding's fix) would also have hidden
    assert 4 * STALL_S <= data_b and 0.85 < o.ratio <= 1.0
    assert o.verdict == "realised"
    assert c.step_s.change < -0.5 * 4 * STALL_S  # the typical step got faster by most of the stall
    assert c.step_s.before == pytest.approx(before.stats.step_s) and c.step_s.after == pytest.approx(after.stats.step_s)
    assert c.basis == "step" and c.tokens_per_step.before == c.tokens_per_step.after == 2 * 32 * 4
    assert c.config_changes == [{"key": "faults.loader.batch_delay_s", "before": STALL_S, "after": None,
                                 "missing": "after"}]


def test_cli_reports_the_stall_outcome(real_pair, tmp_path):
    """The saved pair through `gpuprof compare`, BEFORE saved without its analysis (analysed on load,
    as analyze() made it: the analysis is pure), AFTER with its own."""
    from typer.testing import CliRunner

    import gpuprof.cli.compare  # noqa: F401 - registers the verb
    from gpuprof.cli import app
    from gpuprof.profile import save

    before, _, after, after_analysis = real_pair
    save(before, tmp_path / "before.json")
    save(after, tmp_path / "after.json", after_analysis.to_dict())
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "before.json"), str(tmp_path / "after.json")],
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    expected = compare(*real_pair)
    o = {x.id: x for x in expected.outcomes}["data-loading-exposed"]
    row = next(line for line in res.stdout.splitlines() if line.startswith("│ data-loading-exposed"))
    assert f"{o.ratio:.2f}" in row and "realised" in row
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
