"""The training loop's structure from its source (gpuprof.attach.loops), and steps found from the
loop's own lines (gpuprof.attach.phases.loop_marks + find_steps): scripts shaped like the ones
users run, written to a folder; timelines built sample by sample, as py-spy's speedscope gives them."""

import textwrap

from gpuprof.attach import loops
from gpuprof.attach.phases import find_steps, loop_marks, phase_spans
from gpuprof.attach.pyspy import Timeline

NANOGPT = """\
import torch
iter_num = 0
while True:
    lr = get_lr(iter_num)
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
        X, Y = get_batch('train')
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
"""

EPOCHS = """\
def train():
    for epoch in range(3):
        for batch in loader:
            loss = model(batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
"""

HELPER = """\
def step_fn(batch):
    loss = model(batch)
    loss.backward()

def main():
    for batch in loader:
        step_fn(batch)
        opt.step()
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_nanogpts_loops_the_step_loop_and_its_micro_step_loop(tmp_path):
    f = _write(tmp_path, "train.py", NANOGPT)
    shape = loops.shape_of(f, "<module>", 11)  # the backward line
    assert shape.step_loop == (3, 15) and shape.micro_loop == (7, 11)
    assert [shape.region(n) for n in (4, 6, 9, 10, 11, 12, 14, 15, 20)] == [
        "step", "step", "micro", "micro", "micro", "step", "step", "step", None]


def test_an_epoch_loop_around_the_step_loop_has_no_micro_step_loop(tmp_path):
    f = _write(tmp_path, "train.py", EPOCHS)
    shape = loops.shape_of(f, "train", 5)
    assert shape.step_loop == (3, 7) and shape.micro_loop is None  # the batch loop steps: one backward each
    assert shape.region(5) is None  # nothing to tell apart: steps come from the optimizer step


def test_the_loop_is_found_in_the_caller_of_a_helper_that_calls_backward(tmp_path):
    f = _write(tmp_path, "train.py", HELPER)
    bwd = ("Tensor.backward", "/site-packages/torch/_tensor.py", 600)
    stack = (("<module>", f, 10), ("main", f, 7), ("step_fn", f, 3), bwd)
    shape = loops.find_shape([stack])
    assert (shape.function, shape.step_loop, shape.micro_loop) == ("main", (6, 8), None)


def test_no_source_no_shape(tmp_path):
    bwd = ("Tensor.backward", "/site-packages/torch/_tensor.py", 600)
    assert loops.find_shape([(("<module>", str(tmp_path / "gone.py"), 5), bwd)]) is None
    assert loops.shape_of(_write(tmp_path, "x.py", "def f(:\n"), "<module>", 1) is None  # not Python


def test_steps_from_the_loops_own_lines_with_unsampled_boundaries_split(tmp_path):
    """nanoGPT's loop, 4 micro-steps a step, 12 steps; the once-per-step code (line 12) is sampled
    in 8 of them, and one micro-step's compute in step 4 not at all (it shows as data only, and
    still counts: its data line comes after the backward line and before the next forward line);
    the gaps hold 1 or 2 steps and are split so."""
    f = _write(tmp_path, "train.py", NANOGPT)
    bwd = ("Tensor.backward", "/site-packages/torch/_tensor.py", 600)
    tl, t = Timeline(1), 0.0

    def sample(line, *inner):
        nonlocal t
        tl.spans.append((t, t + 0.005, (("<module>", f, line), *inner)))
        t += 0.005

    seen = [True, True, False, True, True, False, True, False, True, True, False, True]
    for step in range(12):
        for micro in range(4):  # nanoGPT's order: forward, the next batch, backward
            compute = not (step == 4 and micro == 2)
            if compute:
                sample(9, ("Module._call_impl", "/site-packages/torch/nn/modules/module.py", 1))
            for _ in range(4):
                sample(10, ("get_batch", f, 2))
            if compute:
                sample(11, bwd)
                sample(11, bwd)
        if seen[step]:
            sample(12, ("Adam.step", "/site-packages/torch/optim/adam.py", 1))
    shape = loops.find_shape(st for _, _, st in tl.spans)
    marks = loop_marks(tl, shape)
    assert len(marks[0]) == sum(seen)
    steps, info = find_steps(phase_spans(tl), marks=marks)
    assert info["typical_micro_steps"] == 4
    assert info["boundary_source"] == "the step loop's once-per-step lines (the script's source)"
    # gaps after steps 0, 1, 3, 4, 6, 8, 9: 1, 2, 1, 2, 2, 1, 2 steps
    assert info["gap_micro_steps"] == [4, 8, 4, 8, 8, 4, 8]
    assert [s["split_from"] for s in steps] == [1, 2, 2, 1, 2, 2, 2, 2, 1, 2, 2]
