"""The built-in loop: nanoGPT semantics, phases that add up, an injected delay recovered."""

import numpy as np
import pytest

from gpuprof.errors import GpuprofError
from gpuprof.runners.builtin import LoopConfig, LoopFaults, run_builtin
from gpuprof.runners.data import LoaderFaults, MemmapLoader, generated_dataset

SMALL = dict(model="tiny", n_layer=1, n_embd=64, n_head=2, batch_size=4, block_size=64, grad_accum=3,
             steps=4, warmup=1, device="cpu")


def test_phases_add_up_to_the_step_and_count_everything():
    prof = run_builtin(LoopConfig(**SMALL))
    assert len(prof.steps) == 4 and len(prof.warmup_steps) == 1
    for step in prof.steps:
        assert abs(sum(step.phases.values()) - step.wall_s) <= 0.01 * step.wall_s
        assert step.micro_steps == 3 and step.tokens == 4 * 64 * 3
    s = prof.stats
    assert set(s.phases) == {"data", "h2d", "forward", "backward", "optimizer", "other"}
    assert s.tokens_per_s == pytest.approx(4 * 64 * 3 / s.step_s)
    assert s.step_s == pytest.approx(sum(p.seconds for p in s.phases.values()))  # the phases add up to it
    assert s.phases["forward"].share + s.phases["backward"].share > 0.5
    cfg = prof.run["config"]
    assert cfg["param_count"] > 0 and cfg["tokens_per_step"] == 768 and cfg["model_dims"]["n_layer"] == 1
    assert prof.environment["python"] and prof.environment["torch"]


def test_injected_data_delay_appears_as_the_data_share():
    delay = 0.05
    prof = run_builtin(LoopConfig(**SMALL), faults=LoopFaults(loader=LoaderFaults(batch_delay_s=delay)))
    s = prof.stats
    injected = SMALL["grad_accum"] * delay
    assert injected / s.step_s > 0.15  # the injection is a large part of the step, even on a loaded machine
    data = s.phases["data"].seconds
    assert data >= injected * 0.99  # a sleep never ends early
    # what the batch itself costs, and a sleep's overshoot on a loaded VM, stay a small part of the
    # step (seen: 1-5% alone, 5.4% with other jobs on the 2 cores)
    assert (data - injected) / s.step_s < 0.10, (data, injected, s.step_s)


def test_eval_fault_is_its_own_phase():
    prof = run_builtin(LoopConfig(**SMALL), faults=LoopFaults(eval_every_step=2))
    assert prof.stats.phases["eval"].seconds > 0


def test_loader_reads_like_nanogpt(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    import torch

    loader = MemmapLoader(path, batch_size=3, block_size=8, device="cpu", generator=torch.Generator().manual_seed(0))
    x, y = loader.get_batch()
    assert x.shape == (3, 8) and x.dtype == torch.int64
    assert torch.equal(y, x + 1)  # targets are the next tokens


def test_generated_dataset_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    p1 = generated_dataset(100, n_tokens=5000)
    mtime = p1.stat().st_mtime_ns
    p2 = generated_dataset(100, n_tokens=5000)
    assert p1 == p2 and p2.stat().st_mtime_ns == mtime
    assert str(p1).startswith(str(tmp_path / "gpuprof"))
    assert np.fromfile(p1, dtype=np.uint16).max() < 100


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(steps=0), "--steps must be positive"),
        (dict(batch_size=-1), "--batch-size must be positive"),
        (dict(dtype="fp12"), "unknown dtype"),
        (dict(model="gpt5"), "unknown model preset"),
        pytest.param(dict(device="cuda"), "CUDA is not available",
                     marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="has CUDA")),
        (dict(device="cudafoo"), "unknown device"),
        (dict(n_head=3, n_embd=64), "divisible"),
    ],
)
def test_bad_config(change, message):
    with pytest.raises(GpuprofError, match=message):
        run_builtin(LoopConfig(**{**SMALL, **change}))


@pytest.mark.parametrize("name", ["bfloat16", "BF16", "torch.bfloat16"])
def test_torch_and_upper_case_dtype_names_are_accepted(name):
    cfg = LoopConfig(**{**SMALL, "dtype": name})
    cfg.validate()
    assert cfg.dtype == "bf16"


def test_short_data_file(tmp_path):
    path = tmp_path / "short.bin"
    np.arange(10, dtype=np.uint16).tofile(path)
    with pytest.raises(GpuprofError, match="needs at least 65"):
        run_builtin(LoopConfig(**SMALL, data=str(path)))


def test_compile_mode_implies_compile_and_is_validated():
    from gpuprof.errors import GpuprofError

    cfg = LoopConfig(**{**SMALL, "compile_mode": "reduce-overhead"})
    cfg.validate()
    assert cfg.compile is True
    with pytest.raises(GpuprofError, match="--compile-mode 'fast': use one of default, reduce-overhead"):
        LoopConfig(**{**SMALL, "compile_mode": "fast"}).validate()


def test_cuda_graphs_with_gradient_accumulation_are_refused_up_front(monkeypatch):
    """reduce-overhead (and max-autotune) run CUDA graph trees: the next micro-step's replay
    overwrites the gradients the last backward left in .grad, and torch raised mid-run on an H200
    (docs/measurements/2026-12-04-nvidia-h200.md). The loop refuses in one line before it starts,
    per rank under torchrun; CPU runs no CUDA graphs and is left alone."""
    from gpuprof.errors import GpuprofError
    from gpuprof.runners.builtin import cudagraph_accumulation_problem

    assert cudagraph_accumulation_problem("reduce-overhead", 2, cuda=True)
    assert cudagraph_accumulation_problem("max-autotune", 4, cuda=True)
    assert cudagraph_accumulation_problem("max-autotune-no-cudagraphs", 4, cuda=True) is None
    assert cudagraph_accumulation_problem("default", 4, cuda=True) is None
    assert cudagraph_accumulation_problem("reduce-overhead", 1, cuda=True) is None
    assert cudagraph_accumulation_problem("reduce-overhead", 4, cuda=False) is None
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = LoopConfig(**{**SMALL, "device": "cuda", "grad_accum": 2, "compile_mode": "reduce-overhead"})
    with pytest.raises(GpuprofError, match=r"cannot accumulate gradients over 2 micro-steps.*--grad-accum 1"):
        cfg.validate()
    LoopConfig(**{**SMALL, "grad_accum": 2, "compile_mode": "reduce-overhead"}).validate()  # CPU: fine
    monkeypatch.setenv("WORLD_SIZE", "2")  # one micro-step per rank: CUDA graphs can run it
    with pytest.raises(GpuprofError, match="CUDA is not available"):
        cfg.validate()
