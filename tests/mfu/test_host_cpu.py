"""The host sampler's CPU figures: merged short intervals, bounds that are never exceeded (a sample
that would is dropped and counted), this run's own CPU (this process and its child processes) and
the other processes' share. Driven by a fake psutil on a fake clock, then two real runs with a
busy-loop process beside an idle main thread (counted samples, figures compared with the busy
process's own counters over the same time: nothing depends on the machine's speed)."""

import os
import random
import signal
import subprocess
import sys
import time
import types
from collections import namedtuple

import pytest
from mfu.fake_time import FakeTime, wait_until

from gpuprof.analysis.findings import Context
from gpuprof.analysis.rules import machine
from gpuprof.measure.host import HostSampler
from gpuprof.measure.sampling import _SamplerThread
from gpuprof.measure.timer import PhaseTimer
from gpuprof.profile import Profile, StepRecord

CoreTimes = namedtuple("scputimes", "user nice system idle iowait irq softirq steal guest guest_nice")
ProcTimes = namedtuple("pcputimes", "user system children_user children_system")
DiskIO = namedtuple("sdiskio", "read_bytes busy_time")
PID = 4_000_000  # not a real pid: nothing reads the real /proc for it but the fault counter


class FakePsutil:
    """psutil as HostSampler uses it, over counters the test moves with `advance`.

    Process CPU counters are truncated to 10 ms clock ticks like /proc's (`ticks=True`), which is
    what turns a 1 ms interval into a 1000% reading."""

    class NoSuchProcess(Exception):
        pass

    def __init__(self, cores: int = 2, ticks: bool = True):
        self.t_ns = 0
        self.ticks = ticks
        self.core = [[0.0, 0.0, 0.0] for _ in range(cores)]  # busy, idle, iowait seconds
        self.procs = {PID: {"cpu": 0.0, "reaped": 0.0, "ppid": None}}
        self.limbo: dict[int, tuple[int, float]] = {}  # exited, not yet reaped: pid -> (ppid, cpu)

    # the clock and the counters
    def clock(self) -> int:
        return self.t_ns

    def advance(self, dt_s: float, own: dict | None = None, others: float = 0.0) -> None:
        """dt_s seconds pass; each pid in `own` uses that many cores, other processes `others`."""
        own = own or {}
        busy = sum(own.values()) + others
        assert busy <= len(self.core) + 1e-9
        for c in self.core:
            frac = min(1.0, busy)
            c[0] += frac * dt_s
            c[1] += (1 - frac) * dt_s
            busy -= frac
        for pid, cores in own.items():
            self.procs[pid]["cpu"] += cores * dt_s
        self.t_ns += int(round(dt_s * 1e9))

    def spawn(self, pid: int, ppid: int = PID) -> None:
        self.procs[pid] = {"cpu": 0.0, "reaped": 0.0, "ppid": ppid}

    def exit(self, pid: int) -> None:
        p = self.procs.pop(pid)
        self.limbo[pid] = (p["ppid"], p["cpu"] + p["reaped"])

    def reap(self, pid: int) -> None:
        ppid, cpu = self.limbo.pop(pid)
        self.procs[ppid]["reaped"] += cpu

    def _q(self, s: float) -> float:
        return int(s * 100 + 1e-9) / 100 if self.ticks else s

    # the psutil API
    def Process(self, pid):  # noqa: N802 - psutil's name
        if pid not in self.procs:
            raise self.NoSuchProcess(pid)
        return _FakeProc(self, pid)

    def cpu_times(self, percpu=False):
        assert percpu
        return [CoreTimes(self._q(b), 0.0, 0.0, self._q(i), self._q(w), 0.0, 0.0, 0.0, 0.0, 0.0)
                for b, i, w in self.core]

    def disk_io_counters(self, perdisk=False):
        return {"vda": DiskIO(0, 0)}


class _FakeProc:
    def __init__(self, ps: FakePsutil, pid: int):
        self.ps, self.pid = ps, pid

    def _st(self):
        if self.pid not in self.ps.procs:
            raise FakePsutil.NoSuchProcess(self.pid)
        return self.ps.procs[self.pid]

    def cpu_times(self):
        st = self._st()
        return ProcTimes(self.ps._q(st["cpu"]), 0.0, self.ps._q(st["reaped"]), 0.0)

    def memory_info(self):
        return types.SimpleNamespace(rss=100 << 20)

    def io_counters(self):
        return types.SimpleNamespace(read_bytes=0, read_chars=0)

    def children(self, recursive=False):
        out, queue = [], [self.pid]
        while queue:
            parent = queue.pop(0)
            for pid, st in list(self.ps.procs.items()):
                if st["ppid"] == parent:
                    out.append(_FakeProc(self.ps, pid))
                    queue.append(pid)
        return out


def _sampler(fake: FakePsutil, interval_s: float = 0.1) -> tuple[HostSampler, types.SimpleNamespace]:
    """A started HostSampler on the fake and its clock, without a thread: the test takes the samples."""
    smp = HostSampler(interval_s=interval_s, psutil_mod=fake, pid=PID, clock=fake.clock, threaded=False)
    ctx = types.SimpleNamespace(device="cpu", timer=PhaseTimer(clock=fake.clock), profile=None, config={})
    smp.start(ctx)
    return smp, ctx


def _tick(smp: HostSampler, fake: FakePsutil) -> None:
    smp.sample_now()


def _own(smp: HostSampler) -> list[float]:
    return [v["own_cpu_cores"] for _, v in smp._samples]


# ------------------------------------------------------------------ short intervals, bounds
def test_a_1ms_interval_is_merged_into_the_next_sample_not_read_as_1000_percent():
    fake = FakePsutil(cores=2)
    fake.procs[PID]["cpu"] = 0.0095  # the next 10 ms clock tick is 0.5 ms of CPU away
    smp, ctx = _sampler(fake)
    fake.advance(0.001, own={PID: 1.0})  # 1 ms: the process counter jumps a whole tick (10 ms)
    _tick(smp, fake)
    assert smp._samples == [] and smp.merged_short == 1  # 10 ms / 1 ms would have read 1000%
    fake.advance(0.100, own={PID: 1.0})
    _tick(smp, fake)
    (own,) = _own(smp)
    assert own == pytest.approx(1.0, abs=0.1)  # one sample over the 101 ms
    out = smp.stop(ctx)
    assert out["samples"] == 1 and out["merged_short"] == 1 and out["dropped"] == {}
    assert out["summary"]["proc_cpu_pct"]["max"] <= 200.0
    assert out["summary"]["cpu_pct_max_core"]["max"] <= 100.0


def test_a_reading_beyond_the_cores_is_dropped_and_counted_and_the_next_is_clean():
    fake = FakePsutil(cores=2)
    smp, ctx = _sampler(fake)
    fake.advance(0.1, own={PID: 1.0})
    _tick(smp, fake)
    fake.procs[PID]["cpu"] += 1.0  # 1 s of CPU in a 100 ms interval: 11 cores on a 2-core machine
    fake.advance(0.1, own={PID: 1.0})
    _tick(smp, fake)
    fake.advance(0.1, own={PID: 1.0})
    _tick(smp, fake)
    out = smp.stop(ctx)
    assert out["dropped"] == {"own_cpu_above_cores": 1} and out["samples"] == 2
    assert _own(smp) == [pytest.approx(1.0, abs=0.1)] * 2  # nothing of the jump is carried on
    assert out["summary"]["own_cpu_cores"]["max"] <= 2.0


def test_a_core_counter_going_backwards_drops_the_sample():
    fake = FakePsutil(cores=2)
    smp, ctx = _sampler(fake)
    fake.advance(0.1, own={PID: 0.5})
    _tick(smp, fake)
    fake.core[1][1] -= 0.5  # idle time going backwards (seen on some VMs): busy > 100% of that core
    fake.advance(0.1, own={PID: 0.5})
    _tick(smp, fake)
    out = smp.stop(ctx)
    assert out["dropped"] == {"core_busy_out_of_range": 1} and out["samples"] == 1
    assert out["summary"]["cpu_pct_max_core"]["max"] <= 100.0


def test_tick_truncation_is_carried_to_the_next_sample_never_above_the_cores_nor_lost():
    # A process and its worker saturate 2 cores; 10 ms ticks over 60-140 ms intervals make single
    # readings swing above 2 cores. They are reported at 2 and the excess carried, so no sample is
    # dropped and the CPU seconds add up.
    rng = random.Random(11)
    fake = FakePsutil(cores=2)
    fake.spawn(PID + 1)
    smp, ctx = _sampler(fake)
    dts = []
    for _ in range(40):
        dt = rng.uniform(0.06, 0.14)
        fake.advance(dt, own={PID: 1.0, PID + 1: 1.0})
        _tick(smp, fake)
        dts.append(dt)
    out = smp.stop(ctx)
    own = _own(smp)
    assert out["dropped"] == {} and len(own) == 40
    assert max(own) <= 2.0 and out["own_cpu_carried"] >= 1
    counted = sum(o * dt for o, dt in zip(own, dts))
    assert counted == pytest.approx(2.0 * sum(dts), abs=0.06)  # what is still carried: a few ticks
    assert out["summary"]["children_cpu_cores"]["mean"] == pytest.approx(1.0, abs=0.1)
    assert out["descendants_max"] == 1


# ------------------------------------------------------------------ own vs others
def test_own_is_this_process_and_its_workers_others_the_rest_of_the_machine():
    fake = FakePsutil(cores=2, ticks=False)
    fake.spawn(PID + 1)  # a DataLoader worker
    fake.spawn(PID + 2, ppid=PID + 1)  # and a process it started
    smp, ctx = _sampler(fake)
    fake.advance(0.1, own={PID: 0.5, PID + 1: 0.5, PID + 2: 0.2}, others=0.6)
    _tick(smp, fake)
    (_, v), = smp._samples
    assert v["cpu_busy_cores"] == pytest.approx(1.8)
    assert v["own_cpu_cores"] == pytest.approx(1.2) and v["proc_cpu_pct"] == pytest.approx(50.0)
    assert v["children_cpu_cores"] == pytest.approx(0.7)
    assert v["others_cpu_cores"] == pytest.approx(0.6)
    assert v["cpu_pct"] == pytest.approx(90.0) and v["cpu_pct_max_core"] == pytest.approx(100.0)


def test_a_worker_that_exits_between_reads_is_counted_once():
    fake = FakePsutil(cores=2, ticks=False)
    fake.spawn(PID + 1)
    smp, ctx = _sampler(fake)
    fake.advance(0.1, own={PID: 0.5, PID + 1: 1.0})
    _tick(smp, fake)
    fake.advance(0.1, own={PID: 0.5, PID + 1: 1.0})
    fake.exit(PID + 1)  # gone from the process table, not yet in its parent's reaped times
    _tick(smp, fake)
    fake.reap(PID + 1)  # now its whole CPU time is in the parent's children_user
    fake.advance(0.1, own={PID: 0.5})
    _tick(smp, fake)
    fake.advance(0.1, own={PID: 0.5})
    _tick(smp, fake)
    own = _own(smp)
    # The exit interval's worker time shows one sample late; it is never lost nor counted twice.
    assert own == [pytest.approx(1.5), pytest.approx(0.5), pytest.approx(1.5), pytest.approx(0.5)]
    assert sum(own) * 0.1 == pytest.approx(0.4 * 0.5 + 0.2 * 1.0)


def test_others_holding_the_cores_end_to_end_names_them_with_their_share():
    # The situation of issue 11: another process busy on a 2-core machine, this run at ~25% of it.
    fake = FakePsutil(cores=2)
    smp, ctx = _sampler(fake)
    for _ in range(30):
        fake.advance(0.1, own={PID: 0.5}, others=1.4)
        _tick(smp, fake)
    host = smp.stop(ctx)
    assert host["summary"]["others_cpu_cores"]["mean"] == pytest.approx(1.4, abs=0.03)
    steps = [StepRecord(i, 1.0, {"forward": 0.4, "backward": 0.6}, tokens=4096, micro_steps=1) for i in range(3)]
    prof = Profile(run={"mode": "builtin", "config": {"device": "cpu"}}, steps=steps,
                   environment={"device": "cpu"}, measurements={"host": host})
    (f,) = machine.cpu_saturated(Context(profile=prof, stats=prof.stats))
    assert "other processes held 1.4 of 2 cores (70%)" in f.title and "this run used 0.5" in f.title
    assert "model's compute" not in f.fix and "free the cores" in f.fix
    assert f.evidence["others_share"] == pytest.approx(0.70, abs=0.02)


def test_the_host_table_shows_this_run_and_others_in_cores_and_what_was_merged_or_dropped():
    from rich.console import Console

    from gpuprof.render.mfu import samplers_panel

    fake = FakePsutil(cores=2)
    smp, ctx = _sampler(fake)
    fake.advance(0.001, own={PID: 0.5}, others=1.4)
    _tick(smp, fake)
    for _ in range(5):
        fake.advance(0.1, own={PID: 0.5}, others=1.4)
        _tick(smp, fake)
    fake.procs[PID]["cpu"] += 1.0
    fake.advance(0.1, own={PID: 0.5}, others=1.4)
    _tick(smp, fake)
    c = Console(width=200, record=True, color_system=None)
    c.print(samplers_panel({"host": smp.stop(ctx)}))
    out = c.export_text()
    for s in ("this run", "others", "0.50", "1.40", "1 short intervals merged into the next",
              "dropped 1 (own cpu above cores)", "cores of 2"):
        assert s in out, s


# ------------------------------------------------------------------ the sampling thread
def test_a_rate_sampler_first_ticks_one_interval_after_start():
    ticks = []
    clock = FakeTime(until_s=0.2)
    th = _SamplerThread(0.05, ticks.append, clock.ns, first_after_interval=True, wait=clock.wait,
                        threaded=False)
    th.start(PhaseTimer(clock=clock.ns))
    th.run()
    assert ticks == [50_000_000, 100_000_000, 150_000_000]  # on the timer's clock: not at once
    # Stopped before its first interval ends: no tick at all.
    ticks.clear()
    clock = FakeTime(until_s=0.01)
    th = _SamplerThread(0.05, ticks.append, clock.ns, first_after_interval=True, wait=clock.wait,
                        threaded=False)
    th.start(PhaseTimer(clock=clock.ns))
    th.run()
    assert ticks == [] and clock.waits == [0.05]


def test_the_host_sampler_first_sample_covers_its_first_interval():
    # The real loop on a fake clock and the fake psutil: samples at 100, 200, 300 ms, each a rate
    # over the interval before it, drawn at its middle.
    fake = FakePsutil(cores=2, ticks=False)

    def wait(seconds):
        fake.advance(seconds, own={PID: 0.5}, others=0.25)
        return fake.t_ns >= 300_000_000

    smp = HostSampler(interval_s=0.1, psutil_mod=fake, pid=PID, clock=fake.clock, wait=wait, threaded=False)
    ctx = types.SimpleNamespace(device="cpu", timer=PhaseTimer(clock=fake.clock), profile=None, config={})
    smp.start(ctx)
    smp._thread.run()
    out = smp.stop(ctx)
    assert out["samples"] == out["ticks"] == 2 and out["merged_short"] == 0 and out["late_ticks"] == 0
    assert out["timeline"]["t_s"] == [0.05, 0.15]  # the stop (the wait reaching 300 ms) ends it
    assert out["timeline"]["own_cpu_cores"] == [pytest.approx(0.5)] * 2
    assert out["timeline"]["others_cpu_cores"] == [pytest.approx(0.25)] * 2


# ------------------------------------------------------------------ real processes
_SPIN = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def _spin_elsewhere(seconds: float) -> int:
    """A Python spin loop that is not this process's descendant: its parent exits at once, so it is
    reparented, like any other process on the machine. Returns its pid. (Its output goes to
    /dev/null: holding the captured pipe would keep run() waiting until it ends.)"""
    code = ("import subprocess as s, sys; p = s.Popen([sys.executable, '-c', %r], stdin=s.DEVNULL, "
            "stdout=s.DEVNULL, stderr=s.DEVNULL); print(p.pid)" % _SPIN.format(s=seconds))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    return int(out.stdout.split()[0])


def _spinning(pid: int) -> None:
    """Wait until process `pid` has used 0.1 s of CPU: its interpreter has started and is busy
    (counted on its own CPU clock, not guessed as a wall-clock delay)."""
    import psutil

    proc = psutil.Process(pid)

    def cpu():
        t = proc.cpu_times()
        return t.user + t.system

    assert wait_until(lambda: cpu() >= 0.1, timeout_s=60), f"process {pid} did not start spinning in 60 s"


def _sample_idle(samples: int, beside: int) -> tuple[dict, float]:
    """The real HostSampler over an idle main thread until it has `samples` samples, and the cores
    that process `beside` used meanwhile, read from its own counters (the reference: on a loaded
    2-core machine a spin loop gets anywhere from a third of a core to a whole one)."""
    import psutil

    ref = psutil.Process(beside)
    c0, t0 = ref.cpu_times(), time.perf_counter()
    smp = HostSampler(interval_s=0.05)
    ctx = types.SimpleNamespace(device="cpu", timer=PhaseTimer(), profile=None, config={})
    smp.start(ctx)
    assert wait_until(lambda: smp.sample_count >= samples, poll_s=0.01), f"fewer than {samples} samples in 60 s"
    out = smp.stop(ctx)
    c1, t1 = ref.cpu_times(), time.perf_counter()
    return out, (c1.user + c1.system - c0.user - c0.system) / (t1 - t0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reparenting and /proc children: Linux")
def test_real_busy_process_elsewhere_is_measured_as_others_not_this_run():
    pid = _spin_elsewhere(60.0)  # killed when done; 60 s only bounds a leak
    try:
        _spinning(pid)
        out, spin = _sample_idle(20, beside=pid)
    finally:
        _kill(pid)
    s = out["summary"]
    others, own = s["others_cpu_cores"]["mean"], s["own_cpu_cores"]["mean"]
    assert spin >= 0.15, f"the spin loop got {spin:.2f} cores: the machine is too loaded to tell"
    # Others hold at least the spin loop's share (10 ms ticks, windows a few ms apart: 20% slack).
    assert others >= 0.8 * spin, (others, spin)
    # This process only sleeps and samples: its CPU is the sampler thread's own cost (whatever a
    # sample costs on this CPU), far below the others'.
    sampler = out["cost"]["share_of_one_core"]
    assert own == pytest.approx(sampler, abs=0.05), (own, sampler)
    assert others >= 3 * (own - sampler) and others > own, (own, sampler, others)
    assert out["descendants_max"] == 0
    assert s["own_cpu_cores"]["max"] <= out["cpu_count"] and s["cpu_pct_max_core"]["max"] <= 100.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc children: Linux")
def test_real_busy_child_process_is_this_runs_own_cpu():
    child = subprocess.Popen([sys.executable, "-c", _SPIN.format(s=60.0)])  # terminated when done
    try:
        _spinning(child.pid)
        out, spin = _sample_idle(20, beside=child.pid)
    finally:
        child.terminate()
        child.wait(timeout=10)
    s = out["summary"]
    assert out["descendants_max"] >= 1
    assert s["children_cpu_cores"]["mean"] == pytest.approx(spin, rel=0.2, abs=0.03), (s["children_cpu_cores"], spin)
    assert s["own_cpu_cores"]["mean"] >= s["children_cpu_cores"]["mean"]
    assert s["own_cpu_cores"]["max"] <= out["cpu_count"]
