"""`gpuprof recommend` end to end through Typer: JSON keys, --write, --from, --config,
--measure, and one-line errors with exit code 2 for bad input."""

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.recommend.config import read_config


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["recommend", *args])


def test_famous_suggestion_json():
    r = invoke("--target-tokens", "2^20", "--tolerance", "0", "--gpu", "h200", "--model", "gpt2",
               "--dtype", "bf16", "--compile", "--batch-size", "16", "--grad-accum", "64", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["target_tokens"] == 1_048_576
    c256 = next(c for c in d["candidates"] if c["batch_size"] == 256)
    assert c256["grad_accum"] == 4 and c256["tokens"] == 1_048_576 and c256["fits"] is False
    assert c256["memory_bytes"] > d["capacity_bytes"]
    assert d["best"]["fits"] is True and d["best"]["batch_size"] < 256
    assert d["current"]["batch_size"] == 16 and d["current"]["grad_accum"] == 64
    assert d["flags"].startswith(f"--batch_size={d['best']['batch_size']} ")
    assert d["throughput"]["source"] == "flops"


def test_text_report_prints_the_view(monkeypatch):
    import gpuprof.render.recommend as render
    from gpuprof.report.recommend import BEST, recommend_view

    seen = []

    def spy(rec, **kw):
        seen.append((rec, recommend_view(rec, **kw)))
        return seen[-1][1]

    monkeypatch.setattr(render, "recommend_view", spy)
    r = invoke("-t", "1M", "--gpu", "h200", "--batch-size", "16", "--grad-accum", "64")
    assert r.exit_code == 0, r.output
    (rec, v), = seen
    # the view's texts, as the report prints them
    for text in (v.title.text, v.verdict.text, v.breakdown.title.text,
                 *(f.text for f in v.facts if f.label != "speed"),  # the speed line wraps
                 *(cell for row in v.rows for cell in row.texts),
                 *(name for name, _, _ in v.breakdown.rows)):
        assert text in r.output
    assert "1,000,000 (1M)" in v.title.text and v.rows[0].texts[3] == "1,048,576 (2^20)"
    assert v.verdict.tone == BEST and "loss_backward" in [t for t, _, _ in v.breakdown.rows]
    speed = next(f for f in v.facts if f.label == "speed")
    assert speed.text.startswith("FLOP estimate: not measured")
    assert any("906 ms" in d for d in v.details)  # the FLOP floor, units.seconds as every report
    # memory in decimal GB, as --memory-gb and the datasheet ("141 GB"), 3 significant figures
    memory = next(f for f in v.facts if f.label == "memory")
    assert memory.text.startswith("141 GB from NVIDIA H200 SXM") and "of 141 GB (" in rec.reason


def test_write_new_file_and_refuse_existing(tmp_path):
    out = tmp_path / "corrected.py"
    r = invoke("-t", "1Mi", "--gpu", "h100", "--write", str(out))
    assert r.exit_code == 0, r.output
    values = read_config(out)
    tokens = values["batch_size"] * values["gradient_accumulation_steps"] * values["block_size"]
    assert abs(tokens - 1_048_576) <= 0.05 * 1_048_576
    assert values["dtype"] == "bfloat16" and values["compile"] is True
    assert f"--batch_size={values['batch_size']}" in r.output
    before = out.read_text()
    r = invoke("-t", "1Mi", "--gpu", "h100", "--write", str(out))
    assert r.exit_code == 2 and "already exists" in r.output and out.read_text() == before
    r = invoke("-t", "0.5Mi", "--gpu", "h100", "--write", str(out), "--force")
    assert r.exit_code == 0 and out.read_text() != before


def test_config_file_is_the_current_config():
    r = invoke("-t", "1M", "--gpu", "h200", "--config",
               os.path.join(FIXTURES, "h200_b16_accum64.py"), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["current"]["batch_size"] == 16 and d["current"]["gradient_accumulation_steps"] == 64
    assert d["compile"] is True and d["dtype"] == "bf16" and d["model"]["n_layer"] == 12


def test_nanogpt_ddp_config_with_world_size():
    r = invoke("-t", "0.5M", "--gpu", "a100-40gb", "--world-size", "8", "--config",
               os.path.join(FIXTURES, "nanogpt_train_gpt2.py"), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    cur = d["current"]
    assert cur["batch_size"] == 12 and cur["grad_accum"] == 5 and cur["tokens"] == 491_520
    assert d["best"]["gradient_accumulation_steps"] % 8 == 0


def test_from_real_cpu_profile():
    prof = os.path.join(FIXTURES, "tiny_cpu_b4x4.gpuprof.json")
    r = invoke("-t", "2Ki", "--from", prof, "--memory-gb", "8", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["model"]["n_embd"] == 128 and d["model"]["block_size"] == 64
    assert d["throughput"]["source"] == "profile"
    assert d["current"]["batch_size"] == 4 and d["current"]["grad_accum"] == 4
    # a CPU profile says nothing about an H100: its timing is not used there
    r = invoke("-t", "2Ki", "--from", prof, "--gpu", "h100", "--json")
    d = json.loads(r.output)
    assert d["throughput"]["source"] == "flops"
    assert any("not used" in n for n in d["notes"])


def test_measure_on_cpu():
    r = invoke("-t", "128", "--model", "tiny", "--block-size", "16", "--dtype", "fp32",
               "--no-compile", "--measure", "--measure-budget", "3", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["throughput"]["source"] == "measured"
    assert d["measure"]["device"] == "cpu" and d["measure"]["points"][0]["batch_size"] == 1
    assert all(c["tokens"] == c["batch_size"] * 16 * c["grad_accum"] for c in d["candidates"])


@pytest.mark.parametrize("args, fragment", [
    (["-t", "1M", "--gpu", "h900"], "unknown GPU 'h900'"),
    (["-t", "1M", "--gpu", "h200", "--model", "gpt5"], "unknown model preset 'gpt5'"),
    (["-t", "1000", "--gpu", "h200"], "smaller than one sequence"),
    (["-t", "10000", "--gpu", "h200", "--world-size", "8"], "nearest are 8,192"),
    (["-t", "-1M", "--gpu", "h200"], "cannot read target"),
    (["-t", "0", "--gpu", "h200"], "must be positive"),
    (["-t", "1M", "--gpu", "h200", "--block-size", "0"], "--block-size must be positive"),
    (["-t", "1M", "--gpu", "h200", "--world-size", "-2"], "--world-size must be positive"),
    (["-t", "1M", "--gpu", "h200", "--n-head", "7"], "divisible by n_head"),
    (["-t", "1M", "--gpu", "h200", "--dtype", "int4"], "unknown dtype"),
    (["-t", "1M", "--gpu", "h200", "--config", os.path.join(FIXTURES, "finetune_with_code.py")],
     "never executes"),
    (["-t", "1M", "--gpu", "h200", "--config", "/nonexistent/c.py"], "no such file"),
    (["-t", "1M", "--memory-gb", "0"], "--memory-gb must be positive"),
])
def test_bad_input_is_one_line_exit_2(args, fragment):
    _check_one_line_error(args, fragment)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA here --measure --gpu is allowed")
def test_measure_cannot_time_a_gpu_that_is_not_here():
    _check_one_line_error(["-t", "1M", "--gpu", "h200", "--measure"], "--measure")


def _check_one_line_error(args, fragment):
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprof: error: ")
    assert fragment in lines[0]


def test_target_tokens_help_states_the_suffix_rule():
    import typer.main

    from gpuprof.units import SUFFIX_RULE

    cmd = typer.main.get_command(app).commands["recommend"]
    target = next(p for p in cmd.params if p.name == "target_tokens")
    assert SUFFIX_RULE in target.help
