"""`gpuprof export`: the hand-off to the renderers, output checks before anything is written,
one-line errors, the fallback file when a write fails."""

import json

from typer.testing import CliRunner

import gpuprof.cli.export  # noqa: F401 - registers the verb (until gpuprof/cli/__init__.py imports it)
from gpuprof import profile as profile_io
from gpuprof.analysis.pipeline import Analysis, analyze
from gpuprof.cli import app
from gpuprof.render.html import render_html
from gpuprof.render.trace import render_trace

runner = CliRunner()


def _one_line_error(res, text):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and text in err, err


def test_export_writes_the_trace_and_the_page_from_the_stored_findings(builtin_profile, builtin_analysis,
                                                                      tmp_path):
    from dataclasses import replace

    from gpuprof.analysis.findings import Finding

    src = tmp_path / "run.gpuprof.json"
    # The stored analysis, with a finding the rules would not make: export renders what was saved.
    stored = replace(builtin_analysis, findings=builtin_analysis.findings + (
        Finding(id="stored-only", title="a finding only the saved analysis has", saving_s=None,
                saving_share=None, evidence={}, kind="info"),))
    profile_io.save(builtin_profile, src, stored.to_dict())
    trace, page = tmp_path / "t.json", tmp_path / "r.html"
    res = runner.invoke(app, ["export", str(src), "--trace", str(trace), "--html", str(page)])
    assert res.exit_code == 0, res.output
    assert f"trace written to {trace}" in res.stdout and f"HTML report written to {page}" in res.stdout
    loaded, saved = profile_io.read(src)
    analysis = Analysis.from_dict(saved, loaded)
    assert analysis.finding("stored-only") is not None
    assert json.loads(trace.read_text()) == render_trace(loaded, analysis)
    assert page.read_text(encoding="utf-8") == render_html(loaded, analysis)
    ids = [e["args"]["id"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "i"]
    assert ids == [f.id for f in stored.findings]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "run.gpuprof.json", "t.json"]  # no temp left


def test_a_profile_saved_without_an_analysis_is_analysed(builtin_profile, tmp_path):
    data = builtin_profile.to_dict()
    assert "analysis" not in data and "findings" not in data
    src = tmp_path / "bare.json"
    src.write_text(json.dumps(data))
    trace = tmp_path / "t.json"
    res = runner.invoke(app, ["export", str(src), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    ids = [e["args"]["id"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "i"]
    assert ids == [f.id for f in analyze(profile_io.load(src)).findings]
    assert "dominant-phase" in ids  # every run with phases has at least that one


def test_nothing_to_export_is_a_one_line_error(builtin_profile, tmp_path):
    src = tmp_path / "run.json"
    profile_io.save(builtin_profile, src)
    _one_line_error(runner.invoke(app, ["export", str(src)]), "give --trace FILE.json and/or --html FILE.html")


def test_bad_inputs_and_outputs_are_refused_before_writing(builtin_profile, tmp_path):
    src = tmp_path / "run.json"
    profile_io.save(builtin_profile, src)
    _one_line_error(runner.invoke(app, ["export", str(tmp_path / "nope.json"), "--html", str(tmp_path / "r.html")]),
                    "no such file")
    _one_line_error(runner.invoke(app, ["export", str(src), "--html", str(tmp_path / "no" / "r.html")]),
                    "--html: cannot write")
    same = str(tmp_path / "x.out")
    _one_line_error(runner.invoke(app, ["export", str(src), "--trace", same, "--html", same]), "both name")
    _one_line_error(runner.invoke(app, ["export", str(src), "--trace", str(src)]), "is this run's profile")
    not_json = tmp_path / "notes.txt"
    not_json.write_text("hello")
    _one_line_error(runner.invoke(app, ["export", str(not_json), "--trace", str(tmp_path / "t.json")]),
                    "not valid JSON")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run.json"]


def test_malformed_ranks_are_a_one_line_error(builtin_profile, tmp_path):
    bad_ranks = [
        ({"schema_version": 1, "steps": [{"index": 0}]}, "rank 0: not a gpuprof profile"),  # not even a profile
        # A schema-1 rank profile with a step without its times: refused naming the rank, not a traceback.
        ({"schema_version": 1, "tool": {"name": "gpuprof"}, "steps": [{"index": 0}]}, "rank 0: malformed"),
    ]
    for bad_rank, message in bad_ranks:
        src = tmp_path / "merged.json"
        data = builtin_profile.to_dict()
        data["ranks"] = [{"rank": 0, "status": "ok", "profile": bad_rank}]
        src.write_text(json.dumps(data))
        res = runner.invoke(app, ["export", str(src), "--trace", str(tmp_path / "t.json")])
        _one_line_error(res, message)
        assert not (tmp_path / "t.json").exists()


def test_a_failed_write_goes_to_a_fallback_file_and_exits_3(builtin_profile, tmp_path, monkeypatch):
    import errno

    import gpuprof.files as files

    src = tmp_path / "run.json"
    profile_io.save(builtin_profile, src)
    monkeypatch.chdir(tmp_path)
    real, calls = files.atomic_write, []

    def flaky(path, data, overwrite=True):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, overwrite=overwrite)

    monkeypatch.setattr(files, "atomic_write", flaky)
    page = tmp_path / "r.html"
    res = runner.invoke(app, ["export", str(src), "--html", str(page)])
    assert res.exit_code == 3, res.output
    rescued = next(tmp_path.glob("r.rescued-*.html"))
    assert f"saved it to {rescued} instead" in res.stderr and not page.exists()
    assert rescued.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
