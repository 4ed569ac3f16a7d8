"""The training loop's demand on storage and the headroom verdict: the arithmetic."""

import pytest

from gpuprof.disk.requirement import Need, assess, resolve_need
from gpuprof.errors import GpuprofError


def test_tokens_per_sec_to_reads_and_bytes():
    n = resolve_need(tokens_per_sec=1_075_200)  # block 1024 by default
    assert n.block_size == 1024
    assert n.samples_per_s == pytest.approx(1050)
    assert n.reads_per_s == pytest.approx(1050)
    assert n.bytes_per_read == 2050  # (1024 + 1) uint16 tokens
    assert n.mb_s == pytest.approx(1050 * 2050 / 1e6)  # 2.1525 MB/s


def test_batch_shape_and_step_time():
    # The FACTS.md run: 16 x 1024 x 64 = 1,048,576 tokens per 21 s step
    n = resolve_need(batch_size=16, block_size=1024, grad_accum=64, step_s=21)
    assert n.tokens_per_step == 1_048_576
    assert n.tokens_per_s == pytest.approx(1_048_576 / 21)
    assert n.samples_per_s == pytest.approx(1024 / 21)  # 48.76 samples/s
    assert n.samples_per_step == 1024
    assert n.mb_s == pytest.approx(1024 / 21 * 2050 / 1e6)


def test_grad_accum_defaults_to_one_and_block_size_changes_sample():
    n = resolve_need(batch_size=12, block_size=256, step_s=0.5)
    assert n.tokens_per_s == pytest.approx(12 * 256 / 0.5)
    assert n.bytes_per_read == 514


def test_no_requirement_asked():
    assert resolve_need() is None
    assert resolve_need(batch_size=16, block_size=512) is None


@pytest.mark.parametrize("kwargs,msg", [
    ({"step_s": 2.0}, "--batch-size"),
    ({"grad_accum": 4}, "--step-s"),
    ({"tokens_per_sec": 0}, "positive"),
    ({"tokens_per_sec": -5}, "positive"),
    ({"batch_size": 8, "step_s": 0}, "positive"),
])
def test_bad_requirement_inputs(kwargs, msg):
    with pytest.raises(GpuprofError, match=msg):
        resolve_need(**kwargs)


def _profile(tmp_path, step_s=None, tokens=0, config=None):
    """A saved gpuprof profile: 3 measured steps of `step_s` seconds and `tokens` tokens each (none
    when step_s is None), and the run's config."""
    from gpuprof.profile import Profile, StepRecord, save

    steps = [] if step_s is None else [StepRecord(i, step_s, {"forward": step_s}, tokens=tokens)
                                       for i in range(3)]
    p = tmp_path / "run.gpuprof.json"
    save(Profile(run={"config": config or {}}, steps=steps), p)
    return str(p)


def test_profile_tokens_per_s(tmp_path):
    p = _profile(tmp_path, 20.0, 1_000_000, {"block_size": 512, "batch_size": 16, "grad_accum": 4})
    n = resolve_need(profile=p)
    assert n.tokens_per_s == 50_000 and n.block_size == 512  # at the typical step
    assert n.tokens_per_step == 16 * 512 * 4 and n.step_s == 20.0
    assert n.samples_per_s == pytest.approx(50_000 / 512)


def test_profile_computed_from_shape_when_tokens_missing(tmp_path):
    p = _profile(tmp_path, 2.0, 0, {"block_size": 1024, "batch_size": 8, "grad_accum": 2})
    assert resolve_need(profile=p).tokens_per_s == pytest.approx(8 * 1024 * 2 / 2.0)


def test_command_line_beats_profile(tmp_path):
    p = _profile(tmp_path, 1.0, 50_000, {"block_size": 512})
    assert resolve_need(profile=p).tokens_per_s == 50_000
    n = resolve_need(profile=p, tokens_per_sec=10_000, block_size=1024)
    assert (n.tokens_per_s, n.block_size) == (10_000, 1024)


def test_profile_missing_fields_are_named(tmp_path):
    p = _profile(tmp_path, None, 0, {"block_size": 1024})
    with pytest.raises(GpuprofError, match="no tokens/s measured.*run.config.batch_size.*a measured step"):
        resolve_need(profile=p)
    p2 = _profile(tmp_path, 1.0, 1000, {})
    with pytest.raises(GpuprofError, match="run.config.block_size"):
        resolve_need(profile=p2)


def test_profile_not_json_or_missing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(GpuprofError, match="not valid JSON"):
        resolve_need(profile=str(bad))
    with pytest.raises(GpuprofError, match="no such file"):
        resolve_need(profile=str(tmp_path / "absent.json"))
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(GpuprofError, match="not a gpuprof profile"):
        resolve_need(profile=str(arr))


def _result(qd1=38_000.0, par=120_000.0, cold=150.0, warm=50_000.0):
    entry = lambda iops, size: {"iops": iops, "mb_s": iops * size / 1e6}  # noqa: E731
    return {"settings": {"read_sizes": ["2KiB", "4KiB"]},
            "random": {"2KiB": {"qd1": entry(qd1, 2048), "parallel": entry(par, 2048)}},
            "loader": {"cold": {"samples_per_s": cold, "read_amplification": 4096.0},
                       "warm": {"samples_per_s": warm}}}


def test_assess_headroom_and_verdict_line():
    need = resolve_need(tokens_per_sec=1_075_200)  # 1,050 reads/s
    a = assess(need, _result())
    assert a["headroom"] == pytest.approx(38_000 / 1050)
    assert a["headroom_parallel"] == pytest.approx(120_000 / 1050)
    assert a["loader_cold_headroom"] == pytest.approx(150 / 1050)
    assert a["status"] == "ok" and a["loader_status"] == "too slow"
    assert a["verdict"] == ("needs 2.2 MB/s, 1,050 reads/s; this disk does 38,000 reads/s "
                            "at QD1 → 36× headroom (ok)")
    assert "4,096× read amplification" in a["loader_verdict"]


def test_assess_statuses_and_time_per_step():
    need = Need(tokens_per_s=1024 * 1000, block_size=1024, source="t", step_s=2.0,
                tokens_per_step=1024 * 512)
    assert assess(need, _result(qd1=5000))["status"] == "tight"
    assert assess(need, _result(qd1=1500))["status"] == "marginal"
    a = assess(need, _result(qd1=500, cold=256))
    assert a["status"] == "too slow" and a["headroom"] == pytest.approx(0.5)
    assert a["loader_cold_s_per_step"] == pytest.approx(512 / 256)  # 2 s of reads per step
    assert "2.0 s of reads per step" in a["loader_verdict"]
