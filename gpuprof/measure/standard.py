"""The standard set of instruments for a diagnose run, in the order they must stop.

Instruments stop in list order: the sync counter first (it only restores a torch setting),
then the samplers (so later work does not pollute their samples), then the post-run
measurements that compute: the micro-batch curve, the FLOP count, the matmul ceiling."""

from __future__ import annotations

from gpuprof.measure.instruments import default_instruments
from gpuprof.measure.microbatch import MicroBatchProbe
from gpuprof.measure.samplers import HostSampler, NvmlSampler
from gpuprof.measure.storage import StorageFacts
from gpuprof.measure.syncs import SyncCounter


def standard_instruments(device: str, data_path: str | None, *, samplers: bool = True,
                         probe: bool = True, microbatch: bool = True) -> list:
    theirs = default_instruments(device, data_path, nvml_interval_s=0.1 if samplers else 0,
                                 host_interval_s=0.1 if samplers else 0, probe=probe, flops=True)
    sampling = [i for i in theirs if isinstance(i, (NvmlSampler, HostSampler))]
    post = [i for i in theirs if not isinstance(i, (NvmlSampler, HostSampler))]
    return [SyncCounter(), StorageFacts(data_path), *sampling,
            *([MicroBatchProbe()] if microbatch else []), *post]
