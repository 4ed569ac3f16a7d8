"""The step lines scripts print about themselves (gpuprof.steplog): nanoGPT, build-nanogpt, llm.c
and HF Trainer formats on literal lines, the `reported` summary beside gpuprof's step, its
line in the report (gpuprof.report.words), and one tiny build-nanogpt-style script run through run_script."""

import io
import math
import re
import statistics
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprof.report.words import script_log_line
from gpuprof.runners.script import run_script
from gpuprof.steplog import HF_NO_STEP_TIME, EvalLine, StepLine, parse_line, parse_lines, reported_summary

# (line, format, step, loss, step_ms, tokens_per_s, mfu_pct)
STEP_LINES = [
    # nanoGPT train.py
    ("iter 12: loss 4.1234, time 123.45ms, mfu 12.34%", "nanogpt", 12, 4.1234, 123.45, None, 12.34),
    ("iter 0: loss 10.9876, time 21000.12ms, mfu -100.00%", "nanogpt", 0, 10.9876, 21000.12, None, -100.0),
    ("iter 3: loss 4.0000, time 263.65ms, mfu 0.00%, slept 20.51ms", "nanogpt", 3, 4.0, 263.65, None, 0.0),
    ("iter 7: loss 3.5, time 21,000.50ms, mfu 164.12%", "nanogpt", 7, 3.5, 21000.5, None, 164.12),
    ("iter 8: loss 3.5, time 120.00ms", "nanogpt", 8, 3.5, 120.0, None, None),
    ("[rank0]: iter 9: loss nan, time 1.2e+02ms, mfu 1.5e+01%", "nanogpt", 9, math.nan, 120.0, None, 15.0),
    # build-nanogpt train_gpt2.py
    ("step    12 | loss: 4.123456 | lr 6.0000e-04 | norm: 1.2345 | dt: 123.45ms | tok/sec: 12345.67",
     "build-nanogpt", 12, 4.123456, 123.45, 12345.67, None),
    ("step     0 | loss: 10.987654 | lr 8.3916e-07 | norm: 15.4321 | dt: 21,345.67ms | tok/sec: 24,562.09",
     "build-nanogpt", 0, 10.987654, 21345.67, 24562.09, None),
    ("step 5 | loss: 3.2 | lr: 1.0000e-03 | grad norm: 0.9 | dt: 1.2345e+02ms | tok/sec: 4.1e+05 | MFU: 41.25%",
     "build-nanogpt", 5, 3.2, 123.45, 4.1e5, 41.25),
    ("step 7, loss: 6.5, dt: 1.50s, tok/sec: 3000.00", "build-nanogpt", 7, 6.5, 1500.0, 3000.0, None),
    ("step 3 | loss: 4.0 | dt: 99.00ms", "build-nanogpt", 3, 4.0, 99.0, None, None),
    # llm.c train_gpt2.py, train_gpt2.cu (now and earlier)
    ("step 12/100 | train loss 4.1234 | norm 1.2345 | lr 6.00e-04 | (123.45 ms | 12345 tok/s)",
     "llm.c", 12, 4.1234, 123.45, 12345.0, None),
    ("step    1/74 | loss 11.010906 (+nanz)| norm 15.3672 (+nanz)| lr 8.57e-07 | 2,345.67 ms | 24.3% bf16 MFU | "
     "223611 tok/s", "llm.c", 1, 11.010906, 2345.67, 223611.0, 24.3),
    ("step 3/74: train loss 4.500000 (acc 4.500000) (120.500000 ms, 8500 tok/s)", "llm.c", 3, 4.5, 120.5, 8500.0, None),
    # HF Trainer's printed log dicts: Python repr, JSON, values printed wrapped
    ("{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.12}",
     "hf-trainer", None, 2.31, None, None, None),
    ('{"loss": 2.31, "grad_norm": 1.2, "learning_rate": 5e-05, "epoch": 0.12}',
     "hf-trainer", None, 2.31, None, None, None),
    ("{'loss': nan, 'grad_norm': tensor(1.2, device='cuda:0'), 'learning_rate': np.float64(5e-05), 'epoch': 0.5}",
     "hf-trainer", None, math.nan, None, None, None),
    ('{"loss": NaN, "grad_norm": null, "learning_rate": 5e-05, "epoch": 0.5, "step": 40}',
     "hf-trainer", 40, math.nan, None, None, None),
    # 1.6 steps/s × 12.3 s fits no whole step count: 1/1.6 s
    ("{'train_runtime': 12.3, 'train_samples_per_second': 4.5, 'train_steps_per_second': 1.6, 'train_loss': 2.3, "
     "'epoch': 1.0}", "hf-trainer", None, 2.3, 625.0, None, None),
    # round(steps / runtime, 3) = 0.269 over 37.1234 s: 10 steps, 3712.34 ms each (1/0.269 would say 3717.5)
    ('{"train_runtime": 37.1234, "train_samples_per_second": 2.155, "train_steps_per_second": 0.269, '
     '"train_tokens_per_second": 2206.5, "train_loss": 2.3, "epoch": 1.0}',
     "hf-trainer", None, 2.3, 3712.34, 2206.5, None),
    # transformers >= 5 prints floats as f"{v:.4g}" strings (real output of tests/fixtures/hf_trainer_train.py)
    ("{'loss': '5.376', 'grad_norm': '1.227', 'learning_rate': '0.001', 'epoch': '0.01562'}",
     "hf-trainer", None, 5.376, None, None, None),
    # '2.39' s is the less precise figure here: 1/1.673 s
    ("{'train_runtime': '2.39', 'train_samples_per_second': '13.39', 'train_steps_per_second': '1.673', "
     "'train_loss': '5.382', 'epoch': '0.0625'}", "hf-trainer", None, 5.382, 1e3 / 1.673, None, None),
    # colour codes and `\r` progress output around a line
    ("\x1b[32mstep 5 | loss: 3.0 | dt: 10.00ms | tok/sec: 100.00\x1b[0m", "build-nanogpt", 5, 3.0, 10.0, 100.0, None),
    ("\x1b[1m\x1b[36miter 4\x1b[0m: loss 3.0000, time 50.00ms, mfu 1.00%", "nanogpt", 4, 3.0, 50.0, None, 1.0),
    ("  3%|3         | 3/100 [00:01<00:30]\rstep 5/10 | train loss 3.0 | lr 1e-3 | (10.00 ms | 100 tok/s)\r",
     "llm.c", 5, 3.0, 10.0, 100.0, None),
    ("\r\x1b[2K{'loss': 1.5, 'learning_rate': 1e-4, 'epoch': 2.0}", "hf-trainer", None, 1.5, None, None, None),
]

NOT_STEP_LINES = [
    "step 0: train loss 10.9876, val loss 10.9912",  # nanoGPT's eval line: an EvalLine, below
    "step 5 done",
    "saving checkpoint at step 1000 | loss: 3.0",  # no step time
    "at step 10 the loss was 3.2 and it took 100 ms",
    "step 1000 | loss: 3.1 | saved to ckpt.pt",
    "validation loss: 3.1234",
    "HellaSwag accuracy: 2500/10042=0.2490",
    "val loss 3.2",
    "step 5/10 | val loss 3.2 | (1.00 ms | 10 tok/s)",
    "step 5 | val_loss: 3.2 | dt: 100.00ms",
    "step 5/10 done in 100 ms",
    "iteration 5: loss 3.0, time 100ms",
    "iter 5: loss 3.0",
    "{'eval_loss': 2.1, 'eval_runtime': 1.0, 'eval_samples_per_second': 9.0, 'eval_steps_per_second': 1.1, "
    "'epoch': 1.0}",
    "{'loss': 2.0}",  # a user's dict: no Trainer key beside it
    "{'loss': 'low', 'epoch': 1}",
    "{'loss': __import__('os').getcwd(), 'epoch': 1}",  # never evaluated
    "{not a dict}",
    "  3%|3         | 3/100 [00:01<00:30, 2.9it/s]",
    "",
]


def _close(a, b):
    if a is None or b is None:
        return a is b
    if math.isnan(b):
        return math.isnan(a)
    return a == pytest.approx(b, rel=1e-9)


@pytest.mark.parametrize("line,fmt,step,loss,step_ms,tps,mfu", STEP_LINES)
def test_step_lines_of_each_format(line, fmt, step, loss, step_ms, tps, mfu):
    rec = parse_line(line)
    assert isinstance(rec, StepLine), line
    assert (rec.format, rec.step) == (fmt, step)
    for got, want in ((rec.loss, loss), (rec.step_ms, step_ms), (rec.tokens_per_s, tps), (rec.mfu_pct, mfu)):
        assert _close(got, want), (line, got, want)
    assert rec.whole_run == ("train_steps_per_second" in line)


@pytest.mark.parametrize("line", NOT_STEP_LINES)
def test_lines_that_are_not_step_lines(line):
    assert not isinstance(parse_line(line), StepLine)


def test_nanogpt_eval_line_stays_an_eval_line():
    assert parse_line("step 250: train loss 3.2101, val loss 3.3012") == EvalLine(250, 3.2101, 3.3012)
    steps, evals = parse_lines(["step 0: train loss 4.0, val loss 4.1", "iter 0: loss 4.0, time 9.00ms, mfu -100.00%",
                                "hello", "iter 1: loss 3.9, time 1.00ms, mfu -100.00%"])
    assert [s.step for s in steps] == [0, 1] and [e.val_loss for e in evals] == [4.1]


def _lines(fmt_line, dts):
    return [parse_line(fmt_line.format(i=i, dt=dt)) for i, dt in enumerate(dts)]


def test_summary_skips_the_warmup_lines_and_gives_the_ratio():
    recs = _lines("step {i:5d} | loss: 4.0 | lr 6.0000e-04 | norm: 1.0 | dt: {dt:.2f}ms | tok/sec: 1,000.00",
                  [900.0, 300.0, 100.0, 110.0, 120.0, 130.0])
    rep = reported_summary(recs, skip_first=2, gpuprof_step_s=0.125)
    assert rep["format"] == "build-nanogpt" and rep["lines"] == 6 and rep["skipped_first"] == 2
    assert rep["step_ms_median"] == pytest.approx(115.0) and rep["step_ms_source"] == "step lines"
    assert rep["tokens_per_s_median"] == pytest.approx(1000.0)
    assert rep["ratio"] == pytest.approx(125.0 / 115.0)
    assert rep["mfu_pct_median"] is None and rep["mfu_lines"] == 0
    # No more lines than the warmup: nothing is skipped (as before).
    rep = reported_summary(recs[:2], skip_first=2, gpuprof_step_s=None)
    assert rep["skipped_first"] == 0 and rep["step_ms_median"] == pytest.approx(600.0) and rep["ratio"] is None


def test_summary_ignores_nanogpt_mfu_placeholders():
    recs = [parse_line(f"iter {i}: loss 4.0, time {t:.2f}ms, mfu {m:.2f}%")
            for i, (t, m) in enumerate([(500, -100), (100, -100), (102, -100), (104, -100), (106, -100),
                                        (108, 30.0), (110, 32.0)])]
    rep = reported_summary(recs, skip_first=1, gpuprof_step_s=0.2)
    assert rep["mfu_lines"] == 2 and rep["mfu_pct_median"] == pytest.approx(31.0)
    assert rep["step_ms_median"] == pytest.approx(105.0) and rep["ratio"] == pytest.approx(200 / 105)


def test_summary_of_hf_trainer_logs():
    per_step = [parse_line(f"{{'loss': {2.5 - i / 10}, 'learning_rate': 5e-05, 'epoch': {i / 4}}}") for i in range(3)]
    rep = reported_summary(per_step, skip_first=2, gpuprof_step_s=0.3)
    assert rep["format"] == "hf-trainer" and rep["lines"] == 3
    assert rep["step_ms_median"] is None and rep["ratio"] is None and rep["note"] == HF_NO_STEP_TIME
    final = parse_line("{'train_runtime': 40.0321, 'train_samples_per_second': 3.997, "
                       "'train_steps_per_second': 0.25, 'train_loss': 2.3, 'epoch': 1.0}")
    rep = reported_summary(per_step + [final], skip_first=2, gpuprof_step_s=3.5)
    assert rep["step_ms_median"] == pytest.approx(4003.21) and "whole run" in rep["step_ms_source"]
    assert rep["ratio"] == pytest.approx(3500 / 4003.21) and "note" not in rep


def test_summary_uses_the_main_format_only():
    recs = _lines("iter {i}: loss 4.0, time {dt:.2f}ms", [50.0, 60.0, 70.0]) + [
        parse_line("step 3/10 | train loss 3.0 | (999.00 ms | 10 tok/s)")]
    rep = reported_summary(recs, skip_first=0, gpuprof_step_s=None)
    assert rep["format"] == "nanogpt" and rep["lines"] == 3 and rep["step_ms_median"] == pytest.approx(60.0)
    assert rep["other_formats"] == {"llm.c": 1}
    empty = reported_summary([], skip_first=2, gpuprof_step_s=0.1)
    assert empty["lines"] == 0 and empty["format"] is None and empty["step_ms_median"] is None
    assert empty["ratio"] is None


def _line(reported, step_s):
    """The report's line of a profile whose script logged `reported`, gpuprof's typical step `step_s`."""
    return script_log_line(SimpleNamespace(measurements={"script": {"reported": reported}}),
                           SimpleNamespace(step_s=step_s))


def test_terminal_line_names_the_format_the_median_and_the_ratio():
    recs = _lines("step {i:5d} | loss: 4.0 | dt: {dt:.2f}ms | tok/sec: 12,345.67", [123.45] * 10)
    rep = reported_summary(recs, skip_first=2, gpuprof_step_s=0.12510)
    line = _line(rep, 0.12510)
    assert line == ("the script's own log: build-nanogpt format, 10 step lines, median dt 123.45 ms, 12.3K tok/s; "
                    "gpuprof's typical step 125.10 ms (1.01×)")
    hf = reported_summary([parse_line("{'loss': 2.0, 'epoch': 0.5}")], skip_first=2, gpuprof_step_s=0.2)
    line = _line(hf, 0.2)
    assert line.startswith("the script's own log: hf-trainer format, 1 log lines, no per-step time: HF Trainer "
                           "prints a step time only as train_steps_per_second")
    assert line.endswith("; gpuprof's typical step 200.00 ms")
    # A profile saved before the format was recorded: nanoGPT lines, ratio computed here.
    old = {"lines": 5, "step_ms_median": 98.73, "mfu_pct_median": None, "mfu_lines": 0, "skipped_first": 2}
    line = _line(old, 0.10366)
    assert line == ("the script's own log: nanogpt format, 5 step lines, median time 98.73 ms; "
                    "gpuprof's typical step 103.66 ms (1.05×)")
    assert _line({"lines": 0}, 0.1) is None  # no line of its own logged: nothing to say


# A tiny GPT-ish step on the CPU with a steady sleep, printing build-nanogpt's line (in colour,
# with thousands separators in tok/sec) after each optimizer step, as train_gpt2.py does.
TINY_SCRIPT = textwrap.dedent('''
    import time
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    B, T, V = 4, 16, 64
    model = torch.nn.Sequential(torch.nn.Embedding(V, 32), torch.nn.Linear(32, V))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(50):
        t0 = time.time()
        x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, V), y.view(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        time.sleep(0.03)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dt = time.time() - t0
        print(f"\\x1b[32mstep {step:5d} | loss: {loss.item():.6f} | lr 1.0000e-03 | norm: {norm:.4f} | "
              f"dt: {dt * 1000:.2f}ms | tok/sec: {B * T / dt:,.2f}\\x1b[0m")
''')


def test_a_build_nanogpt_script_reports_its_median_and_the_ratio(tmp_path):
    script = tmp_path / "train_gpt2.py"
    script.write_text(TINY_SCRIPT)
    buf = io.StringIO()
    run = run_script(str(script), [], steps=5, warmup=2, stdout=buf)
    assert run.ended == "stopped"
    # The script's own figures, read here without gpuprof's parser.
    dts = [float(x) for x in re.findall(r"dt: ([0-9.]+)ms", buf.getvalue())]
    tps = [float(x.replace(",", "")) for x in re.findall(r"tok/sec: ([0-9.,]+)", buf.getvalue())]
    assert len(dts) == 6  # steps 0-5: the 7th optimizer step stops the script before its print
    section = run.profile.measurements["script"]
    rep = section["reported"]
    assert rep["format"] == "build-nanogpt" and rep["lines"] == 6 and rep["skipped_first"] == 2
    assert rep["step_ms_median"] == pytest.approx(statistics.median(dts[2:]))
    assert rep["tokens_per_s_median"] == pytest.approx(statistics.median(tps[2:]))
    assert rep["mfu_pct_median"] is None and rep["mfu_lines"] == 0
    ours_ms = run.profile.stats.step_s * 1e3  # gpuprof's typical step
    assert rep["ratio"] == pytest.approx(ours_ms / rep["step_ms_median"])
    # Both clocks time the same 30 ms-dominated step: they agree to well within 25%.
    assert 0.8 < rep["ratio"] < 1.25
    assert section["iter_lines"][3] == {"format": "build-nanogpt", "step": 3, "loss": pytest.approx(4.2, abs=0.5),
                                        "step_ms": dts[3], "tokens_per_s": tps[3], "mfu_pct": None}
    line = script_log_line(run.profile, run.profile.stats)
    assert line.startswith("the script's own log: ")
    assert f"build-nanogpt format, 6 step lines, median dt {rep['step_ms_median']:.2f} ms" in line
    assert line.endswith(f"; gpuprof's typical step {ours_ms:.2f} ms ({rep['ratio']:.2f}×)")


HF_FIXTURE = str(Path(__file__).resolve().parent.parent / "fixtures" / "hf_trainer_train.py")


def test_hf_trainer_run_to_its_end_reports_the_whole_run_average(tmp_path):
    for name in ("transformers", "accelerate"):
        pytest.importorskip(name, reason=f"{name} is not installed (pip install -e '.[trainers]')")
    buf = io.StringIO()
    run = run_script(HF_FIXTURE, [str(tmp_path / "out"), "--max-steps", "4"], steps=2, warmup=1, stop=False,
                     stdout=buf)
    assert run.ended == "finished"
    text = buf.getvalue() + "\n"
    # The Trainer's summary as printed (quotes and number style depend on the transformers version).
    sps = float(re.search(r"train_steps_per_second['\"]: '?([0-9.e+-]+)", text).group(1))
    rep = run.profile.measurements["script"]["reported"]
    assert rep["format"] == "hf-trainer" and rep["lines"] == 5  # logging_steps=1: 4 dicts + the summary
    assert rep["step_ms_median"] == pytest.approx(1e3 / sps, rel=2e-3) and "whole run" in rep["step_ms_source"]
    ours_ms = run.profile.stats.step_s * 1e3  # gpuprof's typical step
    assert rep["ratio"] == pytest.approx(ours_ms / rep["step_ms_median"])
    # The Trainer's average holds its startup and first steps; gpuprof's typical step does not. How much
    # startup weighs against a step depends on the CPU (Python setup vs matmuls), so the bounds are
    # no fixed share of it: the Trainer's runtime (4 x its average) spans every step gpuprof timed
    # (the warmup one and the 3 measured, run to the end), so their sum is no larger (1%: the
    # Trainer's steps/s is rounded); and gpuprof's typical step, without the startup, is not far above.
    timed = run.profile.warmup_steps + run.profile.steps
    assert len(timed) == 4
    timed_ms = sum(st.wall_s for st in timed) * 1e3
    assert timed_ms <= 4 * rep["step_ms_median"] * 1.01, (timed_ms, rep["step_ms_median"])
    assert 0 < rep["ratio"] < 1.5
