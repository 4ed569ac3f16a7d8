"""Sharded rules on chosen numbers: sharded-memory (what a rank holds of the training state,
what it would unsharded, and on CUDA whether it would fit each GPU without sharding), the FSDP2
units' granularity (a root holding the embeddings, many tiny units), and FSDP2 on CUDA (its
collectives' time in flight on its own streams: bus bandwidth and the fixes' savings)."""

import pytest

from gpuprof.analysis.engine import Context
from gpuprof.analysis.rules.sharded import sharded_memory

GiB = 2**30


def _sharding(kind="fsdp2", grads=True):
    return {"kind": kind, "units": [{"module": "(root)"}], "memory": {
        "param_bytes_total": 8 * GiB, "param_bytes_local": 1 * GiB,  # 8 ranks
        "grad_bytes_local": 1 * GiB if grads else None,
        "optimizer_state_bytes_total": 16 * GiB, "optimizer_state_bytes_local": 2 * GiB, "optimizer": "AdamW"}}


def _finding(profile_factory, device="cuda", sharding=None, memory=None):
    measurements = {"sharding": sharding or _sharding()}
    if memory is not None:
        measurements["memory"] = memory
    p = profile_factory({"forward": 0.1, "backward": 0.2}, device=device, measurements=measurements)
    (f,) = sharded_memory(Context(profile=p, stats=p.stats))
    return f


def test_a_model_that_fits_unsharded_is_said_to_with_the_arithmetic(profile_factory):
    f = _finding(profile_factory, memory={"peak_allocated_bytes": 30 * GiB, "capacity_bytes": 141 * GiB})
    ev = f.evidence
    assert ev["held_bytes"] == 4 * GiB and ev["unsharded_bytes"] == 32 * GiB
    assert ev["unsharded_peak_bytes"] == 58 * GiB  # 30 GiB measured + the 28 GiB FSDP shards away
    assert f.kind == "info" and f.saving_s is None
    assert f.title.startswith("the model would fit on each GPU without sharding") and "DDP" in f.note


def test_a_model_that_does_not_fit_unsharded_needs_its_sharding(profile_factory):
    f = _finding(profile_factory, memory={"peak_allocated_bytes": 120 * GiB, "capacity_bytes": 141 * GiB})
    assert f.evidence["unsharded_peak_bytes"] == 148 * GiB and "sharding is needed" in f.note


def test_unset_gradients_count_as_the_parameters_shard(profile_factory):
    f = _finding(profile_factory, sharding=_sharding(grads=False),
                 memory={"peak_allocated_bytes": 30 * GiB, "capacity_bytes": 141 * GiB})
    assert f.evidence["held_bytes"] == 4 * GiB and "counted as the parameters' shard" in f.because


def test_no_fit_verdict_without_a_measured_peak_or_for_tensor_parallel(profile_factory):
    assert "not measured" in _finding(profile_factory, device="cpu").note
    assert "not measured" in _finding(profile_factory, memory=None).note
    tp = _finding(profile_factory, sharding=_sharding("tensor_parallel"),
                  memory={"peak_allocated_bytes": 30 * GiB, "capacity_bytes": 141 * GiB})
    assert "activations too" in tp.note and "unsharded_peak_bytes" not in tp.evidence


# -- how the model was cut into FSDP2 units ------------------------------------------------------

from gpuprof.analysis.rules.sharded import fsdp_wrap_granularity  # noqa: E402


def _units(profile_factory, units):
    p = profile_factory({"forward": 0.1, "backward": 0.2},
                        measurements={"sharding": {"kind": "fsdp2", "units": units}})
    return {f.id: f for f in fsdp_wrap_granularity(Context(profile=p, stats=p.stats))}


def test_a_root_holding_the_embeddings_is_one_large_all_gather(profile_factory):
    # GPT-2 124M's shape: wte (tied head) 38.6M + wpe 0.8M in the root, 12 blocks of 7.1M
    units = [{"module": "(root)", "params": 39_400_000}] + [{"module": f"h.{i}", "params": 7_100_000} for i in range(12)]
    found = _units(profile_factory, units)
    f = found["fsdp-root-unit-large"]
    assert f.kind == "info" and f.saving_s is None and "fully_shard the embeddings" in f.fix
    assert f.title == "the root FSDP unit holds 31.6% of the parameters in one all-gather"
    assert "fsdp-units-tiny" not in found


def test_balanced_units_say_nothing_and_many_tiny_ones_are_named(profile_factory):
    balanced = [{"module": "(root)", "params": 35_000}] + [{"module": f"h.{i}", "params": 50_000} for i in range(4)]
    assert _units(profile_factory, balanced) == {}  # tests/fixtures/fsdp_train.py's proportions
    tiny = [{"module": "(root)", "params": 10_000}] + [{"module": f"h.{i}", "params": 20_000} for i in range(24)]
    f = _units(profile_factory, tiny)["fsdp-units-tiny"]
    assert f.evidence["units"] == 25 and "several blocks per fully_shard" in f.fix


# -- FSDP2 on CUDA: its collectives' time in flight on its own streams -----------------------------

from gpuprof.analysis.distributed import _job_collectives  # noqa: E402
from gpuprof.analysis.distributed_results import DistributedStats  # noqa: E402
from gpuprof.analysis.rules.sharded import fsdp_backward_regather, fsdp_reduce_every_micro_step  # noqa: E402

def _row(rank, exposed, by_kind, gpu_timeline=True):
    return {"rank": rank, "step_s": 0.5, "micro_steps": 2,
            "collectives": {"by_kind": by_kind, "exposed_s": exposed, "world": 2, "backend": "nccl",
                            "gpu_timeline": gpu_timeline}}


KINDS = {  # per step, medians: host seconds are the enqueueing on CUDA
    "all_gather": {"calls": 18, "bytes": 400_000_000, "seconds": 0.002, "backward_calls": 8,
                   "backward_seconds": 0.001, "gpu_seconds": 0.090, "gpu_backward_seconds": 0.040},
    "all_gather_wait": {"calls": 18, "seconds": 0.030, "backward_calls": 8, "backward_seconds": 0.020},
    "reduce_scatter": {"calls": 10, "bytes": 200_000_000, "seconds": 0.001, "backward_calls": 10,
                       "backward_seconds": 0.001, "gpu_seconds": 0.060, "gpu_backward_seconds": 0.060},
}


def test_bus_bandwidth_on_cuda_comes_from_the_time_in_flight_never_from_the_enqueueing():
    job = _job_collectives([_row(0, 0.03, KINDS)])
    assert job["by_kind"]["all_gather"]["algbw_Bps"] == pytest.approx(400e6 / 0.090)
    assert job["by_kind"]["all_gather"]["busbw_Bps"] == pytest.approx(400e6 / 0.090 / 2)
    no_events = {k: {f: v for f, v in d.items() if not f.startswith("gpu_")} for k, d in KINDS.items()}
    assert "busbw_Bps" not in _job_collectives([_row(0, 0.03, no_events)])["by_kind"]["all_gather"]
    host = _job_collectives([_row(0, 0.03, no_events, gpu_timeline=False)])  # gloo: host time is the collective's
    assert host["by_kind"]["all_gather"]["algbw_Bps"] == pytest.approx(400e6 / 0.002)


def _sharded_ctx(profile_factory):
    units = [{"module": "(root)", "params": 1000, "reshard_after_forward": False}] + \
        [{"module": f"h.{i}", "params": 1000, "reshard_after_forward": True} for i in range(4)]
    p = profile_factory({"forward": 0.2, "backward": 0.25, "comm": 0.05}, device="cuda",
                        measurements={"sharding": {"kind": "fsdp2", "units": units}})
    d = DistributedStats.from_dict({"world_size": 2, "collectives": _job_collectives([_row(0, 0.05, KINDS)])})
    return Context(profile=p, stats=p.stats, distributed=d)


def test_on_cuda_the_fsdp_fixes_claim_the_time_in_flight_as_an_upper_bound(profile_factory):
    ctx = _sharded_ctx(profile_factory)
    (regather,) = fsdp_backward_regather(ctx)
    # the backward all-gathers in flight on FSDP's stream (not + the copy-out's wait: that one is
    # on the GPU timeline's comm, the host's enqueue seconds are not the collective's time)
    assert regather.saving_s == pytest.approx(0.040) and regather.confidence == "low"
    assert regather.evidence["in_flight"] is True and "upper bound" in regather.note
    (reduce,) = fsdp_reduce_every_micro_step(ctx)
    assert reduce.saving_s == pytest.approx(0.060 / 2) and reduce.confidence == "low"
