"""No data-parallel launch takes the machine down or outlives gpuprof: more ranks than the node
can run are refused up front with the numbers (exit 2, nothing started), every rank dies with
gpuprof (SIGTERM or SIGKILL), and gpuprof's temporary folders do not pile up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from gpuprof.errors import GpuprofError
from gpuprof.runners import launch

from ddp_helpers import DDP_SCRIPT, gpuprof_here


def _no_torchelastic_folders_added(before: set) -> list:
    return sorted(set(n for n in os.listdir(tempfile.gettempdir()) if n.startswith("torchelastic_")) - before)


def _torchelastic() -> set:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("torchelastic_")}


def test_more_ranks_than_cores_is_refused_before_anything_starts(data_dir):
    before = _torchelastic()
    # in this process: the refusal comes before torchrun or any rank starts (a process of its own
    # only added a Python and torch start-up)
    r = gpuprof_here("diagnose", "--nproc-per-node", "1000", DDP_SCRIPT, f"--data_dir={data_dir}")
    cores = len(os.sched_getaffinity(0))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"gpuprof: error: --nproc-per-node 1000: this machine has {cores} CPU core(s) for gpuprof, and a "
        f"CPU rank computes on at least one; more ranks than cores only wait on each other; use at most {cores}"]
    assert "launching" not in r.stderr
    assert _no_torchelastic_folders_added(before) == []  # torchrun's option check makes none either


def test_capacity_counts_gpus_cores_and_memory(monkeypatch, fake_cuda):
    import torch

    assert torch.cuda.device_count() == 1
    with pytest.raises(GpuprofError, match=r"--nproc-per-node 2: this node has 1 visible CUDA GPU\(s\), "
                                           r"and each NCCL rank needs a GPU of its own; use at most 1"):
        launch.check_capacity(2, cuda=True)
    launch.check_capacity(1, cuda=True)
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    with pytest.raises(GpuprofError, match="has 4 CPU core"):
        launch.check_capacity(5, cuda=False)
    rss = psutil.Process().memory_info().rss
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("vm", (), {"available": 3 * (rss + 2**30)})())
    launch.check_capacity(3, cuda=False, rank_bytes=2**30, rank_bytes_source="for the model")
    with pytest.raises(GpuprofError) as exc:
        launch.check_capacity(4, cuda=False, rank_bytes=2**30, rank_bytes_source="for the model")
    assert "4 ranks need at least" in str(exc.value) and "+ 1.00 GiB for the model" in str(exc.value)
    assert str(exc.value).endswith("use at most 3")


def test_a_rank_dies_with_its_launcher_even_when_the_launcher_is_killed(tmp_path):
    """The mechanism each rank uses: prctl(PR_SET_PDEATHSIG) asked in the child, then the parent
    is SIGKILLed (nothing of it runs), and the kernel kills the child."""
    child_pid = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import os, subprocess, sys, time
c = subprocess.Popen([sys.executable, "-c", '''
import os, time
from gpuprof.runners.rank import die_with_launcher
assert die_with_launcher({{os.getpid()}})
open({str(child_pid)!r}, "w").write(str(os.getpid()))
time.sleep(120)
'''.replace("{{os.getpid()}}", str(os.getpid()))], start_new_session=True)
time.sleep(120)
"""])
    try:
        for _ in range(200):
            if child_pid.exists() and child_pid.read_text():
                break
            time.sleep(0.05)
        pid = int(child_pid.read_text())
        assert psutil.pid_exists(pid)
        parent.kill()
        parent.wait(10)
        psutil.wait_procs([psutil.Process(pid)], timeout=10)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        parent.kill()


def test_an_orphaned_rank_exits_at_once():
    r = subprocess.run([sys.executable, "-c", "from gpuprof.runners.rank import die_with_launcher\n"
                        "die_with_launcher(1)\nprint('still here')"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "still here" not in r.stdout  # its parent is not pid 1: gone


def test_stale_rank_folders_of_dead_gpuprofs_are_swept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"gpuprof-ranks-{dead.pid}-abc"
    live = tmp_path / f"gpuprof-ranks-{os.getpid()}-def"
    other = tmp_path / "gpuprof-ranks-notapid"
    for d in (stale, live, other):
        d.mkdir()
        (d / "rank0.json").write_text("{}")
    assert launch.sweep_stale_folders(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and other.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_rank_outlives_gpuprof(tmp_path, data_dir, sig, one_many_process_test):
    # one launch at a time (tests/cpu_lock.py): a torchrun started beside it by another test (attach's
    # plain torchrun launcher) makes a torchelastic_* folder of its own that this test would count
    cmd = [sys.executable, "-m", "gpuprof", "diagnose", "--nproc-per-node", "2", "--steps", "500",
           "--warmup", "1", "--post-budget", "0", "--out", str(tmp_path / "p.json"), DDP_SCRIPT,
           f"--data_dir={data_dir}", "--max_iters=1000"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    ranks, before = [], _torchelastic()
    try:
        for line in p.stdout:  # rank 0 prints an iter line per step: both ranks are running
            if line.startswith("iter 2:"):
                break
        ranks = [c for c in psutil.Process(p.pid).children(recursive=True)
                 if "gpuprof.runners.rank" in " ".join(c.cmdline())]
        assert len(ranks) == 2
        p.send_signal(sig)
        p.wait(60)
        gone, alive = psutil.wait_procs(ranks, timeout=30)
        assert not alive, [r.pid for r in alive]
    finally:
        for r in ranks:
            if r.is_running():
                r.kill()
        if p.poll() is None:
            p.kill()
    folder = f"gpuprof-ranks-{p.pid}-"
    left = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(folder)]
    if sig == signal.SIGTERM:
        assert left == [] and p.returncode == 130
        assert _no_torchelastic_folders_added(before) == []
    else:  # SIGKILL: nothing of gpuprof ran; the next launch sweeps its folder
        assert p.returncode == -signal.SIGKILL
        launch.sweep_stale_folders()
        assert [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(folder)] == []


def test_ranks_get_the_nccl_settings_that_keep_their_entries(monkeypatch):
    """NCCL's default under torchrun (TearDown) SIGABRTs a rank whose collective timed out before
    it can write its entry; CleanUpOnly lets it raise in Python. A value the user set is kept."""
    monkeypatch.setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")  # the user's own
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    monkeypatch.delenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", raising=False)
    with launch.rank_env() as added:
        assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
        assert os.environ["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] == "250"
        assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
        assert sorted(added) == ["TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"]
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ
    assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
