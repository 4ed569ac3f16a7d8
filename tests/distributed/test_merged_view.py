"""The rank a merged profile shows: gpuprof.merge stores the choice's figures (`run.view`: rank,
rule id, each rank's busy seconds), the report words them; an older profile's stored sentence
still reads."""

from __future__ import annotations

import pytest

from gpuprof.analysis.distributed_results import VIEW_LOWEST, VIEW_SLOWEST, MergedView
from gpuprof.analysis.pipeline import analyze
from gpuprof.merge import merge_entries
from gpuprof.profile import Profile
from gpuprof.report import words
from gpuprof.report.model import build_report

from test_merge_rules import _rank_profile  # this folder's (pytest puts it on sys.path)


def _row(report, label):
    return next((text for lab, text in report.what_ran if lab == label), None)


def test_the_slowest_rank_is_stored_as_figures_and_worded_by_the_report():
    merged = merge_entries([_rank_profile(0, data_s=0.01, exposed_s=0.09),
                            _rank_profile(1, data_s=0.09, exposed_s=0.01)])
    stored = merged.run["view"]
    assert set(stored) == {"rank", "rule", "busy_s"}  # figures only: no sentence in the profile
    assert stored["rank"] == 1 and stored["rule"] == VIEW_SLOWEST
    view = MergedView.of_run(Profile.from_dict(merged.to_dict()).run)  # as saved and read back
    assert view.rank == 1 and view.slowest and view.text is None
    assert view.busy_s[1] == pytest.approx(view.busy_s[0] + 0.08)
    report = build_report(merged, analyze(merged))
    line = _row(report, "view")
    assert line == words.view_text(view)
    assert line.startswith("rank 1 (the slowest rank: busy ") and "every rank under `ranks`" in line
    assert "(the slowest)" in report.throughput


def test_without_two_measured_ranks_the_lowest_rank_is_shown():
    a, b = _rank_profile(0, data_s=0.01, exposed_s=0.01), _rank_profile(1, data_s=0.01, exposed_s=0.01)
    for e in (a, b):
        e["profile"]["measurements"].pop("comm")
    merged = merge_entries([b, a])
    assert merged.run["view"] == {"rank": 0, "rule": VIEW_LOWEST, "busy_s": {}}
    view = MergedView.of_run(merged.run)
    assert not view.slowest
    report = build_report(merged, analyze(merged))
    assert _row(report, "view").startswith("rank 0 (the lowest rank with a profile")
    assert "(the slowest)" not in report.throughput


def test_an_older_profiles_sentence_still_reads():
    run = {"rank": 1, "view": "rank 1 (the slowest rank); every rank under `ranks`"}
    view = MergedView.of_run(run)
    assert view.rank == 1 and view.slowest and view.text == run["view"]
    assert words.view_text(view) == run["view"]
    old_lowest = MergedView.of_run({"rank": 0, "view": "rank 0 (the lowest rank with a profile); every rank"})
    assert old_lowest.rule == VIEW_LOWEST and not old_lowest.slowest
    assert MergedView.of_run({"rank": 0}) is None  # a single process: no view row
    assert MergedView.of_run({"view": {"rank": 2, "rule": VIEW_SLOWEST, "busy_s": {"x": 1, "2": "bad"}}}).busy_s == {}
