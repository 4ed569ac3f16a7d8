"""What the machine does during the run: an NVML sampler (the GPU) and a host sampler (psutil).

Each is an Instrument: start(ctx) starts a daemon thread that samples every `interval_s`;
stop(ctx) joins it and summarises the samples overall and per phase. Sample timestamps are on
the PhaseTimer's clock (nanoseconds since its origin), so a sample is attributed to the phase
span that contains it: a statistical picture (100 ms samples over millisecond phases), exact in
aggregate over many steps. The threads never raise: a field that cannot be read is counted and
reported, and the run goes on. Each sampler reports its own sample count, late ticks and cost
(CPU time of its thread).
"""

from __future__ import annotations

import bisect
import os
import statistics
import threading
import time
from typing import Callable, Mapping

# NVML clock-event ("throttle") reason bits, nvml.h: nvmlClocksEventReason*.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
TIMELINE_MAX_POINTS = 2000  # per sampler; longer runs are decimated in the stored timeline


# ----------------------------------------------------------------------------------- helpers
def decode_throttle(mask: int) -> list[str]:
    """Names of the clock-event reason bits set in an NVML mask."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def stats(values: list[float]) -> dict | None:
    """mean / min / max / p50 / p90 of the values that were read (None when none were)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "min": xs[0], "max": xs[-1],
            "p50": xs[len(xs) // 2], "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))], "n": len(xs)}


class PhaseLookup:
    """Which phase a timer-relative nanosecond timestamp falls in.

    Measured steps' spans give their labels; a timestamp inside a warmup step is 'warmup';
    anything else (setup, between steps, after the loop) is 'outside'."""

    def __init__(self, spans: list[tuple[int, int, str]], measured: list[tuple[int, int]] | None = None,
                 warmup: list[tuple[int, int]] | None = None):
        self.spans = sorted(spans)
        self.starts = [s[0] for s in self.spans]
        self.measured = sorted(measured) if measured is not None else None
        self.warmup = sorted(warmup or [])
        self._m_starts = [w[0] for w in self.measured or []]
        self._w_starts = [w[0] for w in self.warmup]

    @staticmethod
    def _inside(windows, starts, t) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and windows[i][0] <= t < windows[i][1]

    def phase(self, t_ns: int) -> str:
        if self.measured is not None and not self._inside(self.measured, self._m_starts, t_ns):
            return "warmup" if self._inside(self.warmup, self._w_starts, t_ns) else "outside"
        i = bisect.bisect_right(self.starts, t_ns) - 1
        if i >= 0 and self.spans[i][0] <= t_ns < self.spans[i][1]:
            return self.spans[i][2]
        return "outside"

    @classmethod
    def from_ctx(cls, ctx) -> "PhaseLookup":
        spans = list(getattr(ctx.timer, "spans", []) or [])
        prof = getattr(ctx, "profile", None)
        if prof is None or not prof.steps:
            return cls(spans)

        def win(steps):
            return [(int(s.start_s * 1e9), int((s.start_s + s.wall_s) * 1e9)) for s in steps]

        return cls(spans, win(prof.steps), win(prof.warmup_steps))


def per_phase(samples: list[tuple[int, dict]], lookup: PhaseLookup, keys: list[str]) -> dict:
    """{phase: {"samples": n, key: mean, ...}} from (t_ns, values) samples."""
    groups: dict[str, list[dict]] = {}
    for t, vals in samples:
        groups.setdefault(lookup.phase(t), []).append(vals)
    out = {}
    for ph, rows in groups.items():
        entry: dict = {"samples": len(rows)}
        for k in keys:
            xs = [r[k] for r in rows if r.get(k) is not None]
            entry[k] = statistics.fmean(xs) if xs else None
        out[ph] = entry
    return out


def _timeline(samples: list[tuple[int, dict]], keys: list[str]) -> dict:
    step = max(1, -(-len(samples) // TIMELINE_MAX_POINTS))
    pick = samples[::step]
    tl = {"t_s": [round(t / 1e9, 4) for t, _ in pick]}
    for k in keys:
        tl[k] = [v.get(k) for _, v in pick]
    return tl


class _SamplerThread:
    """A daemon thread calling `tick(t_ns)` every interval, on the timer's clock. Never raises."""

    def __init__(self, interval_s: float, tick: Callable[[int], None], clock: Callable[[], int]):
        self.interval_s = interval_s
        self.tick = tick
        self.clock = clock
        self.origin_ns = 0
        self.stop_evt = threading.Event()
        self.thread: threading.Thread | None = None
        self.ticks = self.late = self.errors = 0
        self.last_error: str | None = None
        self.cpu_s = 0.0
        self.busy_s = 0.0
        self.started_ns = self.stopped_ns = 0

    def align(self, timer) -> None:
        """Put our timestamps on the PhaseTimer's: origin = now - (timer's seconds since origin)."""
        now = self.clock()
        self.origin_ns = now - int(timer.now_s() * 1e9) if timer is not None else now
        self.started_ns = now

    def start(self, timer=None) -> None:
        if timer is not None or not self.started_ns:
            self.align(timer)
        self.thread = threading.Thread(target=self._run, name="gpuprof-sampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        interval_ns = int(self.interval_s * 1e9)
        next_ns = self.clock()
        while True:
            t0 = self.clock()
            if t0 - next_ns > interval_ns // 2:
                self.late += 1  # the thread was starved: the host (or the GIL) is busy
            try:
                self.tick(t0 - self.origin_ns)
                self.ticks += 1
            except Exception as exc:  # noqa: BLE001 - a sampler must never take the run down
                self.errors += 1
                self.last_error = f"{exc.__class__.__name__}: {exc}"
            self.busy_s += (self.clock() - t0) / 1e9
            next_ns += interval_ns
            if self.stop_evt.wait(max(0.0, (next_ns - self.clock()) / 1e9)):
                break
            if self.clock() > next_ns + interval_ns:  # fell far behind: resynchronise
                next_ns = self.clock()
        self.cpu_s = time.thread_time() - cpu0

    def stop(self) -> None:
        self.stop_evt.set()
        if self.thread is not None:
            self.thread.join(timeout=5.0)
        self.stopped_ns = self.clock()

    def cost(self) -> dict:
        dur = max((self.stopped_ns - self.started_ns) / 1e9, 1e-9)
        return {"thread_cpu_s": self.cpu_s, "busy_s": self.busy_s,
                "cpu_s_per_sample": self.cpu_s / self.ticks if self.ticks else None,
                "share_of_one_core": self.cpu_s / dur, "duration_s": dur}


# --------------------------------------------------------------------------------------- NVML
NVML_KEYS = ["gpu_util_pct", "mem_util_pct", "mem_used_bytes", "sm_clock_mhz", "sm_clock_share",
             "power_w", "power_share", "temp_c", "pcie_rx_bytes_s", "pcie_tx_bytes_s"]


def resolve_nvml_handle(nvml, device: str, env: Mapping[str, str] | None = None,
                        uuid: str | None = None):
    """(handle, description) of the NVML device behind a torch device string.

    A UUID (from torch's device properties) is exact. Otherwise CUDA_VISIBLE_DEVICES maps the
    visible index to a physical index or a (possibly abbreviated) GPU-/MIG- UUID. Raises
    LookupError with a readable reason when it cannot be mapped."""
    env = os.environ if env is None else env
    dev = str(device)
    idx = int(dev.split(":", 1)[1]) if ":" in dev else 0
    if uuid:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid), {"visible_index": idx, "uuid": uuid, "via": "torch uuid"}
        except Exception:  # noqa: BLE001 - e.g. a MIG UUID torch spells differently: use the env
            pass
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        note = None
        if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and _count(nvml) > 1:
            note = "CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA and NVML may number GPUs differently"
        return nvml.nvmlDeviceGetHandleByIndex(idx), {"visible_index": idx, "nvml_index": idx,
                                                      "via": "index", "note": note}
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    if idx >= len(entries):
        raise LookupError(f"{dev} is not visible with CUDA_VISIBLE_DEVICES={cvd!r}")
    entry = entries[idx]
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry)), {"visible_index": idx, "nvml_index": int(entry),
                                                             "via": "CUDA_VISIBLE_DEVICES index"}
    if entry.upper().startswith(("GPU-", "MIG-")):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(entry), {"visible_index": idx, "uuid": entry,
                                                           "via": "CUDA_VISIBLE_DEVICES uuid"}
        except Exception:  # noqa: BLE001 - CUDA accepts UUID prefixes, NVML wants the full one
            matches = []
            for i in range(_count(nvml)):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                if _text(nvml.nvmlDeviceGetUUID(h)).lower().startswith(entry.lower()):
                    matches.append((i, h))
            if len(matches) == 1:
                i, h = matches[0]
                return h, {"visible_index": idx, "nvml_index": i, "uuid_prefix": entry,
                           "via": "CUDA_VISIBLE_DEVICES uuid prefix"}
            raise LookupError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(matches)} GPUs") from None
    raise LookupError(f"cannot map CUDA_VISIBLE_DEVICES entry {entry!r} to an NVML device")


def _count(nvml) -> int:
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001
        return 0


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _torch_uuid(device: str) -> str | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        u = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
        return u if u.upper().startswith(("GPU-", "MIG-")) else f"GPU-{u}"
    except Exception:  # noqa: BLE001 - old torch without .uuid: fall back to the env mapping
        return None


class NvmlSampler:
    """Samples the GPU(s) the run uses through NVML → measurements['nvml'].

    nvml: a pynvml-like module (tests pass a fake); default imports pynvml (nvidia-ml-py).
    PCIe throughput is read every `pcie_every` ticks: each NVML PCIe read blocks ~20 ms."""

    name = "nvml"

    def __init__(self, interval_s: float = 0.1, *, nvml=None, pcie_every: int = 5,
                 env: Mapping[str, str] | None = None, uuid_of: Callable[[str], str | None] | None = _torch_uuid,
                 clock: Callable[[], int] = time.perf_counter_ns):
        self.interval_s = interval_s
        self._nvml = nvml
        self.pcie_every = max(1, pcie_every)
        self.env = env
        self.uuid_of = uuid_of
        self._thread = _SamplerThread(interval_s, self._tick, clock)
        self._reason: str | None = None
        self._gpus: list[dict] = []
        self._handles: list = []
        self._samples: list[list[tuple[int, dict]]] = []
        self._field_errors: dict[str, int] = {}
        self._unreadable: dict[str, str] = {}
        self._disabled: set[str] = set()
        self._fails: dict[str, int] = {}
        self._initialised = False

    # -- lifecycle
    def start(self, ctx) -> None:
        if not str(ctx.device).startswith("cuda"):
            self._reason = f"run on {ctx.device}: no GPU to sample"
            return
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError:
                self._reason = "nvidia-ml-py (pynvml) is not installed"
                return
            self._nvml = nvml
        try:
            nvml.nvmlInit()
            self._initialised = True
        except Exception as exc:  # noqa: BLE001 - no driver, no library, no permission
            self._reason = f"NVML could not start: {_err(exc)}"
            return
        try:
            uuid = self.uuid_of(ctx.device) if self.uuid_of else None
            handle, desc = resolve_nvml_handle(nvml, ctx.device, self.env, uuid)
        except Exception as exc:  # noqa: BLE001
            self._reason = f"cannot find {ctx.device} in NVML: {_err(exc)}"
            return
        self._handles = [handle]
        self._gpus = [dict(desc, **self._static(handle))]
        self._samples = [[]]
        self._thread.start(ctx.timer)

    def stop(self, ctx) -> dict | None:
        if self._handles:
            self._thread.stop()
        if self._initialised:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        if not self._handles:
            return {"available": False, "reason": self._reason, "samples": 0}
        lookup = PhaseLookup.from_ctx(ctx)
        gpus = []
        for info, samples in zip(self._gpus, self._samples):
            measured = [(t, v) for t, v in samples if lookup.phase(t) not in ("warmup", "outside")] or samples
            throttle: dict[str, int] = {}
            n_thr = 0
            for _, v in measured:
                if v.get("throttle_mask") is not None:
                    n_thr += 1
                    for r in decode_throttle(v["throttle_mask"]):
                        throttle[r] = throttle.get(r, 0) + 1
            gpus.append(dict(info, summary={k: stats([v.get(k) for _, v in measured]) for k in NVML_KEYS},
                             phases=per_phase(samples, lookup, NVML_KEYS),
                             throttle_share={r: c / n_thr for r, c in throttle.items()} if n_thr else None,
                             timeline=_timeline(samples, NVML_KEYS)))
        t = self._thread
        return {
            "available": True, "reason": None, "interval_s": self.interval_s,
            "samples": t.ticks, "late_ticks": t.late, "errors": t.errors, "last_error": t.last_error,
            "field_errors": dict(self._field_errors), "unreadable": dict(self._unreadable),
            "cost": t.cost(), "gpus": gpus,
            "summary": gpus[0]["summary"], "phases": gpus[0]["phases"],
            "throttle_share": gpus[0]["throttle_share"],
        }

    # -- reading
    def _read(self, field: str, fn, *args):
        if field in self._disabled:
            return None
        try:
            val = fn(*args)
            self._fails[field] = 0
            return val
        except Exception as exc:  # noqa: BLE001 - one unreadable field never stops the others
            self._field_errors[field] = self._field_errors.get(field, 0) + 1
            self._unreadable[field] = _err(exc)
            self._fails[field] = self._fails.get(field, 0) + 1
            if "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc) or self._fails[field] >= 3:
                self._disabled.add(field)  # stop paying for a field that will not answer
            return None

    def _static(self, h) -> dict:
        n = self._nvml
        name = self._read("name", n.nvmlDeviceGetName, h)
        uuid = self._read("uuid", n.nvmlDeviceGetUUID, h)
        mem = self._read("memory_total", n.nvmlDeviceGetMemoryInfo, h)
        clk = self._read("sm_clock_max", n.nvmlDeviceGetMaxClockInfo, h, getattr(n, "NVML_CLOCK_SM", 1))
        lim = self._read("power_limit", n.nvmlDeviceGetEnforcedPowerLimit, h)
        return {"name": _text(name) if name is not None else None,
                "uuid": _text(uuid) if uuid is not None else None,
                "memory_total_bytes": int(mem.total) if mem is not None else None,
                "sm_clock_max_mhz": float(clk) if clk else None,
                "power_limit_w": lim / 1000.0 if lim else None}

    def _tick(self, t_ns: int) -> None:
        n = self._nvml
        pcie = self._thread.ticks % self.pcie_every == 0
        for i, h in enumerate(self._handles):
            info = self._gpus[i]
            v: dict = {}
            util = self._read("utilization", n.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                v["gpu_util_pct"] = float(util.gpu)
                v["mem_util_pct"] = float(util.memory)
            mem = self._read("memory", n.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                v["mem_used_bytes"] = int(mem.used)
            clk = self._read("sm_clock", n.nvmlDeviceGetClockInfo, h, getattr(n, "NVML_CLOCK_SM", 1))
            if clk is not None:
                v["sm_clock_mhz"] = float(clk)
                if info.get("sm_clock_max_mhz"):
                    v["sm_clock_share"] = clk / info["sm_clock_max_mhz"]
            pw = self._read("power", n.nvmlDeviceGetPowerUsage, h)
            if pw is not None:
                v["power_w"] = pw / 1000.0
                if info.get("power_limit_w"):
                    v["power_share"] = v["power_w"] / info["power_limit_w"]
            temp = self._read("temperature", n.nvmlDeviceGetTemperature, h, getattr(n, "NVML_TEMPERATURE_GPU", 0))
            if temp is not None:
                v["temp_c"] = float(temp)
            reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
                n, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            if reasons is not None:
                mask = self._read("throttle_reasons", reasons, h)
                if mask is not None:
                    v["throttle_mask"] = int(mask)
            if pcie:  # NVML reports KB/s
                rx = self._read("pcie_rx", n.nvmlDeviceGetPcieThroughput, h, getattr(n, "NVML_PCIE_UTIL_RX_BYTES", 1))
                tx = self._read("pcie_tx", n.nvmlDeviceGetPcieThroughput, h, getattr(n, "NVML_PCIE_UTIL_TX_BYTES", 0))
                if rx is not None:
                    v["pcie_rx_bytes_s"] = rx * 1024.0
                if tx is not None:
                    v["pcie_tx_bytes_s"] = tx * 1024.0
            self._samples[i].append((t_ns, v))


def _err(exc: Exception) -> str:
    msg = str(exc) or type(exc).__name__
    return msg if type(exc).__name__ in msg else f"{type(exc).__name__}: {msg}"


# --------------------------------------------------------------------------------------- host
HOST_KEYS = ["cpu_pct", "cpu_pct_max_core", "proc_cpu_pct", "rss_bytes", "read_bytes_s",
             "read_chars_s", "major_faults_s", "disk_read_bytes_s", "disk_busy_pct"]


def disk_for_path(path: str | None) -> tuple[str | None, str | None]:
    """(block device name as psutil.disk_io_counters(perdisk=True) knows it, reason if None)."""
    if not path:
        return None, "no data file known"
    try:
        st = os.stat(path)
    except OSError as exc:
        return None, f"cannot stat {path}: {exc.strerror}"
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if major == 0:
        return None, "the data file is on a filesystem without a block device (overlay, tmpfs, network)"
    sys_link = f"/sys/dev/block/{major}:{minor}"
    if not os.path.exists(sys_link):
        return None, f"no {sys_link} (not Linux?)"
    return os.path.basename(os.path.realpath(sys_link)), None


def _whole_disks(names) -> list[str]:
    """Physical whole disks among psutil's per-disk names (no partitions, loop, ram, zram)."""
    out = []
    for n in names:
        if n.startswith(("loop", "ram", "zram", "dm-", "md")):
            continue
        if os.path.exists(f"/sys/block/{n}") or not os.path.exists("/sys/block"):
            out.append(n)
    return out


def _major_faults(pid: int) -> int | None:
    """Major page faults of the process from /proc/<pid>/stat (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[9])  # field 12 (majflt); `rest` starts at field 3
    except (OSError, IndexError, ValueError):
        return None


class HostSampler:
    """CPU % per core, process CPU/RSS/reads/major faults, and the data disk's reads (psutil)
    → measurements['host'].

    All disks' counters are recorded; the data file's disk is chosen at stop(), when the run has
    said which file it read (a generated dataset is only known then). When that file has no block
    device (overlay, tmpfs, NFS), the sum over physical disks stands in, and the report says so."""

    name = "host"

    def __init__(self, interval_s: float = 0.1, data_path: str | None = None, *, psutil_mod=None,
                 pid: int | None = None, clock: Callable[[], int] = time.perf_counter_ns):
        self.interval_s = interval_s
        self.data_path = data_path
        self._ps = psutil_mod
        self.pid = pid or os.getpid()
        self._thread = _SamplerThread(interval_s, self._tick, clock)
        self._samples: list[tuple[int, dict]] = []
        self._disk_raw: list[tuple[int, dict]] = []  # (t_ns end of interval, {disk: (read_bytes, busy_ms)})
        self._prev: dict | None = None
        self._unreadable: dict[str, str] = {}
        self._reason: str | None = None
        self._per_core: list[list[float]] = []

    def start(self, ctx) -> None:
        if self._ps is None:
            try:
                import psutil
            except ImportError:
                self._reason = "psutil is not installed"
                return
            self._ps = psutil
        try:
            self._proc = self._ps.Process(self.pid)
            self._proc.cpu_percent(None)  # prime: the first call has no interval
            self._ps.cpu_percent(percpu=True)
        except Exception as exc:  # noqa: BLE001
            self._reason = f"psutil cannot read this process: {_err(exc)}"
            return
        self._thread.align(ctx.timer)
        self._prev = self._counters()
        self._prev_t = self._thread.clock()
        self._disk_raw.append((self._prev_t - self._thread.origin_ns, self._prev["disks"]))
        self._thread.start()

    def _counters(self) -> dict:
        c: dict = {"io": None, "disks": {}}
        try:
            c["io"] = self._proc.io_counters()
        except Exception as exc:  # noqa: BLE001 - needs permissions on some OSes, absent on macOS
            self._unreadable["io_counters"] = _err(exc)
        try:
            disks = self._ps.disk_io_counters(perdisk=True) or {}
            c["disks"] = {k: (d.read_bytes, getattr(d, "busy_time", None)) for k, d in disks.items()}
        except Exception as exc:  # noqa: BLE001
            self._unreadable["disk_io_counters"] = _err(exc)
        c["majflt"] = _major_faults(self.pid)
        if c["majflt"] is None:
            self._unreadable["major_faults"] = "no /proc/<pid>/stat (not Linux)"
        return c

    def _tick(self, t_ns: int) -> None:
        now = self._thread.clock()
        dt = max((now - self._prev_t) / 1e9, 1e-9)
        v: dict = {}
        try:
            cores = self._ps.cpu_percent(percpu=True)
            v["cpu_pct"] = sum(cores) / len(cores) if cores else None
            v["cpu_pct_max_core"] = max(cores) if cores else None
            self._per_core.append(list(cores))
        except Exception as exc:  # noqa: BLE001
            self._unreadable["cpu_percent"] = _err(exc)
        try:
            v["proc_cpu_pct"] = self._proc.cpu_percent(None)
            v["rss_bytes"] = self._proc.memory_info().rss
        except Exception as exc:  # noqa: BLE001
            self._unreadable["process"] = _err(exc)
        cur = self._counters()
        prev = self._prev
        if cur["io"] is not None and prev["io"] is not None:
            v["read_bytes_s"] = (cur["io"].read_bytes - prev["io"].read_bytes) / dt
            if hasattr(cur["io"], "read_chars"):
                v["read_chars_s"] = (cur["io"].read_chars - prev["io"].read_chars) / dt
        if cur["majflt"] is not None and prev["majflt"] is not None:
            v["major_faults"] = cur["majflt"] - prev["majflt"]
            v["major_faults_s"] = v["major_faults"] / dt
        self._prev, self._prev_t = cur, now
        # Rates describe the interval that just ended: attribute them to its midpoint.
        self._samples.append((t_ns - int(dt * 1e9 / 2), v))
        self._disk_raw.append((t_ns, cur["disks"]))

    def _disk_rates(self, names: list[str]) -> None:
        """Fill disk_read_bytes_s / disk_busy_pct of each sample from the raw counters of `names`."""
        for (t0, a), (t1, b), (_, v) in zip(self._disk_raw, self._disk_raw[1:], self._samples):
            dt = max((t1 - t0) / 1e9, 1e-9)
            rb = [b[n][0] - a[n][0] for n in names if n in a and n in b]
            if rb:
                v["disk_read_bytes_s"] = sum(rb) / dt
            busy = [b[n][1] - a[n][1] for n in names if n in a and n in b and a[n][1] is not None]
            if busy:  # Linux: ms the device was busy; with several disks, the busiest
                v["disk_busy_pct"] = min(100.0, max(busy) / 10.0 / dt)

    def stop(self, ctx) -> dict | None:
        if self._prev is None:
            return {"available": False, "reason": self._reason, "samples": 0}
        self._thread.stop()
        path = self.data_path
        if path is None:
            run = getattr(getattr(ctx, "profile", None), "run", None) or {}
            path = run.get("data_path") or _cfg_get(ctx.config, "data")
        disk, disk_reason = disk_for_path(path)
        seen = set().union(*(d.keys() for _, d in self._disk_raw)) if self._disk_raw else set()
        if disk is not None and disk not in seen:
            disk, disk_reason = None, f"{disk} is not in the kernel's disk statistics"
        names = [disk] if disk else _whole_disks(sorted(seen))
        self._disk_rates(names)
        lookup = PhaseLookup.from_ctx(ctx)
        measured = [(t, v) for t, v in self._samples if lookup.phase(t) not in ("warmup", "outside")] or self._samples
        phases = per_phase(self._samples, lookup, HOST_KEYS + ["major_faults"])
        per_core = [statistics.fmean(c) for c in zip(*self._per_core)] if self._per_core else None
        t = self._thread
        return {
            "available": True, "reason": None, "interval_s": self.interval_s,
            "samples": t.ticks, "late_ticks": t.late, "errors": t.errors, "last_error": t.last_error,
            "unreadable": dict(self._unreadable), "cost": t.cost(),
            "data_path": path, "disk": disk if disk else ("all:" + ",".join(names) if names else None),
            "disk_reason": disk_reason,
            "cpu_count": len(per_core) if per_core else None,
            "cpu_pct_per_core_mean": per_core,
            "major_faults_total": sum(v.get("major_faults", 0) for _, v in measured),
            "summary": {k: stats([v.get(k) for _, v in measured]) for k in HOST_KEYS},
            "phases": phases,
            "timeline": _timeline(self._samples, HOST_KEYS),
        }


def _cfg_get(cfg, key):
    if isinstance(cfg, dict):
        return cfg.get(key)
    return getattr(cfg, key, None)
