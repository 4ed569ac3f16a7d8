"""Profile: summary arithmetic, JSON round trip, and validated loading."""

import json

import pytest

from gpuprof import profile as P
from gpuprof.errors import GpuprofError
from gpuprof.profile import StepRecord


def _steps():
    return [
        StepRecord(0, 1.0, {"data": 0.25, "forward": 0.25, "backward": 0.5}, tokens=1000, micro_steps=2),
        StepRecord(1, 2.0, {"data": 1.25, "forward": 0.25, "backward": 0.5}, tokens=1000, micro_steps=2),
        StepRecord(2, 1.5, {"data": 0.75, "forward": 0.25, "backward": 0.5}, tokens=1000, micro_steps=2),
    ]


def test_summary_numbers():
    s = P.summarize(_steps())
    assert s["step_s"] == 1.5 and s["timeline"] == "host"
    assert s["mean_step_s"] == pytest.approx(1.5)  # (1 + 2 + 1.5) / 3
    assert s["tokens_per_s"] == pytest.approx(1000 / 1.5)
    assert s["phases"]["data"]["seconds"] == pytest.approx(0.75)
    assert s["phases"]["data"]["share"] == pytest.approx(0.75 / 1.5)
    assert sum(p["share"] for p in s["phases"].values()) == pytest.approx(1.0)
    assert s["phases"]["h2d"]["seconds"] == 0.0  # every phase name is present
    assert "eval" not in s["phases"]  # eval only when measured


def test_summary_uses_gpu_timeline_when_every_step_has_one():
    steps = [StepRecord(0, 1.2, {"forward": 1.2}, gpu_s=1.0, gpu_phases={"forward": 0.9, "data": 0.1})]
    s = P.summarize(steps)
    assert s["timeline"] == "gpu" and s["step_s"] == 1.0
    assert s["phases"]["data"]["idle_exposed_s"] == pytest.approx(0.1)
    assert s["phases"]["forward"]["host_seconds"] == 1.2


def test_round_trip(tmp_path):
    prof = P.Profile(run={"mode": "builtin", "config": {"batch_size": 4}}, steps=_steps(),
                     summary=P.summarize(_steps()), findings=[{"id": "x", "title": "t", "saving_s": 1.0, "saving_share": 0.5}])
    path = tmp_path / "run.gpuprof.json"
    P.save(prof, path)
    again = P.load(path)
    assert again.to_dict() == json.loads(prof.to_json())
    assert [p.name for p in tmp_path.iterdir()] == ["run.gpuprof.json"]  # no temp leftovers


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


def test_run_header_says_not_measured_for_unknown_dims():
    from rich.console import Console

    from gpuprof.profile import Profile
    from gpuprof.render.terminal import run_header

    prof = Profile(run={"mode": "script", "command": ["train.py"],
                        "config": {"model": "LitGPT (script)", "model_dims": {"vocab_size": 256}}}, steps=[])
    console = Console(width=120, record=True)
    console.print(run_header(prof))
    text = console.export_text()
    assert "None" not in text and "L=not measured" in text and "V=256" in text
