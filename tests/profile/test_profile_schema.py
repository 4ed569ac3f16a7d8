"""Schema 1 → 2: files saved by the previous gpuprof (tests/profile/fixtures/: the built-in loop on a
CPU, a nanoGPT script with a data delay, a merged 2-rank DDP run with a straggler) load as a
Profile of measurements only, are judged again by `analyze` to the same top finding, and the
analysis is pure (twice equal, the Profile untouched) and round-trips through a saved file."""

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuprof import profile as P
from gpuprof.analysis.pipeline import Analysis, analyze
from gpuprof.cli import app

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA1 = sorted(FIXTURES.glob("schema1_*.gpuprof.json"))
runner = CliRunner()


def _old(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _frozen(profile) -> str:
    """The whole Profile as text: any change to it, nested dicts included, changes this."""
    return json.dumps(copy.deepcopy(profile.to_dict()), sort_keys=True)


def test_the_three_fixtures_are_there_and_schema_1():
    assert [p.name for p in SCHEMA1] == ["schema1_builtin_cpu_tiny.gpuprof.json",
                                         "schema1_ddp2_straggler_rank1.gpuprof.json",
                                         "schema1_nanogpt_script_data_delay.gpuprof.json"]
    for path in SCHEMA1:
        old = _old(path)
        assert old["schema_version"] == 1 and old["summary"] and old["findings"]


@pytest.mark.parametrize("path", SCHEMA1, ids=lambda p: p.name.split(".")[0])
def test_a_schema_1_file_migrates_to_measurements_only(path):
    old = _old(path)
    prof, stored = P.read(path)
    assert stored is None  # schema 1 kept no analysis of the kind Analysis.from_dict reads
    assert prof.schema_version == P.SCHEMA_VERSION == 2
    d = prof.to_dict()
    # What schema 1 derived is gone (the summary, the findings, a merged run's distributed section) ...
    assert "summary" not in d and "findings" not in d and "analysis" not in d
    assert "distributed" not in prof.measurements
    assert not hasattr(prof, "summary") and not hasattr(prof, "findings")
    # ... what was measured is kept as it was.
    assert d["steps"] == old["steps"] and d["warmup_steps"] == old["warmup_steps"]
    assert d["run"] == old["run"] and d["environment"] == old["environment"] and d["tool"] == old["tool"]
    assert prof.measurements == {k: v for k, v in old["measurements"].items() if k != "distributed"}
    # Every rank of a merged run is migrated too: schema 2, no summary or findings of its own.
    assert len(prof.ranks) == len(old.get("ranks") or [])
    for entry, was in zip(prof.ranks, old.get("ranks") or []):
        rp = entry["profile"]
        assert rp["schema_version"] == 2 and "summary" not in rp and "findings" not in rp
        assert rp["steps"] == was["profile"]["steps"]
        assert {k: v for k, v in entry.items() if k != "profile"} == {k: v for k, v in was.items() if k != "profile"}
        assert P.rank_profile(entry).stats.n_steps == len(rp["steps"])


@pytest.mark.parametrize("path", SCHEMA1, ids=lambda p: p.name.split(".")[0])
def test_the_statistics_derived_again_are_the_ones_the_file_stored(path):
    """These runs were consistent (no irregular step), so the typical step is the old mean step,
    and the median and percentiles of all steps are the old summary's `step_s` (the median) and
    its p10/p90, phase for phase."""
    s = _old(path)["summary"]
    st = P.load(path).stats
    assert st.irregular == () and st.typical == tuple(x["index"] for x in _old(path)["steps"])
    assert st.timeline == s["timeline"] and st.n_steps == s["n_steps"]
    assert st.step_s == pytest.approx(s["mean_step_s"], rel=1e-12)
    assert st.median_s == pytest.approx(s["step_s"], rel=1e-12)
    assert (st.p10_s, st.p90_s) == (pytest.approx(s["step_s_p10"]), pytest.approx(s["step_s_p90"]))
    assert (st.min_s, st.max_s) == (s["step_s_min"], s["step_s_max"])
    assert st.tokens_per_step == s["tokens_per_step"] and st.micro_steps == s["micro_steps"]
    assert set(st.phases) == set(s["phases"])
    for name, e in s["phases"].items():
        assert st.phases[name].seconds == pytest.approx(e["seconds"], rel=1e-12, abs=1e-15), name
        assert st.phases[name].share == pytest.approx(e["share"], rel=1e-12, abs=1e-15), name
    assert st.step_s == pytest.approx(sum(e.seconds for e in st.phases.values()), rel=1e-12)


@pytest.mark.parametrize("path", SCHEMA1, ids=lambda p: p.name.split(".")[0])
def test_analyze_gives_the_files_own_top_finding(path):
    old = _old(path)
    prof = P.load(path)
    a = analyze(prof)
    assert a.findings, "no finding"
    assert a.findings[0].id == old["findings"][0]["id"]
    assert a.stats == prof.stats and a.repairs == ()
    # MFU is judged on the typical step now (the old summary divided by the median step).
    if a.mfu is not None and a.mfu.achieved_tflops and old["summary"]["mfu"].get("achieved_tflops"):
        assert a.mfu.step_s == pytest.approx(prof.stats.step_s)
        was = old["summary"]["mfu"]
        assert a.mfu.achieved_tflops == pytest.approx(was["achieved_tflops"] * was["step_s"] / prof.stats.step_s)
    if prof.ranks:  # the ranks' statistics, measured no more: derived again by the analysis
        was = old["measurements"]["distributed"]
        assert a.distributed.slowest.rank == was["slowest"]["rank"]
        assert [r.rank for r in a.distributed.ranks] == [r["rank"] for r in was["ranks"]]
        assert a.findings[0].title == old["findings"][0]["title"]  # straggler-rank: the job's own rule
    else:
        assert a.distributed is None


@pytest.mark.parametrize("path", SCHEMA1, ids=lambda p: p.name.split(".")[0])
def test_analysing_twice_is_equal_and_never_changes_the_profile(path):
    prof = P.load(path)
    before = _frozen(prof)
    first = analyze(prof)
    assert _frozen(prof) == before
    second = analyze(prof)
    assert _frozen(prof) == before
    assert first == second and first.to_dict() == second.to_dict()
    # With options too (a GPU to divide by): still pure.
    third = analyze(prof, gpu="h200")
    assert _frozen(prof) == before and third.options.gpu == "h200"
    assert analyze(prof, gpu="h200") == third


@pytest.mark.parametrize("path", SCHEMA1, ids=lambda p: p.name.split(".")[0])
def test_a_profile_saved_with_its_analysis_round_trips(path, tmp_path):
    prof = P.load(path)
    a = analyze(prof)
    out = tmp_path / "again.gpuprof.json"
    P.save(prof, out, a.to_dict())
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["schema_version"] == 2 and list(saved) == [
        "schema_version", "tool", "environment", "run", "steps", "warmup_steps", "measurements",
        *(["ranks"] if prof.ranks else []), "analysis"]
    assert saved["analysis"]["findings"][0]["id"] == a.findings[0].id
    assert saved["analysis"]["steps"]["step_s"] == prof.stats.step_s
    again, stored = P.read(out)
    assert again.to_dict() == json.loads(json.dumps(prof.to_dict()))
    back = Analysis.from_dict(stored, again)
    assert back.findings == a.findings
    assert back.stats == a.stats and back.corrected == a.corrected and back.repairs == a.repairs
    assert back.to_dict() == json.loads(json.dumps(a.to_dict()))
    # Judged again from the saved file: the same analysis.
    assert analyze(again) == a


def test_analyze_and_export_of_a_schema_1_file(tmp_path):
    path = FIXTURES / "schema1_nanogpt_script_data_delay.gpuprof.json"
    res = runner.invoke(app, ["analyze", str(path), "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert printed["schema_version"] == 2 and "summary" not in printed and "findings" not in printed
    assert printed["analysis"]["findings"][0]["id"] == _old(path)["findings"][0]["id"]
    # --stored shows a saved analysis: a schema-1 file has none (one line, exit 2).
    res = runner.invoke(app, ["analyze", str(path), "--stored"])
    assert res.exit_code == 2 and "no analysis saved in it" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    # export analyses a schema-1 file first: its findings are the fresh analysis's.
    trace = tmp_path / "t.json"
    res = runner.invoke(app, ["export", str(path), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    ids = [e["args"]["id"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "i"]
    assert ids == [f.id for f in analyze(P.load(path)).findings]
