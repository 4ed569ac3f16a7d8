"""The Profile: plain data, versioned JSON, atomic save, validated load.

Stable keys (documented in README): schema_version, tool, environment, run.config,
steps[], summary.step_s, summary.tokens_per_s, summary.phases.<name>.seconds/.share,
findings[] (id, title, saving_s, saving_share, ...). Optional measurement sections go under
`measurements.<name>` (mfu, nvml, host, script, disk, ...), each owned by its producer.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from gpuprof import __version__
from gpuprof.errors import GpuprofError
from gpuprof.files import atomic_write, read_user_text

SCHEMA_VERSION = 1

PHASES = ("data", "h2d", "forward", "backward", "optimizer", "other", "eval")
# Phases that enqueue no GPU work of their own: their GPU span is idle time the host exposed.
HOST_ONLY_PHASES = ("data", "other")


@dataclass
class StepRecord:
    """One measured optimizer step."""

    index: int
    wall_s: float  # host wall time of the step
    phases: dict[str, float]  # host seconds per phase; sums to wall_s
    tokens: int = 0
    micro_steps: int = 0
    gpu_s: float | None = None  # span of the step on the GPU timeline (CUDA only)
    gpu_phases: dict[str, float] | None = None  # GPU-timeline seconds per phase; sums to gpu_s
    start_s: float = 0.0  # host time of the step start, seconds since the timer was created
    extra: dict = field(default_factory=dict)

    @property
    def idle_exposed(self) -> dict[str, float] | None:
        if self.gpu_phases is None:
            return None
        return {p: self.gpu_phases.get(p, 0.0) for p in HOST_ONLY_PHASES if p in self.gpu_phases}

    def measured_spans(self, gpu: bool = False) -> list | None:
        """The step's phase spans in the order they ran ([phase, start_s, seconds] from the step
        start, PhaseTimer): the host's, or with gpu=True the GPU timeline's (from the CUDA events),
        when they agree with the matching phase totals (within 1% + 1 µs); None when absent or
        when the totals were changed after the run (a script's sampled data attribution moves
        `other` time to `data` without knowing where in the step it was)."""
        spans = (self.extra or {}).get("gpu_spans" if gpu else "spans")
        phases = self.gpu_phases if gpu else self.phases
        if not spans or phases is None or any(s[0] == "…" for s in spans):
            return None
        total: dict[str, float] = {}
        for label, _, dur in spans:
            total[label] = total.get(label, 0.0) + dur
        for p in set(total) | {p for p, v in phases.items() if v > 0}:
            a, b = total.get(p, 0.0), phases.get(p, 0.0)
            if abs(a - b) > 1e-6 + 0.01 * max(a, b):
                return None
        return spans

    def to_dict(self) -> dict:
        d = {
            "index": self.index,
            "start_s": round(self.start_s, 9),
            "wall_s": self.wall_s,
            "tokens": self.tokens,
            "micro_steps": self.micro_steps,
            "phases": self.phases,
            "gpu_s": self.gpu_s,
            "gpu_phases": self.gpu_phases,
            "idle_exposed": self.idle_exposed,
        }
        if self.extra:
            d["extra"] = self.extra
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepRecord":
        return cls(
            index=int(d["index"]),
            wall_s=float(d["wall_s"]),
            phases={k: float(v) for k, v in d["phases"].items()},
            tokens=int(d.get("tokens", 0)),
            micro_steps=int(d.get("micro_steps", 0)),
            gpu_s=None if d.get("gpu_s") is None else float(d["gpu_s"]),
            gpu_phases=None if d.get("gpu_phases") is None
            else {k: float(v) for k, v in d["gpu_phases"].items()},
            start_s=float(d.get("start_s", 0.0)),
            extra=d.get("extra") or {},
        )



@dataclass
class Profile:
    run: dict  # mode, command, config{...}, rank, world_size
    steps: list[StepRecord]
    environment: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    measurements: dict = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)
    warmup_steps: list[StepRecord] = field(default_factory=list)
    # A merged data-parallel run (gpuprof.merge): one entry per rank, sorted by rank:
    # {"rank", "local_rank", "node_rank", "host", "status": ok|failed|interrupted|missing,
    #  "error": dict|None, "profile": that rank's whole profile dict, or None when missing}.
    # The top-level steps/summary/measurements are then the slowest rank's (the lowest present
    # rank's when the all-reduces were not measured): gpuprof.merge. Empty for a single process.
    ranks: list[dict] = field(default_factory=list)
    tool: dict = field(default_factory=lambda: {"name": "gpuprof", "version": __version__})
    schema_version: int = SCHEMA_VERSION

    @property
    def config(self) -> dict:
        return self.run.setdefault("config", {})

    def to_dict(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "tool": self.tool,
            "environment": self.environment,
            "run": self.run,
            "summary": self.summary,
            "steps": [s.to_dict() for s in self.steps],
            "warmup_steps": [s.to_dict() for s in self.warmup_steps],
            "measurements": self.measurements,
            "findings": self.findings,
            **({"ranks": self.ranks} if self.ranks else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        return cls(
            schema_version=d["schema_version"],
            tool=d.get("tool", {}),
            environment=d.get("environment", {}),
            run=d.get("run", {}),
            summary=d.get("summary", {}),
            steps=[StepRecord.from_dict(s) for s in d.get("steps", [])],
            warmup_steps=[StepRecord.from_dict(s) for s in d.get("warmup_steps", [])],
            measurements=d.get("measurements", {}),
            findings=d.get("findings", []),
            ranks=list(d.get("ranks") or []),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(steps: list[StepRecord]) -> dict:
    """Summary of measured steps.

    step_s is the median step time: on CUDA the step's span on the GPU timeline (what the GPU
    experiences, immune to host run-ahead), otherwise host wall time. Phase seconds are the mean
    per step of each phase on that same timeline; shares divide by the sum of phase means, so
    they add up to 1 and never count an interval twice."""
    if not steps:
        return {}
    on_gpu = all(s.gpu_s is not None and s.gpu_phases is not None for s in steps)
    times = [s.gpu_s if on_gpu else s.wall_s for s in steps]
    n = len(steps)
    phase_mean = {}
    for p in PHASES:
        vals = [((s.gpu_phases if on_gpu else s.phases) or {}).get(p, 0.0) for s in steps]
        if any(vals) or p != "eval":
            phase_mean[p] = sum(vals) / n
    total = sum(phase_mean.values()) or 1.0
    phases = {}
    for p, sec in phase_mean.items():
        entry = {
            "seconds": sec,
            "share": sec / total,
            "host_seconds": sum(s.phases.get(p, 0.0) for s in steps) / n,
        }
        if on_gpu:
            entry["gpu_seconds"] = sec
            entry["idle_exposed_s"] = (
                sum((s.idle_exposed or {}).get(p, 0.0) for s in steps) / n
            )
        phases[p] = entry
    step_s = _median(times)
    tokens = _median([float(s.tokens) for s in steps])
    micro = _median([float(s.micro_steps) for s in steps])
    return {
        "timeline": "gpu" if on_gpu else "host",
        "n_steps": n,
        "step_s": step_s,
        "mean_step_s": total,  # sum of the mean phase seconds: the denominator of every share
        "step_s_p10": _quantile(times, 0.1),
        "step_s_p90": _quantile(times, 0.9),
        "step_s_min": min(times),
        "step_s_max": max(times),
        "spread": (_quantile(times, 0.9) - _quantile(times, 0.1)) / step_s if step_s else 0.0,
        "host_step_s": _median([s.wall_s for s in steps]),
        "tokens_per_step": int(tokens),
        "micro_steps": int(micro),
        "tokens_per_s": tokens / step_s if step_s else 0.0,
        "phases": phases,
    }


def save(profile: Profile, path: str | os.PathLike) -> None:
    """Write the profile atomically (a temp file in the same folder, then rename)."""
    atomic_write(path, profile.to_json())


def load(path: str | os.PathLike) -> Profile:
    """Read and validate a profile. Every user-causable problem is a one-line GpuprofError."""
    path = Path(path)
    text = read_user_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuprofError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return from_data(data, str(path))


def from_data(data, where: str = "profile") -> Profile:
    tool = data.get("tool") if isinstance(data, dict) else None
    if not isinstance(data, dict) or "schema_version" not in data or not isinstance(tool, dict) or (
        tool.get("name") != "gpuprof"
    ):
        raise GpuprofError(f"{where}: not a gpuprof profile (no schema_version/tool)")
    version = data["schema_version"]
    if not isinstance(version, int):
        raise GpuprofError(f"{where}: schema_version must be an integer")
    if version > SCHEMA_VERSION:
        raise GpuprofError(
            f"{where}: schema version {version} is newer than this gpuprof understands "
            f"({SCHEMA_VERSION}); upgrade gpuprof"
        )
    try:
        prof = Profile.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GpuprofError(f"{where}: malformed gpuprof profile ({exc!r})") from None
    validate_ranks(prof.ranks, where)
    return prof


def validate_ranks(ranks, where: str = "profile") -> list[dict]:
    """A merged profile's rank entries, checked (a one-line GpuprofError, never a traceback
    later): a list of dicts with a unique non-negative integer `rank`, a known `status`, and a
    `profile` that is None or itself a loadable profile."""
    if not isinstance(ranks, list):
        raise GpuprofError(f"{where}: ranks must be a list of rank entries")
    seen = set()
    for e in ranks:
        r = e.get("rank") if isinstance(e, dict) else None
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise GpuprofError(f"{where}: ranks: each entry needs a non-negative integer rank")
        if r in seen:
            raise GpuprofError(f"{where}: ranks: rank {r} appears twice")
        seen.add(r)
    for e in ranks:
        r = e["rank"]
        if e.get("status") not in ("ok", "failed", "interrupted", "missing"):
            raise GpuprofError(f"{where}: ranks: rank {r} has an unknown status {e.get('status')!r}")
        prof = e.get("profile")
        if prof is not None:
            if not isinstance(prof, dict) or prof.get("ranks"):
                raise GpuprofError(f"{where}: ranks: rank {r}'s profile must be one process's profile")
            from_data(prof, f"{where}: rank {r}")
    return ranks


def environment(device: str | None = None) -> dict:
    """What the run ran on: CPU, cores, RAM, OS, Python, torch, CUDA/driver, device name."""
    import psutil
    import torch

    env = {
        "cpu_model": _cpu_model(),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "ram_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "driver": None,
        "device": device,
        "device_name": platform.processor() or platform.machine(),
    }
    if device and str(device).startswith("cuda") and torch.cuda.is_available():
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
    elif device:
        env["device_name"] = f"CPU ({env['cpu_model']})"
    return env


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
