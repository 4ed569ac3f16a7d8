"""The NVML sampler: what the GPU does during the run (nvidia-ml-py's pynvml).

An Instrument: start(ctx) starts a daemon thread sampling every `interval_s`; stop(ctx) joins it
and summarises the samples overall and per phase. Only the GPU the run uses is read: its torch
UUID (a whole GPU or a MIG instance), else, with an old torch, CUDA_VISIBLE_DEVICES; a torch UUID
NVML does not know leaves the GPU not measured rather than guessed. A field that cannot be read
(on a MIG instance: utilization, clocks, power) is counted and reported; the run goes on. It
reports its own sample count, late ticks and cost (CPU time of its thread).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Mapping

from gpuprof.measure.cuda import is_cuda
from gpuprof.measure.sampling import PhaseLookup, _err, _SamplerThread, _timeline, per_phase, stats

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


def decode_throttle(mask: int) -> list[str]:
    """Names of the clock-event reason bits set in an NVML mask."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


# --------------------------------------------------------------------------------------- NVML
NVML_KEYS = ["gpu_util_pct", "mem_util_pct", "mem_used_bytes", "sm_clock_mhz", "sm_clock_share",
             "power_w", "power_share", "temp_c", "pcie_rx_bytes_s", "pcie_tx_bytes_s"]


def resolve_nvml_handle(nvml, device: str, env: Mapping[str, str] | None = None,
                        uuid: str | None = None):
    """(handle, description) of the NVML device behind a torch device string.

    A UUID from torch's device properties is exact: it is looked up as given when it carries a
    GPU-/MIG- prefix, else as "GPU-<uuid>" then "MIG-<uuid>" (a MIG instance). When it resolves
    to nothing, LookupError: falling back to an index would read the parent GPU or another GPU.
    Only without a torch UUID does CUDA_VISIBLE_DEVICES map the visible index to a physical index
    or a (possibly abbreviated) GPU-/MIG- UUID, and `via` says which way was taken. Raises
    LookupError with a readable reason when the device cannot be mapped."""
    env = os.environ if env is None else env
    dev = str(device)
    idx = _visible_index(dev)
    if uuid:
        return _by_torch_uuid(nvml, uuid, idx)
    # CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML by PCI bus id.
    order_note = None
    if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and _count(nvml) > 1:
        order_note = "CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA and NVML may number GPUs differently"
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return _by_index(nvml, idx), {"visible_index": idx, "nvml_index": idx, "via": "index", "note": order_note}
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    if idx >= len(entries):
        raise LookupError(f"{dev} is not visible with CUDA_VISIBLE_DEVICES={cvd!r}")
    entry = entries[idx]
    if entry.isdigit():
        return _by_index(nvml, int(entry)), {"visible_index": idx, "nvml_index": int(entry),
                                             "via": "CUDA_VISIBLE_DEVICES index", "note": order_note}
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


def _visible_index(device: str) -> int:
    """The CUDA index a torch device string names ("cuda" alone: 0)."""
    dev = str(device)
    return int(dev.split(":", 1)[1]) if ":" in dev else 0


def _uuid_spellings(uuid: str) -> list[str]:
    u = uuid.strip()
    if u.upper().startswith(("GPU-", "MIG-")):
        return [u]
    # torch prints the bare 16-byte UUID; NVML names a whole GPU GPU-<uuid>, a MIG instance MIG-<uuid>
    return [f"GPU-{u}", f"MIG-{u}"]


def _by_torch_uuid(nvml, uuid: str, idx: int):
    tried = []
    for spelling in _uuid_spellings(uuid):
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(spelling)
        except Exception as exc:  # noqa: BLE001 - NotFound for the spelling that is not this device
            tried.append(f"{spelling}: {_err(exc)}")
            continue
        return handle, {"visible_index": idx, "uuid": spelling, "via": "torch uuid"}
    raise LookupError(f"NVML knows no device with torch's UUID {uuid} ({'; '.join(tried)}); "
                      "not guessing by index, which could be the parent GPU or another one")


def _by_index(nvml, i: int):
    try:
        return nvml.nvmlDeviceGetHandleByIndex(i)
    except Exception as exc:  # noqa: BLE001 - past the last GPU: NVML says Invalid Argument
        raise LookupError(f"NVML has no GPU {i} ({_count(nvml)} GPUs): {_err(exc)}") from None


def _count(nvml) -> int:
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001
        return 0


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _not_supported(exc: Exception) -> bool:
    return "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc)


def _mig_info(nvml, handle) -> dict:
    """{"mig": True/False/None, "mig_parent_uuid": ...}: whether NVML says the handle is a MIG
    instance (None when it cannot tell), and the UUID of the GPU it is carved from."""
    is_mig = getattr(nvml, "nvmlDeviceIsMigDeviceHandle", None)
    if is_mig is None:
        return {"mig": None}
    try:
        flag = is_mig(handle)
    except Exception as exc:  # noqa: BLE001
        # a GPU that cannot be partitioned answers NotSupported: it is not a MIG instance
        return {"mig": False if _not_supported(exc) else None}
    if not bool(getattr(flag, "value", flag)):  # pynvml returns a ctypes c_uint
        return {"mig": False}
    info: dict = {"mig": True, "mig_parent_uuid": None}
    try:
        parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        info["mig_parent_uuid"] = _text(nvml.nvmlDeviceGetUUID(parent))
    except Exception:  # noqa: BLE001 - the parent is context, not a measurement
        pass
    return info


def _torch_uuid(device: str) -> str | None:
    """torch's UUID of the CUDA device (bare or GPU-/MIG- prefixed, as torch prints it); None when
    torch has no CUDA or no UUID (old torch), which leaves the CUDA_VISIBLE_DEVICES mapping."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(torch.device("cuda", _visible_index(device)))
        u = str(props.uuid).strip()
    except Exception:  # noqa: BLE001 - old torch without .uuid: fall back to the env mapping
        return None
    return u or None


def nvml_module(given=None):
    """(the NVML binding, None): `given` (a test's fake) or pynvml from nvidia-ml-py; (None, why)
    when it is not installed."""
    if given is not None:
        return given, None
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed"
    return pynvml, None


class NvmlSampler:
    """Samples the GPU(s) the run uses through NVML → measurements['nvml'].

    nvml: a pynvml-like module (tests pass a fake); default imports pynvml (nvidia-ml-py).
    PCIe throughput is read every `pcie_every` ticks: each NVML PCIe read blocks ~20 ms.
    clock (nanoseconds), wait and threaded: the time source, as _SamplerThread takes it; the
    defaults (perf_counter_ns, the stop event's wait, a thread) are the production ones. With
    threaded=False no thread starts and the caller takes each sample with sample_now()."""

    name = "nvml"

    def __init__(self, interval_s: float = 0.1, *, nvml=None, pcie_every: int = 5,
                 env: Mapping[str, str] | None = None, uuid_of: Callable[[str], str | None] | None = _torch_uuid,
                 clock: Callable[[], int] = time.perf_counter_ns,
                 wait: Callable[[float], bool] | None = None, threaded: bool = True):
        self.interval_s = interval_s
        self._nvml = nvml
        self.pcie_every = max(1, pcie_every)
        self.env = env
        self.uuid_of = uuid_of
        self._thread = _SamplerThread(interval_s, self._tick, clock, wait=wait, threaded=threaded)
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
        if not is_cuda(ctx.device):
            self._reason = f"run on {ctx.device}: no GPU to sample"
            return
        nvml, self._reason = nvml_module(self._nvml)
        if nvml is None:
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
            why = str(exc) if isinstance(exc, LookupError) else _err(exc)
            self._reason = f"cannot find {ctx.device} in NVML: {why}"
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
            if _not_supported(exc) or self._fails[field] >= 3:
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
                "power_limit_w": lim / 1000.0 if lim else None,
                **_mig_info(n, h)}

    def sample_now(self) -> None:
        """Take one sample now, on the clock, as the thread does each interval (never raises)."""
        if self._handles:
            self._thread.tick_now()

    @property
    def sample_count(self) -> int:
        """Samples taken so far (the `samples` the report gives)."""
        return self._thread.ticks

    def latest(self) -> dict | None:
        """The last sample of the run's GPU (for a live display), or None before the first."""
        try:
            return dict(self._samples[0][-1][1]) if self._samples and self._samples[0] else None
        except (IndexError, TypeError):
            return None

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
