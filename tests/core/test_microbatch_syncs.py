"""The micro-batch curve (fit and measurement) and the CUDA sync counter (with a fake torch)."""

import types
import warnings

import pytest
import torch

from gpuprof.measure.microbatch import _settled, _sizes, fit_line, measure_curve_inputs
from gpuprof.measure.syncs import SyncCounter
from gpuprof.measure.timer import PhaseTimer
from gpuprof.dims import GPTConfig
from gpuprof.runners.gpt import GPT


def test_fit_line_recovers_fixed_and_per_sample_cost_despite_one_outlier():
    xs = [1, 2, 4, 8]
    ys = [0.010 + 0.002 * x for x in xs]
    ys[1] *= 5  # one disturbed timing
    fixed, slope = fit_line(xs, ys)
    assert fixed == pytest.approx(0.010, rel=0.05) and slope == pytest.approx(0.002, rel=0.05)


def test_sizes_and_settling():
    assert _sizes(8, None) == [1, 4, 8, 16]
    assert _sizes(1, None) == [1, 2, 4]
    assert _settled([0.100, 0.105, 0.300]) and not _settled([0.100, 0.150])


def test_measure_curve_on_a_small_gpt_leaves_no_gradients():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, vocab_size=64, block_size=128))
    x = torch.randint(0, 64, (4, 128))
    out = measure_curve_inputs(model, (x, x), {}, "cpu", reps=2, budget_s=10)
    assert [p["batch_size"] for p in out["points"]] == [1, 2, 4, 8]
    t = {p["batch_size"]: p["seconds"] for p in out["points"]}
    assert t[8] > t[1]  # 8 sequences cost more than one, whatever the machine's load
    assert out["fixed_s"] >= 0
    assert all(p.grad is None for p in model.parameters())


def test_measure_curve_synchronizes_the_measured_device(monkeypatch):
    # A model on cuda:1 whose script never called set_device: waiting on the current device
    # (0) would time nothing and create a context on GPU 0.
    from fakes.cuda import FakeCuda

    fake = FakeCuda(n_devices=2).install(monkeypatch)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64, block_size=16))
    x = torch.randint(0, 64, (2, 16))
    out = measure_curve_inputs(model, (x, x), {}, "cuda:1", reps=1, budget_s=5)
    assert len(out["points"]) >= 2
    assert {c[1] for c in fake.calls if c[0] == "synchronize"} == {1} and fake.contexts == {1}


def _sync_run(fake, counter, timer, warmup_items=50, steps=2):
    """A warmup step whose eval does `warmup_items` .item() calls (nanoGPT's iter-0
    estimate_loss), then `steps` measured steps each with 3 .item() in the forward, 2
    torch.cuda.synchronize() (a tutorial's timing) and one blocking host-to-device copy."""
    ctx = types.SimpleNamespace(device="cuda:0", timer=timer, profile=None)
    counter.start(ctx)
    timer.start_step()
    with timer.phase("eval"):
        for _ in range(warmup_items):
            fake.item()
    timer.end_step()
    for _ in range(steps):
        timer.start_step()
        with timer.phase("forward"):
            for _ in range(3):
                fake.item()
        torch.cuda.synchronize()
        torch.cuda.synchronize()
        with timer.phase("h2d"):
            fake.item()  # a pageable x.to("cuda") is a memcpy-and-sync
        timer.end_step()
    records = timer.steps()
    ctx.profile = types.SimpleNamespace(steps=records[1:], warmup_steps=records[:1])
    return counter.stop(ctx)


def test_sync_counter_counts_device_synchronize_and_only_measured_steps(fake_cuda):
    import torch._dynamo  # noqa: F401 - imported by torch.compiler.disable: its own filters come first

    warnings.filterwarnings("ignore", message=".*called a synchronizing CUDA operation")  # the user's
    filters, showwarning = list(warnings.filters), warnings.showwarning
    out = _sync_run(fake_cuda, SyncCounter(), PhaseTimer.for_device("cuda", pool=64))
    assert out["per_step"] == 5  # 3 .item() + 2 synchronize; the copy is not a "sync"
    assert out["calls"] == {"sync-debug warnings": 8, "torch.cuda.synchronize": 4}
    assert out["in_copies_per_step"] == 1
    assert out["per_phase"] == {"forward": 6, "other": 4, "h2d": 2}
    assert out["warmup_total"] == 50 and out["measured_steps"] == 2
    # the user's settings are back exactly
    assert torch.cuda.synchronize == fake_cuda.synchronize
    assert fake_cuda.sync_mode == 0
    assert warnings.filters == filters and warnings.showwarning is showwarning


def test_device_synchronize_does_not_warn_in_torch_sync_debug_mode(fake_cuda):
    # The fake is as strict as torch 2.13: a device synchronize never reaches the warning path,
    # so counting warnings alone misses it.
    fake_cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.synchronize()
        fake_cuda.item()
    assert [str(w.message) for w in seen] == ["called a synchronizing CUDA operation"]


def test_sync_counter_keeps_other_warnings_and_does_nothing_on_cpu(fake_cuda):
    counter = SyncCounter()
    counter.start(types.SimpleNamespace(device="cpu", timer=PhaseTimer(), profile=None))
    assert counter.stop(None) is None and fake_cuda.sync_mode == 0


def test_torchs_own_syncs_are_counted_apart(fake_cuda):
    """torch.compile(mode="reduce-overhead"): cudagraph_trees synchronizes while it records a
    CUDA graph, inside the user's forward. Those are torch's, not the script's: counted apart,
    with their place, and never in the per-step figure the sync rule reads."""
    import os

    torch_dir = os.path.dirname(torch.__file__)
    where = os.path.join(torch_dir, "_inductor", "cudagraph_trees.py")
    ns = {"torch": torch, "warnings": warnings}
    graphs = os.path.join(torch_dir, "cuda", "graphs.py")
    exec(compile("def graph_enter():\n    torch.cuda.synchronize()\n", graphs, "exec"), ns)
    exec(compile("def record_function():\n    torch.cuda.synchronize()\n    graph_enter()\n"
                 "def warn_item():\n    warnings.warn_explicit('called a synchronizing CUDA operation',"
                 " UserWarning, __file__, 1)\n", where, "exec"), {**ns, "__file__": where}, ns)
    counter = SyncCounter()
    timer = PhaseTimer.for_device("cuda", pool=64)
    ctx = types.SimpleNamespace(device="cuda:0", timer=timer, profile=None)
    counter.start(ctx)
    for _ in range(3):
        timer.start_step()
        with timer.phase("forward"):
            ns["record_function"]()  # cudagraph_trees: a sync, and torch.cuda.graph's own
            ns["warn_item"]()
            fake_cuda.item()  # the user's own .item()
            ns["graph_enter"]()  # a torch.cuda.graph the script enters itself: the script's
        timer.end_step()
    records = timer.steps()
    ctx.profile = types.SimpleNamespace(steps=records[1:], warmup_steps=records[:1])
    out = counter.stop(ctx)
    assert out["per_step"] == 2 and out["per_phase"] == {"forward": 4}  # .item() and its own graph
    assert out["torch_own_in_steps"] == 6
    assert out["torch_own_places"] == {"torch/_inductor/cudagraph_trees.py:record_function": 6,
                                       "torch/_inductor/cudagraph_trees.py": 3}
