"""Sharded rules from the model's structure, on chosen numbers: sharded-memory (what a rank holds of
the training state, what it would unsharded, and on CUDA whether it would fit each GPU without
sharding) and the FSDP2 units' granularity (a root holding the embeddings, many tiny units)."""

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
