"""Hand-built profiles for the report tests: the numbers are chosen, so the words can be checked.

A CUDA run (GPU timeline, NVML and host samplers) cannot be measured on a CPU machine, so it is
built here from figures of the shape the timer and the samplers produce."""

from __future__ import annotations

from gpuprof.profile import Profile, StepRecord

TINY_DIMS = {"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 4096, "block_size": 256}


def cpu_config(**kw) -> dict:
    cfg = {"device": "cpu", "model": "tiny", "batch_size": 8, "block_size": 256, "grad_accum": 2, "dtype": "fp32",
           "compile": False, "pin_memory": True, "tokens_per_step": 4096, "model_dims": dict(TINY_DIMS),
           "param_count": 921_088}
    cfg.update(kw)
    return cfg


def steps_of(phase_list: list[dict], gpu_list: list[dict] | None = None, micro: int = 2) -> list[StepRecord]:
    out = []
    for i, ph in enumerate(phase_list):
        gp = gpu_list[i] if gpu_list else None
        out.append(StepRecord(i, sum(ph.values()), dict(ph), tokens=4096, micro_steps=micro,
                              gpu_s=sum(gp.values()) if gp else None, gpu_phases=dict(gp) if gp else None,
                              start_s=float(i)))
    return out


def cpu_profile(phase_list: list[dict], measurements: dict | None = None, micro: int = 2, **cfg) -> Profile:
    steps = steps_of(phase_list, micro=micro)
    return Profile(run={"mode": "builtin", "config": cpu_config(**cfg)}, steps=steps,
                   environment={"device": "cpu", "device_name": "CPU (Test EPYC)", "ram_bytes": 24 * 2**30},
                   measurements=dict(measurements or {}))


HOST_GPU = {"forward": 0.020, "data": 0.150, "h2d": 0.002, "backward": 0.030, "optimizer": 0.010, "other": 0.001}
GPU = {"forward": 0.100, "data": 0.050, "h2d": 0.004, "backward": 0.200, "optimizer": 0.012, "other": 0.001}


def _nvml_phase(util, rss):
    return {"samples": 10, "gpu_util_pct": util, "sm_clock_share": 0.92, "power_share": 0.81,
            "mem_used_bytes": rss, "temp_c": 61.0, "pcie_rx_bytes_s": 1.2e9, "pcie_tx_bytes_s": 3.1e6}


def _host_phase(cpu, own, rss):
    return {"samples": 10, "cpu_pct": cpu, "cpu_pct_max_core": 100.0, "own_cpu_cores": own,
            "others_cpu_cores": 0.1, "rss_bytes": rss, "read_bytes_s": 1.07e9, "major_faults_s": 0.0,
            "disk_read_bytes_s": 0.0}


def gpu_profile() -> Profile:
    """An H200 run whose GPU waits for data loading: 50 ms of GPU idle per step while the host
    loads for 150 ms (the other 100 ms overlap the GPU's forward)."""
    steps = steps_of([HOST_GPU] * 3, [GPU] * 3)
    nvml = {"available": True, "samples": 30, "interval_s": 0.1, "late_ticks": 0, "errors": 0,
            "cost": {"thread_cpu_s": 0.01, "share_of_one_core": 0.002}, "gpus": [{"name": "NVIDIA H200"}],
            "summary": {"gpu_util_pct": {"mean": 71.0}, "mem_used_bytes": {"mean": 1.07e9}},
            "phases": {"forward": _nvml_phase(99.0, 1.07e9), "backward": _nvml_phase(99.0, 1.07e9),
                       "data": _nvml_phase(12.0, 1.07e9)},
            "throttle_share": {"sw_power_cap": 0.3}}
    host = {"available": True, "samples": 30, "interval_s": 0.1, "late_ticks": 0, "errors": 0,
            "cost": {"thread_cpu_s": 0.01, "share_of_one_core": 0.002}, "cpu_count": 16, "disk": "nvme0n1",
            "summary": {"cpu_pct": {"mean": 12.0}, "own_cpu_cores": {"mean": 1.0}, "others_cpu_cores": {"mean": 0.2},
                        "proc_cpu_pct": {"mean": 100.0}, "cpu_busy_cores": {"mean": 1.2}},
            "phases": {"data": _host_phase(8.0, 0.08, 1.07e9), "forward": _host_phase(7.0, 1.0, 1.07e9),
                       "backward": _host_phase(7.0, 1.0, 1.07e9), "optimizer": _host_phase(7.0, 1.0, 1.07e9)}}
    cfg = cpu_config(device="cuda:0", dtype="bf16", model="gpt2", batch_size=16, block_size=1024, grad_accum=2,
                     tokens_per_step=32768, param_count=124_000_000,
                     model_dims={"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304, "block_size": 1024})
    return Profile(run={"mode": "builtin", "config": cfg}, steps=steps,
                   environment={"device": "cuda:0", "device_name": "NVIDIA H200", "ram_bytes": 128 * 2**30,
                                "device_memory_bytes": 141 * 10**9},
                   measurements={"nvml": nvml, "host": host,
                                 "memory": {"peak_allocated_bytes": 20e9, "capacity_bytes": 141e9}})
