"""Log parsing and what a log alone implies (FACTS.md's H200 case); the other formats' line
parsing is tested in tests/script/test_step_logs.py."""

from pathlib import Path

import pytest

from gpuprof.analysis.logs import analyze_log
from gpuprof.steplog import IterLine, StepLine, parse_line
from gpuprof.errors import GpuprofError

FIX = Path(__file__).parent / "fixtures"
H200_LOG = FIX / "nanogpt_h200_21s_mfu164.log"
FACTS_CFG = dict(batch_size=16, block_size=1024, gradient_accumulation_steps=64)


def test_parse_line_keeps_its_api():
    rec = parse_line("iter 10: loss 4.2345, time 21000.12ms, mfu 104.33%")
    assert rec == StepLine("nanogpt", 10, 4.2345, 21000.12, None, 104.33)
    assert IterLine is StepLine  # the runner's name for it
    assert rec.to_dict() == {"format": "nanogpt", "step": 10, "loss": 4.2345, "step_ms": 21000.12,
                             "tokens_per_s": None, "mfu_pct": 104.33}
    assert parse_line("hello") is None


def test_facts_case_implies_1_5b_params_and_a_third_of_the_printed_mfu():
    r = analyze_log(H200_LOG, gpu="h200", config=FACTS_CFG)
    assert r.iter_lines == 10 and r.eval_lines == 1
    assert r.step_s_median == pytest.approx(21.0, abs=0.01)
    assert r.reported_mfu_pct == pytest.approx(164.12, abs=0.01)
    assert r.tokens_per_step == 1048576
    # FLOPs per step from the printed mfu and nanoGPT's A100 constant.
    assert r.flops_per_step == pytest.approx(1.6412 * 312e12 * 21.0, rel=1e-3)
    assert r.nearest_gpt2 == "gpt2-xl"
    assert 1.4e9 < r.implied_params < 1.7e9
    assert r.true_mfu == pytest.approx(1.6412 * 312 / 989.5, rel=1e-3)  # ≈ 0.517, 1/3.17 of printed
    assert r.floor_s == pytest.approx(10.87, abs=0.02)
    assert r.expected_step_s["60%"] == pytest.approx(r.floor_s / 0.6)
    assert r.verdict.id == "healthy"
    causes = [m.cause for m in r.misreport]
    assert causes == ["a100_constant", "impossible"]
    # The FACTS table: the same 21 s for GPT-2 124M would be 4.3% true MFU.
    row = {x.model: x for x in r.size_table}
    assert row["gpt2"].true_mfu_at_step == pytest.approx(0.043, abs=0.001)
    assert row["gpt2"].nanogpt_mfu_at_step == pytest.approx(0.137, abs=0.001)
    assert row["gpt2-medium"].floor_s == pytest.approx(2.57, abs=0.01)


def test_config_dims_give_exact_size_and_a_consistency_check(tmp_path):
    cfg = dict(FACTS_CFG, n_layer=48, n_head=25, n_embd=1600, vocab_size=50304)
    r = analyze_log(H200_LOG, gpu="NVIDIA H200", config=cfg)
    assert r.implied_params_method == "config n_layer/n_embd"
    assert r.implied_params == pytest.approx(1.556e9, rel=0.01)
    assert r.config_consistency == pytest.approx(1.0, abs=0.01)
    # A 124M config with the same log cannot be right: flagged.
    small = dict(FACTS_CFG, n_layer=12, n_head=12, n_embd=768)
    r = analyze_log(H200_LOG, gpu="h200", config=small)
    assert any("tokens per step or world_size differ" in w for w in r.warnings)


def test_log_without_mfu_uses_config_flops_and_flags_slow_step(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"iter {i}: loss 3.0, time 21000.00ms\n" for i in range(1, 6)))
    cfg = dict(FACTS_CFG, n_layer=12, n_head=12, n_embd=768)
    r = analyze_log(log, gpu="h200", config=cfg)
    assert r.reported_mfu_pct is None and r.flops_source.startswith("config")
    assert r.true_mfu == pytest.approx(0.0432, abs=0.001)
    assert r.verdict.id == "slow" and r.misreport == ()


def test_no_gpu_means_no_true_mfu_but_still_flops(tmp_path):
    r = analyze_log(H200_LOG, config=FACTS_CFG)
    assert r.true_mfu is None and r.floor_s is None and r.flops_per_step > 0
    assert any("--gpu" in w for w in r.warnings)
    r = analyze_log(H200_LOG, gpu="h200")  # no config: no tokens, no model size
    assert r.implied_params is None and r.true_mfu == pytest.approx(0.5174, abs=1e-3)
    r = analyze_log(H200_LOG, peak_tflops=1000.0, config=FACTS_CFG)
    assert r.peak_source == "--peak-tflops" and r.true_mfu == pytest.approx(1.6412 * 0.312, rel=1e-3)


def test_world_size_divides_accumulation(tmp_path):
    r = analyze_log(H200_LOG, gpu="h200", config=dict(FACTS_CFG, world_size=8))
    assert r.tokens_per_step == 16 * 1024 * 8 and r.world_size == 8


def test_invalid_logs_are_user_errors(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("step 0: train loss 10.9, val loss 10.9\nsomething else\n")
    with pytest.raises(GpuprofError, match="no nanoGPT iteration lines .* no step times in another known format"):
        analyze_log(empty)
    with pytest.raises(GpuprofError, match="no such file"):
        analyze_log(tmp_path / "missing.log")
    with pytest.raises(GpuprofError, match="not a number"):
        analyze_log(H200_LOG, config={"batch_size": "sixteen", "block_size": 1024})


def test_build_nanogpt_log_skips_step_0_and_uses_no_printed_mfu(tmp_path):
    log = tmp_path / "build.log"
    dts = [9000.0, 2000.0, 2100.0, 1900.0, 2050.0]  # step 0 compiles: left out of the median
    log.write_text("".join(f"step {i:5d} | loss: 4.5 | lr 6.0000e-04 | norm: 1.2000 | dt: {dt:.2f}ms | "
                           f"tok/sec: {524288 / dt * 1e3:,.2f}\n" for i, dt in enumerate(dts))
                   + "validation loss: 4.4000\nHellaSwag accuracy: 2500/10042=0.2490\n")
    cfg = dict(tokens_per_step=524288, n_layer=12, n_head=12, n_embd=768)
    r = analyze_log(log, gpu="h200", config=cfg)
    assert r.format == "build-nanogpt" and r.iter_lines == 5 and r.steady_lines == 4
    assert r.first_iter == 0 and r.last_iter == 4
    assert r.step_s_median == pytest.approx(2.025)  # median of 2000, 2100, 1900, 2050 ms
    assert r.tokens_per_s_printed == pytest.approx(524288 / 2.025, rel=1e-3)
    assert r.reported_mfu_pct is None and r.flops_source.startswith("config")
    assert r.misreport == ()


def test_llmc_log_skips_its_first_step_1(tmp_path):
    log = tmp_path / "llmc.log"
    ms = [5000.0, 140.0, 150.0, 145.0]  # llm.c prints step+1: its slow first step is `step 1`
    log.write_text("".join(f"step {i + 1:4d}/10 | train loss 3.100000 | norm 1.0000 | lr 6.00e-04 | "
                           f"({m:.2f} ms | {524288 / m * 1e3:.0f} tok/s)\n" for i, m in enumerate(ms))
                   + "val loss 3.05\n")
    r = analyze_log(log)
    assert r.format == "llm.c" and r.steady_lines == 3
    assert r.step_s_median == pytest.approx(0.145)


def test_hf_trainer_log_has_only_a_whole_run_average(tmp_path):
    log = tmp_path / "hf.log"
    log.write_text("{'loss': 2.5, 'grad_norm': 1.1, 'learning_rate': 5e-05, 'epoch': 0.5}\n"
                   "{'eval_loss': 2.4, 'eval_runtime': 3.0, 'eval_steps_per_second': 9.9, 'epoch': 1.0}\n"
                   "{'train_runtime': 40.0321, 'train_samples_per_second': 3.997, "
                   "'train_steps_per_second': 0.25, 'train_loss': 2.3, 'epoch': 1.0}\n")
    r = analyze_log(log)
    # 0.25 steps/s over 40.0321 s: 10 steps, so 4.00321 s each (not 1/0.25 = 4 s)
    assert r.format == "hf-trainer" and r.iter_lines == 1
    assert r.step_s_median == pytest.approx(4.00321)
    assert any("whole-run average" in w for w in r.warnings)
    log.write_text("{'loss': 2.5, 'grad_norm': 1.1, 'learning_rate': 5e-05, 'epoch': 0.5}\n")
    with pytest.raises(GpuprofError, match="no step times"):  # per-step dicts carry no time
        analyze_log(log)
