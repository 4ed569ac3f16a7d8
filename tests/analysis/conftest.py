"""Synthetic profiles for rule tests: the numbers are chosen, so the arithmetic can be checked."""

import pytest

from gpuprof.profile import Profile, StepRecord


def make_profile(phases: dict, *, n_steps: int = 4, device: str = "cpu", gpu_phases: dict | None = None,
                 config: dict | None = None, measurements: dict | None = None, environment: dict | None = None,
                 micro_steps: int = 4, tokens: int = 4096, warmup: list | None = None,
                 extra: dict | None = None) -> Profile:
    steps = []
    for i in range(n_steps):
        wall = sum(phases.values())
        gp = dict(gpu_phases) if gpu_phases else None
        steps.append(StepRecord(i, wall, dict(phases), tokens=tokens, micro_steps=micro_steps,
                                gpu_s=sum(gp.values()) if gp else None, gpu_phases=gp,
                                extra=dict(extra or {})))
    cfg = {"device": device, "batch_size": 8, "block_size": 128, "grad_accum": micro_steps, "dtype": "fp32",
           "compile": False, "pin_memory": True, "tokens_per_step": tokens,
           "model_dims": {"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 4096, "block_size": 128},
           "param_count": 921088}
    cfg.update(config or {})
    env = {"device": device, "device_name": "CPU", "ram_bytes": 24 * 2**30}
    env.update(environment or {})
    warm = [StepRecord(100 + i, w, {"forward": w}) for i, w in enumerate(warmup or [])]
    return Profile(run={"mode": "builtin", "config": cfg}, steps=steps, warmup_steps=warm,
                   environment=env, measurements=dict(measurements or {}))


@pytest.fixture
def profile_factory():
    return make_profile
