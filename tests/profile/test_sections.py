"""The typed view of a Profile's measurements (gpuprof.sections): written and read back, the
file is byte for byte what it was; each section reads its producer's dict tolerantly."""

import dataclasses
import hashlib
import json
import types
from pathlib import Path

import pytest

from gpuprof import profile as P
from gpuprof.sections import (SECTION_TYPES, CommSection, HostSection, NvmlSection, ProbeSection, Record,
                              ScriptSection, Section, Sections)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA1 = sorted(FIXTURES.glob("schema1_*.gpuprof.json"))

# sha256 of Profile.to_json() of each schema-1 fixture as loaded, taken before gpuprof.sections
# existed: the typed view must never change what a Profile writes.
TO_JSON_SHA256 = {
    "schema1_builtin_cpu_tiny.gpuprof.json": "af62694cd59e0681211e69fd9bb59a9058c4b3079a1f3184e942fc1d2084ecaa",
    "schema1_ddp2_straggler_rank1.gpuprof.json": "391ea3061dfe67725f485da35874b12b7313a0a17ea989094f0946f2c0b44a3f",
    "schema1_nanogpt_script_data_delay.gpuprof.json": "300e60e2483ff04d08a3eee0593d3d15777e0c20a27774ce8948f8788270935e",
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.mark.parametrize("path", SCHEMA1, ids=lambda p: p.name.split(".")[0])
def test_to_json_of_a_loaded_fixture_is_byte_for_byte_what_it_was(path):
    prof = P.load(path)
    assert _sha(prof.to_json()) == TO_JSON_SHA256[path.name]


# ------------------------------------------------------------------------------------ helpers
def _empty(rec) -> bool:
    """Every figure of a record is None (an empty container, an empty nested record)."""
    for f in dataclasses.fields(rec):
        if f.name in ("raw", "not_measured"):
            continue
        v = getattr(rec, f.name)
        if isinstance(v, Record):
            if not _empty(v):
                return False
        elif v not in (None, {}, [], ()):
            return False
    return True


def _every_accessor(s: Sections) -> None:
    """Read every typed figure the readers use (nothing may write into the profile)."""
    for name in SECTION_TYPES:
        sec = getattr(s, name)
        repr(sec)
    for key in ("cpu_pct", "own_cpu_cores", "proc_cpu_pct", "others_cpu_cores"):
        s.host.mean(key), s.host.stat(key).max
        for phase in ("data", "forward", "nope"):
            s.host.phase(phase, key), s.nvml.phase(phase, key)
    s.nvml.first.name, s.nvml.throttle("hw_slowdown")
    s.probe.precisions.rate("bf16"), s.probe.precisions.switch.to
    s.script.count("dataloader_next"), s.script.top_function("data"), s.script.reported.step_ms_median
    s.microbatch.seconds_by_batch(), s.unmeasured()


# ------------------------------------------------------------------- the file does not change
@pytest.mark.parametrize("path", SCHEMA1, ids=lambda p: p.name.split(".")[0])
def test_reading_the_sections_changes_nothing_in_the_profile(path):
    prof = P.load(path)
    before = prof.to_json()
    s = prof.sections
    _every_accessor(s)
    assert prof.to_json() == before and _sha(before) == TO_JSON_SHA256[path.name]
    # each section's raw dict is the producer's own object, not a copy
    for name in SECTION_TYPES:
        if name in prof.measurements:
            assert getattr(s, name).raw is prof.measurements[name]
    assert s.raw is prof.measurements


# --------------------------------------------------------------- real sections (schema 1 files)
def _fixture(stem: str) -> P.Profile:
    return P.load(FIXTURES / f"schema1_{stem}.gpuprof.json")


def test_the_builtin_cpu_fixture_reads_typed():
    prof = _fixture("builtin_cpu_tiny")
    m, s = prof.measurements, prof.sections
    host = m["host"]
    assert s.host.available is True and s.host.cpu_count == host["cpu_count"]
    assert s.host.mean("cpu_pct") == host["summary"]["cpu_pct"]["mean"]
    assert s.host.stat("cpu_pct").max == host["summary"]["cpu_pct"]["max"]
    for phase, entry in host["phases"].items():
        assert s.host.phases[phase].samples == entry["samples"]
        assert s.host.phase(phase, "cpu_pct") == (entry["cpu_pct"] if entry["samples"] else None)
    assert s.host.timeline is host["timeline"]
    probe = m["probe"]
    assert (s.probe.tflops, s.probe.dtype, s.probe.method) == (probe["tflops"], probe["dtype"], probe["method"])
    prec = probe["precisions"]
    assert s.probe.precisions.tflops == prec["tflops"] and s.probe.precisions.m == prec["m"]
    assert [(x.k, x.n) for x in s.probe.precisions.shapes] == [(x["k"], x["n"]) for x in prec["shapes"]]
    sw = s.probe.precisions.switch
    assert (sw.from_, sw.to, sw.ratio) == (prec["switch"]["from"], prec["switch"]["to"], prec["switch"]["ratio"])
    assert sw.not_measured is None and sw.present
    fl = m["flops"]
    assert (s.flops.used, s.flops.analytic_per_step, s.flops.counted_per_step, s.flops.agreement) == (
        fl["used"], fl["analytic_per_step"], fl["counted_per_step"], fl["agreement"])
    mb = m["microbatch"]
    assert s.microbatch.fixed_s == mb["fixed_s"] and s.microbatch.per_sample_s == mb["per_sample_s"]
    assert s.microbatch.seconds_by_batch() == {p["batch_size"]: p["seconds"] for p in mb["points"]}
    st = m["storage"]
    assert s.storage.filesystem.kind == st["filesystem"]["kind"] and s.storage.fits_in_ram == st["fits_in_ram"]
    assert s.storage.residency_start.fraction == st["residency_start"]["fraction"]
    assert s.storage.data_path == st["data_path"]
    pr = m["post_run"]
    assert s.post_run.budget_s == pr["budget_s"] and set(s.post_run.parts) == set(pr["parts"])
    assert s.post_run.parts["probe"].allotted_s == pr["parts"]["probe"]["allotted_s"]
    # sections this profile does not have: present False, every figure None
    for name in ("nvml", "script", "memory", "syncs", "copies", "timer", "comm"):
        sec = getattr(s, name)
        assert not sec.present and sec.not_measured is None and _empty(sec), name


def test_the_script_fixture_reads_typed():
    prof = _fixture("nanogpt_script_data_delay")
    sc, s = prof.measurements["script"], prof.sections.script
    assert s.counts is sc["hooks"]["counts"]
    assert s.count("dataloader_next") == sc["hooks"]["counts"]["dataloader_next"]
    assert s.count("no such hook") == 0
    assert s.h2d_note == sc["hooks"]["h2d_note"]
    top = sc["top_functions"]["data"][0]
    t = s.top_function("data")
    assert (t.function, t.file, t.line, t.hot_line, t.share) == (
        top["function"], top["file"], top["line"], top["hot_line"], top["share"])
    assert list(s.top_functions) == list(sc["top_functions"]) and s.top_function("eval") is None
    rep = sc["reported"]
    assert (s.reported.format, s.reported.lines, s.reported.step_ms_median, s.reported.step_ms_source) == (
        rep["format"], rep["lines"], rep["step_ms_median"], rep["step_ms_source"])
    assert s.reported.mfu_pct_median is None and s.reported.first_step_ms is None
    samp = sc["sampler"]
    assert (s.sampler.interval_s, s.sampler.samples, s.sampler.misses) == (
        samp["interval_s"], samp["samples"], samp["misses"])
    assert s.eval_forwards is None  # older profiles kept it; this one does not


def test_the_ddp_fixture_reads_comm_typed():
    prof = _fixture("ddp2_straggler_rank1")
    c, s = prof.measurements["comm"], prof.sections.comm
    assert (s.backend, s.clock, s.bytes_per_round, s.busbw_Bps) == (
        c["backend"], c["clock"], c["bytes_per_round"], c["busbw_Bps"])
    assert s.link is c["link"] and len(s.per_step) == len(c["per_step"])
    for mine, theirs in zip(s.per_step, c["per_step"]):
        assert (mine.index, mine.rounds, mine.in_flight_s, mine.exposed_s) == (
            theirs["index"], theirs["rounds"], theirs["in_flight_s"], theirs["exposed_s"])
        # a count stored as an int stays an int (the figures are kept as stored)
        assert type(mine.extra_rounds_exposed_s) is type(theirs["extra_rounds_exposed_s"])
    # every rank's own profile has its comm section too
    for entry in prof.ranks:
        rp = P.rank_profile(entry)
        assert rp.sections.comm.per_step and rp.sections.comm.not_measured is None


# --------------------------------------------------------------------- empty and unmeasured
@pytest.mark.parametrize("given", [None, {}, "garbage", 3, []])
def test_no_section_reads_as_an_empty_one(given):
    for name, cls in SECTION_TYPES.items():
        sec = cls.from_dict(given)
        assert isinstance(sec, Section) and not sec.present and sec.not_measured is None
        assert _empty(sec), name
    s = Sections.from_measurements(given)
    assert not s.present and s.unmeasured() == []
    for name, cls in SECTION_TYPES.items():
        assert isinstance(getattr(s, name), cls) and _empty(getattr(s, name))


def test_a_not_measured_section_keeps_its_reason_and_no_figure():
    for name, cls in SECTION_TYPES.items():
        sec = cls.from_dict({"not_measured": f"{name} failed: RuntimeError: boom"})
        assert sec.present and sec.not_measured == f"{name} failed: RuntimeError: boom"
        assert _empty(sec), name
    # a failed square probe keeps the precisions it did measure
    probe = ProbeSection.from_dict({"tflops": None, "dtype": "bf16", "not_measured": "no time left",
                                    "precisions": {"tflops": {"bf16": 100.0}, "switch": {"not_measured": "too slow"}}})
    assert probe.not_measured == "no time left" and probe.tflops is None
    assert probe.precisions.rate("bf16") == 100.0 and probe.precisions.switch.not_measured == "too slow"
    assert probe.precisions.switch.ratio is None


def test_unmeasured_lists_every_reason_in_the_profile_order():
    s = Sections.from_measurements({"probe": {"not_measured": "a"}, "host": {"available": True},
                                    "opened": {"not_measured": "b"}, "comm": {"not_measured": ""}})
    assert s.unmeasured() == [("probe", "a"), ("opened", "b")]  # untyped sections too; no empty reason


def test_accessors_return_none_for_missing_figures():
    host = HostSection.from_dict({"available": True, "summary": {"cpu_pct": None},
                                  "phases": {"data": {"samples": 0, "cpu_pct": 50.0},
                                             "forward": {"samples": 3, "cpu_pct": None}}})
    assert host.mean("cpu_pct") is None and host.mean("never") is None and host.stat("x").max is None
    assert host.phase("data", "cpu_pct") is None  # no sample fell in it
    assert host.phase("forward", "cpu_pct") is None and host.phase("eval", "cpu_pct") is None
    assert host.cpu_count is None and host.cost.share_of_one_core is None and host.timeline is None
    nv = NvmlSection.from_dict({"available": True, "gpus": [{}]})
    assert nv.first.name is None and nv.first.memory_total_bytes is None
    assert nv.throttle("hw_slowdown") is None and nv.throttle_share == {}
    assert NvmlSection.from_dict({}).first.name is None
    probe = ProbeSection.from_dict({"tflops": 5.0})
    assert probe.precisions.rate("bf16") is None and probe.precisions.switch.to is None
    script = ScriptSection.from_dict({"hooks": {}})
    assert script.top_function("data") is None and script.sampler is None and script.reported.lines is None
    assert CommSection.from_dict({"per_step": "x"}).per_step == ()


def test_a_value_of_the_wrong_kind_reads_as_none():
    host = HostSection.from_dict({"available": True, "cpu_count": "4", "summary": {"cpu_pct": {"mean": "high"}},
                                  "phases": {"data": {"samples": 2, "cpu_pct": True}}, "timeline": []})
    assert host.cpu_count is None and host.mean("cpu_pct") is None and host.phase("data", "cpu_pct") is None
    assert host.timeline is None
    probe = ProbeSection.from_dict({"precisions": {"tflops": {"bf16": "fast", "fp32": 1}}, "dtype": 16})
    assert probe.precisions.tflops == {"fp32": 1} and probe.dtype is None


def test_numbers_are_kept_as_stored():
    host = HostSection.from_dict({"cpu_count": 8, "summary": {"cpu_pct": {"mean": 50, "n": 3}}})
    assert type(host.cpu_count) is int and type(host.mean("cpu_pct")) is int


def test_sections_of_any_object_with_measurements_and_a_profile_view_is_current():
    ns = types.SimpleNamespace(measurements={"script": {"reported": {"lines": 3}}})
    assert Sections.of(ns).script.reported.lines == 3
    prof = _fixture("builtin_cpu_tiny")
    assert Sections.of(prof).host.cpu_count == prof.measurements["host"]["cpu_count"]
    prof.measurements["host"]["cpu_count"] = 64  # a view read after a change sees it
    assert prof.sections.host.cpu_count == 64


# ------------------------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def small_run():
    from gpuprof.measure.instruments import default_instruments
    from gpuprof.runners.builtin import LoopConfig, run_builtin

    cfg = LoopConfig(model="tiny", n_layer=1, n_embd=64, n_head=2, batch_size=4, block_size=64,
                     grad_accum=2, steps=3, warmup=1, device="cpu")
    return run_builtin(cfg, instruments=default_instruments("cpu", None, interval_s=0.02), post_budget_s=4.0)


def test_a_small_real_run_reads_typed_and_writes_back_byte_for_byte(small_run):
    prof = small_run
    text = prof.to_json()
    s = prof.sections
    _every_accessor(s)
    assert prof.to_json() == text
    again = P.Profile.from_dict(json.loads(text))
    assert again.to_json() == text  # load -> to_dict is what was saved
    m = prof.measurements
    assert s.host.available is True and s.host.cpu_count == m["host"]["cpu_count"]
    assert s.host.mean("cpu_pct") == (m["host"]["summary"]["cpu_pct"] or {}).get("mean")
    assert set(s.host.phases) == set(m["host"]["phases"])
    assert s.storage.present and s.post_run.budget_s == m["post_run"]["budget_s"]
    assert s.storage.filesystem.type == m["storage"]["filesystem"]["type"]
    assert s.syncs.present == ("syncs" in m)  # the sync counter reports on CUDA only
    for name in ("probe", "flops", "microbatch"):  # measured, or saying why not
        sec = getattr(s, name)
        assert sec.present and (sec.not_measured is None) == ("not_measured" not in m[name]), name
    if s.flops.not_measured is None:
        assert s.flops.used == m["flops"]["used"]
    assert not s.nvml.present and not s.comm.present and not s.copies.present  # a CPU run
    assert again.sections == s  # the typed view of the file read back is the same


@pytest.mark.parametrize("path", SCHEMA1, ids=lambda p: p.name)
def test_an_older_files_precision_is_read_from_its_config(path):
    """Files written before the precision record was a measurement kept it in run.config.precision:
    the typed section, the compute dtype and the report's precision row read it from there."""
    from gpuprof.analysis.precision import run_compute_dtype
    from gpuprof.report.words import what_ran

    prof = P.load(path)
    stored = prof.run["config"]["precision"]
    assert "precision" not in prof.measurements
    sec = prof.sections.precision
    assert sec.raw is stored and sec.compute_dtype == stored["compute_dtype"]
    assert run_compute_dtype(prof)[0] == ("fp32" if stored["compute_dtype"] == "tf32" else stored["compute_dtype"])
    assert dict(what_ran(prof, prof.stats))["precision"].startswith(f"{stored['compute_dtype']} matmuls (")


def test_the_precision_measurement_wins_over_the_config():
    m = {"precision": {"compute_dtype": "bf16", "autocast_dtype": "bfloat16", "tf32_matmul": False}}
    old = {"precision": {"compute_dtype": "fp32"}}
    s = Sections.from_measurements(m, old)
    assert s.precision.compute_dtype == "bf16" and s.precision.autocast_dtype == "bfloat16"
    assert s.precision.tf32_matmul is False and s.precision.raw is m["precision"]
    assert Sections.from_measurements({}, old).precision.compute_dtype == "fp32"
    assert not Sections.from_measurements({}, None).precision.present
    assert P.Profile(run={"config": old}, steps=[]).sections.precision.compute_dtype == "fp32"
