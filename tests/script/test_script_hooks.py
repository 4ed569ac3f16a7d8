"""TrainingHooks driven by a hand-written loop: phases, steps, eval, stop, removal. Fake clock."""

import threading

import pytest
import torch
import torch.nn as nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.data import DataLoader
from torch.utils.data import dataloader as dl

from gpuprof.measure.data_names import data_like_name
from gpuprof.measure.hook_calls import _to_target_is_accelerator
from gpuprof.measure.hooks import StopScript, TrainingHooks
from gpuprof.measure.timer import PhaseTimer


class FakeClock:
    """Each reading advances 1 ms: spans count the clock readings inside them."""

    def __init__(self):
        self.t = 0

    def __call__(self):
        self.t += 1_000_000
        return self.t


def _patched_attributes():
    return {
        "Tensor.to": torch.Tensor.__dict__.get("to"),
        "Tensor.cuda": torch.Tensor.__dict__.get("cuda"),
        "Tensor.pin_memory": torch.Tensor.__dict__.get("pin_memory"),
        "Tensor.backward": torch.Tensor.__dict__["backward"],
        "autograd.backward": torch.autograd.backward,
        "Optimizer.zero_grad": torch.optim.Optimizer.__dict__["zero_grad"],
        "Module.zero_grad": torch.nn.Module.__dict__["zero_grad"],
        "clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
        "GradScaler.unscale_": torch.amp.GradScaler.__dict__["unscale_"],
        "GradScaler.update": torch.amp.GradScaler.__dict__["update"],
        "DataLoader.__iter__": dl.DataLoader.__dict__["__iter__"],
        "_BaseDataLoaderIter.__next__": dl._BaseDataLoaderIter.__dict__["__next__"],
        "forward hooks": dict(nn_module._global_forward_hooks),
        "forward pre-hooks": dict(nn_module._global_forward_pre_hooks),
        "optimizer pre-hooks": dict(optim_module._global_optimizer_pre_hooks),
        "optimizer post-hooks": dict(optim_module._global_optimizer_post_hooks),
    }


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, idx, targets):
        logits = self.head(self.emb(idx))
        return nn.functional.cross_entropy(logits.view(-1, 16), targets.view(-1))


def _setup(stop_after=None):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {}

    def first(module, args, kwargs):
        seen.update(module=module, args=args, kwargs=kwargs)
        return PhaseTimer(clock=FakeClock())

    hooks = TrainingHooks(first, stop_after=stop_after)
    return model, opt, hooks, seen


def _batch():
    return torch.randint(0, 16, (2, 4)), torch.randint(0, 16, (2, 4))


def test_steps_micro_steps_and_phases_from_a_plain_loop():
    model, opt, hooks, seen = _setup()
    hooks.install()
    try:
        for _ in range(3):
            for _ in range(2):  # gradient accumulation
                x, y = _batch()
                loss = model(x, targets=y) / 2
                loss.backward()
            opt.step()
            opt.zero_grad()
    finally:
        hooks.remove()
    steps = hooks.timer.steps()
    assert len(steps) == 3
    assert [s.micro_steps for s in steps] == [2, 2, 2]
    assert [s.extra["forwards"] for s in steps] == [2, 2, 2]
    assert [s.tokens for s in steps] == [16, 16, 16]  # 2 forwards x (2 x 4) token ids, kwargs too
    for s in steps:
        assert s.phases["forward"] > 0 and s.phases["backward"] > 0 and s.phases["optimizer"] > 0
        assert sum(s.phases.values()) == pytest.approx(s.wall_s)
    assert seen["module"] is model and seen["kwargs"].keys() == {"targets"}
    assert hooks.counts["forward"] == 6 and hooks.counts["backward"] == 6  # outermost calls only
    assert hooks.counts["optimizer_step"] == 3


def test_no_grad_forward_is_eval_until_the_next_training_event():
    model, opt, hooks, _ = _setup()
    hooks.install()
    try:
        x, y = _batch()
        model(x, y).backward()
        with torch.no_grad():
            model(x, y)
            assert hooks.timer.current == "eval"
            model(x, y).item()  # eval loss.item(): still eval
        assert hooks.timer.current == "eval"
        loss = model(x, y)  # a training forward ends eval mode
        assert hooks.timer.current == "other"
        loss.backward()
        opt.step()
    finally:
        hooks.remove()
    (step,) = hooks.timer.steps()
    assert step.phases["eval"] > 0
    # (the thread's page faults and kernel time, where the OS counts them per thread, are the timer's)
    assert ({k: v for k, v in step.extra.items() if k not in ("spans", "minor_faults", "kernel_s")}
            == {"forwards": 2, "backwards": 2, "eval_forwards": 2})
    # one eval span, between the first backward and the next training forward, as it ran
    labels = [s[0] for s in step.extra["spans"]]
    assert labels.count("eval") == 1 and labels.index("backward") < labels.index("eval")


def test_stop_after_raises_a_base_exception_that_except_exception_cannot_swallow():
    model, opt, hooks, _ = _setup(stop_after=2)
    assert not issubclass(StopScript, Exception)
    hooks.install()
    caught_by_user = False
    try:
        with pytest.raises(StopScript):
            for _ in range(10):
                try:
                    x, y = _batch()
                    model(x, y).backward()
                    opt.step()
                except Exception:
                    caught_by_user = True
    finally:
        hooks.remove()
    assert not caught_by_user
    assert hooks.steps_done == 2 and hooks.stopped
    assert len(hooks.timer.steps()) == 2


def test_stop_repeats_when_a_bare_except_swallows_it():
    model, opt, hooks, _ = _setup(stop_after=1)
    hooks.install()
    swallowed = 0
    try:
        with pytest.raises(StopScript):
            for _ in range(10):
                try:
                    x, y = _batch()
                    model(x, y).backward()
                    opt.step()
                except BaseException:
                    swallowed += 1
                    if swallowed > 1:
                        raise
    finally:
        hooks.remove()
    assert swallowed == 2 and hooks.steps_done == 1  # stopped again at the very next step


@pytest.mark.parametrize("accelerator", [False, True])
def test_every_hook_and_patch_is_removed(monkeypatch, accelerator):
    import gpuprof.measure.hooks as hooks_module

    monkeypatch.setattr(hooks_module, "accelerator_available", lambda: accelerator)
    before = _patched_attributes()
    model, opt, hooks, _ = _setup()
    hooks.install()
    assert ("to" in torch.Tensor.__dict__) is accelerator  # Tensor.to wrapped only with an accelerator
    assert len(nn_module._global_forward_pre_hooks) == len(before["forward pre-hooks"]) + 1
    x, y = _batch()
    model(x, y).backward()
    assert not model._forward_hooks  # the outermost module's forward hook lived for its call only
    hooks.remove()
    assert _patched_attributes() == before
    assert not model._forward_hooks
    hooks.remove()  # idempotent


def test_user_data_function_is_data_and_is_dropped_if_it_runs_the_model():
    model, opt, hooks, _ = _setup()
    ns = {}

    def get_batch():
        return _batch()

    def next_batch_and_train():  # misnamed: it trains
        x, y = _batch()
        model(x, y).backward()
        return x, y

    ns["get_batch"], ns["next_batch"] = get_batch, next_batch_and_train
    hooks.install()
    try:
        x, y = _batch()
        model(x, y).backward()  # first forward: the timer exists from here on
        hooks.wrap_attr(ns, "get_batch", "get_batch")
        hooks.wrap_attr(ns, "next_batch", "next_batch")
        ns["get_batch"]()
        ns["next_batch"]()
        opt.step()
    finally:
        hooks.remove()
    assert ns["get_batch"] is get_batch and ns["next_batch"] is next_batch_and_train  # restored
    assert hooks.disqualified == {"next_batch"}
    (step,) = hooks.timer.steps()
    assert step.phases["data"] > 0


def test_dataloader_iteration_is_data():
    model, opt, hooks, _ = _setup()
    data = [_batch() for _ in range(4)]
    loader = DataLoader(data, batch_size=None)
    hooks.install()
    try:
        for x, y in loader:
            model(x, y).backward()
            opt.step()
    finally:
        hooks.remove()
    steps = hooks.timer.steps()
    assert len(steps) == 4
    assert all(s.phases.get("data", 0) > 0 for s in steps[1:])  # the first batch precedes step 0
    assert hooks.counts["dataloader_next"] >= 4


def test_other_threads_are_ignored():
    model, opt, hooks, _ = _setup()
    hooks.install()
    try:
        x, y = _batch()
        model(x, y).backward()
        t = threading.Thread(target=lambda: model(x, y))
        t.start()
        t.join()
        opt.step()
    finally:
        hooks.remove()
    assert hooks.counts["forward"] == 1


@pytest.mark.parametrize("args,kwargs,expected", [
    (("cuda",), {}, True), (("cuda:1",), {}, True), ((0,), {}, True), ((torch.device("cuda"),), {}, True),
    (("cpu",), {}, False), ((torch.float16,), {}, False), ((), {"device": "cuda", "non_blocking": True}, True),
    ((), {"dtype": torch.float16}, False), ((torch.zeros(1),), {}, False), (("mps",), {}, True),
])
def test_host_to_device_target_detection(args, kwargs, expected):
    assert _to_target_is_accelerator(args, kwargs) is expected


def test_cpu_to_cpu_copies_are_not_h2d(monkeypatch):
    import gpuprof.measure.hooks as hooks_module

    monkeypatch.setattr(hooks_module, "accelerator_available", lambda: True)  # wrap Tensor.to here too
    model, opt, hooks, _ = _setup()
    hooks.install()
    assert "to" in torch.Tensor.__dict__
    try:
        x, y = _batch()
        model(x.to("cpu"), y.to(torch.int64)).backward()
        x.to("cpu")
        opt.step()
    finally:
        hooks.remove()
    assert hooks.counts["h2d_copies"] == 0


@pytest.mark.parametrize("name,expected", [
    ("get_batch", True), ("next_batch", True), ("load_tokens", True), ("__getitem__", True),
    ("train_batch", False), ("load_checkpoint", False), ("estimate_loss", False), ("main", False),
])
def test_data_like_names(name, expected):
    assert data_like_name(name) is expected


def test_grad_scaler_skipped_step_still_ends_the_step():
    model, opt, hooks, _ = _setup()
    scaler = torch.amp.GradScaler("cpu", init_scale=float("inf"))  # every step overflows: skipped
    hooks.install()
    try:
        for _ in range(3):
            x, y = _batch()
            scaler.scale(model(x, y)).backward()
            scaler.step(opt)
            scaler.update()
    finally:
        hooks.remove()
    assert hooks.counts["optimizer_step"] == 0 and hooks.counts["skipped_optimizer_step"] == 3
    assert len(hooks.timer.steps()) == 3


def test_without_a_visible_forward_the_first_backward_starts_the_run():
    model, opt, hooks, seen = _setup()
    hooks.install()
    try:
        hooks._pre_handle.remove()  # as if every forward ran inside a compiled region: none is seen
        for _ in range(2):
            x, y = _batch()
            model(x, y).backward()
            opt.step()
    finally:
        hooks.remove()
    assert seen["module"] is None and hooks.counts["no_forward_start"] == 1
    steps = hooks.timer.steps()
    assert len(steps) == 2 and [s.micro_steps for s in steps] == [1, 1]


def test_outermost_calls_only_and_submodules_take_the_hook_free_path():
    _, opt, hooks, _ = _setup()
    inner = nn.Linear(4, 4)
    seen_labels = []

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            y = self.inner(x)
            seen_labels.append(hooks.timer.current)  # after a nested call of a known module
            seen_labels.append(len(nn_module._global_forward_pre_hooks))
            return y

    outer = Outer()
    opt = torch.optim.SGD(outer.parameters(), lr=0.1)
    n_global = len(nn_module._global_forward_pre_hooks)
    hooks.install()
    try:
        inner(torch.zeros(4)).sum().backward()  # inner alone: an outermost call
        assert hooks.timer.current == "other"
        outer(torch.zeros(4)).sum().backward()  # inner nested: one forward, still running after it
        opt.step()
    finally:
        hooks.remove()
    assert seen_labels == ["forward", n_global]  # our global pre-hook is off during a forward
    assert hooks.counts["forward"] == 2


def test_a_module_created_per_call_is_seen_every_time():
    model, opt, hooks, _ = _setup()
    hooks.install()
    try:
        for _ in range(6):
            x, y = _batch()
            logits = model.head(model.emb(x))
            crit = nn.CrossEntropyLoss()  # a new module each time, maybe at a freed one's address
            loss = crit(logits.view(-1, 16), y.view(-1))
            del crit
            loss.backward()
            opt.step()
        # A hook lives for its call only: nothing is left on any module, live or freed (a dead
        # one's address reused by a new module must never look hooked).
        assert not model.head._forward_hooks and not model.emb._forward_hooks
    finally:
        hooks.remove()
    # head, emb and the loss module are three outermost calls per step, all six steps
    assert [s.extra["forwards"] for s in hooks.timer.steps()] == [3] * 6


def test_activation_checkpoint_recompute_is_backward():
    from torch.utils.checkpoint import checkpoint

    model, opt, hooks, _ = _setup()
    hooks.install()
    try:
        for _ in range(2):
            x, y = _batch()
            h = checkpoint(model.emb, x, use_reentrant=False)
            loss = nn.functional.cross_entropy(model.head(h).view(-1, 16), y.view(-1))
            loss.backward()
            opt.step()
    finally:
        hooks.remove()
    steps = hooks.timer.steps()
    assert [s.extra["forwards"] for s in steps] == [2, 2]  # emb and head; not the recompute


def test_positional_non_blocking_is_read_and_copies_counted_per_step():
    from gpuprof.measure.hook_calls import _non_blocking

    x = torch.zeros(4, dtype=torch.int64)
    assert _non_blocking("cuda", (0, True), {}) and not _non_blocking("cuda", (0,), {})
    assert _non_blocking("to", ("cuda", torch.int64, True), {})
    assert _non_blocking("to", (torch.int64, True), {}) and _non_blocking("to", (x, True), {})
    assert not _non_blocking("to", ("cuda",), {}) and _non_blocking("to", ("cuda",), {"non_blocking": True})

    model, opt, hooks, _ = _setup()
    hooks.install()
    try:
        xb, yb = _batch()
        model(xb, yb).backward()  # starts the run
        # the real Tensor.cuda needs a GPU: wrap a stand-in with the same signature
        cuda = hooks._wrap_copy(lambda t, *a, **k: t, "cuda")
        to = hooks._wrap_copy(lambda t, *a, **k: t, "to")
        cuda(x, 0, True)  # x.cuda(0, True): non_blocking, but from pageable memory
        to(x, "cuda", torch.int64, True)
        cuda(x, 0)  # blocking
        opt.step()
    finally:
        hooks.remove()
    (step,) = hooks.timer.steps()
    assert step.extra["h2d_copies"] == 3 and step.extra["h2d_blocking"] == 1
    assert step.extra["h2d_pageable"] == 3 and step.extra["h2d_pageable_bytes"] == 3 * 32
    assert hooks.counts["h2d_blocking"] == 1


def test_the_global_pre_hook_steps_aside_under_one_key_and_a_raising_forward_ends():
    """Per forward the pre-hook leaves torch's dict and comes back under the same key (no new
    handle each time); a forward that raises still ends its span (always_call) and leaves the hook
    in place; remove() takes it out for good."""
    model, opt, hooks, _ = _setup()

    class Boom(nn.Module):
        def forward(self, idx):
            raise ValueError("boom")

    boom = Boom()
    hooks.install()
    try:
        key = hooks._pre_handle.id
        assert nn_module._global_forward_pre_hooks[key] == hooks._fwd_pre
        x, y = _batch()
        model(x, y).backward()
        assert list(nn_module._global_forward_pre_hooks).count(key) == 1
        with pytest.raises(ValueError):
            boom(x)
        assert hooks.timer.current == "other" and key in nn_module._global_forward_pre_hooks
        model(x, targets=y).backward()
        opt.step()
        assert hooks._pre_handle.id == key
    finally:
        hooks.remove()
    assert key not in nn_module._global_forward_pre_hooks
    (step,) = hooks.timer.steps()
    assert step.extra["forwards"] == 3 and step.micro_steps == 2


@pytest.mark.parametrize("dtype, counted", [(torch.int64, True), (torch.int32, True), (torch.uint8, True),
                                            (torch.float32, False), (torch.bool, False)])
def test_tokens_are_counted_for_integer_id_inputs_only(dtype, counted):
    from gpuprof.measure.hook_calls import _tokens_of

    t = torch.zeros(2, 3, dtype=dtype)
    assert _tokens_of((t,), {}) == (6 if counted else 0)
    assert _tokens_of((), {"idx": t}) == (6 if counted else 0)
    assert _tokens_of((), None) == 0


def test_a_closure_passed_to_step_is_not_optimizer_time():
    # Lightning calls optimizer.step(closure): training_step's forward, backward and bookkeeping run
    # inside the step. Its own time must not be the optimizer's.
    import time as _time

    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks = TrainingHooks(lambda m, a, k: PhaseTimer())
    hooks.install()
    try:
        x, y = _batch()
        for _ in range(2):
            def closure():
                loss = model(x, y)
                _time.sleep(0.03)  # the step's bookkeeping (self.log, callbacks)
                loss.backward()
                return loss

            opt.step(closure=closure) if _ == 0 else opt.step(closure)
            opt.zero_grad()
    finally:
        hooks.remove()
    steps = hooks.timer.steps()
    assert len(steps) >= 1
    for s in steps:
        assert s.phases.get("optimizer", 0) < 0.02, s.phases
        assert s.phases.get("other", 0) >= 0.025 and s.phases["forward"] > 0 and s.phases["backward"] > 0
