"""The data calls found from the first training forward's inputs (gpuprof/runners/loader_discovery.py)
and timed where they can be (loader_timing.py), on small scripts of the shapes users write: a
generator advanced by next(), one resumed by a for loop, a user iterator class, the batch passed to
a train_step function, a dict batch; the builtin `next` stand-in removed after the run and never
taking another iterator's next()."""

import io
import textwrap

import pytest

from gpuprof.runners.script import run_script

MODEL = '''
import time
import torch
import torch.nn as nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.out = nn.Linear(16, 64)
    def forward(self, x, y=None):
        logits = self.out(self.emb(x))
        return nn.functional.cross_entropy(logits.view(-1, 64), (x if y is None else y).view(-1))

torch.manual_seed(0)
model = Tiny()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
'''


def _line(body: str, text: str) -> int:
    """The line of train.py (MODEL + body) that holds `text`."""
    lines = (MODEL + textwrap.dedent(body)).splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _run(tmp_path, body: str, steps=3):
    path = tmp_path / "train.py"
    path.write_text(MODEL + textwrap.dedent(body))
    run = run_script(str(path), [], steps=steps, warmup=1, stdout=io.StringIO(), post_budget_s=0.0)
    assert run.ended == "stopped", run.error
    return run.profile, run


def _att(p):
    return p.measurements["script"]["data_attribution"]


def _data_share(p):
    return sum(s.phases.get("data", 0.0) for s in p.steps) / sum(s.wall_s for s in p.steps)


NEXT_GEN = '''
def batches():
    while True:
        time.sleep(0.02)
        yield torch.randint(0, 64, (4, 8)), torch.randint(0, 64, (4, 8))

loader = batches()
other = iter(range(10**6))
x, y = next(loader)
for step in range(100):
    loss = model(x, y)
    loss.backward()
    next(other)  # an iterator that is not the batch's: the builtin's own call
    opt.step()
    opt.zero_grad()
    x, y = next(loader)
'''


def test_a_generator_advanced_by_next_is_timed_and_other_next_calls_are_left_alone(tmp_path):
    p, run = _run(tmp_path, NEXT_GEN)
    disc = _att(p)["discovered"]
    assert disc["timed"] == [f"next(loader): batches (train.py:{_line(NEXT_GEN, 'def batches')})"]
    assert disc["call_site"] == f"train.py:{_line(NEXT_GEN, 'loss = model(x, y)')}"
    # one next(loader) per step and none of next(other): the last step's never came (stopped at its opt.step)
    assert run.counts["data_calls"] == len(p.steps) + len(p.warmup_steps) - 1
    assert 0.5 < _data_share(p) < 1.0  # 20 ms of sleep in a step of little else


def test_the_stand_in_for_next_is_gone_from_the_scripts_globals_after_the_run(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(MODEL + textwrap.dedent('''
        def batches():
            while True:
                yield torch.randint(0, 64, (4, 8)), None
        loader = batches()
        for step in range(6):
            x, y = next(loader)
            model(x).backward()
            opt.step()
        import builtins
        print("NEXT_IS_BUILTIN", next is builtins.next, "next" in globals())
        '''))
    out = io.StringIO()
    run = run_script(str(path), [], steps=2, warmup=1, stop=False, stdout=out, post_budget_s=0.0)
    assert run.ended == "finished" and _att(run.profile)["discovered"]["timed"]
    # while the script ran its globals held the stand-in (removed when the run ends)
    assert "NEXT_IS_BUILTIN False True" in out.getvalue()
    assert "next" not in run.profile.to_dict()["run"]["config"].get("script_globals", {})


FOR_GEN = '''
def batches():
    while True:
        time.sleep(0.03)
        yield torch.randint(0, 64, (4, 8))

for step, x in enumerate(batches()):
    model(x).backward()
    opt.step()
    opt.zero_grad()
'''


def test_a_generator_a_for_loop_resumes_is_handed_to_the_sampler(tmp_path):
    p, _ = _run(tmp_path, FOR_GEN, steps=4)
    disc = _att(p)["discovered"]
    assert disc["timed"] == [] and disc["sampled"] == [f"for ... in batches(): batches (train.py:{_line(FOR_GEN, 'def batches')})"]
    # the samples that fell in it moved that share of `other` to data (30 ms of sleep in a ~35 ms step)
    assert _att(p)["other_samples_in_data_functions"] > 0 and _data_share(p) > 0.3


ITER_CLASS = '''
class Shards:
    def __iter__(self):
        return self
    def __next__(self):
        time.sleep(0.01)
        return {"x": torch.randint(0, 64, (4, 8))}

it = iter(Shards())
for step in range(100):
    batch = next(it)
    model(batch["x"]).backward()
    opt.step()
'''


def test_a_user_iterator_class_has_its_next_wrapped(tmp_path):
    p, run = _run(tmp_path, ITER_CLASS)
    assert _att(p)["discovered"]["timed"] == [f"Shards.__next__ (train.py:{_line(ITER_CLASS, 'def __next__')})"]
    assert run.counts["data_calls"] >= len(p.steps)


TRAIN_STEP = '''
class Loader:
    def next_batch(self):
        time.sleep(0.01)
        return torch.randint(0, 64, (4, 8)), torch.randint(0, 64, (4, 8))

def train_step(model, inputs, targets):
    loss = model(inputs, targets)
    loss.backward()
    opt.step()

def main():
    loader = Loader()
    for step in range(100):
        xb, yb = loader.next_batch()
        train_step(model, xb, targets=yb)

main()
'''


def test_the_batch_passed_to_a_train_step_is_followed_to_its_callers_loader(tmp_path):
    p, _ = _run(tmp_path, TRAIN_STEP)
    disc = _att(p)["discovered"]
    assert disc["timed"] == [f"Loader.next_batch (train.py:{_line(TRAIN_STEP, 'def next_batch')})"]
    assert disc["call_site"] == f"train.py:{_line(TRAIN_STEP, 'loss = model(inputs, targets)')}"


OWN_NEXT = '''
def next(it):  # the script's own next(): wrapped as its function, never replaced
    time.sleep(0.01)
    return it.__next__()

def batches():
    while True:
        yield torch.randint(0, 64, (4, 8))

gen = batches()
for step in range(100):
    x = next(gen)
    model(x).backward()
    opt.step()
'''


def test_a_module_with_its_own_next_has_that_function_timed(tmp_path):
    p, _ = _run(tmp_path, OWN_NEXT)
    assert _att(p)["discovered"]["timed"] == [f"next (train.py:{_line(OWN_NEXT, 'def next(it)')})"]


@pytest.mark.parametrize("call", ["model(x.to('cpu'))", "model(**{'x': x})"])
def test_non_data_arguments_are_not_followed(tmp_path, call):
    body = f'''
def get_tokens():
    return torch.randint(0, 64, (4, 8))

for step in range(100):
    x = get_tokens()
    {call}.backward()
    opt.step()
'''
    p, _ = _run(tmp_path, body)
    assert _att(p)["discovered"]["timed"] == [f"get_tokens (train.py:{_line(body, 'def get_tokens')})"]
