"""Sharded training under `gpuprof diagnose --nproc-per-node 2` (gloo on CPU, torchrun): an FSDP2
GPT (tests/fixtures/fsdp_train.py: fully_shard per block and the root) with a slow rank, one with
a rank that dies between two all-gathers, and a tensor-parallel MLP with a slow rank
(tests/fixtures/tp_train.py). Nothing hangs; FSDP's and DTensor's collectives are the `comm` phase,
counted exactly; the straggler is named through its peers' waiting; no post-run part runs the
sharded model."""

from __future__ import annotations

import pytest

from gpuprof.analysis.bounds import violations
from gpuprof.analysis.pipeline import Analysis
from gpuprof.profile import Profile

from ddp_helpers import FIXTURES, finding, gpuprof, load, rank_stats

FSDP = str(FIXTURES / "fsdp_train.py")
SLOW_S = 0.08  # rank 1 sleeps this long per micro-step inside its blocks' forward: at 0.04 the backward re-gather (~0.03 s) outranked it while other test suites loaded the machine
ACCUM, UNITS, BLOCKS = 2, 5, 4  # micro-steps; FSDP units (4 blocks + the root); of them resharded
PARAMS, BLOCK_PARAMS = 234_880, 49_984  # the fixture's GPT, every parameter; one block's
PARAM_TENSORS = 5 + 12 * BLOCKS  # wte, wpe, ln_f (2), lm_head; 12 per block
RUN = ["--steps", "4", "--warmup", "1", "--post-budget", "2"]  # post-run parts run: they must not run the model


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp") / "merged.json"
    r = gpuprof("diagnose", "--nproc-per-node", "2", *RUN, "--out", out, FSDP, "--slow_rank=1",
                f"--slow_s={SLOW_S}", "--max_iters=30", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return load(out), r


def test_every_rank_is_written_and_the_view_is_the_slowest(slow_run):
    prof, r = slow_run
    assert [(e["rank"], e["status"]) for e in prof["ranks"]] == [(0, "ok"), (1, "ok")]
    assert prof["run"]["view"]["rank"] == 1 and prof["run"]["view"]["rule"] == "slowest-rank"
    merged = Profile.from_dict(prof)
    assert violations(merged, Analysis.from_dict(prof["analysis"], merged)) == []
    assert "sharded (FSDP2): 2 ranks" in r.stdout


def test_the_straggler_is_named_first_with_the_time_its_peers_wait(slow_run):
    prof, _ = slow_run
    top = prof["analysis"]["findings"][0]
    assert top["id"] == "straggler-rank" and top["evidence"]["rank"] == 1
    assert top["evidence"]["phase"] == "forward"
    injected = SLOW_S * ACCUM
    assert abs(top["saving_s"] - injected) <= 0.25 * injected, (top["saving_s"], injected)
    # rank 0 waited for it inside FSDP's collectives: its comm phase holds that wait, not its forward.
    # The mechanism, with a margin that holds beside the suite's other worker: CI read 0.1199 s of a
    # 0.16-s injection (2026-12-07), where 0.75 of it was asked; how much of the wait lands in `comm`
    # on a quiet machine is benchmarks/fsdp_runs.py --pairs' (the saving within 25%)
    r0 = rank_stats(next(e for e in prof["ranks"] if e["rank"] == 0))
    r1 = rank_stats(next(e for e in prof["ranks"] if e["rank"] == 1))
    assert r0.phases["comm"].seconds - r1.phases["comm"].seconds >= 0.5 * injected
    assert r0.phases["forward"].seconds < r1.phases["forward"].seconds - 0.5 * injected


def test_collectives_are_counted_exactly_per_step(slow_run):
    prof, _ = slow_run
    for e in prof["ranks"]:
        steps = e["profile"]["steps"]
        assert len(steps) == 4
        for s in steps:
            c = s["extra"]["collectives"]
            # per micro-step: all 5 units gathered for forward, the 4 resharded blocks again for backward
            assert c["all_gather"]["calls"] == ACCUM * (UNITS + BLOCKS)
            assert c["all_gather"]["backward_calls"] == ACCUM * BLOCKS
            assert c["all_gather"]["bytes"] == ACCUM * (PARAMS + BLOCKS * BLOCK_PARAMS) * 4  # fp32
            assert c["reduce_scatter"]["calls"] == ACCUM * UNITS
            assert c["reduce_scatter"]["bytes"] == ACCUM * PARAMS * 4
            assert c["all_gather"]["seconds"] > 0 and s["phases"]["comm"] > 0
        m = e["profile"]["measurements"]
        assert m["collectives"]["group"] == {"size": 2, "backend": "gloo"}
        sh = m["sharding"]
        for s in steps:  # clip_grad_norm_ over the DTensor gradients: one all-reduce of the 53 norms
            assert (s["extra"]["collectives"]["funcol_all_reduce"]["calls"],
                    s["extra"]["collectives"]["funcol_all_reduce"]["bytes"]) == (1, PARAM_TENSORS * 4)
            assert "funcol_wait" not in s["extra"]["collectives"]
        assert sh["kind"] == "fsdp2" and len(sh["units"]) == UNITS
        assert sh["params_total"] == PARAMS and sh["params_local"] == PARAMS // 2
        # the root keeps its parameters after forward (FSDP2 decides at its first forward)
        assert [u["reshard_after_forward"] for u in sh["units"]] == [False] + [True] * BLOCKS


def test_nothing_after_the_run_runs_the_sharded_model(slow_run):
    prof, _ = slow_run
    ids = {f["id"] for f in prof["analysis"]["findings"]}
    assert not ids & {"micro-batch-too-small", "precision-slow", "compile-missing", "attention-by-hand"}
    for e in prof["ranks"]:
        m = e["profile"]["measurements"]
        assert "sharded (FSDP2)" in m["microbatch"]["not_measured"]
        assert any("sharded (FSDP2)" in x for x in m["flops"]["errors"])
        assert "sharded (FSDP2)" in m["probe"]["precisions"]["not_measured"]
        assert "comm" not in m  # the DDP meter stays out of a sharded run


def test_fsdp_fixes_carry_measured_savings(slow_run):
    prof, _ = slow_run
    rs = finding(prof, "fsdp-reduce-every-micro-step")
    assert rs is not None and rs["evidence"]["reduce_scatter_calls"] == ACCUM * UNITS
    # half of the reduce-scatters: those of the micro-step that is not the step's last
    assert rs["saving_s"] == pytest.approx(rs["evidence"]["reduce_scatter_s"] / 2)
    regather = finding(prof, "fsdp-backward-regather")
    assert regather is not None and regather["evidence"]["backward_all_gathers"] == ACCUM * BLOCKS
    exposed = finding(prof, "collectives-exposed")
    assert exposed is not None and exposed["kind"] == "info" and "MixedPrecisionPolicy" in exposed["fix"]


def test_a_rank_dying_between_all_gathers_ends_the_run_with_what_was_measured(tmp_path):
    out = tmp_path / "merged.json"
    r = gpuprof("diagnose", "--nproc-per-node", "2", *RUN, "--out", out, FSDP, "--die_rank=1", "--die_at=3",
                "--reshard=False", "--gradient_accumulation_steps=1", "--max_iters=30", timeout=240)
    assert r.returncode == 1, r.stderr[-3000:]
    prof = load(out)
    statuses = {e["rank"]: e["status"] for e in prof["ranks"]}
    assert statuses[1] == "missing" and statuses[0] in ("failed", "interrupted")
    steps = next(e for e in prof["ranks"] if e["rank"] == 0)["profile"]["steps"]
    assert steps  # rank 0's completed steps survive; with reshard_after_forward=False nothing is re-gathered
    for s in steps:
        assert s["extra"]["collectives"]["all_gather"]["backward_calls"] == 0
        assert s["extra"]["collectives"]["reduce_scatter"]["calls"] == UNITS


TP_SLOW_S = 0.04  # rank 1 sleeps this long in each forward of the tensor-parallel MLP


def test_tensor_parallel_collectives_are_measured_and_its_straggler_named(tmp_path):
    out = tmp_path / "merged.json"
    r = gpuprof("diagnose", "--nproc-per-node", "2", *RUN, "--out", out, str(FIXTURES / "tp_train.py"),
                "--slow_rank=1", f"--slow_s={TP_SLOW_S}", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    prof = load(out)
    merged = Profile.from_dict(prof)
    assert violations(merged, Analysis.from_dict(prof["analysis"], merged)) == []
    # the peer waits for the slow rank in RowwiseParallel's all-reduce: the `comm` phase, not compute.
    # First among the fixes for the step's regular time: a loaded host can add outlier steps, named
    # apart as irregular-steps (a CI run beside the suite's other work ranked one above it)
    regular = [f for f in prof["analysis"]["findings"] if f["id"] != "irregular-steps"]
    top = regular[0]
    assert top["id"] == "straggler-rank" and top["evidence"]["rank"] == 1
    # its size, loosely: beside the suite's other work a 40-ms sleep read 56 ms in one CI run, and
    # 29.6 ms and 40.6 ms (its peer waiting 68 ms in `comm`) in others; neither the sleep nor the
    # peer's wait is a tight truth on a loaded host. The size within 25% on a quiet machine is a
    # benchmark's (benchmarks/fsdp_runs.py --pairs times FSDP2's; tensor parallel has none yet)
    r0 = next(e for e in prof["ranks"] if e["rank"] == 0)["profile"]["steps"]
    wait0 = sorted(s["phases"]["comm"] for s in r0)[len(r0) // 2]
    assert 0.5 * TP_SLOW_S <= top["saving_s"] <= 2.0 * TP_SLOW_S, top["saving_s"]
    assert "tensor parallel (DTensor): 2 ranks" in r.stdout and "DTensor all-reduce 1×" in r.stdout
    for e in prof["ranks"]:
        for s in e["profile"]["steps"]:
            c = s["extra"]["collectives"]
            # one all-reduce per forward: proj's Partial (8, 64) fp32 output made Replicate; its wait
            # matched to its issue (none unmatched), in flight at least as long as the host was blocked
            assert set(c) == {"funcol_all_reduce"}, c
            ar = c["funcol_all_reduce"]
            assert (ar["calls"], ar["bytes"], ar["backward_calls"]) == (1, 8 * 64 * 4, 0)
            assert ar["in_flight_seconds"] >= ar["seconds"] - 1e-6 and ar["seconds"] > 0
            # the phase holds the collective's host time (and the switches around it: a sampler
            # thread may take the GIL between the switch and the call on this loaded host)
            assert ar["seconds"] <= s["phases"]["comm"] * 1.02 + 1e-4
    # rank 0's wait for rank 1, in the typical step (one step may start late on this loaded host,
    # when rank 0 itself was held up: it then waits less)
    assert wait0 >= 0.5 * TP_SLOW_S
    for e in prof["ranks"]:
        m = e["profile"]["measurements"]
        sh = m["sharding"]
        # fc column-sharded (weight and bias), proj row-sharded; proj's 64-value bias replicated
        assert sh["kind"] == "tensor_parallel" and sh["params_local"] == (sh["params_total"] - 64) // 2 + 64
        assert "tensor parallel (DTensor)" in m["microbatch"]["not_measured"]


def test_each_rank_says_what_it_holds_of_the_training_state(slow_run):
    prof, _ = slow_run
    for e in prof["ranks"]:
        mem = e["profile"]["measurements"]["sharding"]["memory"]
        # read from the tensors: fp32 parameters whole and this rank's half; AdamW's exp_avg and
        # exp_avg_sq sharded like them, and one 4-byte `step` per parameter tensor, not sharded
        assert (mem["param_bytes_total"], mem["param_bytes_local"]) == (PARAMS * 4, PARAMS * 4 // 2)
        assert mem["optimizer"] == "AdamW"
        assert mem["optimizer_state_bytes_total"] == 2 * PARAMS * 4 + PARAM_TENSORS * 4
        assert mem["optimizer_state_bytes_local"] == PARAMS * 4 + PARAM_TENSORS * 4
    f = finding(prof, "sharded-memory")
    assert f is not None and f["kind"] == "info"
    ev = f["evidence"]
    assert ev["unsharded_bytes"] == 2 * PARAMS * 4 + 2 * PARAMS * 4 + PARAM_TENSORS * 4
    assert ev["held_bytes"] < ev["unsharded_bytes"]
    assert "not measured" in f["note"]  # a CPU run has no device memory to judge the fit against
