"""CLI: diagnose on the built-in loop, --out/--json, analyze round trip, bad input -> exit 2."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gpuprof.cli import app

runner = CliRunner()
FAST = ["--n-layer", "1", "--n-embd", "64", "--n-head", "2", "--batch-size", "2", "--block-size", "32",
        "--grad-accum", "2", "--steps", "3", "--warmup", "1", "--device", "cpu", "--no-samplers"]


def test_diagnose_json_and_analyze_round_trip(tmp_path):
    out = tmp_path / "run.gpuprof.json"
    res = runner.invoke(app, ["diagnose", *FAST, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    saved = json.loads(out.read_text())
    assert printed == saved
    assert saved["schema_version"] == 2 and saved["tool"]["name"] == "gpuprof"
    assert "summary" not in saved and "findings" not in saved  # the judgement is the analysis, beside it
    analysis = saved["analysis"]
    s = analysis["steps"]
    assert s["step_s"] > 0 and s["tokens_per_s"] == pytest.approx(2 * 32 * 2 / s["step_s"])
    assert s["n_steps"] == 3 and s["step_s"] == pytest.approx(sum(p["seconds"] for p in s["phases"].values()))
    for name in ("data", "h2d", "forward", "backward", "optimizer", "other"):
        assert 0 <= s["phases"][name]["share"] <= 1 and "seconds" in s["phases"][name]
    findings = analysis["findings"]
    assert findings and {"id", "title", "saving_s", "saving_share"} <= set(findings[0])

    again = runner.invoke(app, ["analyze", str(out), "--json"])
    assert again.exit_code == 0, again.output
    re_read = json.loads(again.stdout)
    assert re_read["analysis"]["steps"] == s  # the same steps judged again: the same statistics
    assert [f["id"] for f in re_read["analysis"]["findings"]] == [f["id"] for f in findings]
    assert re_read["steps"] == saved["steps"]
    stored = runner.invoke(app, ["analyze", str(out), "--json", "--stored"])
    assert stored.exit_code == 0, stored.output
    assert json.loads(stored.stdout)["analysis"]["findings"] == findings  # the saved analysis, as saved

    report = runner.invoke(app, ["analyze", str(out)])  # the first screen
    assert report.exit_code == 0
    assert "Where the step goes: " in report.stdout and "tokens/s" in report.stdout
    assert "more with --details" in report.stdout and "Where a typical step's time goes" not in report.stdout
    full = runner.invoke(app, ["analyze", str(out), "--details"])  # the whole report, then the details
    assert full.exit_code == 0
    assert "Where a typical step's time goes" in full.stdout and "What ran" in full.stdout
    assert "Model FLOPs utilization" in full.stdout and "more with --details" not in full.stdout


def test_diagnose_report(tmp_path):
    res = runner.invoke(app, ["diagnose", *FAST], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    assert "forward" in res.stdout and "Verdict:" in res.stdout
    # issue #43: verdict first, at most 25 lines at 100 columns before "more with --details"
    lines = res.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("gpuprof diagnosis"))
    hint = next(i for i, line in enumerate(lines) if line.startswith("more with --details"))
    assert hint - start <= 25 and lines[start + 1].startswith("step ")
    assert any(line.startswith("Verdict:") for line in lines[start + 2:start + 5])


def _one_line_error(res, text):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and text in err, err


def test_missing_data_file(tmp_path):
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, "--data", str(tmp_path / "nope.bin")]), "does not exist")


def test_data_file_too_short(tmp_path):
    path = tmp_path / "short.bin"
    np.arange(8, dtype=np.uint16).tofile(path)
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, "--data", str(path)]), "needs at least 33")


@pytest.mark.parametrize(
    "args, text",
    [
        (["--dtype", "fp12"], "unknown dtype"),
        (["--model", "gpt5"], "unknown model preset"),
        (["--steps", "0"], "--steps must be positive"),
        (["--steps", "-3"], "--steps must be positive"),
        (["--grad-accum", "0"], "--grad-accum must be positive"),
    ],
)
def test_bad_options(args, text):
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, *args]), text)


@pytest.mark.parametrize(
    "content, text",
    [("{oops", "not valid JSON"), ('{"a": 1}', "not a gpuprof profile"),
     ('{"schema_version": 7, "tool": {"name": "gpuprof"}}', "newer")],
)
def test_analyze_bad_files(tmp_path, content, text):
    path = tmp_path / "p.json"
    path.write_text(content)
    _one_line_error(runner.invoke(app, ["analyze", str(path)]), text)


def test_write_refuses_an_existing_file_before_running(tmp_path):
    target = tmp_path / "corrected.py"
    target.write_text("batch_size = 12\n")
    res = runner.invoke(app, ["diagnose", *FAST, "--write", str(target)])
    _one_line_error(res, "already exists")
    assert target.read_text() == "batch_size = 12\n"


def test_bad_disk_report_fails_before_running(tmp_path):
    bad = tmp_path / "disk.json"
    bad.write_text('{"hello": 1}')
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, "--disk-report", str(bad)]), "not a bench-disk JSON result")


# -- nothing lost, nothing silent: outputs checked before the run, rescued after it ----------


@pytest.fixture
def no_run(monkeypatch):
    """The built-in loop fails the test if it starts."""
    import gpuprof.runners.builtin as builtin

    def started(*args, **kwargs):
        pytest.fail("the built-in loop started")

    monkeypatch.setattr(builtin, "run_builtin", started)


@pytest.mark.parametrize(
    "opts, text",
    [
        (["--out", "/proc/x.json"], "--out: cannot write /proc/x.json: cannot create files in /proc"),
        (["--out", "{tmp}/missing/x.json"], "--out: cannot write {tmp}/missing/x.json: folder {tmp}/missing does not exist"),
        (["--out", "{tmp}"], "--out: cannot write {tmp}: it is a directory"),
        (["--write", "{tmp}/mine.py"], "--write: {tmp}/mine.py already exists; pass --force to replace it"),
        (["--out", "{tmp}/p.json", "--write", "{tmp}/p.json", "--force"], "--out and --write both name"),
    ],
    ids=["proc", "missing-folder", "folder", "write-existing", "same-file"],
)
def test_a_bad_output_path_fails_before_anything_runs(no_run, tmp_path, opts, text):
    if "/proc/" in text and not __import__("os").path.isdir("/proc/self"):
        pytest.skip("needs Linux /proc")
    (tmp_path / "mine.py").write_text("batch_size = 12\n")
    opts = [o.replace("{tmp}", str(tmp_path)) for o in opts]
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, *opts]), text.replace("{tmp}", str(tmp_path)))
    assert (tmp_path / "mine.py").read_text() == "batch_size = 12\n"


def _fails_once(monkeypatch):
    """gpuprof.files.atomic_write raising ENOSPC on its first call only (a disk full after the
    run); the rescue's own write then goes through."""
    import errno

    import gpuprof.files as files

    real, calls = files.atomic_write, []

    def flaky(path, data, overwrite=True):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, overwrite=overwrite)

    monkeypatch.setattr(files, "atomic_write", flaky)
    return calls


def test_a_write_that_fails_after_the_run_is_rescued_and_exits_3(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    _fails_once(monkeypatch)
    out = tmp_path / "run.gpuprof.json"
    res = runner.invoke(app, ["diagnose", *FAST, "--out", str(out), "--json"])
    assert res.exit_code == 3, res.output
    (rescued,) = cwd.iterdir()
    assert rescued.name.startswith("run.gpuprof.rescued-") and rescued.suffix == ".json"
    assert json.loads(rescued.read_text()) == json.loads(res.stdout)  # the whole profile, safe
    assert not out.exists()
    line = res.stderr.strip().splitlines()[-1]  # after the post-run progress lines
    assert line == (f"gpuprof: warning: could not write the profile to {out} (OSError: No space left "
                    f"on device); saved it to {rescued} instead")


def test_the_report_names_the_rescued_file_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails_once(monkeypatch)
    res = runner.invoke(app, ["diagnose", *FAST, "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 3, res.output
    assert "Where the step goes: " in res.stdout and "profile written to" not in res.stdout
    assert "saved it to " + str(next(tmp_path.glob("p.rescued-*.json"))) in res.stderr


def test_block_size_100000_is_refused_before_anything_runs_with_the_memory_numbers(no_run, monkeypatch):
    import gpuprof.preflight as preflight
    import gpuprof.runners.builtin as builtin

    monkeypatch.setattr(preflight, "device_memory", lambda device: (16 * 1024**3, "available RAM"))
    monkeypatch.setattr(preflight, "probe_ceiling", lambda *a: pytest.fail("probed a run that cannot fit"))
    monkeypatch.setattr(builtin, "GPT", lambda *a, **k: pytest.fail("built a model for a run that cannot fit"))
    res = runner.invoke(app, ["diagnose", "--block-size", "100000", "--device", "cpu", "--no-samplers"])
    _one_line_error(res, "this run would not fit: its peak memory is estimated at 62.1 GiB (memory model")
    assert "vs 16.0 GiB available RAM" in res.stderr and "largest that fit (estimated): --batch-size " in res.stderr


def test_post_run_work_shares_the_budget_and_says_what_it_does(tmp_path):
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["diagnose", *FAST, "--post-budget", "0.5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "gpuprof: after the run: micro-batch curve (up to" in res.stderr
    post = json.loads(out.read_text())["measurements"]["post_run"]
    assert post["budget_s"] == 0.5 and post["source"] == "--post-budget"
    # --no-samplers: no probe; `settle` runs when what was timed left a saving within noise;
    # `experiments` (the loop's own steps with a fix switched, first) when one fits what was left
    assert {"flops", "microbatch"} <= set(post["parts"]) <= {"experiments", "flops", "microbatch", "settle"}
    # each part is allotted at most what the budget had left when it started (speed-independent:
    # what a part spends depends on the machine, the rule that bounds it does not)
    spent = 0.0
    for name, part in post["parts"].items():
        assert part["allotted_s"] <= max(0.0, post["budget_s"] - spent) + 1e-6, (name, post)
        spent += part["spent_s"]
    bad = runner.invoke(app, ["diagnose", *FAST, "--post-budget", "-1"])
    assert bad.exit_code == 2 and "--post-budget" in bad.stderr


def _slow_ceiling(monkeypatch, flops_s=1e6):
    """A fake slow device: at 1 MFLOP/s the FAST config's 2.4e8 FLOPs per step take 4.0 min."""
    import gpuprof.preflight as preflight

    monkeypatch.setattr(preflight, "FLOOR_FLOPS_PER_S", 0.0)  # probe even this small a step
    monkeypatch.setattr(preflight, "probe_ceiling",
                        lambda device, dtype: preflight.Ceiling(flops_s, f"a fake {flops_s / 1e6:g} MFLOP/s ceiling"))


def test_an_hour_long_run_is_refused_without_allow_slow(no_run, monkeypatch):
    _slow_ceiling(monkeypatch, 2e5)
    _one_line_error(runner.invoke(app, ["diagnose", *FAST]),
                    "one optimizer step is estimated at 20.2 min (2.4e8 FLOPs per step by the nanoGPT "
                    "formula ÷ a fake 0.2 MFLOP/s ceiling); the 4 steps of this run (warmup + measured) "
                    "≈ 81.0 min; pass --allow-slow to run it anyway")


def test_a_step_of_minutes_is_said_up_front_and_runs(monkeypatch):
    _slow_ceiling(monkeypatch)
    res = runner.invoke(app, ["diagnose", *FAST])
    assert res.exit_code == 0, res.output
    first = res.stderr.splitlines()[0]
    assert first.startswith("gpuprof: warning: one optimizer step is estimated at 4.0 min (2.4e8 FLOPs")
    assert first.endswith("running it, Ctrl-C stops it")
    assert "Where the step goes: " in res.stdout


def test_write_with_no_config_fix_still_prints_the_report(tmp_path, monkeypatch):
    import gpuprof.cli.output as output

    monkeypatch.setattr(output, "corrected_text", lambda analysis: None)
    target = tmp_path / "corrected.py"
    res = runner.invoke(app, ["diagnose", *FAST, "--write", str(target)])
    assert res.exit_code == 0, res.output
    assert "Where the step goes: " in res.stdout and not target.exists()
    assert res.stderr.strip().splitlines()[-1] == (f"gpuprof: note: nothing written to {target}: no finding "
                                                   f"of this run is a config fix")
