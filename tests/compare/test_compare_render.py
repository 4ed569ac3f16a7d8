"""The compare report at 80 and 120 columns: no wrapped or cut cell, no broken word; and its JSON."""

import io
import json

import pytest
from rich.console import Console

from compare_profiles import BASE_PHASES, finding, hand
from gpuprof.analysis.compare import compare
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.render.compare import comparison_json, render_comparison, table
from gpuprof.report.compare import compare_view, outcome_line


def per_token_pair():
    long_id = "backward-forward-ratio"  # among the longest rule ids
    b = hand([BASE_PHASES] * 3, findings=[
        finding("data-loading-exposed", 0.30, {"data": 0.30}), finding(long_id, 0.05, {}),
        finding("compute-bound", None, kind="verdict")],
        mfu=MfuResult(mfu=0.123, mfu_vs_ceiling=0.456))
    a = hand([dict({k: v * 2 for k, v in BASE_PHASES.items()}, data=0.001, eval=0.2)] * 3, tokens=8192,
                     config={"batch_size": 16, "data": "/a/rather/long/path/to/the/new/train.bin"},
                     findings=[finding("eval-in-measured-steps", 0.2, {"eval": 0.2}, step=1.6)])
    a[0].ranks = [{"rank": 0}, {"rank": 1}]
    return (*b, *a)


def rendered(c, width):
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    render_comparison(c, console)
    return console.export_text()


def table_rows(table):
    cols = [list(col._cells) for col in table.columns]
    return [[str(cells[i]) for cells in cols] for i in range(len(cols[0]))]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("which", ["hand", "per-token"])
def test_no_wrapped_cell_and_no_broken_word(hand_pair, width, which):
    c = compare(*(hand_pair if which == "hand" else per_token_pair()), before_name="runs/before.gpuprof.json",
                after_name="runs/after.gpuprof.json")
    text = rendered(c, width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    assert "…" not in text  # nothing cut
    v = compare_view(c)
    for rows in (v.summary, v.phases, v.outcomes):  # the tables the report prints
        assert rows is not None
        for row in table_rows(table(rows)):  # every row's cells on one line: nothing wrapped
            assert any(all(cell in line for cell in row) for line in lines), (row, text)
    words = set(text.split())
    prose = [c.basis_note, *c.notes, compare_view(c).step_change, *(outcome_line(o) for o in c.outcomes if o.predicted_s is not None),
             *(f["title"] for f in c.new_findings), *(ch["key"] + ":" for ch in c.config_changes)]
    for sentence in prose:
        for word in sentence.split():
            assert word in words, (word, text)  # wrapped at spaces, never inside a word


def test_report_says_what_changed(hand_pair):
    c = compare(*hand_pair)
    text = rendered(c, 80)
    prose = " ".join(text.split())  # lines wrapped at 80 columns, joined back
    assert "same tokens per step (4,096): compared per step" in text
    assert "step (typical)" in text and "1.05 s" in text and "750 ms" in text and "-300 ms (-28.6%)" in text
    assert "data-loading-exposed" in text and "0.83" in text and "partly" in text
    assert "storage-too-slow" in text and "3.00" in text and "exceeded" in text
    assert "achieved = drop of data" in prose and "achieved = drop of the typical step" in prose
    assert "no interval: judged on ±15% of the prediction" in prose  # hand findings carry no interval
    assert "New in AFTER" in text and "cpu-saturated" in text
    assert "batch_size: 8 → 16" in text and "grad_accum: 4 → 2" in text
    assert "MFU vs ceiling not measured: AFTER: no matmul ceiling measured in the step's dtype" in prose
    # -28.6% is less than BEFORE's own spread over all its steps, (1.72 - 0.94) / 1.00 = 78%, but the
    # interval of the change (4 and 4 typical steps: every AFTER step faster than every BEFORE one)
    # says faster; the spread note is only for runs too short for an interval
    step_change = compare_view(c).step_change
    assert step_change == ("change interval: -42.3% to -16.7% per step (94%, Mann–Whitney, 4 and 4 steps): faster "
                           "beyond run-to-run noise")
    assert " ".join(step_change.split()) in prose  # the report prints the model's line
    assert "within run-to-run noise" not in prose
    assert "BEFORE had 1 irregular step(s), left out of its typical step (the mean step with them: 1.24 s)" in prose


def test_per_token_report_says_so():
    text = rendered(compare(*per_token_pair()), 80)
    assert "compared per token" in text and "per 1M tokens" in text
    assert "world size changed 1 → 2" in text
    assert "eval-in-measured-steps" in text  # a new finding of AFTER


def test_json_form(hand_pair):
    c = compare(*hand_pair)
    d = json.loads(comparison_json(c, {"fail_if_slower_pct": 5.0, "slower_pct": c.slower_pct, "failed": False}))
    assert d["basis"] == "step" and d["step_s"]["before"] == pytest.approx(1.05)
    assert d["slower_pct"] == pytest.approx(-30 / 1.05) and d["gate"]["failed"] is False
    f = {x["id"]: x for x in d["findings"]}
    assert f["data-loading-exposed"]["achieved_s"] == pytest.approx(0.25)
    assert f["data-loading-exposed"]["ratio"] == pytest.approx(0.25 / 0.30)
    assert [p["phase"] for p in d["phases"]][0] == "data"
    assert d["mfu_vs_ceiling"]["after"] is None  # not measured stays null, never a number
