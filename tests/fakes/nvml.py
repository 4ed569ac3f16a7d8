"""A contract fake of `pynvml` (nvidia-ml-py) for a machine without a GPU: at least as strict as
the real bindings (checked against nvidia-ml-py 13.615's pynvml.py).

- Errors are the real `pynvml.NVMLError` subclasses: `pynvml.NVMLError(code)` builds
  NVMLError_NotFound, NVMLError_NotSupported, ... exactly as `_nvmlCheckReturn` does.
- Every call before `nvmlInit` or after the matching `nvmlShutdown` raises Uninitialized
  (the library keeps an init reference count; shutting down when not initialised raises too).
- `nvmlDeviceGetHandleByIndex` past `nvmlDeviceGetCount` raises Invalid Argument; a handle the
  library never gave out raises Invalid Argument.
- `nvmlDeviceGetHandleByUUID` matches only a full UUID with its GPU-/MIG- prefix (Not Found
  otherwise); like pynvml it takes str or bytes. `nvmlDeviceGetUUID` returns str (pynvml >= 11
  decodes), `nvmlDeviceGetName` bytes (as older bindings did), so callers must accept both.
- MIG instances (`migs`, carved from GPU 0) are reachable only by their MIG- UUID, not by index
  (NVML counts whole GPUs). On a MIG handle utilization, clocks, power, temperature,
  throttle reasons and the PCIe/NVLink links answer NotSupported; memory is the instance's own. `nvmlDeviceIsMigDeviceHandle` returns a ctypes c_uint, as
  pynvml does; a GPU that cannot be partitioned (`mig_capable=False`) answers NotSupported.

Handles are ints: GPU i is i, MIG instance j is MIG_BASE + j. `fail` names fields that raise
(NotSupported for "power", Unknown Error for the rest); `calls` counts the sampled reads.
"""

from __future__ import annotations

import ctypes
import types

import pynvml

MIG_BASE = 100
# What a MIG device handle cannot answer (the parent GPU's business or not partitioned).
# NVML answers a MIG device handle for the instance's own facts (name, UUID, memory, processes)
# and NotSupported for the physical GPU's (clocks, power, temperature, throttle reasons, PCIe and
# NVLink links): those belong to the parent handle.
MIG_NOT_SUPPORTED = {"utilization", "sm_clock", "sm_clock_max", "power", "power_limit", "temperature",
                     "throttle_reasons", "pcie", "pcie_max", "nvlink"}


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """Stand-in for the parts of pynvml gpuprof uses; see the module docstring."""

    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVMLError = pynvml.NVMLError
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED

    def __init__(self, fail_init=False, fail=(), uuids=("GPU-aaaa-1111", "GPU-bbbb-2222"), migs=(),
                 mig_capable=True, throttle_mask=0x4 | 0x40, nvlinks=0, nvlink_version=0, pcie=(5, 16),
                 running=None):
        self.fail_init = fail_init
        self.running = dict(running or {})  # GPU index -> PIDs with a compute context on it
        self.fail = set(fail)
        self.uuids = list(uuids)
        self.migs = list(migs)
        self.mig_capable = mig_capable
        self.throttle_mask = throttle_mask  # default: sw power cap + hw thermal slowdown
        self.calls: dict[str, int] = {}
        self.util = 80
        # NVLink: `nvlinks` active links (0: the GPU has none: NotSupported), `nvlink_version` the
        # nvmlNvlinkVersion_t enum NVML returns (6 = NVLink 4.0 on Hopper); PCIe max (gen, width).
        self.nvlinks, self.nvlink_version, self.pcie = nvlinks, nvlink_version, pcie
        self.refs = 0  # nvmlInit reference count
        self.shutdown = False

    # -- library state
    def _live(self, h=None) -> None:
        if self.refs <= 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        if h is not None and not (isinstance(h, int) and (0 <= h < len(self.uuids)
                                                          or 0 <= h - MIG_BASE < len(self.migs))):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _is_mig(self, h) -> bool:
        return h >= MIG_BASE

    def _hit(self, name, h):
        self._live(h)
        self.calls[name] = self.calls.get(name, 0) + 1
        if self._is_mig(h) and name in MIG_NOT_SUPPORTED:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if name in self.fail:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED if name == "power" else pynvml.NVML_ERROR_UNKNOWN)

    def nvmlInit(self):
        if self.fail_init:
            raise nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.refs += 1

    def nvmlShutdown(self):
        self._live()
        self.refs -= 1
        self.shutdown = self.refs == 0

    # -- finding a device
    def nvmlDeviceGetCount(self):
        self._live()
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._live()
        if not 0 <= i < len(self.uuids):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetHandleByUUID(self, u):
        self._live()
        u = u.decode() if isinstance(u, bytes) else u
        if u in self.uuids:
            return self.uuids.index(u)
        if u in self.migs:
            return MIG_BASE + self.migs.index(u)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, h):
        self._live(h)
        return self.migs[h - MIG_BASE] if self._is_mig(h) else self.uuids[h]

    def nvmlDeviceIsMigDeviceHandle(self, h):
        self._live(h)
        if not self.mig_capable:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return ctypes.c_uint(1 if self._is_mig(h) else 0)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        self._live(h)
        if not self._is_mig(h):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    # -- static facts
    def nvmlDeviceGetName(self, h):
        self._live(h)
        return b"NVIDIA H200 MIG 1g.18gb" if self._is_mig(h) else b"NVIDIA H200"  # old bindings: bytes

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        self._hit("sm_clock_max", h)
        return 1980

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._hit("power_limit", h)
        return 700_000

    # -- sampled readings
    def nvmlDeviceGetMemoryInfo(self, h):
        self._hit("memory", h)
        if self._is_mig(h):
            return types.SimpleNamespace(total=18e9, used=9e9, free=9e9)
        return types.SimpleNamespace(total=141e9, used=50e9 + h, free=91e9)

    def nvmlDeviceGetUtilizationRates(self, h):
        self._hit("utilization", h)
        return types.SimpleNamespace(gpu=self.util, memory=40)

    def nvmlDeviceGetClockInfo(self, h, kind):
        self._hit("sm_clock", h)
        return 990

    def nvmlDeviceGetPowerUsage(self, h):
        self._hit("power", h)
        return 350_000

    def nvmlDeviceGetTemperature(self, h, kind):
        self._hit("temperature", h)
        return 60

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._hit("throttle_reasons", h)
        return self.throttle_mask

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._hit("pcie", h)
        return 1000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 10

    def nvmlDeviceGetNvLinkState(self, h, link):
        self._hit("nvlink", h)
        if link >= pynvml.NVML_NVLINK_MAX_LINKS:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not self.nvlinks:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_FEATURE_ENABLED if link < self.nvlinks else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        self._hit("nvlink", h)
        if not self.nvlinks:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.nvlink_version

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        """pynvml's list of c_nvmlProcessInfo_t-like objects (pid, usedGpuMemory)."""
        self._hit("processes", h)
        if self._is_mig(h):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in self.running.get(h, [])]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        self._hit("pcie_max", h)
        return self.pcie[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        self._hit("pcie_max", h)
        return self.pcie[1]
