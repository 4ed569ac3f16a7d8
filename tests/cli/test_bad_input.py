"""Bad input, verb by verb: exit 2 (or the documented code) with one line on stderr, never a
traceback, and no file of the user's changed (checksums of everything in the folder before and
after). A new verb adds its rows here."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuprof.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROFILE = Path(__file__).resolve().parents[1] / "profile" / "fixtures" / "schema1_builtin_cpu_tiny.gpuprof.json"
BIG = "1" + "0" * 400


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A user's folder: a nanoGPT script and its data, a config, a saved profile, a checkpoint,
    a link to the script, a bench-disk result that is not one."""
    d = tmp_path_factory.mktemp("user")
    shutil.copy(FIXTURES / "nanogpt_train.py", d / "train.py")
    (d / "data").mkdir()
    np.arange(4096, dtype=np.uint16).tofile(d / "data" / "train.bin")
    np.arange(512, dtype=np.uint16).tofile(d / "data" / "val.bin")
    (d / "config.py").write_text("batch_size = 12\n")
    (d / "corrected.py").write_text("# gpuprof corrected config: apply on top of your own, e.g.\nbatch_size = 16\n")
    shutil.copy(PROFILE, d / "run.gpuprof.json")
    (d / "ckpt.pt").write_bytes(b"PK\x03\x04" + bytes(60))
    (d / "notes.txt").write_text("my notes\n")
    (d / "not-json.json").write_text("{nope")
    (d / "other.json").write_text(json.dumps({"hello": 1}))
    (d / "future.json").write_text(json.dumps({"schema_version": 99, "tool": {"name": "gpuprof"}}))
    (d / "link.html").symlink_to(d / "train.py")
    (d / "a-folder").mkdir()
    (d / "bad.log").write_text("iter 0: loss 4.0, time -12.0ms, mfu 3.00%\niter 1: loss 4.0, time nanms, mfu 3.00%\n")
    return d


def checksums(folder: Path) -> dict:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p)] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# (verb and arguments, expected exit code, a phrase of the one error line). Paths are relative
# to the user's folder (the current folder while the case runs).
CASES = [
    # diagnose: options
    ("diagnose --steps 0", 2, "--steps must be positive"),
    ("diagnose --warmup -1", 2, "--warmup must be zero or positive"),
    ("diagnose --post-budget -1", 2, "--post-budget must be zero or positive"),
    ("diagnose --post-budget nan", 2, "--post-budget must be zero or positive"),
    ("diagnose --batch-size 0", 2, "--batch-size must be positive"),
    ("diagnose --block-size -5", 2, "--block-size must be positive"),
    ("diagnose --grad-accum 0", 2, "--grad-accum must be positive"),
    ("diagnose --dtype fp9", 2, "fp9"),
    ("diagnose --device bogus", 2, "bogus"),
    ("diagnose --model nope", 2, "unknown model preset 'nope'"),
    ("diagnose --n-head 3", 2, "divisible"),
    ("diagnose --steps abc", 2, "Invalid value for '--steps'"),
    ("diagnose --data missing.bin", 2, "missing.bin"),
    ("diagnose --disk-report not-json.json", 2, "not a bench-disk JSON result"),
    ("diagnose --peak-tflops -5", 2, "--peak-tflops must be positive"),
    ("diagnose --peak-tflops nan", 2, "--peak-tflops must be positive"),
    ("diagnose --reported-mfu nan", 2, "--reported-mfu must be"),
    ("diagnose --reported-mfu -3", 2, "--reported-mfu must be"),
    # diagnose: outputs that would replace the user's files
    ("diagnose --out train.py train.py", 2, "train.py is this run's script"),
    ("diagnose --out data/train.bin train.py", 2, "is not a gpuprof profile"),
    ("diagnose --trace data/val.bin train.py", 2, "is not a gpuprof trace"),
    ("diagnose --html link.html train.py", 2, "link.html is this run's script"),
    ("diagnose --html link.html", 2, "is not a gpuprof HTML report"),
    ("diagnose --html notes.txt", 2, "is not a gpuprof HTML report"),
    ("diagnose --out run.gpuprof.json --data run.gpuprof.json", 2, "is this run's --data"),
    ("diagnose --out a-folder", 2, "it is a directory"),
    ("diagnose --out missing/run.json", 2, "folder missing does not exist"),
    ("diagnose --write config.py", 2, "already exists; pass --force"),
    ("diagnose --out x.json --trace x.json", 2, "both name x.json"),
    # diagnose: scripts and launches
    ("diagnose nosuch.py", 2, "nosuch.py"),
    ("diagnose a-folder", 2, "a-folder"),
    ("diagnose --verify --json", 2, "--verify prints a comparison report"),
    ("diagnose --nproc-per-node 0 train.py", 2, "--nproc-per-node must be a positive"),
    ("diagnose --nproc-per-node 1000 train.py", 2, "more ranks than cores"),
    ("diagnose --nnodes 2 train.py", 2, "torchrun options need --nproc-per-node"),
    ("diagnose --nproc-per-node 1 --rank-timeout -1 train.py", 2, "--rank-timeout must be positive"),
    ("diagnose --nproc-per-node 1 --nnodes x train.py", 2, "torchrun refused the launcher options"),
    # analyze
    ("analyze missing.json", 2, "missing.json: no such file"),
    ("analyze not-json.json", 2, "not valid JSON"),
    ("analyze other.json", 2, "not a gpuprof profile"),
    ("analyze future.json", 2, "newer than this gpuprof understands"),
    ("analyze", 2, "give a profile file"),
    ("analyze --log missing.log", 2, "missing.log: no such file"),
    ("analyze --log bad.log", 2, "1 step line(s) with impossible numbers skipped (the first: step time -12 ms)"),
    ("analyze --log bad.log --batch-size -3", 2, "--batch-size must be positive"),
    ("analyze --log bad.log --peak-tflops -1", 2, "--peak-tflops must be positive"),
    ("analyze run.gpuprof.json --html train.py", 2, "is not a gpuprof HTML report"),
    ("analyze run.gpuprof.json --trace run.gpuprof.json", 2, "is this run's profile"),
    ("analyze run.gpuprof.json --write config.py", 2, "already exists; pass --force"),
    ("analyze run.gpuprof.json --peak-tflops 0", 2, "--peak-tflops must be positive"),
    # export
    ("export run.gpuprof.json", 2, "nothing to export"),
    ("export run.gpuprof.json --html train.py", 2, "is not a gpuprof HTML report"),
    ("export run.gpuprof.json --html data/train.bin", 2, "is not a gpuprof HTML report"),
    ("export run.gpuprof.json --html link.html", 2, "is not a gpuprof HTML report"),
    ("export run.gpuprof.json --trace notes.txt", 2, "is not a gpuprof trace"),
    ("export missing.json --html r.html", 2, "no such file"),
    ("export other.json --html r.html", 2, "not a gpuprof profile"),
    # merge
    ("merge", 2, "Missing argument"),
    ("merge run.gpuprof.json --out data/train.bin", 2, "is not a gpuprof profile"),
    ("merge run.gpuprof.json --out run.gpuprof.json", 2, "is this run's profile"),
    ("merge other.json", 2, "not a gpuprof profile"),
    ("merge run.gpuprof.json --peak-tflops -1", 2, "--peak-tflops must be positive"),
    # compare
    ("compare run.gpuprof.json missing.json", 2, "no such file"),
    ("compare run.gpuprof.json other.json", 2, "not a gpuprof profile"),
    ("compare run.gpuprof.json run.gpuprof.json --fail-if-slower -1", 2, "--fail-if-slower must be"),
    ("compare run.gpuprof.json run.gpuprof.json --fail-if-slower nan", 2, "--fail-if-slower must be"),
    ("compare run.gpuprof.json run.gpuprof.json --peak-tflops -1", 2, "--peak-tflops must be positive"),
    # recommend
    ("recommend -t 0 --gpu h200", 2, "must be positive"),
    ("recommend -t -5 --gpu h200", 2, "cannot read target tokens"),
    ("recommend -t 1e400 --gpu h200", 2, "out of range"),
    (f"recommend -t {BIG} --gpu h200", 2, "out of range"),
    ("recommend -t abc --gpu h200", 2, "cannot read target tokens"),
    ("recommend -t 1M --gpu h200 --tolerance -1", 2, "--tolerance"),
    ("recommend -t 1M --gpu h200 --tolerance nan", 2, "--tolerance"),
    ("recommend -t 1M --memory-gb -1", 2, "--memory-gb"),
    ("recommend -t 1M --memory-gb nan", 2, "--memory-gb"),
    ("recommend -t 1M --gpu h200 --model nope", 2, "unknown model preset 'nope'"),
    ("recommend -t 1M --gpu h200 --world-size 0", 2, "--world-size must be positive"),
    ("recommend -t 1M --gpu h200 --batch-size 0", 2, "--batch-size must be positive"),
    ("recommend -t 1M --gpu h200 --dtype fp9", 2, "fp9"),
    ("recommend -t 1M --gpu h200 --config missing.py", 2, "missing.py"),
    ("recommend -t 1M --gpu h200 --from other.json", 2, "not a gpuprof profile"),
    ("recommend -t 1M --gpu h200 --measure-budget -1", 2, "--measure-budget"),
    ("recommend -t 1M --gpu h200 --write train.py", 2, "already exists; pass --force"),
    ("recommend -t 1M --gpu h200 --write corrected.py", 2, "already exists; pass --force"),
    ("recommend -t 1M --gpu h200 --write config.py --config config.py --force", 2, "is this run's --config"),
    # bench-disk
    ("bench-disk missing-dir", 2, "missing-dir"),
    ("bench-disk . --size 0", 2, "size"),
    ("bench-disk . --size -1", 2, "size"),
    ("bench-disk . --size abc", 2, "abc"),
    ("bench-disk . --duration 0", 2, "--duration"),
    ("bench-disk . --duration nan", 2, "--duration"),
    ("bench-disk . --repeats 1", 2, "--repeats"),
    ("bench-disk . --readers 0", 2, "--readers"),
    ("bench-disk . --block-size 0", 2, "block"),
    ("bench-disk . --profile not-json.json", 2, "not-json.json"),
    ("bench-disk . --tokens-per-sec -5", 2, "tokens"),
    # scenario
    ("scenario run nosuch", 2, "nosuch"),
    ("scenario run", 2, "give one scenario NAME or --all"),
    ("scenario list --folder missing-dir", 2, "missing-dir"),
    # no such verb or option
    ("nosuchverb", 2, "No such command 'nosuchverb'"),
    ("recommend --bogus", 2, "No such option"),
]


@pytest.mark.parametrize("args,code,phrase", CASES, ids=[c[0][:60] for c in CASES])
def test_bad_input_is_one_line_and_changes_nothing(folder, monkeypatch, capsys, args, code, phrase):
    monkeypatch.chdir(folder)
    before = checksums(folder)
    with pytest.raises(SystemExit) as exc:
        main(args.split())
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert exc.value.code == code, (out[-2000:], err[-2000:])
    assert "Traceback" not in err + out
    assert len(lines) == 1 and lines[0].startswith("gpuprof: error: "), err[-2000:]
    assert phrase in lines[0], lines[0]
    assert checksums(folder) == before
    leftovers = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert leftovers == []  # no temporary file left behind


# -- after the run: what the run itself opened or wrote is kept ------------------------------------

RUN = ["diagnose", "--steps", "2", "--warmup", "1", "--post-budget", "0", "--no-samplers"]


def _run(folder, monkeypatch, capsys, args):
    """A real run in a process of its own: a script run in this one would leave torch's global
    settings (TF32 set the legacy way) changed for later tests."""
    r = subprocess.run([sys.executable, "-m", "gpuprof", *args], cwd=folder, capture_output=True, text=True,
                       timeout=180)
    assert "Traceback" not in r.stdout + r.stderr
    return r.returncode, r.stdout, r.stderr


def test_a_checkpoint_the_script_writes_at_the_output_path_is_kept(tmp_path, monkeypatch, capsys):
    shutil.copy(FIXTURES / "nanogpt_train.py", tmp_path / "train.py")
    (tmp_path / "data").mkdir()
    np.arange(4096, dtype=np.uint16).tofile(tmp_path / "data" / "train.bin")
    np.arange(512, dtype=np.uint16).tofile(tmp_path / "data" / "val.bin")
    (tmp_path / "out").mkdir()
    code, out, err = _run(tmp_path, monkeypatch, capsys,
                          [*RUN, "--out", "out/ckpt.pt", "train.py", "--eval_interval=1", "--vocab_size=4096"])
    assert code == 3, err[-2000:]
    import torch

    assert torch.load(tmp_path / "out" / "ckpt.pt")["iter_num"] >= 1  # the script's checkpoint, whole
    line = next(x for x in err.splitlines() if "could not write the profile" in x)
    assert "written during the run" in line and "saved it to" in line
    rescued = Path(line.rsplit("saved it to ", 1)[1].split(" instead")[0])
    assert json.loads(rescued.read_text())["tool"]["name"] == "gpuprof"


def test_files_the_run_read_are_kept_even_with_force(tmp_path, monkeypatch, capsys):
    """The dataset (the profile knows it) and a config file the script's configurator read (seen
    through the audit hook): with --force both may be named before the run, neither is replaced."""
    shutil.copy(FIXTURES / "nanogpt_train.py", tmp_path / "train.py")
    (tmp_path / "data").mkdir()
    np.arange(4096, dtype=np.uint16).tofile(tmp_path / "data" / "train.bin")
    np.arange(512, dtype=np.uint16).tofile(tmp_path / "data" / "val.bin")
    (tmp_path / "myconf.py").write_text("vocab_size = 4096\n")
    before = checksums(tmp_path)
    code, out, err = _run(tmp_path, monkeypatch, capsys, [*RUN, "--force", "--out", "data/train.bin",
                                                          "--trace", "myconf.py", "train.py", "myconf.py"])
    assert code == 3, err[-2000:]
    text = " ".join(err.split())
    assert "data/train.bin is the run's dataset; gpuprof never replaces it" in text
    assert "myconf.py is a file this run opened; gpuprof never replaces it" in text
    after = checksums(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
