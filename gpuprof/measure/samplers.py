"""What the machine does during the run: the NVML sampler (measure/nvml.py) and the host
sampler (measure/host.py), over the shared machinery in measure/sampling.py. This module keeps
the names importable from one place."""

from gpuprof.measure.host import HOST_KEYS, HostSampler, disk_for_path
from gpuprof.measure.nvml import (NVML_KEYS, THROTTLE_REASONS, NvmlSampler, decode_throttle,
                                  resolve_nvml_handle)
from gpuprof.measure.sampling import (TIMELINE_MAX_POINTS, PhaseLookup, _SamplerThread, per_phase,
                                      stats)

__all__ = ["HOST_KEYS", "HostSampler", "disk_for_path", "NVML_KEYS", "THROTTLE_REASONS",
           "NvmlSampler", "decode_throttle", "resolve_nvml_handle", "TIMELINE_MAX_POINTS",
           "PhaseLookup", "_SamplerThread", "per_phase", "stats"]
