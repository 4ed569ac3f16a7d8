"""The instruments the CLI hands to a run: samplers, FLOP counting, the matmul ceiling."""

from __future__ import annotations

from gpuprof.measure.flops import FlopsInstrument
from gpuprof.measure.probe import CeilingProbe
from gpuprof.measure.samplers import HostSampler, NvmlSampler


def default_instruments(device: str, data_path: str | None, *, nvml_interval_s: float = 0.1,
                        host_interval_s: float = 0.1, probe: bool = True, flops: bool = True) -> list:
    """Instruments for a run on `device` reading `data_path` (None: known only after the run).

    Order matters: instruments stop in list order, so the samplers stop before the FLOP count
    and the matmul probe run, and neither pollutes the samples. The NVML sampler is only added
    for CUDA devices; a CPU run has no GPU to sample."""
    out: list = []
    if str(device).startswith("cuda") and nvml_interval_s and nvml_interval_s > 0:
        out.append(NvmlSampler(nvml_interval_s))
    if host_interval_s and host_interval_s > 0:
        out.append(HostSampler(host_interval_s, data_path))
    if flops:
        out.append(FlopsInstrument())
    if probe:
        out.append(CeilingProbe())
    return out
