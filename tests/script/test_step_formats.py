"""The step lines of today's LLM training repositories (gpuprof.steplog_formats): nanochat,
modded-nanogpt, torchtitan and litgpt, each as its own print statement writes it; the lines
that must not count as steps; no format's pattern taking another's lines; the summary beside
gpuprof's step and the log analysis on those formats; one tiny nanochat-style script run through
run_script. The older formats (nanoGPT, build-nanogpt, llm.c, HF Trainer) are in test_step_logs.py."""

import io
import re
import statistics
import textwrap

import pytest

from gpuprof.analysis.logs import analyze_log
from gpuprof.errors import GpuprofError
from gpuprof.runners.script import run_script
from gpuprof.steplog import NO_STEP_TIME, StepLine, parse_line, parse_lines, reported_summary
from gpuprof.steplog_formats import (ITER_RE, _ANSI_RE, _build_nanogpt, _litgpt, _llmc, _modded_nanogpt,
                                     _nanochat, _nanogpt, _torchtitan)

RED, GREEN, ORANGE, TURQ, BLUE, CYAN, MAGENTA, YELLOW, RESET = (
    "\033[31m", "\033[32m", "\033[33m", "\033[36m", "\033[34m", "\033[36m", "\033[35m", "\033[33m", "\033[39m")


def nanochat(step, num_iterations, loss, dt, tok_per_sec, mfu, *, lrm=1.0, eta_str=""):
    """karpathy/nanochat scripts/base_train.py's step line, its f-string as written there."""
    pct_done = 100 * step / num_iterations
    epoch = "1 pq: 0 rg: 160"
    total_training_time = 0.0
    return (f"step {step:05d}/{num_iterations:05d} ({pct_done:.2f}%) | loss: {loss:.6f} | lrm: {lrm:.2f} | "
            f"dt: {dt * 1000:.2f}ms | tok/sec: {tok_per_sec:,} | bf16_mfu: {mfu:.2f} | epoch: {epoch} | "
            f"total time: {total_training_time/60:.2f}m{eta_str}")


def modded(step, train_steps, approx_training_time_ms):
    """KellerJordan/modded-nanogpt train_gpt.py's train line (step is the loop's 0-based index)."""
    return (f"step:{step+1}/{train_steps} train_time:{approx_training_time_ms:.0f}ms "
            f"step_avg:{approx_training_time_ms/(step + 1):.2f}ms")


def torchtitan(step, loss, tps, mfu, *, grad_norm=1.2345, gib=12.34, pct=15.6, tflops=56.78):
    """pytorch/torchtitan torchtitan/components/metrics.py's log line, colours included, after its
    logging prefix (torchtitan/tools/logging.py)."""
    mfu_str = f"{mfu:.2f}%" if mfu is not None else "N/A"
    return ("[titan] 2025-06-01 10:00:00,123 - root - INFO - "
            f"{RED}step: {step:2}  {GREEN}loss: {loss:8.5f}  {ORANGE}grad_norm: {grad_norm:7.4f}  "
            f"{TURQ}memory: {gib:5.2f}GiB({pct:.2f}%)  {BLUE}tps: {round(tps):,}  "
            f"{CYAN}tflops: {tflops:,.2f}  {MAGENTA}mfu: {mfu_str}{RESET}")


def litgpt(iter_, step, loss, iter_time_s, *, is_accumulating=False, val_loss="n/a", epoch=0):
    """Lightning-AI/litgpt litgpt/pretrain.py's fabric.print line."""
    return (f"Epoch {epoch + 1} | iter {iter_} step {step} |"
            f" loss train: {loss:.3f},"
            f" val: {val_loss} |"
            f" iter time: {iter_time_s * 1000:.2f} ms"
            f"{' (step)' if not is_accumulating else ''}"
            f" remaining time: 0:12:34")


# (line, format, step, loss, step_ms, tokens_per_s, mfu_pct, elapsed_ms)
STEP_LINES = [
    # nanochat: the line of the user report, its last step, a CPU run (peak inf: MFU 0.00), earlier
    # copies (`mfu:`, a grad norm), chat_sft/mid_train (no total), and the accepted MFU spellings
    ("step 00012/00040 (30.00%) | loss: 5.436076 | lrm: 0.80 | dt: 157.12ms | tok/sec: 13,041 | bf16_mfu: 41.23 | "
     "epoch: 1 pq: 0 rg: 160 | total time: 0.00m", "nanochat", 12, 5.436076, 157.12, 13041.0, 41.23, None),
    (nanochat(40, 40, 3.1234567, 0.4321, 1_234_567, 48.1, lrm=0.05, eta_str=" | eta: 0.0m"),
     "nanochat", 40, 3.123457, 432.1, 1234567.0, 48.1, None),
    (nanochat(0, 20, 10.98, 21.5, 48, 0.0), "nanochat", 0, 10.98, 21500.0, 48.0, 0.0, None),
    ("step 00007/00100 (7.00%) | loss: 6.543210 | grad norm: 1.2345 | lrm: 1.00 | dt: 98.76ms | tok/sec: 531,234 | "
     "mfu: 39.87 | total time: 0.00m", "nanochat", 7, 6.54321, 98.76, 531234.0, 39.87, None),
    ("step 00012 (30.00%) | loss: 1.234567 | lrm: 0.80 | dt: 157.12ms | tok/sec: 13,041 | mfu: 41.23 | epoch: 1 | "
     "total time: 0.00m", "nanochat", 12, 1.234567, 157.12, 13041.0, 41.23, None),
    ("step 00003/00010 (30.00%) | loss: 4.0 | dt: 100.00ms | tok/sec: 1,000 | fp8_mfu: 52.5", "nanochat", 3, 4.0,
     100.0, 1000.0, 52.5, None),
    ("step 00003/00010 (30.00%) | loss: 4.0 | dt: 100.00ms | tok/sec: 1,000 | mfu: 41.2%", "nanochat", 3, 4.0,
     100.0, 1000.0, 41.2, None),
    # modded-nanogpt: today's line (no loss), and 2024's (train_loss, step_avg nan before step 11)
    (modded(124, 1750, 12345.4), "modded-nanogpt", 125, None, None, None, None, 12345.0),
    ("step:11/3000 train_loss:4.1234 train_time:1234ms step_avg:nanms", "modded-nanogpt", 11, 4.1234, None, None,
     None, 1234.0),
    # torchtitan: today's (colours, logger prefix), MFU N/A under FP8, 2024's `wps:`
    (torchtitan(10, 7.12345, 1234.4, 12.345), "torchtitan", 10, 7.12345, None, 1234.0, 12.35, None),
    (torchtitan(1, 12.0, 512, None), "torchtitan", 1, 12.0, None, 512.0, None, None),
    (f"{CYAN}step:  5  {GREEN}loss:  7.1234  {YELLOW}memory: 12.34GiB(15.60%)  {BLUE}wps: 2,345  "
     f"{MAGENTA}mfu: 10.00%{RESET}", "torchtitan", 5, 7.1234, None, 2345.0, 10.0, None),
    # litgpt: an iteration is a step (iter == step): its time; under gradient accumulation: none
    (litgpt(100, 100, 3.1234, 0.12034), "litgpt", 100, 3.123, 120.34, None, None, None),
    (litgpt(100, 25, 3.1234, 0.12034, val_loss="3.200"), "litgpt", 25, 3.123, None, None, None, None),
    ("iter 100 step 100: loss 3.1234, iter time: 120.34ms (optimizer.step)", "litgpt", 100, 3.1234, 120.34, None,
     None, None),
    ("iter 4 | step 4: loss 3.1234, iter time: 99.00 ms (optimizer.step), remaining time: 1.20 days", "litgpt", 4,
     3.1234, 99.0, None, None, None),
]

NOT_STEP_LINES = [
    "Step 00250 | Validation bpb: 0.812345",  # nanochat's eval
    "step 00012/00040 | Validation bpb: 0.81",
    "step 00012/00040 (30.00%) | Validation bpb: 0.81",
    "Step 00250 | CORE metric: 0.2012",
    "GPU: NVIDIA H100 80GB HBM3 | Peak FLOPS (BF16): 9.89e+14",
    "Total batch size 524,288 => gradient accumulation steps: 1",
    "step 00012/00040 (30.00%) | loss: 5.4 | saved",  # no dt
    "step:125/1750 val_loss:3.2800 train_time:12345ms step_avg:98.76ms",  # modded-nanogpt's eval
    "step:0/1750 val_loss:10.8258 train_time:0ms step_avg:0.04ms",
    f"{YELLOW}validate step: 10  {GREEN}loss:  7.1234  {TURQ}memory: 12.34GiB(15.60%)  {BLUE}tps: 1,234{RESET}",
    "step:  5  loss:  7.1234  memory: 12.34GiB(15.60%)",  # no tokens/s: not torchtitan's line
    "iter 100: val loss 3.1234, val time: 12.34 ms",  # litgpt's eval
    "Final evaluation | val loss: 3.123 | val ppl: 22.713",
    "iter 100 step 25 | saving checkpoint",
]


@pytest.mark.parametrize("line,fmt,step,loss,step_ms,tps,mfu,elapsed", STEP_LINES)
def test_each_format_reads_its_projects_line(line, fmt, step, loss, step_ms, tps, mfu, elapsed):
    rec = parse_line(line)
    assert isinstance(rec, StepLine), line
    assert (rec.format, rec.step) == (fmt, step)
    for got, want in ((rec.loss, loss), (rec.step_ms, step_ms), (rec.tokens_per_s, tps), (rec.mfu_pct, mfu),
                      (rec.elapsed_ms, elapsed)):
        assert got == (want if want is None else pytest.approx(want, rel=1e-9)), (line, got, want)
    assert not rec.whole_run
    assert ("elapsed_ms" in rec.to_dict()) == (elapsed is not None)


@pytest.mark.parametrize("line", NOT_STEP_LINES)
def test_eval_and_other_lines_of_these_projects_are_no_steps(line):
    assert not isinstance(parse_line(line), StepLine), parse_line(line)


PARSERS = {"nanogpt": lambda t: (m := ITER_RE.search(t)) and _nanogpt(m), "build-nanogpt": _build_nanogpt,
           "llm.c": _llmc, "nanochat": _nanochat, "modded-nanogpt": _modded_nanogpt, "torchtitan": _torchtitan,
           "litgpt": _litgpt}
OLDER_LINES = [  # one line of each older format (all of them: test_step_logs.py)
    ("iter 12: loss 4.1234, time 123.45ms, mfu 12.34%", "nanogpt"),
    ("step    12 | loss: 4.123456 | lr 6.0000e-04 | norm: 1.2345 | dt: 123.45ms | tok/sec: 12345.67", "build-nanogpt"),
    ("step 12/100 | train loss 4.1234 | norm 1.2345 | lr 6.00e-04 | (123.45 ms | 12345 tok/s)", "llm.c"),
    ("step    1/74 | loss 11.010906 (+nanz)| norm 15.3672 (+nanz)| lr 8.57e-07 | 2,345.67 ms | 24.3% bf16 MFU | "
     "223611 tok/s", "llm.c"),
]


@pytest.mark.parametrize("line,fmt", [(x[0], x[1]) for x in STEP_LINES] + OLDER_LINES)
def test_no_format_takes_another_formats_line(line, fmt):
    text = _ANSI_RE.sub("", line)
    takers = [name for name, parse in PARSERS.items() if parse(text)]
    assert takers == [fmt], (line, takers)


def test_modded_nanogpt_step_times_come_from_its_running_total():
    # Its clock stops for validation (step 3's eval) and a gap in the lines spreads over its steps.
    lines = ["step:0/20 val_loss:10.8258 train_time:0ms step_avg:0.04ms",
             modded(0, 20, 150.2), modded(1, 20, 250.4), modded(2, 20, 349.3),
             "step:3/20 val_loss:5.0000 train_time:349ms step_avg:116.43ms",
             modded(3, 20, 450.0), modded(5, 20, 650.0)]
    steps, evals = parse_lines(lines)
    assert evals == []
    assert [(s.step, s.step_ms) for s in steps] == [(1, 150.0), (2, 100.0), (3, 99.0), (4, 101.0), (6, 100.0)]
    # The runner hands reported_summary lines parsed one by one: it derives the same times.
    recs = [r for r in map(parse_line, lines) if isinstance(r, StepLine)]
    rep = reported_summary(recs, skip_first=1, gpuprof_step_s=0.1)
    assert rep["format"] == "modded-nanogpt" and rep["lines"] == 5 and rep["skipped_first"] == 1
    assert rep["step_ms_median"] == pytest.approx(100.0) and rep["ratio"] == pytest.approx(1.0)
    # 2024's copies restart the clock at step 10; a log cut after step 1 has no first step.
    steps, _ = parse_lines([f"step:{i}/3000 train_loss:4.0 train_time:{t}ms step_avg:nanms"
                            for i, t in ((10, 9000), (11, 100), (12, 201), (12, 201))])
    assert [s.step_ms for s in steps] == [None, None, 101.0, None]


def _nanochat_lines(dts, mfus):
    return [parse_line(nanochat(i, 40, 5.0 - i / 10, dt, int(524288 / dt), m))
            for i, (dt, m) in enumerate(zip(dts, mfus))]


def test_nanochat_summary_skips_the_warmup_and_reads_separators():
    dts = [21.5, 0.160, 0.150, 0.155, 0.158, 0.152, 0.151]  # step 00000 compiles
    recs = _nanochat_lines(dts, [1.1, 38.0, 40.0, 39.0, 38.5, 39.5, 40.5])
    rep = reported_summary(recs, skip_first=2, gpuprof_step_s=0.1575)
    assert rep["format"] == "nanochat" and rep["lines"] == 7 and rep["skipped_first"] == 2
    assert rep["step_ms_median"] == pytest.approx(statistics.median(d * 1e3 for d in dts[2:]))
    assert rep["tokens_per_s_median"] == pytest.approx(statistics.median(int(524288 / d) for d in dts[2:]))
    assert rep["tokens_per_s_median"] > 1000  # "3,378,000" read whole, not as 3
    assert rep["mfu_lines"] == 5 and rep["mfu_pct_median"] == pytest.approx(39.5)
    assert rep["ratio"] == pytest.approx(157.5 / rep["step_ms_median"])
    assert "mfu_note" not in rep and "note" not in rep


def test_nanochat_mfu_of_zero_on_a_cpu_is_no_claim():
    rep = reported_summary(_nanochat_lines([2.0, 0.5, 0.4, 0.45], [0.0] * 4), skip_first=1, gpuprof_step_s=0.45)
    assert rep["step_ms_median"] == pytest.approx(450.0)
    assert rep["mfu_pct_median"] is None and rep["mfu_lines"] == 0
    assert "no MFU claim" in rep["mfu_note"] and "CPU" in rep["mfu_note"]
    # nanoGPT's 0.00% is a figure against its A100 constant: still counted, as before.
    nano = [parse_line(f"iter {i}: loss 3.0, time 100.00ms, mfu 0.00%") for i in range(3)]
    rep = reported_summary(nano, skip_first=1, gpuprof_step_s=None)
    assert rep["mfu_pct_median"] == 0.0 and rep["mfu_lines"] == 2 and "mfu_note" not in rep


def test_torchtitan_summary_has_tokens_per_second_and_no_step_time():
    recs = [parse_line(torchtitan(s, 8.0 - s / 10, tps, mfu))
            for s, tps, mfu in ((1, 300, 1.5), (10, 12000, 40.0), (20, 12500, 41.0), (30, 12250, 40.5))]
    rep = reported_summary(recs, skip_first=1, gpuprof_step_s=0.5)
    assert rep["format"] == "torchtitan" and rep["lines"] == 4 and rep["skipped_first"] == 1
    assert rep["step_ms_median"] is None and rep["ratio"] is None
    assert rep["tokens_per_s_median"] == pytest.approx(12250.0)
    assert rep["mfu_pct_median"] == pytest.approx(40.5) and rep["mfu_lines"] == 3
    assert rep["note"] == NO_STEP_TIME["torchtitan"]


def test_litgpt_summary_under_gradient_accumulation_says_why_there_is_no_step_time():
    recs = [parse_line(litgpt(4 * s, s, 3.0, 0.05)) for s in range(1, 5)]
    rep = reported_summary(recs, skip_first=1, gpuprof_step_s=0.2)
    assert rep["format"] == "litgpt" and rep["lines"] == 4 and rep["step_ms_median"] is None
    assert rep["note"] == NO_STEP_TIME["litgpt"] and rep["ratio"] is None
    recs = [parse_line(litgpt(s, s, 3.0, t)) for s, t in ((1, 9.0), (2, 0.1), (3, 0.12), (4, 0.11))]
    rep = reported_summary(recs, skip_first=1, gpuprof_step_s=0.11)
    assert rep["step_ms_median"] == pytest.approx(110.0) and "note" not in rep


def test_log_analysis_of_a_nanochat_log(tmp_path):
    log = tmp_path / "base_train.log"
    dts = [30.0, 0.40, 0.41, 0.39, 0.40]
    log.write_text("GPU: NVIDIA H100 80GB HBM3 | Peak FLOPS (BF16): 9.89e+14\n"
                   "Step 00000 | Validation bpb: 3.300000\n"
                   + "".join(nanochat(i, 4, 4.0, dt, int(524288 / dt), 45.0) + "\n" for i, dt in enumerate(dts))
                   + "Step 00004 | Validation bpb: 1.100000\n")
    r = analyze_log(log, gpu="h100", config=dict(tokens_per_step=524288, n_layer=12, n_head=12, n_embd=768))
    assert r.format == "nanochat" and r.iter_lines == 5 and r.steady_lines == 4 and r.first_iter == 0
    assert r.step_s_median == pytest.approx(0.40)
    assert r.tokens_per_s_printed == pytest.approx(int(524288 / 0.40), rel=0.01)
    assert r.reported_mfu_pct is None and r.flops_source.startswith("config")  # its own peak: not inverted
    assert any("nanochat's bf16_mfu (median 45.00%)" in w for w in r.warnings)
    log.write_text("".join(nanochat(i, 4, 4.0, 2.0, 256, 0.0) + "\n" for i in range(4)))  # a CPU run
    r = analyze_log(log)
    assert r.reported_mfu_pct is None and any("no MFU claim" in w for w in r.warnings)


def test_log_analysis_of_modded_nanogpt_and_torchtitan_logs(tmp_path):
    log = tmp_path / "modded.txt"
    totals = [5000.0, 5100.0, 5199.0, 5301.0, 5401.0]
    log.write_text("step:0/5 val_loss:10.8258 train_time:0ms step_avg:0.03ms\n"
                   + "".join(modded(i, 5, t) + "\n" for i, t in enumerate(totals)))
    r = analyze_log(log)
    assert r.format == "modded-nanogpt" and r.iter_lines == 5 and r.steady_lines == 4  # step 1 left out
    assert r.step_s_median == pytest.approx(0.1)
    log = tmp_path / "titan.log"
    log.write_text("".join(torchtitan(s, 7.0, 1234, 40.0) + "\n" for s in (1, 10, 20)))
    with pytest.raises(GpuprofError, match=re.escape("its 3 torchtitan step line(s) give none: torchtitan prints "
                                                     "tokens/s per device")):
        analyze_log(log)


# A nanochat-shaped step on the CPU with a steady sleep, printing base_train.py's line after each
# optimizer step: synchronize, time.time() around the step, the loss .item(), tok/sec with
# separators, and the MFU against gpu_peak_flops = float('inf') (not CUDA), so 0.00.
NANOCHAT_SCRIPT = textwrap.dedent('''
    import time
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    B, T, V = 4, 16, 64
    model = torch.nn.Sequential(torch.nn.Embedding(V, 32), torch.nn.Linear(32, V))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gpu_peak_flops = float('inf')  # MFU not meaningful for CPU/MPS
    num_flops_per_token, total_batch_size, num_iterations = 6 * 4160, B * T, 50
    smooth_train_loss = 0
    for step in range(num_iterations + 1):
        if step % 25 == 0:
            print(f"Step {step:05d} | Validation bpb: {3.0 - step / 100:.6f}")
        if step == num_iterations:
            break
        t0 = time.time()
        x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), y.view(-1))
        loss.backward()
        time.sleep(0.03)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        train_loss_f = loss.item()
        t1 = time.time()
        dt = t1 - t0
        smooth_train_loss = 0.9 * smooth_train_loss + 0.1 * train_loss_f
        debiased_smooth_loss = smooth_train_loss / (1 - 0.9**(step + 1))
        pct_done = 100 * step / num_iterations
        tok_per_sec = int(total_batch_size / dt) * 1000  # x1000: a figure with separators
        mfu = 100 * num_flops_per_token * total_batch_size / dt / gpu_peak_flops
        print(f"step {step:05d}/{num_iterations:05d} ({pct_done:.2f}%) | loss: {debiased_smooth_loss:.6f} | "
              f"lrm: 1.00 | dt: {dt * 1000:.2f}ms | tok/sec: {tok_per_sec:,} | bf16_mfu: {mfu:.2f} | "
              f"epoch: 1 pq: 0 rg: {step} | total time: 0.00m")
''')


def test_a_nanochat_script_reports_its_median_and_no_mfu_claim(tmp_path):
    script = tmp_path / "base_train.py"
    script.write_text(NANOCHAT_SCRIPT)
    buf = io.StringIO()
    run = run_script(str(script), [], steps=5, warmup=2, stdout=buf, post_budget_s=0.0)
    assert run.ended == "stopped"
    text = buf.getvalue()
    # The script's own figures, read here without gpuprof's parser.
    dts = [float(x) for x in re.findall(r"dt: ([0-9.]+)ms", text)]
    tps = [float(x.replace(",", "")) for x in re.findall(r"tok/sec: ([0-9,]+)", text)]
    assert len(dts) == 6 and "Step 00000 | Validation bpb" in text and "bf16_mfu: 0.00" in text
    section = run.profile.measurements["script"]
    rep = section["reported"]
    assert rep["format"] == "nanochat" and rep["lines"] == 6 and rep["skipped_first"] == 2
    assert rep["step_ms_median"] == pytest.approx(statistics.median(dts[2:]))
    assert rep["tokens_per_s_median"] == pytest.approx(statistics.median(tps[2:])) and min(tps) >= 1000
    assert rep["mfu_pct_median"] is None and rep["mfu_lines"] == 0 and "no MFU claim" in rep["mfu_note"]
    ours_ms = run.profile.stats.step_s * 1e3  # gpuprof's typical step
    assert rep["ratio"] == pytest.approx(ours_ms / rep["step_ms_median"])
    assert 0.8 < rep["ratio"] < 1.25  # both clocks time the same 30 ms-dominated step
    assert section["iter_lines"][0]["step"] == 0 and section["iter_lines"][3]["step_ms"] == dts[3]
    assert section["eval_lines"] == []  # nanochat's `Step N | Validation bpb` is no nanoGPT eval line
