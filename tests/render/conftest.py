"""Profiles the renderer tests share: two real runs (the built-in loop and a nanoGPT-style script
given an argument that is HTML) and a hand-built two-rank CUDA-like merged profile, each with its
Analysis (`*_analysis`: the profile analysed, gpuprof.analysis.pipeline; the merged one's findings
and corrected config hand-built with strings that look like HTML)."""

import io
from pathlib import Path

import numpy as np
import pytest

from gpuprof.profile import Profile, StepRecord

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
INJECTED = "<script>alert(1)</script>"
MIN_HOST_SAMPLES = 3  # a line needs two points; one more in case a reading leaves a gap


class SampledThrough:
    """A sampler the run stops only once it has sampled the run through: at least
    MIN_HOST_SAMPLES samples, and one whose interval starts after the measured steps ended.

    A tiny run lasts 30-100 ms, a few 20 ms sampling intervals, fewer on a faster CPU: without
    this, how many samples the profile holds (and whether its timeline has a line) would depend
    on the machine. Counted, not timed: stop() waits for the samples (60 s only as a safety net)."""

    def __init__(self, sampler, min_samples: int = MIN_HOST_SAMPLES, timeout_s: float = 60.0):
        self.sampler = sampler
        self.name = sampler.name
        self.min_samples = min_samples
        self.timeout_s = timeout_s

    def start(self, ctx):
        return self.sampler.start(ctx)

    def stop(self, ctx):
        from mfu.fake_time import wait_until

        smp = self.sampler
        if smp._thread.thread is None:  # it did not start (its report says why): nothing to wait for
            return smp.stop(ctx)
        # Called after the steps: the third sample from now starts after they ended (a sample's
        # interval starts at the sample before it).
        need = max(self.min_samples, smp.sample_count + 3)
        assert wait_until(lambda: smp.sample_count >= need, timeout_s=self.timeout_s), (
            f"the {self.name} sampler took {smp.sample_count} of {need} samples in {self.timeout_s:g} s")
        return smp.stop(ctx)


def _instruments(device, data_path):
    from gpuprof.measure.host import HostSampler
    from gpuprof.measure.instruments import default_instruments

    # Samplers every 20 ms so that a run of a tenth of a second still has a timeline, sampled
    # through the run whatever the machine's speed.
    return [SampledThrough(i) if isinstance(i, HostSampler) else i
            for i in default_instruments(device, data_path, samplers=True, interval_s=0.02, microbatch=False,
                                         flops=False, probe=False)]


@pytest.fixture(scope="session")
def builtin_profile():
    """The built-in loop, tiny, on CPU, with the host sampler (its Analysis: builtin_analysis)."""
    from gpuprof.runners.builtin import LoopConfig, run_builtin

    cfg = LoopConfig(model="tiny", n_layer=1, n_embd=32, n_head=2, batch_size=2, block_size=32,
                     grad_accum=2, steps=3, warmup=1, device="cpu")
    return run_builtin(cfg, instruments=_instruments("cpu", None), post_budget_s=0)


@pytest.fixture(scope="session")
def builtin_analysis(builtin_profile):
    from gpuprof.analysis.pipeline import analyze

    return analyze(builtin_profile)


@pytest.fixture(scope="session")
def script_profile(tmp_path_factory):
    """tests/fixtures/nanogpt_train.py run under the hooks with `--compile_backend=<script>…`
    (a string setting the script keeps but does not use unless it compiles). Its Analysis:
    script_analysis."""
    from gpuprof.runners.script import run_script

    data = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        rng.integers(0, 256, 20_000, dtype=np.uint16).tofile(data / f"{split}.bin")
    out = tmp_path_factory.mktemp("out")
    run = run_script(str(FIXTURES / "nanogpt_train.py"),
                     [f"--data_dir={data}", f"--out_dir={out}", "--threads=1",
                      "--gradient_accumulation_steps=2", f"--compile_backend={INJECTED}"],
                     steps=3, warmup=1, stdout=io.StringIO(), instruments_factory=_instruments,
                     post_budget_s=0)
    assert run.ended == "stopped" and run.profile is not None
    return run.profile


@pytest.fixture(scope="session")
def script_analysis(script_profile):
    from gpuprof.analysis.pipeline import analyze

    return analyze(script_profile)


PHASES_HOST = {"data": 0.10, "h2d": 0.01, "forward": 0.10, "backward": 0.15, "optimizer": 0.03, "other": 0.01}
PHASES_GPU = {"data": 0.09, "h2d": 0.02, "forward": 0.12, "backward": 0.15, "optimizer": 0.03, "other": 0.01}


def cuda_rank_profile(rank: int, n_steps: int, status: str = "ok") -> Profile:
    """A CUDA-like per-rank profile: host and GPU phase times, an NVML timeline. Steps start every
    0.40 s while the GPU needs 0.42 s per step, so the GPU falls behind the host step by step."""
    scale = 1.0 + 0.1 * rank  # rank 1 is 10% slower
    steps, warm = [], [StepRecord(index=0, wall_s=0.6, phases={"other": 0.6}, tokens=1024, micro_steps=2,
                                  gpu_s=0.65, gpu_phases={"other": 0.65}, start_s=0.2)]
    for i in range(n_steps):
        host = {k: v * scale for k, v in PHASES_HOST.items()}
        gpu = {k: v * scale for k, v in PHASES_GPU.items()}
        steps.append(StepRecord(index=i + 1, wall_s=sum(host.values()), phases=host, tokens=1024,
                                micro_steps=2, gpu_s=sum(gpu.values()), gpu_phases=gpu,
                                start_s=1.0 + 0.4 * scale * i))
    t = [0.05 + 0.1 * k for k in range(30)]
    util = [min(100.0, 20.0 + 3.0 * k) for k in range(30)]
    mem = [10e9 + 1e8 * k for k in range(30)]
    nvml = {"available": True, "reason": None, "interval_s": 0.1, "samples": 30,
            "gpus": [{"name": "NVIDIA H200", "memory_total_bytes": 150_000_000_000,
                      "summary": {"gpu_util_pct": {"mean": 63.5, "max": max(util)}},
                      "timeline": {"t_s": t, "gpu_util_pct": util, "mem_util_pct": [u / 2 for u in util],
                                   "mem_used_bytes": mem, "power_w": [None] * 30}}]}
    run = {"mode": "script", "command": ["train.py", f"--run_name={INJECTED}"], "rank": rank, "world_size": 2,
           "ended": "stopped" if status == "ok" else status, "partial": status != "ok",
           "config": {"device": "cuda:0", "batch_size": 8, "block_size": 64, "grad_accum": 2,
                      "tokens_per_step": 1024}}
    return Profile(run=run, steps=steps, warmup_steps=warm,
                   environment={"device_name": "NVIDIA H200", "device": "cuda:0"},
                   measurements={"nvml": nvml, "timer": {"gpu_timeline": True, "reasons": []}})


@pytest.fixture
def merged_profile():
    """Two ranks: rank 0 ok (3 steps), rank 1 failed after 2 steps with an HTML-looking error.
    Shaped as gpuprof.merge makes one: the top level is one rank's view (here rank 0's steps and
    measurements), every rank's own profile under `ranks`. Its Analysis: merged_analysis."""
    r0, r1 = cuda_rank_profile(0, 3), cuda_rank_profile(1, 2, "failed")
    top = Profile(run={**r0.run, "view": "rank 0 (the lowest rank with a profile); every rank under `ranks`"},
                  steps=r0.steps, warmup_steps=r0.warmup_steps,
                  environment=r0.environment, measurements=r0.measurements)
    top.ranks = [
        {"rank": 0, "local_rank": 0, "node_rank": 0, "host": "node-a", "status": "ok", "error": None,
         "profile": r0.to_dict()},
        {"rank": 1, "local_rank": 1, "node_rank": 0, "host": "node-a", "status": "failed",
         "error": {"type": "RuntimeError", "message": "NCCL <b>timeout</b>"}, "profile": r1.to_dict()},
    ]
    return top


def merged_findings(step_s: float) -> tuple:
    """The merged profile's hand-built finding: strings that look like HTML, a config fix."""
    from gpuprof.analysis.findings import Finding

    return (Finding(id="data-loading-exposed", title="the step waits for <data>", kind="fix",
                    saving_s=0.09, saving_share=0.09 / step_s, fix="prefetch & pin",
                    evidence={"data_exposed_s": 0.09, "share": 0.09 / step_s, "note": "<i>x</i>"},
                    note="", config_overrides={"batch_size": 16}),)


@pytest.fixture
def merged_analysis(merged_profile):
    """merged_profile analysed (its ranks' statistics), with the hand-built finding and the
    corrected config it makes in place of the rules' own."""
    from dataclasses import replace

    from gpuprof.analysis.corrected import merge
    from gpuprof.analysis.pipeline import analyze

    a = analyze(merged_profile)
    findings = merged_findings(a.stats.step_s)
    return replace(a, findings=findings, corrected=merge(list(findings), merged_profile.config))
