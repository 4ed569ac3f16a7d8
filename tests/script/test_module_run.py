"""`gpuprof diagnose -m MODULE ARGS`: a repo's script run as `python -m` runs it (tests/module_repo.py);
gpuprof's options written after the script never reach it silently; what the script read from its
command line and environment is recorded in the profile; nothing stays patched after a run."""

import argparse
import io
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.cli.options import script_target, split_at_module
from gpuprof.errors import GpuprofError
from gpuprof.runners.script import run_script
from gpuprof.runners.script_inputs import OptionAfterScript, OwnOptions, ScriptInputs

from module_repo import forget_modules, make_repo

runner = CliRunner()
FAST = ["--steps", "3", "--warmup", "1", "--no-samplers", "--post-budget", "0"]
OWN = OwnOptions("gpuprof diagnose", {"--warmup": True, "--steps": True, "--json": False, "-o": True})
PATCHED = ((argparse.ArgumentParser, "parse_known_args"), (argparse.ArgumentParser, "parse_known_intermixed_args"),
           (os._Environ, "__getitem__"))
ORIGINALS = {(cls, name): cls.__dict__[name] for cls, name in PATCHED}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """The repository, the working directory at its root (where `python -m` is run from)."""
    forget_modules()
    root = make_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    yield root
    forget_modules()


def _run(name, *args, **kw):
    buf = io.StringIO()
    run = run_script(name, list(args), module=True, steps=3, warmup=1, post_budget_s=0.0, stdout=buf, **kw)
    return run, buf.getvalue()


def _where(out: str) -> dict:
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("WHERE "))[len("WHERE "):])


def _nothing_patched():
    for (cls, name), orig in ORIGINALS.items():
        assert cls.__dict__[name] is orig, f"{cls.__name__}.{name} left patched"


def _one_line(res, code):
    assert res.exit_code == code, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("gpuprof: error:")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


def test_a_module_runs_as_python_m_runs_it_and_its_steps_are_profiled(repo, monkeypatch):
    monkeypatch.setenv("TINY_DTYPE", "bfloat16")
    path, argv = list(sys.path), list(sys.argv)
    main = sys.modules.get("__main__")
    run, out = _run("scripts.train", "--device-batch-size", "4")
    assert run.ended == "stopped" and len(run.profile.steps) == 3 and len(run.profile.warmup_steps) == 1
    assert "step 2: loss" in out and "step 4: loss" not in out  # stopped at the 4th step (warmup + steps)
    assert run.profile.run["command"] == ["-m", "scripts.train", "--device-batch-size", "4"]
    where = _where(out)
    file = str(repo / "scripts" / "train.py")
    assert where == {"argv0": file, "path0": str(repo), "package": "scripts", "spec": "scripts.train",
                     "file": file, "name": "__main__"}
    assert (sys.path, sys.argv, sys.modules.get("__main__")) == (path, argv, main)  # all restored
    _nothing_patched()


@pytest.mark.parametrize("name", ["scripts.where", "wherepkg"])
def test_what_the_module_sees_is_what_python_m_gives_it(repo, name):
    """A namespace package's module, and a package's __main__ importing its sibling relatively."""
    python = subprocess.run([sys.executable, "-m", name], capture_output=True, text=True, timeout=60, cwd=repo)
    assert python.returncode == 0, python.stderr
    run, out = _run(name)  # no training step: no profile, but it ran
    assert run.profile is None and run.ended == "finished"
    assert _where(out) == _where(python.stdout)


def test_a_package_runs_its_main_with_a_relative_import_and_is_profiled(repo):
    run, out = _run("trainpkg")
    assert run.ended == "stopped" and len(run.profile.steps) == 3
    assert _where(out)["package"] == "trainpkg" and _where(out)["spec"] == "trainpkg.__main__"
    assert run.profile.run["command"] == ["-m", "trainpkg"]


def test_the_path_form_fails_as_python_does_and_the_module_form_works(repo):
    python = subprocess.run([sys.executable, "scripts/train.py"], capture_output=True, text=True, timeout=60)
    assert python.returncode == 1 and "ModuleNotFoundError: No module named 'pkg'" in python.stderr
    line = _one_line(runner.invoke(app, ["diagnose", *FAST, "scripts/train.py"]), 1)
    assert "train.py:7: ModuleNotFoundError: No module named 'pkg'" in line
    assert "-m scripts.train" in line  # the hint: python -m from this folder finds it
    res = runner.invoke(app, ["diagnose", *FAST, "--json", "-m", "scripts.train", "--num-iterations", "6"])
    assert res.exit_code == 0, res.output
    prof = json.loads(res.stdout)
    assert prof["run"]["command"] == ["-m", "scripts.train", "--num-iterations", "6"]
    assert len(prof["steps"]) == 3
    assert "gpuprof: profiling" not in res.stderr  # --json: nothing of gpuprof's but errors


def test_the_report_shows_the_module_command(repo):
    res = runner.invoke(app, ["diagnose", *FAST, "--details", "-m", "scripts.train", "--num-iterations", "6"])
    assert res.exit_code == 0, res.output
    assert "gpuprof: profiling -m scripts.train:" in res.stderr
    assert "script     -m scripts.train --num-iterations 6" in res.stdout  # What ran (--details)


@pytest.mark.parametrize("args, says", [
    (["-m", "scripts.nope"], "-m scripts.nope: no module named 'scripts.nope'"),
    (["-m", "nope.train"], "-m nope.train: no module named 'nope' (python -m looks in the current folder"),
    (["-m", "scripts/train.py"], "-m takes a module name (-m scripts.train), not a path"),
    (["-m", "pkg"], "'pkg' is a package without a __main__ module"),
    (["-m", "pkg.model.x"], "'pkg.model' is a module, not a package"),
    (["-m", ".train"], "relative module names are not supported"),
])
def test_a_module_that_cannot_run_is_one_line_and_exit_2(repo, args, says):
    assert says in _one_line(runner.invoke(app, ["diagnose", *FAST, *args, "--x"]), 2)


def test_a_gpuprof_option_after_the_script_stops_it_before_a_step(repo):
    res = runner.invoke(app, ["diagnose", *FAST, "-m", "scripts.train", "--warmup", "3"])
    line = _one_line(res, 2)
    assert line == ("gpuprof: error: --warmup after the script is gpuprof's option, and the script has no --warmup "
                    "(its argparse would read it as --warmup-steps): put gpuprof's options before the script: "
                    "gpuprof diagnose --warmup 3 -m scripts.train ...")
    assert "step 0:" not in res.output  # the script never ran a step
    _nothing_patched()


def test_a_gpuprof_option_after_a_script_path_is_caught_too(repo, monkeypatch):
    # the path form with the repo importable, as PYTHONPATH=. puts it: after sys.path[0] (the script's folder)
    monkeypatch.setattr(sys, "path", [sys.path[0], str(repo), *sys.path[1:]])
    line = _one_line(runner.invoke(app, ["diagnose", *FAST, "scripts/train.py", "--json"]), 2)
    assert "--json after the script is gpuprof's option" in line and "refuse it as unrecognized" in line
    assert line.endswith("gpuprof diagnose --json scripts/train.py ...")


def test_a_script_that_parses_its_flags_after_its_first_steps_is_stopped_as_well(repo):
    with pytest.raises(GpuprofError, match="--warmup after the script"):
        _run("scripts.late_args", "--warmup", "3", own_options=OWN)
    _nothing_patched()


def test_the_modules_file_is_never_an_output(repo):
    before = (repo / "scripts" / "train.py").read_text()
    line = _one_line(runner.invoke(app, ["diagnose", *FAST, "--out", "scripts/train.py", "-m", "scripts.train"]), 2)
    assert "is this run's script" in line and (repo / "scripts" / "train.py").read_text() == before


def test_the_scripts_own_option_of_that_name_passes_through(repo):
    res = runner.invoke(app, ["diagnose", *FAST, "--json", "-m", "scripts.own_steps", "--steps", "6"])
    assert res.exit_code == 0, res.output
    assert "STEPS 6" in res.stderr  # the script's --steps reached it (--json: its stdout is on stderr)
    prof = json.loads(res.stdout)
    assert len(prof["steps"]) == 3  # gpuprof's --steps 3, before the script
    entry = next(e for e in prof["run"]["config"]["script_inputs"]["argparse"] if e["dest"] == "steps")
    assert entry["value"] == 6 and entry["given"] is True


def test_a_configurator_script_given_a_gpuprof_option_fails_with_the_hint(repo):
    line = _one_line(runner.invoke(app, ["diagnose", *FAST, "-m", "scripts.cfg_train", "--steps=3"]), 1)
    assert "ValueError: Unknown config key: steps" in line
    assert line.endswith("; --steps=3 after the script went to the script: gpuprof's options come before the script")
    _nothing_patched()


def test_what_the_script_read_is_recorded(repo, monkeypatch):
    monkeypatch.setenv("TINY_DTYPE", "bfloat16")
    monkeypatch.setenv("TINY_RANKED", "1")
    monkeypatch.setenv("TINY_NEVER_READ", "1")  # in the environment, read only by the copy
    run, _ = _run("scripts.train", "--device-batch-size", "4", own_options=OWN)
    inputs = run.profile.config["script_inputs"]
    entries = {e["dest"]: e for e in inputs["argparse"]}
    assert entries["device_batch_size"] == {"flags": ["--device-batch-size"], "dest": "device_batch_size",
                                            "value": 4, "default": 32, "given": True, "type": "int",
                                            "source": "argv"}
    assert entries["warmup_steps"]["given"] is False and entries["warmup_steps"]["value"] == 2
    # the parser given its own list: recorded, its values not from the command line
    assert entries["lr"]["value"] == 0.05 and entries["lr"]["given"] is False and entries["lr"]["source"] == "explicit"
    env = inputs["env"]
    assert env["TINY_DTYPE"] == "bfloat16"  # a name that says the precision: its value
    assert "HOME" in env and env["HOME"] is None  # os.getenv: the name only
    assert "TINY_RANKED" in env and "TINY_UNSET_NAME" in env  # `in`, and a subscript of an unset name
    assert "TINY_NEVER_READ" not in env and "PATH" not in env  # dict(os.environ) asks for no name
    assert not any(k.startswith(("TORCH", "OMP", "CUDA")) for k in env)  # torch's own reads are not the script's
    json.dumps(inputs)  # JSON as it is


def test_nothing_stays_patched_after_a_failed_or_interrupted_run(repo):
    run, _ = _run("scripts.cfg_train", "--nope=1")
    assert run.ended == "failed" and run.error["type"] == "ValueError"
    _nothing_patched()
    run, _ = _run("scripts.ctrl_c")
    assert run.ended == "interrupted"
    _nothing_patched()
    with pytest.raises(GpuprofError, match="--warmup after the script"):
        _run("scripts.train", "--warmup", "3", own_options=OWN)
    _nothing_patched()


# -- the argparse guard and recorder on their own -----------------------------------------

def _parse(argv, build, call):
    saved = sys.argv
    sys.argv = ["train.py", *argv]
    try:
        with ScriptInputs(OWN, "train.py") as rec:
            return rec, call(build())
    finally:
        sys.argv = saved


def _parser():
    p = argparse.ArgumentParser()
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--warmup-lr", type=float, default=0.1)
    p.add_argument("items", nargs="*")
    return p


def test_the_guard_names_what_argparse_would_do():
    with pytest.raises(OptionAfterScript, match=r"would find it ambiguous: --warmup-lr, --warmup-steps"):
        _parse(["--warmup=3"], _parser, lambda p: p.parse_args())
    with pytest.raises(OptionAfterScript, match=r"refuse it as unrecognized"):
        _parse(["a", "--json"], _parser, lambda p: p.parse_intermixed_args())
    # parse_known_args: an unknown option goes back to the script's code (it may pass it on)
    rec, (ns, rest) = _parse(["--json"], _parser, lambda p: p.parse_known_args())
    assert rest == ["--json"]
    # after `--`, and a parser given its own list, are the script's business
    _parse(["--", "--steps"], _parser, lambda p: p.parse_args())
    _parse(["--json"], _parser, lambda p: p.parse_args(["x"]))
    _nothing_patched()


def test_sub_parsers_and_intermixed_parses_are_recorded_once_from_the_command_line():
    def build():
        p = argparse.ArgumentParser()
        sub = p.add_subparsers(dest="cmd")
        t = sub.add_parser("train")
        t.add_argument("--steps", type=int, default=1)  # gpuprof's name, the sub-parser's own option
        return p

    rec, ns = _parse(["train", "--steps", "4"], build, lambda p: p.parse_args())
    assert ns.steps == 4
    assert rec.to_dict()["argparse"] == [{"flags": ["--steps"], "dest": "steps", "value": 4, "default": 1,
                                          "given": True, "type": "int", "source": "argv"}]
    rec, ns = _parse(["a", "--warmup-steps", "7", "b"], _parser, lambda p: p.parse_intermixed_args())
    assert ns.items == ["a", "b"]
    got = {e["dest"]: e for e in rec.to_dict()["argparse"]}
    assert got["warmup_steps"]["given"] is True and got["warmup_steps"]["source"] == "argv"
    assert got["warmup_lr"]["given"] is False


def test_values_that_are_not_json_scalars_are_their_repr_cut_short():
    def build():
        p = argparse.ArgumentParser()
        p.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
        p.add_argument("--name", default="x" * 200)
        p.add_argument("--ratio", type=float, default=float("nan"))
        return p

    rec, _ = _parse(["--sizes", "3", "4"], build, lambda p: p.parse_args())
    got = {e["dest"]: e for e in rec.to_dict()["argparse"]}
    assert got["sizes"]["value"] == "[3, 4]" and got["sizes"]["default"] == "[1, 2]"
    assert got["name"]["value"] == "x" * 200  # a string is a string
    assert got["ratio"]["value"] == "nan"
    json.dumps(rec.to_dict(), allow_nan=False)


def test_a_compiled_function_that_reads_the_environment_still_compiles_whole(monkeypatch):
    """The guest rule: torch.compile(fullgraph=True) of a function reading os.environ compiles as
    it does without gpuprof (the recorder's frame walk would be a graph break)."""
    import torch

    monkeypatch.setenv("TINY_X", "2")

    def double_if_set(x):
        return x * 2 if os.environ.get("TINY_X") == "2" else x

    torch._dynamo.reset()
    try:
        with ScriptInputs(OWN, "train.py"):
            out = torch.compile(double_if_set, backend="eager", fullgraph=True)(torch.ones(2))
    finally:
        torch._dynamo.reset()
    assert out.tolist() == [2.0, 2.0]
    _nothing_patched()


# -- the command line ---------------------------------------------------------------------

def test_minus_m_ends_gpuprofs_options():
    import typer

    cmd = typer.main.get_command(app).commands["diagnose"]
    assert split_at_module(cmd, ["--steps", "3", "-m", "scripts.train", "--steps", "5", "-o", "x"]) == (
        ["--steps", "3", "-m", "scripts.train"], ["--steps", "5", "-o", "x"])
    assert split_at_module(cmd, ["--module=scripts.train", "--json"]) == (["--module=scripts.train"], ["--json"])
    assert split_at_module(cmd, ["--json", "-mscripts.train", "-m", "x"]) == (
        ["--json", "-mscripts.train"], ["-m", "x"])
    assert split_at_module(cmd, ["train.py", "-m", "x"]) is None  # after the script path: the script's
    assert split_at_module(cmd, ["--out", "-m", "train.py"]) is None  # -m as --out's value
    assert split_at_module(cmd, ["-m"]) is None  # click says it needs a value
    with pytest.raises(GpuprofError, match="not both"):
        script_target("train.py", "scripts.train")


def test_help_says_where_gpuprofs_options_go():
    res = runner.invoke(app, ["diagnose", "--help"])
    words = " ".join(res.output.split())
    assert res.exit_code == 0 and "gpuprof's options come before the script" in words
    assert "-m, --module" in words or "--module -m" in words
