"""sharded-memory on chosen numbers: what a rank holds of the training state, what it would hold
unsharded, and on CUDA, from the measured peak and capacity, whether the model would fit each GPU
without sharding (the peak already holds the activations and this rank's shards)."""

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
