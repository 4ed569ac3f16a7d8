"""How the run was timed, fed and computed: `precision` (what the step's matmuls computed in,
read at the first training forward, measure/precision.py), `timer` (the GPU timeline's CUDA events, measure/timer.py),
`storage` (the data file's filesystem and page cache, measure/storage.py), `comm` (a
data-parallel rank's all-reduces, measure/comm.py) and `post_run` (the budget the post-run
measurements shared, measure/budget.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.sections.base import Record, Section, items, mapping


@dataclass(frozen=True)
class PrecisionSection(Section):
    """measurements.precision (measure/precision.py read_precision, with_observed_matmul): the
    observations — autocast, the weights' dtype, TF32 as every torch API reports it, the dtype the
    largest matmul layer was seen computing in — and the compute dtype derived from them
    (hardware.observed_compute_dtype; "tf32" is fp32 with TF32 matmuls on CUDA). Files written
    before it was a measurement kept it in run.config.precision: Sections reads it from there."""

    compute_dtype: str | None = None
    autocast_dtype: str | None = None
    param_dtype: str | None = None
    tf32_matmul: bool | None = None
    tf32_source: str | None = None
    tf32_note: str | None = None
    fp32_precision: str | None = None
    allow_tf32: bool | None = None
    float32_matmul_precision: str | None = None
    observed_matmul_dtype: str | None = None
    observed_layer: str | None = None
    autocast_note: str | None = None
    error: str | None = None  # the reading failed (the script's run went on)


@dataclass(frozen=True)
class TimerSection(Section):
    gpu_timeline: bool | None = None
    method: str | None = None
    steps_unresolved: list = field(default_factory=list)  # step indices without a GPU span
    reasons: list = field(default_factory=list)  # why their CUDA events could not be read


@dataclass(frozen=True)
class Filesystem(Record):
    mountpoint: str | None = None
    type: str | None = None
    device: str | None = None
    kind: str | None = None  # local | network | fuse | memory | ...
    free_bytes: int | None = None
    total_bytes: int | None = None
    warning: str | None = None
    read_ahead_kb: int | None = None


@dataclass(frozen=True)
class Residency(Record):
    """How much of the data file was in the page cache."""

    known: bool | None = None
    fraction: float | None = None
    resident_bytes: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class StorageSection(Section):
    data_path: str | None = None
    file_bytes: int | None = None
    ram_total_bytes: int | None = None
    ram_available_bytes: int | None = None
    fits_in_ram: bool | None = None
    filesystem: Filesystem = field(default_factory=Filesystem)
    residency_start: Residency = field(default_factory=Residency)
    residency_end: Residency = field(default_factory=Residency)

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"filesystem": Filesystem.from_dict(d.get("filesystem")),
                "residency_start": Residency.from_dict(d.get("residency_start")),
                "residency_end": Residency.from_dict(d.get("residency_end"))}


@dataclass(frozen=True)
class CommStep(Record):
    """One measured step's all-reduces."""

    index: int | None = None
    rounds: int | None = None
    in_flight_s: float | None = None
    exposed_s: float | None = None
    extra_rounds_exposed_s: float | None = None
    extra_rounds_in_flight_s: float | None = None


@dataclass(frozen=True)
class CommSection(Section):
    """measurements.comm: the all-reduces of one data-parallel rank; the figures are medians over
    its measured steps (`per_step`)."""

    method: str | None = None
    clock: str | None = None
    backend: str | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    measured_steps: int | None = None
    rounds_per_step: float | None = None
    buckets_per_round: float | None = None
    bytes_per_round: float | None = None
    in_flight_s: float | None = None
    exposed_s: float | None = None
    overlapped_s: float | None = None
    extra_rounds_exposed_s: float | None = None
    extra_rounds_in_flight_s: float | None = None
    algbw_Bps: float | None = None
    busbw_Bps: float | None = None
    busbw_note: str | None = None  # why there is none (one rank crosses no link)
    incomplete_rounds: int | None = None
    link: dict | None = None  # {"name", "nominal_Bps", ...}, as stored
    per_step: tuple[CommStep, ...] = ()

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"per_step": tuple(CommStep.from_dict(s) for s in items(d.get("per_step")) if isinstance(s, dict))}


@dataclass(frozen=True)
class PostRunPart(Record):
    allotted_s: float | None = None
    spent_s: float | None = None
    skipped: list = field(default_factory=list)


@dataclass(frozen=True)
class PostRunSection(Section):
    budget_s: float | None = None
    source: str | None = None
    spent_s: float | None = None
    interrupted: bool | None = None
    parts: dict[str, PostRunPart] = field(default_factory=dict)  # post-run measurement -> its share

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"parts": {k: PostRunPart.from_dict(v) for k, v in mapping(d.get("parts")).items()}}


@dataclass(frozen=True)
class SettleSection(Section):
    """measurements.settle (measure/settle.py): two fixes whose savings' intervals overlapped, the
    paired rounds added to order them, and whether that settled the ranking (`why` when not); and
    the savings whose interval held no change, with the rounds added to decide them (`noise`)."""

    between: list = field(default_factory=list)
    rounds_before: list = field(default_factory=list)
    rounds_added: list = field(default_factory=list)
    settled: bool | None = None
    why: str | None = None
    # a saving still within noise given more rounds: per fix, {fix, rounds_before, planned,
    # rounds_added, within_noise, why (when the planned rounds did not all fit)}
    noise: list = field(default_factory=list)
