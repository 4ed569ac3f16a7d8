"""The GPU an attached process uses, found and sampled through NVML from outside.

NVML's running-process lists (compute, then graphics) name the GPUs the PID has a context on;
the first is sampled by the same sampler `diagnose` uses (utilization, memory, clocks, power,
throttle reasons). In a container NVML may list host PIDs, not the container's: then the PID is
not found, and the GPU is "not measured" with that reason rather than guessed.
"""

from __future__ import annotations

import types


def _pids(nvml, handle) -> set[int]:
    found: set[int] = set()
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        get = getattr(nvml, fn, None)
        if get is None:
            continue
        try:
            found.update(int(p.pid) for p in get(handle))
        except Exception:  # noqa: BLE001 - NotSupported on some GPUs: the other list may answer
            pass
    return found


def gpus_of(pid: int, nvml) -> list[dict]:
    """[{index, uuid, name}] of the GPUs NVML lists `pid` on (NVML already initialised)."""
    from gpuprof.measure.nvml import _text

    out = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        if pid in _pids(nvml, h):
            out.append({"index": i, "uuid": _text(nvml.nvmlDeviceGetUUID(h)), "name": _text(nvml.nvmlDeviceGetName(h))})
    return out


class GpuWatch:
    """NVML on the target's GPU for the window: start() finds it, stop() gives the `nvml` section
    (or {"available": False, "reason": ...})."""

    def __init__(self, pid: int, nvml=None, interval_s: float = 0.1):
        self.pid = pid
        self._nvml = nvml
        self.interval_s = interval_s
        self.gpus: list[dict] = []
        self._sampler = None
        self._reason: str | None = None
        self._ctx = None

    def start(self) -> None:
        from gpuprof.measure.nvml import NvmlSampler, nvml_module
        from gpuprof.measure.timer import PhaseTimer

        nvml, self._reason = nvml_module(self._nvml)
        if nvml is None:
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - no driver: a CPU machine
            self._reason = f"NVML could not start ({exc.__class__.__name__}: {exc}): no GPU to sample"
            return
        try:
            self.gpus = gpus_of(self.pid, nvml)
        except Exception as exc:  # noqa: BLE001
            self._reason = f"NVML could not list the GPUs' processes: {exc.__class__.__name__}: {exc}"
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        if self._reason:
            return
        if not self.gpus:
            self._reason = (f"NVML lists process {self.pid} on no GPU: a CPU run, or a container whose "
                            f"PIDs NVML does not see")
            return
        uuid = self.gpus[0]["uuid"]
        self._sampler = NvmlSampler(interval_s=self.interval_s, nvml=nvml, uuid_of=lambda _dev: uuid, env={})
        self._ctx = types.SimpleNamespace(device="cuda:0", timer=PhaseTimer(), profile=None, config={})
        self._sampler.start(self._ctx)

    def stop(self) -> dict:
        if self._sampler is None:
            return {"available": False, "reason": self._reason, "samples": 0}
        section = self._sampler.stop(self._ctx)
        section["gpus_of_process"] = self.gpus
        return section
