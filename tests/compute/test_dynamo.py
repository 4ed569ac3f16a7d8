"""torch.compile's graph breaks and recompilations, read from dynamo's own records during a run
(gpuprof.measure.dynamo), typed (gpuprof.sections.dynamo) and turned into findings
(gpuprof.analysis.rules.compile_breaks). The runs compile with backend="eager": dynamo only, no
inductor, no C compiler."""

import inspect
import logging
import os
import sys
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo
import torch._logging._internal as tli

from gpuprof.analysis.findings import Context
from gpuprof.analysis.rules import compile_breaks
from gpuprof.measure.dynamo import DynamoRecords, parse_graph_break, parse_recompile
from gpuprof.profile import Profile, StepRecord
from gpuprof.sections import Sections
from gpuprof.sections.dynamo import DynamoSection

HERE = os.path.basename(__file__)


class WithBreak(torch.nn.Module):
    """Two linears with a data-dependent .item() check between them: one graph break."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.a(x)
        if y.abs().sum().item() > 0:
            y = y * 2
        return self.b(y)


class NoBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _item_line() -> int:
    lines, first = inspect.getsourcelines(WithBreak.forward)
    return first + next(i for i, ln in enumerate(lines) if ".item()" in ln)


def _forward_line() -> int:
    return inspect.getsourcelines(WithBreak.forward)[1]


class FakeTimer:
    def __init__(self):
        self.step_index, self.current, self.in_step = None, "other", False

    def step(self, i: int) -> None:
        self.step_index, self.current, self.in_step = i, "forward", True


def _logging_state() -> dict:
    """Every torch logger's level, propagation and handlers, the log state's artifacts and
    dynamo's compile callbacks: what the instrument must leave as it found them."""
    loggers = {name: (lg.level, lg.propagate, tuple(lg.handlers))
               for name, lg in logging.root.manager.loggerDict.items()
               if name.startswith("torch") and isinstance(lg, logging.Logger)}
    cb = torch._dynamo.callback_handler
    return {"loggers": loggers, "artifacts": set(tli.log_state.artifact_names),
            "callbacks": (tuple(cb.start_callbacks), tuple(cb.end_callbacks))}


def _same(before: dict, after: dict) -> bool:
    """The same state for every logger that existed before (compiling imports modules that add
    their own loggers)."""
    return ({k: after["loggers"].get(k) for k in before["loggers"]} == before["loggers"]
            and after["artifacts"] == before["artifacts"] and after["callbacks"] == before["callbacks"])


def _run(model, shapes: list, warmup: int = 1) -> dict:
    """The instrument around one call per step of `model`, step i with a (shapes[i], 8) input of
    ones (constant values: the .item() result is the same each call, so only the shape changes)."""
    timer = FakeTimer()
    ctx = SimpleNamespace(timer=timer, config={"warmup": warmup})
    inst = DynamoRecords()
    inst.start(ctx)
    for i, rows in enumerate(shapes):
        timer.step(i)
        model(torch.ones(rows, 8)).sum().backward()
    timer.step_index, timer.in_step = None, False
    return inst.stop(ctx)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def broken_run():
    """A compiled model with a graph break: warm-up step 0, measured steps 1-3, the input's batch
    size changing in step 3 (a recompilation there). Also the logging state before and after
    (after one compile outside the instrument: torch's first compile creates loggers and drops its
    lazy trace handler by itself)."""
    torch.compile(NoBreak(), backend="eager")(torch.ones(2, 8))
    torch._dynamo.reset()
    before = _logging_state()
    section = _run(torch.compile(WithBreak(), backend="eager"), [2, 2, 2, 4], warmup=1)
    after = _logging_state()
    torch._dynamo.reset()
    return section, before, after


def _profile(dynamo: dict, warm: int = 1, measured: int = 3) -> Profile:
    """A profile whose step indices are the timer's: warm-up 0..warm-1, then the measured steps."""
    def rec(i):
        return StepRecord(i, 1.0, {"forward": 0.4, "backward": 0.5, "optimizer": 0.1}, tokens=1024, micro_steps=1)

    return Profile(run={"mode": "builtin", "config": {"device": "cpu", "compile": True, "grad_accum": 1}},
                   steps=[rec(warm + i) for i in range(measured)], warmup_steps=[rec(i) for i in range(warm)],
                   environment={"device": "cpu"}, measurements={"dynamo": dynamo})


def _ctx(dynamo: dict, **kw) -> Context:
    p = _profile(dynamo, **kw)
    return Context(profile=p, stats=p.stats)


# ------------------------------------------------------------------------- the instrument
def test_the_break_is_recorded_at_this_files_item_line(broken_run):
    section, _, _ = broken_run
    assert section["compiled"] is True and section["graphs"] >= 2 and section["frames"] >= 2
    (b,) = section["breaks"]
    assert b["where"] == f"{HERE}:{_item_line()}" and b["line"] == _item_line()
    assert os.path.realpath(b["file"]) == os.path.realpath(__file__) and b["user_code"] is True
    assert "item()" in b["reason"] and b["count"] >= 1 and b["eager_fallback"] is False
    assert b["step_index"] == 0 and b["phase"] == "forward"  # met while compiling the first step
    assert any("capture_scalar_outputs" in h for h in b["hints"])


def test_the_shape_change_recompiles_in_its_step_with_the_guard(broken_run):
    section, _, _ = broken_run
    fwd = [r for r in section["recompiles"] if r["function"] == "forward"]
    assert len(fwd) == 1
    (r,) = fwd
    assert r["step_index"] == 3 and r["line"] == _forward_line() and r["where"] == f"{HERE}:{_forward_line()}"
    assert "size mismatch" in r["reason"] and "expected 2, actual 4" in r["reason"]
    assert r["compile_s"] is not None and r["compile_s"] > 0
    # the code after the break (dynamo's resume function) recompiles for the same shape change
    resumed = [r for r in section["recompiles"] if r["resume_of"]]
    assert resumed and all(r["step_index"] == 3 for r in resumed)
    assert resumed[0]["resume_of"] == {"function": "forward", "line": _item_line()}
    # each step that compiled is timed; nothing compiled in steps 1 and 2
    assert {c["step_index"] for c in section["compiles"]} == {0, 3}
    assert section["compile_s"] == pytest.approx(sum(c["seconds"] for c in section["compiles"]))


def test_a_new_item_value_recompiles_the_code_after_the_break():
    """The .item() result crosses the break into dynamo's resume function as a Python float it
    guards on: a new value (random inputs) recompiles that part in a measured step."""
    torch.manual_seed(0)
    model = torch.compile(WithBreak(), backend="eager")
    timer, inst = FakeTimer(), DynamoRecords()
    inst.start(SimpleNamespace(timer=timer, config={"warmup": 1}))
    for i in range(4):
        timer.step(i)
        model(torch.randn(2, 8)).sum().backward()
    section = inst.stop(None)
    resumed = [r for r in section["recompiles"] if r["resume_of"]]
    assert resumed and resumed[0]["step_index"] >= 1 and "___stack0 ==" in resumed[0]["reason"]
    found = [f for f in compile_breaks.recompiles(_ctx(section, warm=1, measured=3)) if f.id == "recompile"]
    assert found and f"the part of forward after its graph break at {HERE}:{_item_line()}" in found[0].title
    assert "remove that graph break" in found[0].fix


def test_logging_state_is_restored_after_stop(broken_run):
    _, before, after = broken_run
    assert _same(before, after)


def test_a_model_without_breaks_records_none():
    section = _run(torch.compile(NoBreak(), backend="eager"), [2, 2, 2])
    assert section["compiled"] is True and section["breaks"] == [] and section["recompiles"] == []
    assert section["graphs"] >= 1
    assert compile_breaks.graph_breaks(_ctx(section)) == [] and compile_breaks.recompiles(_ctx(section)) == []


def test_an_uncompiled_run_is_not_compiled_and_gives_no_finding():
    before = _logging_state()
    section = _run(WithBreak(), [2, 2, 4])
    assert _same(before, _logging_state())
    assert section["compiled"] is False and section["graphs"] == 0 and section["frames"] == 0
    assert section["breaks"] == [] and section["recompiles"] == [] and section["compile_s"] == 0.0
    ctx = _ctx(section)
    assert compile_breaks.graph_breaks(ctx) == [] and compile_breaks.recompiles(ctx) == []


def test_a_logger_the_user_enabled_keeps_printing():
    log = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
    level, propagate = log.level, log.propagate
    log.setLevel(logging.DEBUG)
    log.propagate = True
    try:
        inst = DynamoRecords()
        inst.start(SimpleNamespace(timer=FakeTimer(), config={}))
        assert log.propagate is True and log.level == logging.DEBUG  # left as the user set it
        inst.stop(None)
        assert log.propagate is True and log.level == logging.DEBUG and not any(
            type(h).__module__ == "gpuprof.measure.dynamo" for h in log.handlers)
    finally:
        log.setLevel(level)
        log.propagate = propagate


def test_a_record_propagating_to_a_parent_logger_is_read_once():
    log = logging.getLogger("torch._dynamo.convert_frame.__graph_breaks")
    level, propagate = log.level, log.propagate
    log.setLevel(logging.DEBUG)
    log.propagate = True  # as TORCH_LOGS=graph_breaks leaves it: on to torch._dynamo.convert_frame
    try:
        inst = DynamoRecords()
        inst.start(SimpleNamespace(timer=FakeTimer(), config={}))
        log.debug("Graph break in user code at /u/train.py:42\nGraph Break Reason: Data-dependent branching\n")
        section = inst.stop(None)
    finally:
        log.setLevel(level)
        log.propagate = propagate
    (b,) = section["breaks"]
    assert b["count"] == 1 and b["where"] == "train.py:42" and b["reason"] == "Data-dependent branching"


def test_a_failed_start_becomes_not_measured_and_restores(monkeypatch):
    before = _logging_state()

    def boom(self):
        self._saved_loggers.append((logging.getLogger("torch._dynamo.guards.__recompiles"), 0, True, True))
        logging.getLogger("torch._dynamo.guards.__recompiles").setLevel(logging.DEBUG)
        raise RuntimeError("boom")

    monkeypatch.setattr(DynamoRecords, "_hook", boom)
    inst = DynamoRecords()
    inst.start(SimpleNamespace(timer=FakeTimer(), config={}))  # never raises into the run
    assert inst.stop(None) == {"not_measured": "start failed: RuntimeError: boom"}
    assert _same(before, _logging_state())


def test_a_record_that_cannot_be_read_never_reaches_the_compile(monkeypatch):
    def boom(*args, **kwargs):
        raise ValueError("unreadable")

    monkeypatch.setattr("gpuprof.measure.dynamo.parse_graph_break", boom)
    section = _run(torch.compile(WithBreak(), backend="eager"), [2, 2])
    assert section["compiled"] is True and section["breaks"] == []
    assert section["errors"][0] == "a dynamo log record not read: ValueError: unreadable"


def test_dynamo_imported_during_the_run_gives_the_totals_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._dynamo")
    inst = DynamoRecords()
    inst.start(SimpleNamespace(timer=FakeTimer(), config=SimpleNamespace(warmup=2)))  # hooks nothing
    monkeypatch.undo()
    section = inst.stop(None)
    assert "not_captured" in section and section["warmup"] == 2 and section["breaks"] == []


def test_a_graph_break_inside_torch_is_placed_at_the_users_frame():
    torch_file = os.path.join(os.path.dirname(torch.__file__), "nn", "functional.py")
    msg = (f"Graph break in user code at {torch_file}:100\nGraph Break Reason: Data-dependent branching\n"
           "  Explanation: Detected data-dependent branching.\n  Hint: Use `torch.cond`.\n\n"
           f'User code traceback:\n  File "/home/u/train.py", line 42, in forward\n    y = F.thing(x)\n'
           f'  File "{torch_file}", line 100, in thing\n    if x.sum() > 0:\n')
    info = parse_graph_break(msg)
    assert (info["file"], info["line"], info["user_code"]) == ("/home/u/train.py", 42, True)
    assert (info["dynamo_file"], info["dynamo_line"]) == (torch_file, 100)
    assert info["reason"] == "Data-dependent branching" and info["hints"] == ["Use `torch.cond`."]
    rec = parse_recompile(
        "Recompiling function inner in " + os.path.join(os.path.dirname(torch.__file__), "_dynamo", "external_utils.py")
        + ":67\n    triggered by the following guard failure(s):\n    - 0/0: GLOBAL_STATE changed: grad_mode \n")
    assert rec["reason"] == "GLOBAL_STATE changed: grad_mode" and rec["user_code"] is False


def test_the_section_reads_typed(broken_run):
    section, _, _ = broken_run
    s = Sections.from_measurements({"dynamo": section}).dynamo
    assert isinstance(s, DynamoSection) and s.compiled is True and s.raw is section
    assert s.breaks[0].where == f"{HERE}:{_item_line()}" and s.breaks[0].hints
    assert {r.step_index for r in s.recompiles} == {3} and s.compiles[0].trigger == "dynamo"
    assert DynamoSection.from_dict({"not_measured": "x"}).breaks == ()


# ------------------------------------------------------------------------------ the rules
def test_the_real_run_gives_a_graph_break_and_a_recompile_finding(broken_run):
    section, _, _ = broken_run
    ctx = _ctx(section, warm=1, measured=3)
    (f,) = compile_breaks.graph_breaks(ctx)
    assert f.id == "graph-break" and f.title.startswith(f"torch.compile graph break at {HERE}:{_item_line()}: ")
    assert "Tensor.item()" in f.title and "capture_scalar_outputs = True" in f.fix
    assert f.saving_s is None and f.note.startswith("not estimated") and f.kind == "fix"
    found = [x for x in compile_breaks.recompiles(ctx) if x.id != "recompile-warmup"]
    assert {x.id for x in found} == {"recompile"}
    fwd = next(x for x in found if x.evidence["function"] == "forward")
    assert f"{HERE}:{_forward_line()}" in fwd.title and "size mismatch" in fwd.title
    assert "mark_dynamic" in fwd.fix and fwd.saving_s is None and fwd.evidence["step_indices"] == [3]
    assert fwd.evidence["compile_s"] > 0 and "per measured step" in fwd.because


def _break(reason, explanation=None, hints=(), **kw):
    b = {"reason": reason, "explanation": explanation, "hints": list(hints), "file": "/u/train.py",
         "line": 42, "where": "train.py:42", "user_code": True, "count": 2, "step_index": 0}
    b.update(kw)
    return b


@pytest.mark.parametrize("reason, explanation, hints, fix_has", [
    ("Unsupported Tensor.item() call with capture_scalar_outputs=False", None, (), "capture_scalar_outputs = True"),
    ("Data-dependent branching", "Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`).", (), "torch.cond"),
    ("Failed to trace builtin operator", "Dynamo does not know how to trace builtin operator `print` with argument types ['str']",
     (), "remove the print"),
    ("Attempted to call function marked as skipped", ("Dynamo does not know how to trace the builtin `posix.getpid.` This "
     "function is either a Python builtin (e.g. _warnings.warn) or a third-party C/C++ Python extension (perhaps created "
     "with pybind)."), ("If you are attempting to call a logging function (e.g. `print`) ...",),
     "call (posix.getpid) out of forward, or put it in a helper decorated with @torch.compiler.disable"),
    ("Attempted to call function marked as skipped", "Dynamo does not know how to trace the Python builtin `_warnings.warn`.",
     (), "remove the print/logging/warnings call"),
    ("Something new", None, ("Try the frobnicator.",), "Try the frobnicator."),
    ("Something new", None, (), "see dynamo's reason"),
])
def test_the_break_fix_matches_dynamos_reason(reason, explanation, hints, fix_has):
    (f,) = compile_breaks.graph_breaks(_ctx({"compiled": True, "graphs": 3, "frames": 2,
                                             "breaks": [_break(reason, explanation, hints)]}))
    assert f.id == "graph-break" and f.title == f"torch.compile graph break at train.py:42: {reason}"
    assert fix_has in f.fix and f.saving_s is None and f.saving_share is None
    assert "met 2 times while compiling" in f.because and "3 graphs from 2 frames" in f.because
    assert f.evidence["file"] == "/u/train.py" and f.evidence["line"] == 42


def test_a_break_that_makes_dynamo_skip_the_function_says_it_runs_eagerly():
    (f,) = compile_breaks.graph_breaks(_ctx({"breaks": [_break("Unsupported context manager", eager_fallback=True)]}))
    assert f.title.endswith("(the whole function runs eagerly)") and "eagerly, uncompiled" in f.because


def test_one_finding_per_break_place_the_users_first():
    breaks = [_break("A", where="lib.py:1", file="/t/lib.py", line=1, user_code=False, count=9),
              _break("B", count=1), _break("C", where="train.py:50", line=50, count=5)]
    found = compile_breaks.graph_breaks(_ctx({"breaks": breaks}))
    assert [f.title.split(": ", 1)[1] for f in found] == ["C", "B", "A"]


def _recompile(step, reason, function="forward", **kw):
    r = {"function": function, "file": "/u/train.py", "line": 30, "where": "train.py:30", "user_code": True,
         "reason": reason, "reasons": [reason], "step_index": step, "compile_s": 0.25, "resume_of": None}
    r.update(kw)
    return r


def test_recompiles_in_warmup_are_named_as_information_those_in_measured_steps_a_finding_each():
    warm = _recompile(0, "tensor 'x' size mismatch at index 0. expected 16, actual 7")
    (info,) = compile_breaks.recompiles(_ctx({"recompiles": [warm]}))
    assert info.id == "recompile-warmup" and info.kind == "info" and info.saving_s is None
    assert info.title == "torch.compile recompiled 1 function once before the measured steps, 250 ms of compiling"
    assert info.because == "forward at train.py:30 once: tensor 'x' size mismatch at index 0. expected 16, actual 7"
    assert info.evidence["hook_guards"] == 0
    late = _recompile(2, "tensor 'x' size mismatch at index 0. expected 16, actual 7")
    (f, info) = compile_breaks.recompiles(_ctx({"recompiles": [warm, late]}))
    assert info.id == "recompile-warmup" and info.evidence["recompiles"] == 1
    assert f.id == "recompile" and "recompiled forward at train.py:30 once in the measured steps: tensor 'x' size mismatch" in f.title
    assert "size mismatch" in f.title and "mark_dynamic(x, dim)" in f.fix and "dynamic=True" in f.fix
    assert f.saving_s is None and f.note.startswith("not estimated") and f.evidence["guard_kind"] == "shape"
    assert "250 ms" in f.because and "83.3 ms per measured step over 3" in f.because


@pytest.mark.parametrize("reason, extra, fix_has", [
    ("GLOBAL_STATE changed: grad_mode", {}, "torch.no_grad()"),
    ("fn._modules['1'].training == True", {}, "model.eval()"),
    ("n == 1.5", {}, "pass it as a tensor"),
    ("___stack0 == 1.39", {"function": "torch_dynamo_resume_in_forward_at_42",
                           "resume_of": {"function": "forward", "line": 42}}, "remove that graph break"),
])
def test_the_recompile_fix_names_the_guard(reason, extra, fix_has):
    (f,) = [x for x in compile_breaks.recompiles(_ctx({"recompiles": [_recompile(1, reason, **extra)]}))
            if x.id == "recompile"]
    assert fix_has in f.fix and reason in f.title


def test_a_hook_added_to_a_compiled_model_is_named_as_the_warmup_recompiles_cause():
    hook = _recompile(0, "len(self._modules['lm_head']._forward_hooks) != 1")
    (info,) = compile_breaks.recompiles(_ctx({"recompiles": [hook, _recompile(0, "x.size()[0] == 8", line=31,
                                                                              where="train.py:31")]}))
    assert info.evidence == {"recompiles": 2, "functions": 2, "compile_s": 0.5, "hook_guards": 1,
                             "guards": ["len(self._modules['lm_head']._forward_hooks) != 1", "x.size()[0] == 8"]}
    assert "1 of them failed a guard on a module's hooks" in info.note and "2 functions 2 times" in info.title


def test_a_recompile_limit_hit_says_the_function_runs_eagerly():
    hit = {"limit": "recompile_limit", "value": "8", "function": "forward", "file": "/u/train.py", "line": 30,
           "where": "train.py:30", "reason": "n == 7", "step_index": 0}
    (f,) = compile_breaks.recompiles(_ctx({"limit_hits": [hit]}))
    assert f.id == "recompile-limit" and "runs eagerly" in f.title and "recompile_limit (8)" in f.because
    assert "pass it as a tensor" in f.fix


def test_a_real_recompile_limit_hit_is_recorded():
    def scale(x, n):
        return x * n

    compiled = torch.compile(scale, backend="eager", dynamic=False)
    timer = FakeTimer()
    inst = DynamoRecords()
    inst.start(SimpleNamespace(timer=timer, config={}))
    with torch._dynamo.config.patch(recompile_limit=2):
        for i in range(4):
            timer.step(i)
            compiled(torch.ones(2), i)
    section = inst.stop(None)
    (hit,) = section["limit_hits"]
    assert hit["function"] == "scale" and hit["limit"] == "recompile_limit" and hit["reason"] == "n == 1"
    assert hit["step_index"] == 2
    assert [r["reason"] for r in section["recompiles"]] == ["n == 0", "n == 1"]


def test_no_section_or_an_unmeasured_one_gives_nothing():
    for dynamo in ({}, {"not_measured": "start failed: RuntimeError: boom"}):
        ctx = _ctx(dynamo)
        assert compile_breaks.graph_breaks(ctx) == [] and compile_breaks.recompiles(ctx) == []
