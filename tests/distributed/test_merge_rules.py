"""The pieces of the data-parallel path without launching anything: the all-reduce meter's
arithmetic (host and CUDA-event clocks), the merge of rank entries, the three rules, torchrun's
argv, and the CLI's refusals before a launch."""

from __future__ import annotations

import types

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from gpuprof.analysis.bounds import violations
from gpuprof.analysis.pipeline import analyze
from gpuprof.cli import app
from gpuprof.errors import GpuprofError
from gpuprof.measure.comm import CommMeter, CudaClock, HostClock
from gpuprof.merge import merge_entries, merge_profiles
from gpuprof.profile import Profile, StepRecord
from gpuprof.runners.launch import first_failure, torchrun_args

MS = 1_000_000  # ns


def _meter(records, steps):
    m = CommMeter(clock=HostClock())
    m._registered, m._world, m._backend = True, 4, "gloo"
    m._records = [list(r) for r in records]
    ctx = types.SimpleNamespace(profile=types.SimpleNamespace(steps=[types.SimpleNamespace(index=i) for i in steps]))
    return m.stop(ctx)


def test_round_arithmetic_host_clock():
    # One step (index 1), one round of two buckets: ready at 0 and 10 ms, done at 15 and 30 ms.
    sec = _meter([[1, 1000, False, 0, 15 * MS], [1, 3000, True, 10 * MS, 30 * MS]], steps=[1])
    assert sec["in_flight_s"] == pytest.approx(0.030)  # [0,15] ∪ [10,30]
    assert sec["exposed_s"] == pytest.approx(0.020)  # last ready (10 ms) → last done (30 ms)
    assert sec["overlapped_s"] == pytest.approx(0.010)
    assert sec["bytes_per_round"] == 4000 and sec["buckets_per_round"] == 2
    assert sec["algbw_Bps"] == pytest.approx(4000 / 0.030)
    assert sec["busbw_Bps"] == pytest.approx(4000 / 0.030 * 2 * 3 / 4)  # nccl-tests: 2(n-1)/n
    assert sec["rounds_per_step"] == 1 and sec["extra_rounds_exposed_s"] == 0


def test_rounds_per_step_and_extra_rounds():
    # Step 2 all-reduces on both of its micro-steps; warmup step 0 and an incomplete round are left out.
    recs = [[0, 8, True, 0, 5 * MS],
            [2, 8, True, 0, 4 * MS], [2, 8, True, 20 * MS, 27 * MS],
            [3, 8, True, 0, 6 * MS], [3, 8, False, 50 * MS, None]]
    sec = _meter(recs, steps=[2, 3])
    per = {s["index"]: s for s in sec["per_step"]}
    assert per[2]["rounds"] == 2 and per[2]["extra_rounds_exposed_s"] == pytest.approx(0.004)
    assert per[2]["exposed_s"] == pytest.approx(0.011)
    assert per[3]["rounds"] == 1 and sec["incomplete_rounds"] == 1


def test_cuda_clock_reads_events_after_the_run(fake_cuda):
    clock = CudaClock("cuda:0")
    a = clock.mark()
    fake_cuda.enqueue(0.004)
    b = clock.mark()
    with pytest.raises(RuntimeError):  # as CUDA: not complete yet, so never read during the run
        clock.seconds(a, b)
    clock.prepare([a, b])  # polls (the GPU works on while the host sleeps): never a blocking wait
    assert clock.seconds(a, b) == pytest.approx(0.004)
    assert fake_cuda.event_waits == 0 and not any(c[0] == "synchronize" for c in fake_cuda.calls)


def test_cuda_clock_gives_up_on_a_collective_that_never_completes(fake_cuda):
    """A peer stopped: the all-reduce's completion mark waits behind a kernel that never ends.
    The finished run's bounded wait gives up (a fake CUDA raises WouldHang where CUDA hangs)."""
    from gpuprof.measure.timer import FINISHED_GRACE_S

    clock = CudaClock("cuda:0")
    ready = clock.mark()
    fake_cuda.block()
    done = clock.mark()
    clock.prepare([ready, done])
    assert FINISHED_GRACE_S <= fake_cuda.host_now < FINISHED_GRACE_S + 0.01
    with pytest.raises(RuntimeError):
        clock.seconds(ready, done)


def test_a_failing_mark_never_raises_into_the_users_backward(fake_cuda):
    """An event that cannot be created or recorded (OOM, a capture) must not fail the step: the
    hook still all-reduces, and its round is counted incomplete with the reason."""
    meter = CommMeter(clock=CudaClock("cuda:0"))
    fake_cuda.capturing = True
    assert meter._mark() is None
    fake_cuda.capturing = False

    def broken(*a, **k):
        raise RuntimeError("CUDA error: out of memory")

    meter._clock.mark = broken
    assert meter._mark() is None
    assert meter._errors == ["a mark failed: RuntimeError: a CUDA graph was being captured",
                             "a mark failed: RuntimeError: CUDA error: out of memory"]


def _rank_profile(rank, data_s, exposed_s, *, steps=4, other=0.01, rounds=1, micro=2, others=None):
    recs = []
    for i in range(1, steps + 1):
        phases = {"data": data_s, "h2d": 0.0, "forward": 0.02, "backward": 0.03 + exposed_s,
                  "optimizer": 0.005, "other": others[i - 1] if others else other}
        recs.append(StepRecord(index=i, wall_s=sum(phases.values()), phases=phases, tokens=512, micro_steps=micro))
    prof = Profile(run={"mode": "script", "rank": rank, "world_size": 2, "config": {}}, steps=recs)
    prof.measurements["comm"] = {
        "backend": "gloo", "clock": "host", "bytes_per_round": 4e6, "busbw_Bps": 1e9, "algbw_Bps": 1e9,
        "link": {"name": "test", "nominal_Bps": 2e9},
        "per_step": [{"index": i, "rounds": rounds, "in_flight_s": exposed_s + 0.01, "exposed_s": exposed_s,
                      "extra_rounds_exposed_s": exposed_s / 2 if rounds > 1 else 0.0,
                      "extra_rounds_in_flight_s": 0.0} for i in range(1, steps + 1)]}
    return {"rank": rank, "local_rank": rank, "node_rank": 0, "host": "h", "world_size": 2, "status": "ok",
            "error": None, "profile": prof.to_dict()}


def test_a_ranks_busy_seconds_sit_within_its_step_whatever_the_steps_spread():
    """Steps of 66, 66, 76, 76, 76 ms with 1 ms exposed: the median step less its wait (75 ms) is
    longer than the typical step (their mean, 72 ms). busy is taken over the same steps as the
    step, so it is the step less the mean wait, within it (a two-node run read 12.45 ms busy
    outside its step)."""
    entries = [_rank_profile(rank, data_s=0.01, exposed_s=0.001, steps=5, others=(0.0, 0.0, 0.01, 0.01, 0.01))
               for rank in (0, 1)]
    merged = merge_entries(entries)
    analysis = analyze(merged)
    for r in analysis.distributed.ranks:
        assert r.step_s == pytest.approx(0.072)  # 66 ms of phases, other 6 ms on average
        assert r.busy_s == pytest.approx(r.step_s - 0.001)
        assert r.own_phases["backward"] == pytest.approx(0.03)
    assert violations(merged, analysis) == []


def test_merge_finds_the_straggler_exactly():
    # Rank 1 loads data 80 ms slower; rank 0 waits those 80 ms in its all-reduce.
    entries = [_rank_profile(0, data_s=0.01, exposed_s=0.09), _rank_profile(1, data_s=0.09, exposed_s=0.01)]
    merged = merge_entries(entries)
    assert "distributed" not in merged.measurements  # the ranks together are the analysis's, not stored
    analysis = analyze(merged)
    d = analysis.distributed  # typed: gpuprof.analysis.distributed_results
    assert d.slowest.rank == 1 and d.slowest.phase == "data"
    assert d.slowest.extra_s == pytest.approx(0.08)
    assert d.slowest.phase_extra_s == pytest.approx(0.08)
    assert d.communication.rank == 1 and d.communication.exposed_s == pytest.approx(0.01)
    assert {w.rank: w.waiting_s for w in d.communication.waiting} == pytest.approx({0: 0.08, 1: 0.0})
    assert merged.run["rank"] == 1 and merged.run["view"]["rank"] == 1 and merged.run["view"]["rule"] == "slowest-rank"
    # what the choice rests on: each rank's busy seconds per step
    assert merged.run["view"]["busy_s"] == pytest.approx({"0": d.ranks[0].busy_s, "1": d.ranks[1].busy_s})
    assert d.ranks[1].busy_s > d.ranks[0].busy_s
    findings = {f.id: f for f in analysis.findings}
    f = findings["straggler-rank"]
    assert f.evidence["rank"] == 1 and "80.0 ms" in f.title
    assert findings["communication-exposed"].evidence["busbw_Bps"] == 1e9
    assert "ddp-sync-every-micro-step" not in findings
    assert violations(merged, analysis) == []
    assert analyze(merged).to_dict() == analysis.to_dict()  # pure: the merged profile is unchanged


def test_sync_every_micro_step_saving_is_the_extra_rounds():
    entries = [_rank_profile(r, data_s=0.01, exposed_s=0.02, rounds=2) for r in (0, 1)]
    analysis = analyze(merge_entries(entries))
    findings = {f.id: f for f in analysis.findings}
    f = findings["ddp-sync-every-micro-step"]
    assert f.evidence["rounds_per_step"] == 2 and f.saving_s == pytest.approx(0.01)
    # counts stay ints (a median of ints is stored as one)
    c = analysis.distributed.communication
    assert type(c.rounds_per_step) is int and type(c.micro_steps) is int and c.micro_steps == 2
    assert all(type(r.comm.rounds_per_step) is int for r in analysis.distributed.ranks)
    # communication-exposed keeps only what stays exposed after that fix: no interval twice.
    assert findings["communication-exposed"].evidence["exposed_s"] == pytest.approx(0.01)


def test_failed_and_missing_ranks_are_named_and_kept():
    ok = _rank_profile(0, data_s=0.01, exposed_s=0.01)
    failed = _rank_profile(1, data_s=0.01, exposed_s=0.01)
    failed.update(status="failed", error={"type": "RuntimeError", "message": "boom", "file": "t.py", "line": 3,
                                          "time": 10.0})
    missing = {"rank": 2, "local_rank": 0, "node_rank": 1, "host": None, "world_size": 3, "status": "missing",
               "profile": None, "error": {"type": "RankDied", "message": "killed by SIGKILL", "time": 5.0}}
    merged = merge_entries([failed, missing, ok])
    d = analyze(merged).distributed
    assert [r.rank for r in d.ranks] == [0, 1, 2]
    assert d.failed_ranks == (1, 2) and d.world_size == 3
    assert d.slowest is None  # one healthy rank: no straggler to compare
    assert "RuntimeError at t.py:3: boom" in d.ranks[1].error
    assert first_failure([failed, missing, ok])["rank"] == 2  # it failed first
    with pytest.raises(GpuprofError, match="rank 2: RankDied"):
        merge_entries([missing])


def test_failed_ranks_errors_print_as_they_are():
    """A rank's error is printed as its text: gloo's messages hold "[/path/pair.cc:553]", which is
    not console markup (it raised rich's MarkupError instead of the report)."""
    import io

    from rich.console import Console

    from gpuprof.render.terminal import render_diagnosis

    gloo = "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20873"
    entries = []
    for r in (0, 1):
        e = _rank_profile(r, data_s=0.01, exposed_s=0.01)
        error = {"type": "RuntimeError", "message": f"rank {r}: {gloo}", "file": "t.py", "line": 3, "time": 1.0 + r}
        e["profile"]["run"].update(ended="failed", error=error)
        e.update(status="failed", error=error)
        entries.append(e)
    merged = merge_entries(entries)
    console = Console(file=io.StringIO(), width=100, color_system=None)
    render_diagnosis(merged, analyze(merged), console, details=True)  # the ranks' errors: what ran, in --details
    text = " ".join(console.file.getvalue().replace("│", " ").split())  # the panels' lines, joined back
    assert "ended failed: RuntimeError rank 0: [/__w/pytorch/third_party/gloo" in text
    assert "rank 1 failed: RuntimeError at t.py:3: rank 1: [/__w/pytorch/third_party/gloo" in text


def test_merge_profiles_refuses_a_rank_twice_and_fills_placeholders():
    a = merge_entries([_rank_profile(0, 0.01, 0.01)])
    b = merge_entries([_rank_profile(1, 0.01, 0.01)])
    both = merge_profiles([("a", a), ("b", b)])
    assert [e["rank"] for e in both.ranks] == [0, 1]
    assert merge_profiles([("b", b), ("a", a)]).to_dict() == both.to_dict()  # order does not matter
    with pytest.raises(GpuprofError, match="rank 0 is in both a and a2"):
        merge_profiles([("a", a), ("a2", a)])


def test_torchrun_args_pass_through_unchanged():
    argv = torchrun_args({"nproc_per_node": 8, "nnodes": "2", "node_rank": 1, "master_addr": "10.0.0.1",
                          "master_port": 29500, "rdzv_backend": None}, False, "/tmp/spec.json")
    assert argv == ["--nproc-per-node", "8", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                    "--master-port", "29500", "-m", "gpuprof.runners.rank", "/tmp/spec.json"]
    assert torchrun_args({"nproc_per_node": 2}, True, "s")[-4:] == ["--standalone", "-m", "gpuprof.runners.rank", "s"]


def test_cli_refuses_before_launching():
    runner = CliRunner()
    r = runner.invoke(app, ["diagnose", "--nnodes", "2", "train.py"])
    assert r.exit_code == 2 and "need --nproc-per-node" in r.output
    r = runner.invoke(app, ["diagnose", "--nproc-per-node", "3", "--grad-accum", "4", "--steps", "1"])
    assert r.exit_code == 2 and "not a multiple of the world size 3" in r.output
    r = runner.invoke(app, ["diagnose", "--nproc-per-node", "2", "no_such_script.py"])
    assert r.exit_code == 2 and "no such file" in r.output


def test_comm_meter_keeps_the_scripts_own_hook(tmp_path):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        ddp.register_comm_hook(None, allreduce_hook)  # the script's own (e.g. compression)
        ctx = types.SimpleNamespace(ddp=ddp, device="cpu", timer=None)
        with pytest.raises(RuntimeError, match="registered its own DDP comm hook"):
            CommMeter().start(ctx)
        # Without one, ours is registered and sees the round of a backward.
        ddp2 = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        meter = CommMeter()
        meter.start(types.SimpleNamespace(ddp=ddp2, device="cpu", timer=types.SimpleNamespace(step_index=1)))
        ddp2(torch.randn(2, 4)).sum().backward()
        sec = meter.stop(types.SimpleNamespace(profile=types.SimpleNamespace(steps=[types.SimpleNamespace(index=1)])))
        assert sec["rounds_per_step"] == 1 and sec["bytes_per_round"] == (16 + 4) * 4
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("version, links, expect_name, expect_gbs", [
    (6, 18, "NVLink 4.0, 18 links active", 450.0),  # H100/H200 SXM: NVML's enum 6 is NVLink 4.0
    (5, 12, "NVLink 3.1, 12 links active", 300.0),  # A100 SXM reports 5
    (6, 9, "NVLink 4.0, 9 links active", 225.0),  # half the links: half the bandwidth
    (0, 0, "PCIe Gen5 x16", 64.0),  # no NVLink (NotSupported): the PCIe link's maximum
])
def test_link_info_reads_nvml_enums(fake_cuda, version, links, expect_name, expect_gbs, monkeypatch):
    from fakes.nvml import FakeNvml

    from gpuprof.measure.comm import link_info

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    nvml = FakeNvml(uuids=[f"GPU-{u}" for u in fake_cuda.uuids], nvlinks=links, nvlink_version=version)
    info = link_info("cuda:0", 8, nvml=nvml)
    assert info["name"] == expect_name
    assert info["nominal_Bps"] == pytest.approx(expect_gbs * 1e9)
    assert nvml.refs == 0  # shut down again


def test_link_info_says_why_not_known(monkeypatch):
    from gpuprof.measure.comm import link_info

    assert link_info("cpu", 2)["nominal_Bps"] is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert link_info("cuda:0", 16)["name"] == "network between nodes"


@pytest.mark.adversarial
def test_bounds_check_the_distributed_figures():
    entries = [_rank_profile(0, data_s=0.01, exposed_s=0.09), _rank_profile(1, data_s=0.09, exposed_s=0.01)]
    merged = merge_entries(entries)
    analysis = analyze(merged)
    assert violations(merged, analysis) == []
    d = analysis.distributed  # frozen: an impossible analysis is made with replace()
    bad = replace(d, communication=replace(d.communication, exposed_s=0.05, in_flight_s=0.02),  # exposed > in flight
                  ranks=(replace(d.ranks[0], busy_s=5.0), *d.ranks[1:]))  # busier than its step
    analysis = replace(analysis, distributed=bad)
    merged.ranks[1]["profile"]["measurements"]["comm"]["per_step"][0]["exposed_s"] = -1.0
    found = violations(merged, analysis)
    assert any("exposed 0.05 s is more than the 0.02 s in flight" in v for v in found)
    assert any("rank 0: busy 5 s is outside 0..its step" in v for v in found)
    assert any(v.startswith("rank 1: measurements.comm.per_step[1]: negative") for v in found)


def test_link_info_of_a_mig_instance_says_why_and_asks_nothing_nvml_refuses(fake_cuda, monkeypatch):
    """NVML refuses link queries on a MIG handle (the strict fake too); MIG has no peer path."""
    from fakes.nvml import FakeNvml

    from gpuprof.measure.comm import link_info

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    mig = "MIG-" + fake_cuda.uuids[0]
    monkeypatch.setattr(fake_cuda, "uuids", [mig[4:]] + fake_cuda.uuids[1:])
    nvml = FakeNvml(uuids=["GPU-aaaa-1111"], migs=[mig], nvlinks=18, nvlink_version=6)
    info = link_info("cuda:0", 2, nvml=nvml)
    assert info["name"] == "a MIG instance" and info["nominal_Bps"] is None and "MIG" in info["why"]
    assert not nvml.calls.get("nvlink") and not nvml.calls.get("pcie_max")


# -- NCCL: the host runs ahead of the collectives (tests/fakes/nccl.py) ------------------------
def _nccl_backward(fake_cuda, nccl, monkeypatch, timer, meter):
    """One step of a DDP backward with two buckets on NCCL: 10 ms of gradients, bucket 0's
    all-reduce, 10 ms more, bucket 1's (the last); then the optimizer, which waits for both."""
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(dist, "all_reduce", nccl.all_reduce)
    monkeypatch.setattr(dist, "get_world_size", nccl.get_world_size)
    futures = []
    timer.start_step()
    timer.switch("backward")
    for last in (False, True):
        fake_cuda.enqueue(0.010)  # this bucket's gradients
        bucket = types.SimpleNamespace(buffer=lambda: torch.zeros(1000), is_last=lambda last=last: last)
        futures.append(meter.allreduce_hook(None, bucket))
    timer.switch("optimizer")
    for f in futures:  # DDP's finalize_backward: the stream waits for the collectives
        f.wait()
    fake_cuda.enqueue(0.001)
    timer.end_step()


def _stop(meter, timer, ended="finished"):
    steps = timer.steps(stopped=ended not in ("finished", "stopped"))
    ctx = types.SimpleNamespace(profile=types.SimpleNamespace(steps=steps, run={"ended": ended}))
    return meter.stop(ctx), steps


def test_nccl_rounds_read_from_events_while_the_host_ran_ahead(fake_cuda, monkeypatch):
    from fakes.nccl import FakeNccl

    from gpuprof.measure.timer import PhaseTimer

    nccl = FakeNccl(fake_cuda, world_size=2, seconds=0.004)
    timer = PhaseTimer.for_device("cuda:0", pool=32)
    meter = CommMeter(clock=CudaClock("cuda:0"))
    meter._registered, meter._world, meter._backend, meter._timer = True, 2, "nccl", timer
    _nccl_backward(fake_cuda, nccl, monkeypatch, timer, meter)
    assert fake_cuda.host_now == 0 and nccl.launched == 2  # nothing on the host waited
    sec, (step,) = _stop(meter, timer)
    # bucket 0: ready 10 ms, reduced 10-14; bucket 1: ready 20 ms, reduced 20-24 (after its grads)
    assert sec["in_flight_s"] == pytest.approx(0.008)
    assert sec["exposed_s"] == pytest.approx(0.004)  # last ready -> last done
    assert sec["rounds_per_step"] == 1 and sec["incomplete_rounds"] == 0 and sec["mark_errors"] == []
    assert step.gpu_phases["optimizer"] == pytest.approx(0.005)  # waits 4 ms for the reduce, then 1 ms
    assert fake_cuda.event_waits == 0


def test_nccl_peer_gone_neither_hangs_nor_loses_the_step(fake_cuda, monkeypatch):
    """Bucket 1's all-reduce never completes (its peer stopped): the optimizer waits forever on
    the GPU. Reading the run gives up within the bound: the step keeps its host times, the round
    is incomplete, and a fake CUDA raises WouldHang wherever CUDA would have hung."""
    from fakes.nccl import FakeNccl

    from gpuprof.measure.timer import NOT_FINISHED, PhaseTimer, STOPPED_GRACE_S

    nccl = FakeNccl(fake_cuda, world_size=2)
    timer = PhaseTimer.for_device("cuda:0", pool=32)
    meter = CommMeter(clock=CudaClock("cuda:0"))
    meter._registered, meter._world, meter._backend, meter._timer = True, 2, "nccl", timer
    monkeypatch.setattr(nccl, "all_reduce", _gone_after(nccl, 1))
    _nccl_backward(fake_cuda, nccl, monkeypatch, timer, meter)
    sec, (step,) = _stop(meter, timer, ended="failed")
    assert step.wall_s >= 0 and step.gpu_phases is None
    assert timer.gpu_report()["reasons"] == [NOT_FINISHED] and timer.gpu_unfinished
    assert sec["incomplete_rounds"] == 1 and sec["rounds_per_step"] == 0  # no complete round in the step
    assert STOPPED_GRACE_S <= fake_cuda.host_now < STOPPED_GRACE_S + 0.01  # one bounded wait, the meter's none


def _gone_after(nccl, n):
    real = nccl.all_reduce

    def all_reduce(tensor, group=None, async_op=False):
        nccl.peer_gone = nccl.launched >= n
        return real(tensor, group=group, async_op=async_op)

    return all_reduce


def test_one_rank_under_torchrun_still_measures_its_all_reduce(monkeypatch):
    """torchrun --nproc-per-node 1 sets WORLD_SIZE=1: the rank's DDP still all-reduces (across no
    link), and the GPU check on an H200 found such a run with no `comm` at all when the meter asked
    for WORLD_SIZE > 1. A single process that is not data-parallel gets no meter complaint."""
    from gpuprof.measure.instruments import default_instruments

    def meters():
        return [i for i in default_instruments("cpu", None, samplers=False, microbatch=False, flops=False,
                                               probe=False) if isinstance(i, CommMeter)]

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert meters() == []
    monkeypatch.setenv("WORLD_SIZE", "1")
    (meter,) = meters()
    meter.start(types.SimpleNamespace(ddp=None, model=None, device="cpu", timer=None))  # no DDP, one rank: quiet
    assert meter.stop(types.SimpleNamespace(profile=None)) is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="no DistributedDataParallel"):
        CommMeter().start(types.SimpleNamespace(ddp=None, model=None, device="cpu", timer=None))


def _straggler_and_data(data_saving_s: float):
    from gpuprof.analysis.findings import Finding
    from gpuprof.profile import StepRecord
    from gpuprof.stats import step_stats

    steps = [StepRecord(i, 0.100, {"data": 0.084, "forward": 0.006, "backward": 0.008, "other": 0.002},
                        tokens=64, micro_steps=4) for i in range(3)]
    straggler = Finding(id="straggler-rank", title="rank 1 is the straggler", saving_s=0.082, kind="fix",
                        claims={"data": 0.082}, evidence={"rank": 1, "noise_s": 0.001, "phase": "data"})
    data = Finding(id="data-loading-exposed", title="data", saving_s=data_saving_s, kind="fix",
                   claims={"data": min(data_saving_s, 0.084)})
    return step_stats(steps), [data, straggler]


@pytest.mark.parametrize("data_saving_s", [0.081, 0.082, 0.083, 0.086])
def test_the_straggler_goes_before_a_fix_of_the_same_seconds_whichever_saves_a_hair_more(data_saving_s):
    """The straggler's extra time is the slowest rank's data phase, which data-loading-exposed on the
    merged view (that rank's) claims too: one run in five of the same DDP script put data loading
    first with 82 ms and the straggler at 1 ms (benchmarks/ddp_straggler.py --repeat 5)."""
    from gpuprof.analysis.engine import rank

    stats, findings = _straggler_and_data(data_saving_s)
    ranked = [f for f in rank(findings, stats) if f.kind == "fix"]
    assert [f.id for f in ranked] == ["straggler-rank", "data-loading-exposed"]
    assert ranked[0].saving_s == pytest.approx(0.082)
    unpinned = max(data_saving_s - 0.084, 0.0)  # a saving beyond the phase's time is not capped
    assert ranked[1].saving_s == pytest.approx(0.084 - 0.082 + unpinned)  # what is left of the phase
    assert sum(f.saving_s for f in ranked) <= stats.step_s


def test_a_fix_that_saves_clearly_more_than_the_straggler_stays_first():
    """Every rank's data slow, one a little more: fixing the data path saves more than the straggler's
    extra (here 82 ms of data on a 100-ms step against a 20-ms straggler)."""
    from gpuprof.analysis.engine import rank
    from gpuprof.analysis.findings import Finding

    stats, (data, _) = _straggler_and_data(0.082)
    straggler = Finding(id="straggler-rank", title="rank 1", saving_s=0.020, kind="fix", claims={"data": 0.020},
                        evidence={"rank": 1, "noise_s": 0.001})
    ranked = [f for f in rank([straggler, data], stats) if f.kind == "fix"]
    assert [f.id for f in ranked] == ["data-loading-exposed", "straggler-rank"]
    assert ranked[0].saving_s == pytest.approx(0.082) and ranked[1].saving_s == pytest.approx(0.002)
