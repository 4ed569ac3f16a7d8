"""What a run ran on: the machine, the software, the device (read once at the start of a run)."""

from __future__ import annotations

import platform
from pathlib import Path

from gpuprof.measure.cuda import is_cuda


def environment(device: str | None = None, torch_fields: bool = True) -> dict:
    """What the run ran on: CPU, cores, RAM, OS, Python, torch, CUDA/driver, device name.
    torch_fields=False: no torch import and its fields None (`gpuprof attach`: its own torch is not
    the target's, and importing it takes seconds of a core the target may need)."""
    import psutil

    env = {
        "cpu_model": _cpu_model(),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "ram_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": None, "cuda": None, "cuda_available": None,
        "driver": None,
        "device": device,
        "device_name": platform.processor() or platform.machine(),
    }
    if device:  # a CUDA device's own name replaces it below
        env["device_name"] = f"CPU ({env['cpu_model']})"
    if not torch_fields:
        return env
    import torch

    env.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if device and is_cuda(device) and torch.cuda.is_available():
        from gpuprof.measure.cuda import cuda_index

        idx = cuda_index(device)  # "cuda" alone is the current device, not necessarily 0
        env["device_name"] = torch.cuda.get_device_name(idx)
        env["device_memory_bytes"] = torch.cuda.get_device_properties(idx).total_memory
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception:  # NVML missing or failing: the driver stays "not measured"
            pass
    return env


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
