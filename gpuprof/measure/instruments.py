"""The instruments a diagnose run carries, in the order they must stop.

Instruments stop in list order: the sync counter first (it only restores a torch setting) and
the storage facts (a residency read), then the samplers (so later work does not pollute their
samples), then the post-run measurements that compute: the micro-batch curve, the FLOP count,
the matmul ceiling. The NVML sampler is only added for CUDA devices."""

from __future__ import annotations

from gpuprof.measure.flops import FlopsInstrument
from gpuprof.measure.host import HostSampler
from gpuprof.measure.microbatch import MicroBatchProbe
from gpuprof.measure.nvml import NvmlSampler
from gpuprof.measure.probe import CeilingProbe
from gpuprof.measure.storage import StorageFacts
from gpuprof.measure.syncs import SyncCounter


def default_instruments(device: str, data_path: str | None, *, samplers: bool = True,
                        interval_s: float = 0.1, microbatch: bool = True, flops: bool = True,
                        probe: bool = True) -> list:
    """Instruments for a run on `device` reading `data_path` (None: taken from the run)."""
    out: list = [SyncCounter(), StorageFacts(data_path)]
    if samplers and str(device).startswith("cuda"):
        out.append(NvmlSampler(interval_s))
    if samplers:
        out.append(HostSampler(interval_s, data_path))
    if microbatch:
        out.append(MicroBatchProbe())
    if flops:
        out.append(FlopsInstrument())
    if probe:
        out.append(CeilingProbe())
    return out
