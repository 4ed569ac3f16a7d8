"""A model that is not GPT-shaped (a bigram model: an embedding read out as logits, no layers)
with no FLOP count: MFU is "not measured" with the reason, and nothing else changes — in
diagnose and again in analyze of its saved profile (it used to end in KeyError: 'n_layer')."""

import copy
import json
import subprocess
import sys
from pathlib import Path

from gpuprof.analysis.mfu import compute_mfu
from gpuprof.analysis.pipeline import analyze
from gpuprof.dims import missing_gpt_dims
from gpuprof.profile import from_data

HERE = Path(__file__).resolve().parents[1]
SCRIPT = HERE / "fixtures" / "bigram_train.py"
SCHEMA1 = HERE / "profile" / "fixtures" / "schema1_nanogpt_script_data_delay.gpuprof.json"


def test_missing_dims_are_named():
    assert missing_gpt_dims({"block_size": 8}) == ["n_layer", "n_embd", "vocab_size"]
    assert missing_gpt_dims({"block_size": 8}, n_params=4160) == ["n_layer", "n_embd"]
    assert missing_gpt_dims({"n_layer": 2, "n_embd": 32, "block_size": 8, "vocab_size": 64}) == []


def test_partial_dims_and_no_count_mean_mfu_not_measured():
    data = json.loads(SCHEMA1.read_text())
    cfg = data["run"]["config"]
    cfg["model_dims"] = {"block_size": 32}
    data["measurements"].pop("flops", None)
    prof = from_data(copy.deepcopy(data))
    mfu = compute_mfu(prof)
    assert mfu.mfu is None and mfu.flops_per_step is None
    assert any("not GPT-shaped" in w and "no n_layer, n_embd" in w for w in mfu.warnings)
    a = analyze(prof)
    assert a.mfu.mfu is None and a.mfu.flops_per_step is None
    assert a.findings and a.findings[0].id == "data-loading-exposed"  # the rest of the analysis stands


def test_bigram_script_end_to_end(tmp_path, capsys):
    out = tmp_path / "bigram.gpuprof.json"
    run = [sys.executable, "-m", "gpuprof"]
    r = subprocess.run([*run, "diagnose", "--steps", "3", "--warmup", "1", "--post-budget", "0",
                        "--no-samplers", "--details", "--out", str(out), str(SCRIPT)], capture_output=True, text=True,
                       timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "not GPT-shaped" in " ".join(r.stdout.split())
    # analyze runs nothing: gpuprof's entry point in this process (no Python start-up of its own)
    from gpuprof.cli import main

    capsys.readouterr()
    try:
        main(["analyze", str(out), "--details"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    again = capsys.readouterr()
    assert code == 0, again.err[-3000:]
    assert "not GPT-shaped" in " ".join(again.out.split())
