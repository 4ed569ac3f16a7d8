"""Each rule on synthetic profiles: fires when it should, stays quiet when it should not, and
its saving is the arithmetic of the evidence."""

from dataclasses import replace

import pytest

from gpuprof.analysis.engine import Context, Finding, rank, run_rules, with_share
from gpuprof.analysis.mfu_results import MfuResult, MisreportCause
from gpuprof.analysis.rules import batching, gpu, machine, phases
from gpuprof.hardware import find_gpu

H200 = find_gpu("NVIDIA H200")


def ctx_of(p, **kw):
    return Context(profile=p, stats=p.stats, **kw)


# ------------------------------------------------------------------ data-loading-exposed
def test_data_exposed_on_cpu_saves_the_data_time(profile_factory):
    p = profile_factory({"data": 0.3, "forward": 0.2, "backward": 0.4, "optimizer": 0.1})
    (f,) = phases.data_loading_exposed(ctx_of(p))
    assert f.id == "data-loading-exposed" and f.saving_share is None  # the engine derives the share
    f = with_share(f, p.stats.step_s)
    assert f.saving_s == pytest.approx(0.3) and f.saving_share == pytest.approx(0.3)
    assert f.claims == {"data": pytest.approx(0.3)}


def test_data_exposed_quiet_under_five_percent(profile_factory):
    p = profile_factory({"data": 0.04, "forward": 0.3, "backward": 0.66})
    assert phases.data_loading_exposed(ctx_of(p)) == []


def test_data_on_gpu_counts_only_the_idle_it_exposes(profile_factory):
    # The host spends 300 ms loading, but the GPU was busy with queued work for 280 of them.
    p = profile_factory({"data": 0.3, "forward": 0.05, "backward": 0.05}, device="cuda",
                        gpu_phases={"data": 0.02, "forward": 0.3, "backward": 0.68})
    assert phases.data_loading_exposed(ctx_of(p)) == []  # 2% exposed
    p2 = profile_factory({"data": 0.3, "forward": 0.05, "backward": 0.05}, device="cuda",
                         gpu_phases={"data": 0.2, "forward": 0.3, "backward": 0.5})
    (f,) = phases.data_loading_exposed(ctx_of(p2))
    assert f.saving_s == pytest.approx(0.2) and f.confidence == "high"


def test_data_exposed_flags_a_saturated_host(profile_factory):
    p = profile_factory({"data": 0.3, "forward": 0.3, "backward": 0.4},
                        measurements={"host": {"phases": {"data": {"samples": 10, "cpu_pct": 97.0}}}})
    (f,) = phases.data_loading_exposed(ctx_of(p))
    assert f.confidence == "low" and "busy" in f.note


# ------------------------------------------------------------------ eval / compute-bound
def test_eval_in_step(profile_factory):
    p = profile_factory({"eval": 0.25, "forward": 0.25, "backward": 0.5})
    (f,) = phases.eval_in_measured_steps(ctx_of(p))
    f = with_share(f, p.stats.step_s)
    assert f.saving_s == pytest.approx(0.25) and f.saving_share == pytest.approx(0.25)
    assert phases.eval_in_measured_steps(ctx_of(profile_factory({"forward": 0.5, "backward": 0.5}))) == []


def test_compute_bound_verdict_with_floor(profile_factory):
    p = profile_factory({"data": 0.01, "forward": 0.3, "backward": 0.6, "optimizer": 0.09})
    (f,) = phases.compute_bound(ctx_of(p, mfu=MfuResult(floor_s=0.25, mfu=0.25)))
    assert f.kind == "verdict" and f.evidence["times_floor"] == pytest.approx(4.0)
    assert "4.0x its FLOP floor" in f.title
    assert phases.compute_bound(ctx_of(profile_factory({"data": 0.5, "forward": 0.5}))) == []


# ------------------------------------------------------------------ micro-batch
def _curve(fixed, per_sample, sizes):
    return {"fixed_s": fixed, "per_sample_s": per_sample,
            "points": [{"batch_size": b, "seconds": fixed + per_sample * b} for b in sizes]}


def test_micro_batch_too_small_recommends_exact_tokens_and_saves_fixed_cost(profile_factory):
    # 32 micro-steps of batch 1: each pays 10 ms fixed + 2 ms per sample.
    p = profile_factory({"forward": 0.13, "backward": 0.26, "data": 0.01}, micro_steps=32,
                        config={"batch_size": 1, "block_size": 32},
                        measurements={"microbatch": _curve(0.010, 0.002, [1, 2, 4])})
    (f,) = batching.micro_batch_too_small(ctx_of(p))
    b2, n2 = f.config_overrides["batch_size"], f.config_overrides["gradient_accumulation_steps"]
    assert b2 * n2 == 32  # tokens per step unchanged
    assert b2 == 32 and n2 == 1  # everything fits in host RAM for this tiny model
    # old: 32 * (10 + 2) ms; new: 1 * (10 + 64) ms; applied to the run's 0.39 s of fwd+bwd
    assert f.saving_s == pytest.approx(0.39 * (1 - (0.010 + 0.002 * 32) / (32 * 0.012)))
    assert f.evidence["share"] == pytest.approx(10 / 12 * 0.39 / 0.40)


def test_micro_batch_ratio_holds_when_the_run_was_slower_than_the_curve(profile_factory):
    # A loaded host made the run 10x slower than the back-to-back curve: the shares still hold.
    p = profile_factory({"forward": 1.3, "backward": 2.6, "data": 0.1}, micro_steps=32,
                        config={"batch_size": 1, "block_size": 32},
                        measurements={"microbatch": _curve(0.010, 0.002, [1, 2, 4])})
    (f,) = batching.micro_batch_too_small(ctx_of(p))
    assert with_share(f, p.stats.step_s).saving_share == pytest.approx(3.9 * (1 - 0.074 / 0.384) / 4.0)


def test_micro_batch_says_it_costs_little_when_its_fixed_cost_is_small(profile_factory):
    # a fixed 1 ms of a 161 ms micro-step (batch 8): under the 10% worth a change, said as information
    # (no saving, no config change) rather than left out, so a rerun never shows it appear from nothing
    p = profile_factory({"forward": 0.3, "backward": 0.6}, micro_steps=4,
                        measurements={"microbatch": _curve(0.001, 0.02, [1, 4, 8])})
    (f,) = batching.micro_batch_too_small(ctx_of(p))
    assert (f.kind, f.saving_s, f.config_overrides, f.claims) == ("info", None, {}, {})
    assert f.evidence["share"] == pytest.approx(0.001 / 0.161)  # of the step: forward+backward is all of it
    assert "costs little" in f.title and "0.6% of the step" in f.title


def test_micro_batch_respects_memory(profile_factory):
    # GPT-2 124M on a 16 GB GPU: batch 64 x 1024 tokens does not fit, so stop below it.
    dims = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304, "block_size": 1024}
    p = profile_factory({"forward": 1.0, "backward": 2.0}, micro_steps=64, device="cuda",
                        config={"batch_size": 1, "block_size": 1024, "dtype": "bf16", "model_dims": dims},
                        measurements={"microbatch": _curve(0.02, 0.01, [1, 2, 4]),
                                      "memory": {"capacity_bytes": 16 * 10**9, "peak_allocated_bytes": 3e9}})
    (f,) = batching.micro_batch_too_small(ctx_of(p))
    assert f.evidence["memory_needed_bytes"] <= 16 * 10**9
    assert 1 < f.config_overrides["batch_size"] < 64


# ------------------------------------------------------------------ GPU rules
def test_h2d_pageable_saving_comes_from_bytes_and_measured_bandwidths(profile_factory):
    # 0.3 s of host time "in the copy" is mostly the previous forward (a pageable copy waits for
    # the GPU queue): the saving is 200 MB × (1/10 − 1/50 GB/s) = 16 ms, not 0.3 s.
    copies = {"copies": {"pageable_bytes_s": 10e9, "pinned_bytes_s": 50e9}}
    extra = {"h2d_copies": 8, "h2d_pageable": 8, "h2d_pageable_bytes": 200e6, "h2d_blocking": 8}
    p = profile_factory({"h2d": 0.3, "forward": 0.4, "backward": 0.5}, device="cuda", extra=extra,
                        measurements=copies, config={"pin_memory": False},
                        gpu_phases={"h2d": 0.05, "forward": 0.7, "backward": 0.5})
    (f,) = gpu.h2d_pageable(ctx_of(p))
    assert f.saving_s == pytest.approx(0.016) and f.claims == {"h2d": f.saving_s}
    assert f.evidence["pageable_bytes_per_step"] == 200e6 and f.config_overrides == {"pin_memory": True}
    # without the bandwidths: the copies' span on the GPU timeline, an upper bound
    del p.measurements["copies"]
    (f,) = gpu.h2d_pageable(ctx_of(p))
    assert f.saving_s == pytest.approx(0.05) and f.note.startswith("upper bound")
    # pinned, non-blocking copies: nothing to fix; a CPU run has no copies
    p_pinned = profile_factory({"h2d": 0.1, "forward": 0.9}, device="cuda",
                               extra={"h2d_copies": 8, "h2d_bytes": 200e6})
    assert gpu.h2d_pageable(ctx_of(p_pinned)) == []
    assert gpu.h2d_pageable(ctx_of(profile_factory({"h2d": 0.1, "forward": 0.9}, config={"pin_memory": False}))) == []


def test_h2d_pageable_below_one_percent_of_the_step_is_not_reported(profile_factory):
    copies = {"copies": {"pageable_bytes_s": 10e9, "pinned_bytes_s": 50e9}}
    p = profile_factory({"h2d": 0.2, "forward": 0.4, "backward": 0.5}, device="cuda", measurements=copies,
                        extra={"h2d_pageable": 2, "h2d_pageable_bytes": 1e6, "h2d_blocking": 2})
    assert gpu.h2d_pageable(ctx_of(p)) == []  # 80 µs of a 1.1 s step


def test_optimizer_slow_uses_the_bandwidth_floor(profile_factory):
    p = profile_factory({"optimizer": 0.2, "forward": 0.3, "backward": 0.5}, device="cuda",
                        config={"param_count": 124_000_000, "fused_adamw": False})
    (f,) = gpu.optimizer_slow(ctx_of(p, gpu=H200))
    floor = 28 * 124e6 / 4.8e12
    assert f.evidence["optimizer_floor_s"] == pytest.approx(floor)
    assert f.saving_s == pytest.approx(0.2 - floor)
    assert "fused=True" in f.fix


def test_no_tensor_cores_estimates_from_flops(profile_factory):
    p = profile_factory({"forward": 0.3, "backward": 0.6, "optimizer": 0.1}, device="cuda",
                        config={"dtype": "fp32", "tf32_matmul": False, "autocast_dtype": None})
    flops = 1e14
    (f,) = gpu.no_tensor_cores(ctx_of(p, gpu=H200, mfu=MfuResult(flops_per_step=flops)))
    at_half = flops / (0.5 * 989.5e12)
    assert f.saving_s == pytest.approx(0.9 - at_half)
    assert f.config_overrides == {"dtype": "bfloat16"}
    bf16 = profile_factory({"forward": 1.0}, device="cuda", config={"dtype": "bf16", "autocast_dtype": "bfloat16"})
    assert gpu.no_tensor_cores(ctx_of(bf16, gpu=H200)) == []


def test_compile_warmup_and_missing(profile_factory):
    p = profile_factory({"forward": 0.1, "backward": 0.1}, device="cuda", config={"compile": True}, warmup=[30.0, 0.2])
    (f,) = gpu.compile_findings(ctx_of(p))
    assert f.id == "compile-warmup" and f.evidence["warmup_extra_s"] == pytest.approx(30.2 - 0.4)
    eager = profile_factory({"forward": 0.1}, device="cuda", config={"compile": False})
    assert [f.id for f in gpu.compile_findings(ctx_of(eager))] == ["compile-missing"]
    assert gpu.compile_findings(ctx_of(profile_factory({"forward": 0.1}))) == []  # CPU: no advice


def test_launch_bound(profile_factory):
    p = profile_factory({"forward": 0.1, "backward": 0.2}, device="cuda", micro_steps=1,
                        gpu_phases={"forward": 0.1, "backward": 0.2})
    (f,) = gpu.launch_bound(ctx_of(p))
    assert f.evidence["host_fwd_bwd_s"] == pytest.approx(0.3)
    busy = profile_factory({"forward": 0.01, "backward": 0.02}, device="cuda",
                           gpu_phases={"forward": 0.1, "backward": 0.2})
    assert gpu.launch_bound(ctx_of(busy)) == []
    assert "reduce-overhead" in f.fix and "169545" not in f.fix  # one micro-step: CUDA graphs can run it


def test_launch_bound_never_sends_gradient_accumulation_to_cuda_graphs(profile_factory):
    """CUDA graph trees overwrite an accumulated .grad on the next micro-step's replay
    (pytorch/pytorch#169545; the built-in loop crashed so on an H200): with 4 micro-steps the fix
    says so and leads with fewer, larger micro-batches."""
    p = profile_factory({"forward": 0.1, "backward": 0.2}, device="cuda", micro_steps=4,
                        gpu_phases={"forward": 0.1, "backward": 0.2})
    (f,) = gpu.launch_bound(ctx_of(p))
    assert f.fix.startswith("fewer, larger micro-batches") and "169545" in f.fix


def test_sync_in_step(profile_factory):
    p = profile_factory({"forward": 0.4, "backward": 0.5, "other": 0.1}, device="cuda", micro_steps=4,
                        gpu_phases={"forward": 0.4, "backward": 0.5, "other": 0.1},
                        measurements={"syncs": {"per_step": 4.0, "per_phase": {"other": 16}}})
    (f,) = gpu.sync_in_step(ctx_of(p))
    assert f.saving_s == pytest.approx(0.1)
    few = profile_factory({"forward": 1.0}, device="cuda", micro_steps=4, measurements={"syncs": {"per_step": 1}})
    assert gpu.sync_in_step(ctx_of(few)) == []


# ------------------------------------------------------------------ machine rules
def test_gpu_throttled(profile_factory):
    nvml = {"available": True, "throttle_share": {"hw_thermal_slowdown": 0.5, "gpu_idle": 0.9},
            "phases": {"forward": {"sm_clock_share": 0.8}, "backward": {"sm_clock_share": 0.85}}}
    p = profile_factory({"forward": 0.3, "backward": 0.6, "optimizer": 0.1}, device="cuda",
                        measurements={"nvml": nvml})
    (f,) = machine.gpu_throttled(ctx_of(p))
    assert f.saving_s == pytest.approx(1.0 * 0.2)
    assert "hw_thermal_slowdown" in f.title and "gpu_idle" not in f.title
    cool = {"available": True, "throttle_share": {"gpu_idle": 0.9}, "phases": {"forward": {"sm_clock_share": 0.99}}}
    assert machine.gpu_throttled(ctx_of(profile_factory({"forward": 1.0}, measurements={"nvml": cool}))) == []


def test_cpu_saturated(profile_factory):
    p = profile_factory({"forward": 1.0}, measurements={"host": {"summary": {"cpu_pct": {"mean": 96.0}}, "cpu_count": 2}})
    (f,) = machine.cpu_saturated(ctx_of(p))
    assert f.evidence["cpu_busy_mean"] == pytest.approx(0.96)
    idle = profile_factory({"forward": 1.0}, measurements={"host": {"summary": {"cpu_pct": {"mean": 40.0}}}})
    assert machine.cpu_saturated(ctx_of(idle)) == []


def test_mfu_misreported(profile_factory):
    p = profile_factory({"forward": 1.0})
    mfu = MfuResult(reported_mfu_pct=104.0, mfu=0.328, peak_tflops=989.5, dtype="bf16",
                    misreport=(MisreportCause("a100_constant", "A100"), MisreportCause("impossible", ">100")))
    (f,) = machine.mfu_misreported(ctx_of(p, mfu=mfu))
    assert f.kind == "correction" and "impossible" in f.title and "989.5e12" in f.fix
    agrees = replace(mfu, reported_mfu_pct=33.0, misreport=(MisreportCause("agrees", ""),))
    assert machine.mfu_misreported(ctx_of(p, mfu=agrees)) == []


# ------------------------------------------------------------------ ranking
def test_ranking_and_overlap_capping(profile_factory):
    p = profile_factory({"data": 0.5, "forward": 0.5})
    big = Finding("storage-too-slow", "a", 0.4, 0.4, {}, claims={"data": 0.4})
    small = Finding("data-loading-exposed", "b", 0.3, 0.3, {}, claims={"data": 0.3})
    other = Finding("x", "c", 0.2, 0.2, {}, claims={"forward": 0.2})
    verdict = Finding("compute-bound", "d", None, None, {}, kind="verdict")
    info = Finding("dominant-phase", "e", None, None, {}, kind="info")
    ranked = rank([info, verdict, small, other, big], p.stats)
    assert [f.id for f in ranked] == ["storage-too-slow", "x", "data-loading-exposed", "compute-bound", "dominant-phase"]
    capped = ranked[2]
    assert capped.saving_s == pytest.approx(0.1) and capped.overlaps == ["storage-too-slow"]
    fixes = [f for f in ranked if f.saving_s]
    assert sum(f.saving_share for f in fixes) <= 1.0


def test_analyze_returns_ranked_findings_for_a_data_bound_profile(profile_factory):
    p = profile_factory({"data": 0.6, "forward": 0.2, "backward": 0.2})
    findings = run_rules(Context(profile=p, stats=p.stats))
    assert findings[0].id == "data-loading-exposed"
    assert findings[-1].kind == "info"


# ------------------------------------------------------------------ storage
from gpuprof.analysis.rules import storage  # noqa: E402


def _bench(qd1_iops, cold_samples_s, warm_samples_s=1e6):
    return {"settings": {"read_sizes": ["2KiB"]},
            "random": {"2KiB": {"qd1": {"iops": qd1_iops, "mb_s": qd1_iops * 2048 / 1e6},
                                "parallel": {"iops": qd1_iops * 4}}},
            "loader": {"cold": {"samples_per_s": cold_samples_s, "read_amplification": 8.0},
                       "warm": {"samples_per_s": warm_samples_s}}}


def test_storage_too_slow_from_a_bench_disk_result(profile_factory):
    # 8 x 128 x 4 = 4096 tokens/step = 32 samples/step; compute-only step 0.5 s -> 64 samples/s
    # needed. Cold memmap sampling manages 40/s: 0.8 s of reads per step; 0.5 s is exposed.
    p = profile_factory({"data": 0.5, "forward": 0.2, "backward": 0.3}, tokens=4096)
    (f,) = storage.storage_too_slow(ctx_of(p, disk=_bench(qd1_iops=50, cold_samples_s=40)))
    assert f.evidence["needs_reads_per_s"] == pytest.approx(64)
    assert f.evidence["headroom"] == pytest.approx(50 / 64)
    assert f.saving_s == pytest.approx(0.5)  # min(exposed 0.5, cold reads 0.8)
    fast = storage.storage_too_slow(ctx_of(p, disk=_bench(qd1_iops=40000, cold_samples_s=30000)))
    assert fast == []


def test_storage_suspect_on_network_fs_only_when_data_waits(profile_factory):
    nfs = {"storage": {"filesystem": {"type": "nfs4", "kind": "network", "warning": "nfs4 is a network filesystem"},
                       "residency_start": {"known": True, "fraction": 1.0}, "fits_in_ram": True}}
    waiting = profile_factory({"data": 0.3, "forward": 0.7}, measurements=nfs)
    (f,) = storage.storage_too_slow(ctx_of(waiting))
    assert f.saving_s is None and "network" in f.note
    busy = profile_factory({"data": 0.01, "forward": 0.99}, measurements=nfs)
    assert storage.storage_too_slow(ctx_of(busy)) == []


def test_no_more_workers_advised_without_an_idle_core(profile_factory):
    host = {"host": {"phases": {"data": {"samples": 10, "cpu_pct": 98.0}}}, "script": {"hooks": {"counts": {"dataloader_next": 10}}}}
    p = profile_factory({"data": 0.4, "forward": 0.6}, measurements=host)
    p.run["mode"] = "script"
    (f,) = phases.data_loading_exposed(ctx_of(p))
    assert "num_workers" not in f.fix and "idle cores" in f.fix
    host["host"]["phases"]["data"]["cpu_pct"] = 40.0
    (f,) = phases.data_loading_exposed(ctx_of(p))
    assert "num_workers" in f.fix


def test_h2d_pageable_from_script_hook_counts_of_an_older_profile(profile_factory):
    hooks = {"script": {"hooks": {"counts": {"h2d_copies": 8, "h2d_pageable": 8, "h2d_blocking": 8}}}}
    p = profile_factory({"h2d": 0.05, "forward": 0.45, "backward": 0.5}, device="cuda", measurements=hooks)
    p.run["mode"] = "script"
    (f,) = gpu.h2d_pageable(ctx_of(p))
    assert f.evidence["pageable_copies_per_step"] == 8 and f.config_overrides == {}
    assert f.saving_s is None  # no bandwidths, no GPU timeline: not estimated, never the host time
    hooks["script"]["hooks"]["counts"].update(h2d_pageable=0, h2d_blocking=0)
    assert gpu.h2d_pageable(ctx_of(p)) == []
