"""`gpuprof diagnose --nproc-per-node 2` end to end: torchrun launches 2 gloo ranks on this CPU,
every rank is instrumented, the launcher merges them and the distributed rules read the result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from gpuprof.analysis.bounds import violations
from gpuprof.analysis.distributed import distributed_stats
from gpuprof.analysis.pipeline import Analysis
from gpuprof.merge import merge_entries
from gpuprof.profile import Profile

from cpu_lock import many_processes
from ddp_helpers import DDP_SCRIPT, FAST, finding, free_port, gpuprof, gpuprof_here, launch_here, load, rank_stats

DELAY_S = 0.05  # rank 1 sleeps this long in every get_batch: 2 per step (accum 4 over 2 ranks)


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory, data_dir):
    """Rank 1's data path is slow, and the script all-reduces on every micro-step."""
    out = tmp_path_factory.mktemp("straggler") / "merged.json"
    r = gpuprof("diagnose", "--nproc-per-node", "2", *FAST, "--out", out, DDP_SCRIPT,
                f"--data_dir={data_dir}", "--delay_rank=1", f"--delay_s={DELAY_S}", "--sync_every_micro=True")
    assert r.returncode == 0, r.stderr[-3000:]
    return load(out), r


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, data_dir):
    """Two 'nodes' on this machine (static rendezvous on localhost), one rank each; each node
    writes its file, and `gpuprof merge` joins them (all.json). nanoGPT's
    require_backward_grad_sync toggling, no injected delay: the clean run of a world of 2 ranks
    that test_no_sync_toggling_not_flagged reads too (one run of 4 processes for both)."""
    tmp = tmp_path_factory.mktemp("two-nodes")
    port = free_port()

    def node(n):
        return ["diagnose", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(n), "--master-addr",
                "127.0.0.1", "--master-port", str(port), *FAST, "--out", str(tmp / f"node{n}.json"), DDP_SCRIPT,
                f"--data_dir={data_dir}"]

    with many_processes():  # node 1's gpuprof a process of its own, node 0's this one (launch_here)
        p = subprocess.Popen([sys.executable, "-m", "gpuprof", *node(1)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            r0 = launch_here(node(0), timeout=180)
            _, err = p.communicate(timeout=180)
        finally:
            if p.poll() is None:
                p.kill()
    assert r0.returncode == 0, r0.stderr[-3000:]
    assert p.returncode == 0, err[-3000:]
    nodes = [load(tmp / f"node{n}.json") for n in (0, 1)]
    # merge runs nothing: in this process (the nodes above are the processes of their own)
    r = gpuprof_here("merge", tmp / "node1.json", tmp / "node0.json", "--out", tmp / "all.json")
    assert r.returncode == 0, r.stderr
    return tmp, nodes, load(tmp / "all.json")


def test_merged_profile_holds_both_ranks(straggler_run):
    prof, r = straggler_run
    assert [e["rank"] for e in prof["ranks"]] == [0, 1]
    assert all(e["status"] == "ok" and e["profile"]["steps"] for e in prof["ranks"])
    assert prof["run"]["world_size"] == 2
    assert prof["run"]["launch"] == {"nnodes": 1, "nproc_per_node": 2, "world_size": 2}
    for e in prof["ranks"]:
        comm = e["profile"]["measurements"]["comm"]
        assert comm["backend"] == "gloo" and comm["world_size"] == 2 and comm["clock"] == "host"
        assert comm["measured_steps"] == 4
        assert comm["bytes_per_round"] > 0 and comm["busbw_Bps"] > 0
    merged = Profile.from_dict(prof)
    assert violations(merged, Analysis.from_dict(prof["analysis"], merged)) == []
    assert "distributed" not in prof["measurements"]  # the ranks together are the analysis's
    assert "rank 1 is the straggler" in r.stdout and "data parallel: 2 ranks" in r.stdout


def test_straggler_found_with_its_size(straggler_run):
    prof, _ = straggler_run
    f = finding(prof, "straggler-rank")
    assert f is not None, [x["id"] for x in prof["analysis"]["findings"]]
    ev = f["evidence"]
    assert ev["rank"] == 1 and ev["phase"] == "data"
    micro = rank_stats(next(e for e in prof["ranks"] if e["rank"] == 1)).micro_steps
    injected = DELAY_S * micro  # seconds per step
    # The bar, 5 points of the step, is the benchmark's (benchmarks/ddp_straggler.py: 6 of 6
    # within it, docs/measurements/2026-12-01-ddp-straggler.md). Here the suite's other processes
    # share the 2 cores: one run read 6.5 points low (2026-12-04, the other rank slowed too), so
    # the test allows 10.
    assert abs(ev["extra_s"] - injected) / ev["step_s"] <= 0.10, (ev, injected)
    assert prof["run"]["view"]["rank"] == 1 and prof["run"]["view"]["rule"] == "slowest-rank"
    assert f["because"] and "rank 1" in f["because"]


def test_sync_every_micro_step_detected(straggler_run):
    prof, _ = straggler_run
    f = finding(prof, "ddp-sync-every-micro-step")
    assert f is not None
    assert f["evidence"]["rounds_per_step"] == 2 and f["evidence"]["micro_steps"] == 2
    assert 0 < f["saving_s"] < f["evidence"]["step_s"]
    comm = prof["analysis"]["distributed"]["communication"]
    assert comm["rounds_per_step"] == 2 and type(comm["rounds_per_step"]) is int  # a count, saved as one


def test_no_sync_toggling_not_flagged(two_nodes):
    _, _, prof = two_nodes  # both ranks' merged profile: DDP over 2 ranks, toggling its sync
    assert finding(prof, "ddp-sync-every-micro-step") is None
    comm = prof["analysis"]["distributed"]["communication"]
    assert comm["rounds_per_step"] == 1 and comm["micro_steps"] == 2
    assert type(comm["rounds_per_step"]) is int and type(comm["micro_steps"]) is int
    # No injected straggler: whatever rank is busiest, it is not a data-path straggler of 50 ms+.
    f = finding(prof, "straggler-rank")
    assert f is None or f["evidence"]["extra_s"] < DELAY_S


def test_crashing_rank_reported_without_hang(tmp_path, data_dir):
    out = tmp_path / "crash.json"
    r = gpuprof("diagnose", "--nproc-per-node", "2", *FAST, "--rank-timeout", "30", "--out", out,
                DDP_SCRIPT, f"--data_dir={data_dir}", "--crash_rank=1", "--crash_at=3", "--max_iters=50",
                timeout=150)
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "rank 1 failed first" in last and "injected crash on rank 1 at iter 3" in last, last
    prof = load(out)
    by_rank = {e["rank"]: e for e in prof["ranks"]}
    assert by_rank[1]["status"] == "failed"
    assert "injected crash" in by_rank[1]["error"]["message"]
    # What completed is kept: rank 1 ran 3 steps (1 warmup + 2 measured) before raising.
    assert len(by_rank[1]["profile"]["steps"]) == 2
    # rank 0 lost its peer: its collective failed, or torchrun stopped it; never "ok"
    assert by_rank[0]["status"] in ("failed", "interrupted")
    assert by_rank[0]["profile"]["steps"]  # its completed steps are kept
    # A failed data-parallel rank runs nothing on its model after the run (DDP's reducer may still
    # expect a backward: one would launch an all-reduce no peer answers).
    post = by_rank[1]["profile"]["measurements"]["post_run"]
    assert post["budget_s"] == 0 and post["source"].startswith("none: a data-parallel rank that failed")


def test_builtin_loop_data_parallel(tmp_path):
    out = tmp_path / "builtin.json"
    r = gpuprof("diagnose", "--nproc-per-node", "2", *FAST, "--n-layer", "1", "--n-embd", "32",
                "--batch-size", "2", "--block-size", "32", "--grad-accum", "4", "--out", out)
    assert r.returncode == 0, r.stderr[-3000:]
    prof = load(out)
    assert [e["rank"] for e in prof["ranks"]] == [0, 1]
    for e in prof["ranks"]:
        p = e["profile"]
        assert p["run"]["distributed"]["backend"] == "gloo"
        assert p["run"]["config"]["grad_accum"] == 2  # 4 // world size, as nanoGPT
        assert rank_stats(e).micro_steps == 2
        assert p["measurements"]["comm"]["rounds_per_step"] == 1  # no_sync on the first micro-step
        assert e["nccl_env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"  # set for the ranks by the launcher
    assert finding(prof, "ddp-sync-every-micro-step") is None


def test_two_nodes_merge_equals_all_ranks(two_nodes):
    """Each node's file holds its rank; `gpuprof merge` joins them (exit 0, in the fixture) into
    what merging all ranks at once gives."""
    tmp_path, nodes, merged = two_nodes
    assert [[e["rank"] for e in n["ranks"]] for n in nodes] == [[0], [1]]
    assert nodes[0]["analysis"]["distributed"]["absent_ranks"] == [1]
    entries = [e for n in nodes for e in n["ranks"]]
    expected = merge_entries(entries)
    assert merged["ranks"] == expected.ranks
    assert merged["analysis"]["distributed"] == json.loads(json.dumps(distributed_stats(entries, 2).to_dict()))
    assert merged["run"]["launch"] == {"nnodes": 2, "nproc_per_node": 1, "world_size": 2}
    assert merged["steps"] == [s.to_dict() for s in expected.steps]
    again = gpuprof_here("merge", tmp_path / "node0.json", tmp_path / "node0.json")
    assert again.returncode == 2 and "rank 0 is in both" in again.stderr


def test_ctrl_c_stops_all_ranks_and_writes(tmp_path, data_dir):
    out = tmp_path / "interrupted.json"
    cmd = [sys.executable, "-m", "gpuprof", "diagnose", "--nproc-per-node", "2", "--steps", "500",
           "--warmup", "1", "--post-budget", "0", "--out", str(out), DDP_SCRIPT, f"--data_dir={data_dir}",
           "--max_iters=1000"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        for line in p.stdout:  # rank 0 prints an iter line per step
            if line.startswith("iter 4:"):
                break
        os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group
        _, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err[-3000:]
    prof = load(out)
    assert [e["rank"] for e in prof["ranks"]] == [0, 1]
    for e in prof["ranks"]:
        assert e["status"] == "interrupted", e["error"]
        assert len(e["profile"]["steps"]) >= 3


def test_hung_rank_times_out_and_is_located(tmp_path, data_dir):
    """Rank 1's data path never returns at iter 3: rank 0's all-reduce times out (--rank-timeout,
    given to init_process_group since the script passes none), torchrun stops rank 1, and the
    message says where each rank was."""
    out = tmp_path / "hang.json"
    r = gpuprof("diagnose", "--nproc-per-node", "2", *FAST, "--rank-timeout", "5", "--out", out,
                DDP_SCRIPT, f"--data_dir={data_dir}", "--hang_rank=1", "--hang_at=3", timeout=150)
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "rank 0 failed first" in last and "Timed out" in last, last
    assert "rank 1 data" in last  # where the hung rank was: its data path
    prof = load(out)
    by_rank = {e["rank"]: e for e in prof["ranks"]}
    assert by_rank[1]["status"] == "interrupted" and len(by_rank[1]["profile"]["steps"]) == 2
    assert by_rank[1]["profile"]["run"]["ended_in"]["longest"] == "data"
    assert by_rank[1]["profile"]["run"]["ended_in"]["longest_s"] >= 4.5
