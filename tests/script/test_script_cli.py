"""`gpuprof diagnose SCRIPT ARGS...`: report, --json/--out, exit codes for failures."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpuprof.cli import app

runner = CliRunner()
NANOGPT = str(Path(__file__).resolve().parent.parent / "fixtures" / "nanogpt_train.py")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    for split in ("train", "val"):
        np.random.default_rng(1).integers(0, 256, 20_000, dtype=np.uint16).tofile(d / f"{split}.bin")
    return d


def _invoke(data_dir, out_dir, *script_args, opts=()):
    return runner.invoke(app, ["diagnose", "--steps", "2", "--warmup", "1", "--no-samplers", *opts, NANOGPT,
                               f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--threads=1",
                               "--data_delay=0.005", *script_args])


def test_json_keeps_stdout_valid_and_sends_the_script_output_to_stderr(data_dir, tmp_path):
    out = tmp_path / "run.gpuprof.json"
    res = _invoke(data_dir, tmp_path, opts=["--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert printed == json.loads(out.read_text())
    assert "iter 0:" in res.stderr and "iter 0:" not in res.stdout
    assert printed["run"]["mode"] == "script"
    assert printed["run"]["command"][0] == NANOGPT and printed["run"]["command"][1].startswith("--data_dir=")
    assert len(printed["steps"]) == 2 and printed["analysis"]["steps"]["micro_steps"] == 4
    assert printed["measurements"]["script"]["reported"]["lines"] == 2


def test_report_names_the_data_function(data_dir, tmp_path):
    res = _invoke(data_dir, tmp_path, "--data_delay=0.02", opts=["--steps", "3", "--details"])  # ~24 data samples
    assert res.exit_code == 0, res.output
    assert "iter 0:" in res.stdout  # the script's own output, live
    assert "Where a typical step's time goes" in res.stdout  # --details: the whole report
    assert "in get_batch (nanogpt_train.py:" in res.stdout  # the data fix's evidence names it


def test_analyze_of_a_saved_script_profile_shows_the_same_attribution(data_dir, tmp_path):
    out = tmp_path / "run.gpuprof.json"
    res = _invoke(data_dir, tmp_path, "--data_delay=0.02", opts=["--steps", "3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    again = runner.invoke(app, ["analyze", str(out), "--details"])
    assert again.exit_code == 0, again.output
    assert "in get_batch (nanogpt_train.py:" in again.stdout
    words = " ".join(again.stdout.split())  # without the terminal's line wraps
    assert "the script's own log: nanogpt format, 3 step lines" in words and "; gpuprof's typical step " in words


def test_crash_writes_a_partial_profile_and_exits_1(data_dir, tmp_path):
    out = tmp_path / "crash.gpuprof.json"
    res = _invoke(data_dir, tmp_path, "--crash_at=2", opts=["--out", str(out), "--steps", "5"])
    assert res.exit_code == 1
    line = next(i for i, s in enumerate(Path(NANOGPT).read_text().splitlines(), 1) if "injected crash" in s)
    errors = [x for x in res.stderr.splitlines() if x.startswith("gpuprof: error:")]
    assert len(errors) == 1 and f"nanogpt_train.py:{line}: RuntimeError: injected crash at iter 2" in errors[0]
    saved = json.loads(out.read_text())
    assert saved["run"]["partial"] is True and saved["run"]["error"]["line"] == line
    assert len(saved["warmup_steps"]) + len(saved["steps"]) == 2


def test_ctrl_c_gives_a_partial_report_and_exits_130(data_dir, tmp_path):
    out = tmp_path / "int.gpuprof.json"
    res = _invoke(data_dir, tmp_path, "--interrupt_at=3", opts=["--out", str(out), "--steps", "5"])
    assert res.exit_code == 130
    saved = json.loads(out.read_text())
    assert saved["run"]["partial"] is True and saved["run"]["ended"] == "interrupted"
    assert len(saved["warmup_steps"]) + len(saved["steps"]) == 3
    assert "gpuprof diagnosis (partial)" in res.stdout


def test_a_loop_that_never_steps_its_optimizer_gets_steps_from_its_zero_grad(data_dir, tmp_path):
    # nanoGPT's loop with optimizer.step() left out: its zero_grad after the backwards still ends
    # each loop iteration (the `zero_grad` step rule), and the report says so.
    out = tmp_path / "run.gpuprof.json"
    res = _invoke(data_dir, tmp_path, "--no_step=True", "--max_iters=20", opts=["--out", str(out), "--details"])
    assert res.exit_code == 0, res.output
    saved = json.loads(out.read_text())
    assert len(saved["steps"]) == 2 and [s["micro_steps"] for s in saved["steps"]] == [4, 4]
    rule = saved["measurements"]["script"]["steps"]
    assert (rule["rule"], rule["marker"]) == ("zero_grad", "AdamW.zero_grad()")
    assert rule["optimizers_alive"] >= 1  # the script's AdamW (and any an earlier test left alive)
    words = " ".join(res.stdout.replace("│", " ").split())  # What ran's box, unwrapped
    assert "steps one per parameter update: no optimizer step was seen, and AdamW.zero_grad()" in words


def test_bad_script_paths_exit_2(tmp_path):
    (tmp_path / "data.bin").write_bytes(bytes(range(256)))
    for bad in (tmp_path / "missing.py", tmp_path, tmp_path / "data.bin"):
        res = runner.invoke(app, ["diagnose", str(bad)])
        assert res.exit_code == 2
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("gpuprof: error:")


# -- output paths are checked before the script starts; a late write failure is rescued -----


@pytest.fixture
def no_script(monkeypatch):
    import gpuprof.runners.script as script

    monkeypatch.setattr(script, "run_script", lambda *a, **k: pytest.fail("the script started"))


@pytest.mark.parametrize(
    "opts, text",
    [
        (["--out", "/proc/x.json"], "--out: cannot write /proc/x.json: cannot create files in /proc"),
        (["--out", "{tmp}/missing/x.json"], "--out: cannot write {tmp}/missing/x.json: folder {tmp}/missing does not exist"),
        (["--out", "{tmp}"], "--out: cannot write {tmp}: it is a directory"),
        (["--write", "{tmp}/mine.py"], "--write: {tmp}/mine.py already exists; pass --force to replace it"),
        (["--out", NANOGPT], f"--out: {NANOGPT} is this run's script; writing the profile there would replace it"),
    ],
    ids=["proc", "missing-folder", "folder", "write-existing", "the-script-itself"],
)
def test_a_bad_output_path_fails_before_the_script_starts(no_script, data_dir, tmp_path, opts, text):
    if "/proc/" in text and not Path("/proc/self").exists():
        pytest.skip("needs Linux /proc")
    (tmp_path / "mine.py").write_text("batch_size = 12\n")
    res = _invoke(data_dir, tmp_path, opts=[o.replace("{tmp}", str(tmp_path)) for o in opts])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("gpuprof: error: " + text.replace("{tmp}", str(tmp_path))), line
    assert (tmp_path / "mine.py").read_text() == "batch_size = 12\n"


def test_a_profile_write_that_fails_after_the_script_is_rescued(data_dir, tmp_path, monkeypatch):
    import errno

    import gpuprof.files as files

    real, calls = files.atomic_write, []

    def flaky(path, data, overwrite=True):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.EACCES, "Permission denied")
        return real(path, data, overwrite=overwrite)

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(files, "atomic_write", flaky)
    out = tmp_path / "run.gpuprof.json"
    res = _invoke(data_dir, tmp_path, opts=["--out", str(out)])
    assert res.exit_code == 3, res.output
    (rescued,) = cwd.glob("run.gpuprof.rescued-*.json")
    assert json.loads(rescued.read_text())["run"]["mode"] == "script" and not out.exists()
    assert (f"gpuprof: warning: could not write the profile to {out} (PermissionError: Permission denied); "
            f"saved it to {rescued} instead") in res.stderr.splitlines()
