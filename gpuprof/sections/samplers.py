"""The samplers' sections: `host` (psutil, measure/host.py) and `nvml` (measure/nvml.py, per GPU
and, for the first GPU, at the top level). Each keeps a summary per figure over the measured
steps (Stat), the mean per phase (SamplerPhase) and a timeline (kept as stored: a table of
series the renderers draw)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.sections.base import Record, Section, items, mapping, number


@dataclass(frozen=True)
class Stat(Record):
    """One figure over the measured steps' samples (measure/sampling.stats)."""

    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    n: int | None = None


@dataclass(frozen=True)
class SamplerPhase:
    """The samples that fell in one phase: how many, and each figure's mean over them."""

    samples: int = 0
    figures: dict = field(default_factory=dict)  # figure -> mean (None: never read in this phase)

    @classmethod
    def from_dict(cls, d) -> "SamplerPhase":
        d = mapping(d)
        return cls(samples=number(d.get("samples")) or 0,
                   figures={k: number(v) for k, v in d.items() if k != "samples"})

    def figure(self, key: str) -> float | None:
        return self.figures.get(key)


@dataclass(frozen=True)
class Cost(Record):
    """What the sampler thread itself cost."""

    thread_cpu_s: float | None = None
    busy_s: float | None = None
    share_of_one_core: float | None = None
    duration_s: float | None = None


def _summary(d: dict) -> dict:
    return {k: Stat.from_dict(v) for k, v in mapping(d.get("summary")).items()}


def _phases(d: dict) -> dict:
    return {k: SamplerPhase.from_dict(v) for k, v in mapping(d.get("phases")).items()}


class _Figures:
    """Accessors over `summary` and `phases` (a sampler section, or one GPU of it)."""

    summary: dict
    phases: dict

    def stat(self, key: str) -> Stat:
        """The figure over the measured steps (an empty Stat when it was not read)."""
        return self.summary.get(key) or Stat()

    def mean(self, key: str) -> float | None:
        return self.stat(key).mean

    def phase(self, name: str, key: str) -> float | None:
        """The figure's mean over the samples taken while `name` ran; None when it was not read
        or no sample fell in that phase."""
        p = self.phases.get(name)
        return p.figure(key) if p is not None and p.samples else None


@dataclass(frozen=True)
class SamplerSection(_Figures, Section):
    available: bool | None = None
    reason: str | None = None  # why the sampler was not available
    interval_s: float | None = None
    samples: int | None = None
    late_ticks: int | None = None
    errors: int | None = None
    cost: Cost = field(default_factory=Cost)
    unreadable: dict = field(default_factory=dict)  # figure -> the error that kept it unread
    summary: dict[str, Stat] = field(default_factory=dict)
    phases: dict[str, SamplerPhase] = field(default_factory=dict)
    timeline: dict | None = None  # {"t_s": [...], figure: [...]}, as stored

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"cost": Cost.from_dict(d.get("cost")), "summary": _summary(d), "phases": _phases(d)}


@dataclass(frozen=True)
class HostSection(SamplerSection):
    """measurements.host: the machine's and this run's CPU, memory and reads."""

    cpu_count: int | None = None
    data_path: str | None = None
    disk: str | None = None
    disk_reason: str | None = None
    merged_short: int | None = None
    dropped: dict = field(default_factory=dict)  # reason -> samples dropped


@dataclass(frozen=True)
class NvmlGpu(_Figures, Record):
    """One GPU in measurements.nvml.gpus."""

    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None
    sm_clock_max_mhz: float | None = None
    power_limit_w: float | None = None
    summary: dict[str, Stat] = field(default_factory=dict)
    phases: dict[str, SamplerPhase] = field(default_factory=dict)
    throttle_share: dict = field(default_factory=dict)
    timeline: dict | None = None

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"summary": _summary(d), "phases": _phases(d)}


@dataclass(frozen=True)
class NvmlSection(SamplerSection):
    """measurements.nvml: every GPU the run used (`gpus`); summary, phases and clock-event
    reasons at the top level are the first GPU's."""

    gpus: tuple[NvmlGpu, ...] = ()
    throttle_share: dict = field(default_factory=dict)  # clock-event reason -> share of samples

    @classmethod
    def _nested(cls, d: dict) -> dict:
        gpus = tuple(NvmlGpu.from_dict(g) for g in items(d.get("gpus")) if isinstance(g, dict))
        return {**super()._nested(d), "gpus": gpus}

    @property
    def first(self) -> NvmlGpu:
        """The first GPU (an empty one when none was read)."""
        return self.gpus[0] if self.gpus else NvmlGpu()

    def throttle(self, reason: str) -> float | None:
        """The share of samples with this clock-event reason, None when it was never seen."""
        return number(self.throttle_share.get(reason))
