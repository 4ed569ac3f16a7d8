"""Profile: the step statistics (gpuprof.stats), JSON round trip, and validated loading."""

import json

import pytest

from gpuprof import profile as P
from gpuprof.errors import GpuprofError
from gpuprof.profile import StepRecord
from gpuprof.stats import step_stats


def _steps():
    return [
        StepRecord(0, 1.0, {"data": 0.25, "forward": 0.25, "backward": 0.5}, tokens=1000, micro_steps=2),
        StepRecord(1, 2.0, {"data": 1.25, "forward": 0.25, "backward": 0.5}, tokens=1000, micro_steps=2),
        StepRecord(2, 1.5, {"data": 0.75, "forward": 0.25, "backward": 0.5}, tokens=1000, micro_steps=2),
    ]


def test_step_statistics_numbers():
    s = step_stats(_steps())
    assert s.timeline == "host" and s.n_steps == 3 and s.irregular == ()  # ordinary jitter is not irregular
    assert s.median_s == 1.5 and s.min_s == 1.0 and s.max_s == 2.0
    assert s.mean_s == pytest.approx(1.5)  # (1 + 2 + 1.5) / 3
    # The typical step: the mean of the regular steps (here all three) = the sum of the phases' means.
    assert s.step_s == pytest.approx(1.5) and s.step_s == pytest.approx(sum(p.seconds for p in s.phases.values()))
    assert s.typical == (0, 1, 2)
    assert s.tokens_per_s == pytest.approx(1000 / 1.5) and s.tokens_per_step == 1000 and s.micro_steps == 2
    assert s.phases["data"].seconds == pytest.approx(0.75) and s.seconds("data") == pytest.approx(0.75)
    assert s.phases["data"].share == pytest.approx(0.75 / 1.5) and s.share("data") == s.phases["data"].share
    assert sum(p.share for p in s.phases.values()) == pytest.approx(1.0)
    assert s.phases["h2d"].seconds == 0.0  # every phase name is present
    assert "eval" not in s.phases  # eval only when measured
    assert s.p10_s == pytest.approx(1.1) and s.p90_s == pytest.approx(1.9)  # numpy's linear quantiles
    assert s.spread == pytest.approx((1.9 - 1.1) / 1.5)
    assert s.irregular_cost_s == 0.0 and s.run_tokens_per_s == pytest.approx(s.tokens_per_s)


def test_profile_stats_are_derived_from_its_steps_and_cached():
    prof = P.Profile(run={"mode": "builtin"}, steps=_steps())
    assert prof.stats == step_stats(_steps()) and prof.stats is prof.stats
    assert P.Profile(run={}, steps=[]).stats is None


def test_an_irregular_step_is_left_out_of_the_typical_step_and_named():
    steps = [StepRecord(i, 1.0 + 0.01 * i, {"data": 0.2, "forward": 0.3, "backward": 0.5 + 0.01 * i}, tokens=1000)
             for i in range(7)]
    steps.append(StepRecord(7, 4.0, {"data": 3.2, "forward": 0.3, "backward": 0.5}, tokens=1000))  # a 3 s pause
    s = step_stats(steps)
    assert [st.index for st in s.irregular] == [7] and s.typical == tuple(range(7))
    typical = sum(1.0 + 0.01 * i for i in range(7)) / 7
    assert s.step_s == pytest.approx(typical) == pytest.approx(sum(p.seconds for p in s.phases.values()))
    assert s.mean_s == pytest.approx((typical * 7 + 4.0) / 8) and s.median_s == pytest.approx(1.035)
    assert s.irregular_cost_s == pytest.approx(s.mean_s - s.step_s)
    st = s.irregular[0]
    assert st.seconds == 4.0 and st.times_typical == pytest.approx(4.0 / typical)
    assert st.phase == "data" and st.phase_extra_s == pytest.approx(3.0)
    assert s.tokens_per_s == pytest.approx(1000 / typical) and s.run_tokens_per_s == pytest.approx(1000 / s.mean_s)
    # Half the steps slow is the run's normal, not a pause: no step is irregular then.
    half = [StepRecord(i, 4.0 if i % 2 else 1.0, {"forward": 4.0 if i % 2 else 1.0}) for i in range(6)]
    assert step_stats(half).irregular == () and step_stats(half).step_s == pytest.approx(2.5)
    # Fewer than 3 steps: none is irregular.
    assert step_stats(steps[-2:]).irregular == ()


def test_step_stats_use_gpu_timeline_when_every_step_has_one():
    steps = [StepRecord(0, 1.2, {"forward": 1.2}, gpu_s=1.0, gpu_phases={"forward": 0.9, "data": 0.1})]
    s = step_stats(steps)
    assert s.timeline == "gpu" and s.step_s == pytest.approx(1.0) and s.median_s == 1.0
    assert s.phases["data"].idle_exposed_s == pytest.approx(0.1)
    assert s.phases["forward"].host_seconds == 1.2 and s.host_step_s == 1.2
    assert s.phases["forward"].idle_exposed_s is None  # only host-only phases expose GPU idle time
    # One step without its GPU timeline puts the run on host wall time.
    mixed = steps + [StepRecord(1, 1.3, {"forward": 1.3})]
    assert step_stats(mixed).timeline == "host"


def test_round_trip(tmp_path):
    from gpuprof.analysis.pipeline import Analysis, analyze

    prof = P.Profile(run={"mode": "builtin", "config": {"batch_size": 4}}, steps=_steps())
    analysis = analyze(prof)
    path = tmp_path / "run.gpuprof.json"
    P.save(prof, path, analysis.to_dict())
    again, stored = P.read(path)
    assert again.to_dict() == prof.to_dict() == {k: v for k, v in json.loads(prof.to_json()).items()}
    assert again.schema_version == P.SCHEMA_VERSION == 2
    assert "summary" not in again.to_dict() and "findings" not in again.to_dict()
    assert stored == json.loads(json.dumps(analysis.to_dict()))
    assert Analysis.from_dict(stored, again).findings == analysis.findings
    assert P.load(path).to_dict() == again.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["run.gpuprof.json"]  # no temp leftovers
    # Saved without an analysis: read gives None for it.
    P.save(prof, path)
    assert P.read(path)[1] is None


def test_a_schema_1_file_loads_without_what_it_derived(tmp_path):
    prof = P.Profile(run={"mode": "builtin"}, steps=_steps(), measurements={"host": {"available": False}})
    old = {**prof.to_dict(), "schema_version": 1, "summary": {"step_s": 99.0},
           "findings": [{"id": "x", "title": "t", "saving_s": 1.0, "saving_share": 0.5}]}
    old["measurements"] = {**old["measurements"], "distributed": {"ranks": []}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    again, stored = P.read(path)
    assert stored is None and again.schema_version == 2
    assert again.measurements == {"host": {"available": False}}  # measured kept, derived dropped
    assert again.stats.step_s == pytest.approx(1.5)  # derived again from the steps


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ('{"hello": 1}', "not a gpuprof profile"),
        ('[1, 2]', "not a gpuprof profile"),
        ('{"schema_version": 99, "tool": {"name": "gpuprof"}}', "newer than this gpuprof"),
        ('{"schema_version": 1, "tool": {"name": "gpuprof"}, "steps": [{"index": 0}]}', "malformed"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(GpuprofError, match=message) as exc:
        P.load(path)
    assert "\n" not in str(exc.value)


def test_missing_file(tmp_path):
    with pytest.raises(GpuprofError, match="no such file"):
        P.load(tmp_path / "nope.json")


@pytest.mark.parametrize("content", ['{"schema_version": 1, "tool": "x"}',
                                     '{"schema_version": 1, "tool": {"name": "gpuprof"}, "steps": [{"index": 0, "wall_s": 1, "phases": {}, "gpu_s": "x"}]}'])
def test_wrongly_typed_fields_are_one_line_errors(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(GpuprofError):
        P.load(path)


def test_what_ran_says_not_measured_for_unknown_dims():
    from rich.console import Console

    from gpuprof.analysis.pipeline import analyze
    from gpuprof.profile import Profile
    from gpuprof.render.terminal import render_diagnosis

    prof = Profile(run={"mode": "script", "command": ["train.py"],
                        "config": {"model": "LitGPT (script)", "model_dims": {"vocab_size": 256}}}, steps=[])
    console = Console(width=120, record=True)
    render_diagnosis(prof, analyze(prof), console, details=True)  # what ran: in --details
    text = console.export_text()
    assert "None" not in text and "n_layer=not measured" in text and "vocab_size=256" in text
    assert "no complete measured step: nothing to report" in text
