"""What attach does to stay out of the target's way, and how it states its cost (issue 45).

- gpuprof.attach.cost: the target's waits for a CPU (/proc schedstat) before sampling and while
  sampled; the clock and the sleep are injected, the readings real or given.
- gpuprof.attach.gentle: `gpuprof attach`'s main thread at nice 19 from its first import, py-spy
  and the quality probe started at the priority gpuprof was started with (checked in a child
  interpreter: a thread's niceness cannot be raised back by an unprivileged user).
- gpuprof.attach.process: the target's processes found from its own /proc files, not from every
  process on the host; the memory-mapped dataset found in /proc/PID/maps.

How much attach slows a target (≤ 1.05 in every run, goal ≤ 1.02) is a timing on a quiet
machine: benchmarks/attach_overhead.py, figures in docs/measurements/2026-12-07-attach-cost.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import psutil
import pytest

from gpuprof.attach import cost, gentle
from gpuprof.attach.process import descendants, mapped_and_open
from gpuprof.console import _attaches
from gpuprof.report.attach import cost_text

linux = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux /proc")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_rates_are_per_second_over_the_threads_in_both_readings():
    a = {1: (1_000_000_000, 100_000_000), 2: (0, 0), 3: (5, 5)}
    b = {1: (2_000_000_000, 300_000_000), 2: (500_000_000, 100_000_000), 4: (9, 9)}  # 3 ended, 4 new
    r = cost.rates(a, b, 2.0)
    assert r["threads"] == 2
    assert r["cpu_cores"] == pytest.approx(0.75)  # (1.0 + 0.5) s of CPU over 2 s
    assert r["wait_s_per_s"] == pytest.approx(0.15)  # (0.2 + 0.1) s waiting over 2 s
    assert cost.rates(None, b, 2.0) is None and cost.rates(a, b, 0) is None


def test_the_added_wait_is_during_less_before_never_below_zero(monkeypatch):
    clock = Clock()
    readings = iter([
        {7: (0, 0)}, {7: (1_000_000_000, 20_000_000)},  # before: 2 s, 10 ms waited per second
        {7: (2_000_000_000, 20_000_000)}, {7: (12_000_000_000, 520_000_000)},  # during: 10 s, 50 ms/s
    ])
    monkeypatch.setattr(cost, "read", lambda pid: next(readings))
    w = cost.CostWatch(123, clock=clock, sleep=clock.sleep)
    w.before(2.0)
    assert clock.t == 2.0  # the baseline is waited on the injected clock
    w.start()
    clock.sleep(10.0)
    out = w.stop()
    assert out["before"]["wait_s_per_s"] == pytest.approx(0.010)
    assert out["during"]["wait_s_per_s"] == pytest.approx(0.050)
    assert out["added_wait_s_per_s"] == pytest.approx(0.040)
    text = cost_text(out)
    assert "50 ms per second while sampled" in text and "10 ms per second in the 2 s before" in text
    assert "at most 4.0% of its time" in text

    quieter = iter([{7: (0, 0)}, {7: (0, 200_000_000)}, {7: (0, 0)}, {7: (0, 0)}])
    monkeypatch.setattr(cost, "read", lambda pid: next(quieter))
    w = cost.CostWatch(123, clock=clock, sleep=clock.sleep)
    w.before(2.0)
    w.start()
    clock.sleep(5.0)
    assert w.stop()["added_wait_s_per_s"] == 0.0  # the host got quieter: no negative cost


def test_an_unreadable_target_says_not_measured(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(cost, "read", lambda pid: None)
    w = cost.CostWatch(123, clock=clock, sleep=clock.sleep)
    w.before(2.0)
    w.start()
    out = w.stop()
    assert "added_wait_s_per_s" not in out and out["not_measured"]
    assert cost_text(out).startswith("attach's cost on the target not measured")
    assert cost_text(None) is None  # a profile from before the cost was measured


@linux
def test_schedstat_counts_a_busy_threads_cpu():
    done = threading.Event()

    def spin():
        x = 0
        while not done.is_set():
            x += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        # read once the spinner runs: rates() counts the threads in both readings, and a reading
        # taken before it started left only this thread's own reads to count (3.7 s to reach 50 ms
        # of CPU; under load it fell short in 200 tries, 2026-12-08)
        a = cost.read(os.getpid())
        assert t.native_id in a
        b = None
        for _ in range(200):  # until the spinner has run 50 ms of CPU (counted, not timed)
            b = cost.read(os.getpid())
            r = cost.rates(a, b, 1.0)
            if r and r["cpu_cores"] >= 0.05:
                break
            done.wait(0.01)
    finally:
        done.set()
        t.join()
    assert r["cpu_cores"] >= 0.05 and r["wait_s_per_s"] >= 0


def test_gpuprof_help_lists_every_verb_whatever_follows_it():
    r = subprocess.run([sys.executable, "-m", "gpuprof", "--help", "attach"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "diagnose" in r.stdout and "attach" in r.stdout and "bench-disk" in r.stdout


def test_only_the_attach_verb_is_gentle():
    assert _attaches(["attach", "123"]) and _attaches(["--no-color", "attach", "1"])
    assert _attaches(["attach", "123", "--duration", "5"])
    assert not _attaches(["diagnose", "train.py", "attach"])
    assert not _attaches(["watch", "--pid", "123"])
    assert not _attaches([])


@linux
def test_gentle_lowers_the_main_thread_and_starts_children_at_the_first_priority():
    code = textwrap.dedent("""
        import os, subprocess, sys, threading
        tid = lambda: threading.get_native_id()
        first = os.getpriority(os.PRIO_PROCESS, tid())
        from gpuprof.attach.gentle import at_start_priority, be_gentle, gentle, GENTLE_NICE
        assert not gentle() and at_start_priority(lambda: 5) == 5  # not gentle: runs here
        assert be_gentle(idle=1.0) and gentle() and be_gentle()  # a second call changes nothing
        main = os.getpriority(os.PRIO_PROCESS, tid())
        launcher = at_start_priority(lambda: os.getpriority(os.PRIO_PROCESS, tid()))
        child = at_start_priority(lambda: subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
            capture_output=True, text=True).stdout.strip())
        plain = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                               capture_output=True, text=True).stdout.strip()
        try:
            at_start_priority(lambda: 1 / 0)
        except ZeroDivisionError:
            raised = True
        print(first, main, launcher, child, plain, raised, GENTLE_NICE)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    first, main, launcher, child, plain, raised, nice = r.stdout.split()
    assert int(main) == max(int(first), int(nice))  # gpuprof's own work: the lowest priority
    assert int(launcher) == int(child) == int(first)  # py-spy: the priority gpuprof started with
    assert int(plain) == int(main)  # what the main thread starts inherits its niceness
    assert raised == "True"  # an error in the launcher reaches the caller


def test_the_hosts_idle_cores_come_from_two_readings_of_proc_stat(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    readings = iter([(1000, 4000), (1090, 4120)])  # 90 of 120 ticks idle: 3 of 4 cores
    slept = []
    assert gentle.idle_cores(0.3, sleep=slept.append, read=lambda: next(readings)) == pytest.approx(3.0)
    assert slept == [0.3]
    assert gentle.idle_cores(0.3, sleep=slept.append, read=lambda: None) is None


def test_proc_stat_is_read_as_the_kernel_writes_it(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 20 3 2 10 7 0\ncpu0 50 2 25 400 10 1 1 5 3 0\n")
    assert gentle._cpu_jiffies(str(stat)) == (820, 990)  # idle + iowait; guest already inside user
    stat.write_text("garbage\n")
    assert gentle._cpu_jiffies(str(stat)) is None
    assert gentle._cpu_jiffies(str(tmp_path / "missing")) is None


@linux
def test_a_host_with_no_idle_core_keeps_gpuprofs_priority(monkeypatch):
    """At the lowest priority on a host the target fills, a 5 s attach took 68 s (measured): gpuprof
    keeps its priority there, and says so in the cost row."""
    monkeypatch.setattr(gentle, "_choice", None)
    monkeypatch.setattr(gentle, "_launcher", None)
    nice0 = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "getpriority") else None
    assert gentle.be_gentle(idle=0.05) is False
    assert not gentle.gentle()
    if nice0 is not None:
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == nice0  # unchanged
    got = gentle.choice()
    assert got["gentle"] is False and got["idle_cores"] == 0.05
    c = {"before": {"seconds": 2.0, "wait_s_per_s": 0.01}, "during": {"wait_s_per_s": 0.05},
         "added_wait_s_per_s": 0.04, "gpuprof_priority": got}
    assert "gpuprof kept its priority: the host had 0.05 idle cores" in cost_text(c)
    c["gpuprof_priority"] = {"gentle": True, "idle_cores": 1.3, "nice": 19}
    assert cost_text(c).endswith("gpuprof's own work ran at the lowest priority, on idle CPU")


@linux
def test_descendants_are_read_from_the_targets_own_proc_files(monkeypatch):
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        p = psutil.Process(parent.pid)
        for _ in range(500):  # until the grandchild exists
            if len(p.children(recursive=True)) == 1:
                break
            threading.Event().wait(0.02)
        truth = sorted(c.pid for c in p.children(recursive=True))
        assert len(truth) == 1
        assert sorted(c.pid for c in descendants(p)) == truth
        me = psutil.Process()
        assert parent.pid in [c.pid for c in descendants(me)] and truth[0] in [c.pid for c in descendants(me)]
        # never a scan of every process on the host where /proc/PID/task/*/children exists
        monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: pytest.fail("scanned"))
        assert sorted(c.pid for c in descendants(p)) == truth
    finally:
        monkeypatch.undo()
        for c in psutil.Process(parent.pid).children(recursive=True):
            c.kill()
        parent.kill()
        parent.wait()


@linux
def test_a_memory_mapped_dataset_is_found_with_its_exact_path(tmp_path):
    path = tmp_path / "train data.bin"  # a space in the name: the path is the rest of the line
    np.arange(1 << 16, dtype=np.uint16).tofile(path)
    data = np.memmap(path, dtype=np.uint16, mode="r")
    try:
        found = mapped_and_open(os.getpid())
        assert str(path) in found
        assert not any(p.endswith(" (deleted)") or p != p.strip() for p in found)
    finally:
        del data
    assert str(path) not in mapped_and_open(os.getpid())  # a dropped memmap is gone from maps
    assert mapped_and_open(2 ** 22 + 12345) == set()  # no such process: nothing, no error
