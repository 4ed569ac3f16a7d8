"""The typed results of gpuprof.analysis.distributed: what a merged run's ranks say together.

Frozen dataclasses, so nothing downstream changes a figure after it is judged; `to_dict()` gives
the JSON saved as `analysis.distributed` (every field, None where not measured) and
`DistributedStats.from_dict` reads it back, tolerating the keys older files lack. `MergedView`
reads what gpuprof.merge stored about the rank a merged profile shows (`run.view`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


def _lists(v):
    if isinstance(v, dict):
        return {k: _lists(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_lists(x) for x in v]
    return v


def _pick(cls, d: dict | None) -> dict:
    """The keys of `d` that are fields of `cls` (an older or newer file's others are left out)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in (d or {}).items() if k in names}


@dataclass(frozen=True)
class CollectiveKind:
    """One kind of FSDP2 collective per step (medians over a rank's measured steps)."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0
    backward_calls: int = 0
    backward_seconds: float = 0.0
    wait_seconds: float = 0.0  # functional collectives: the host's wait at first use of the result
    in_flight_seconds: float = 0.0  # functional collectives: from the issue to the end of its wait
    gpu_seconds: float = 0.0  # FSDP2 on CUDA: in flight on its own stream (CUDA events)
    gpu_backward_seconds: float = 0.0
    algbw_Bps: float | None = None  # the job's figure only: bytes / seconds
    busbw_Bps: float | None = None  # algbw × (n−1)/n (nccl-tests)


def _kinds(d: dict | None) -> dict[str, CollectiveKind]:
    return {k: CollectiveKind(**_pick(CollectiveKind, v)) for k, v in (d or {}).items() if isinstance(v, dict)}


@dataclass(frozen=True)
class RankCollectives:
    """A rank's FSDP2 collectives: per kind, and exposed = its `comm` phase per step."""

    by_kind: dict = field(default_factory=dict)  # kind -> CollectiveKind
    exposed_s: float | None = None
    world: int | None = None
    backend: str | None = None
    clock: str | None = None
    gpu_timeline: bool | None = None  # the rank's steps on CUDA events: its host seconds are the enqueueing

    @classmethod
    def from_dict(cls, d: dict | None) -> "RankCollectives | None":
        if not isinstance(d, dict):
            return None
        return cls(**{**_pick(cls, d), "by_kind": _kinds(d.get("by_kind"))})


@dataclass(frozen=True)
class RankComm:
    """A rank's DDP all-reduce figures: medians over its measured steps."""

    in_flight_s: float | None = None
    exposed_s: float | None = None
    extra_rounds_exposed_s: float | None = None
    extra_rounds_in_flight_s: float | None = None
    rounds_per_step: int | None = None
    bytes_per_round: float | None = None
    busbw_Bps: float | None = None
    algbw_Bps: float | None = None
    backend: str | None = None
    clock: str | None = None
    link: dict | None = None

    @classmethod
    def from_dict(cls, d: dict | None) -> "RankComm | None":
        return cls(**_pick(cls, d)) if isinstance(d, dict) else None


@dataclass(frozen=True)
class RankRow:
    """One rank of the run: how it ended and, when it has steps, its figures."""

    rank: int
    node_rank: int | None = None
    host: str | None = None
    status: str | None = None
    error: str | None = None
    ended_in: dict | None = None
    step_s: float | None = None
    phases: dict = field(default_factory=dict)
    data_s: float | None = None
    micro_steps: int | None = None
    tokens_per_step: int | None = None
    n_steps: int | None = None
    comm: RankComm | None = None
    comm_not_measured: str | None = None
    collectives: RankCollectives | None = None
    busy_s: float | None = None  # step − exposed communication
    own_phases: dict = field(default_factory=dict)  # each phase without the communication in it

    @classmethod
    def from_dict(cls, d: dict) -> "RankRow":
        return cls(**{**_pick(cls, d), "comm": RankComm.from_dict(d.get("comm")),
                      "collectives": RankCollectives.from_dict(d.get("collectives")),
                      "phases": d.get("phases") or {}, "own_phases": d.get("own_phases") or {}})


@dataclass(frozen=True)
class Slowest:
    """The busiest rank, by how much (paired step by step with the others), and where."""

    rank: int
    extra_s: float
    step_s: float | None = None
    extra_share: float | None = None
    consistency: float | None = None
    steps_compared: int | None = None
    noise_s: float | None = None
    phase: str | None = None
    phase_extra_s: float | None = None
    by_phase_s: dict = field(default_factory=dict)
    others_busy_s: float | None = None

    @classmethod
    def from_dict(cls, d: dict | None) -> "Slowest | None":
        return cls(**_pick(cls, d)) if isinstance(d, dict) and d.get("rank") is not None else None


@dataclass(frozen=True)
class Waiting:
    rank: int
    waiting_s: float


def _waiting(items) -> tuple[Waiting, ...]:
    return tuple(Waiting(**_pick(Waiting, w)) for w in items or () if isinstance(w, dict))


@dataclass(frozen=True)
class Communication:
    """DDP's all-reduce for the job: the figures of the rank that waited least, every rank's wait."""

    rank: int
    in_flight_s: float | None = None
    exposed_s: float | None = None
    overlapped_s: float | None = None
    overlap_share: float | None = None
    step_s: float | None = None
    rounds_per_step: int | None = None
    micro_steps: int | None = None
    extra_rounds_exposed_s: float | None = None
    extra_rounds_in_flight_s: float | None = None
    bytes_per_round: float | None = None
    busbw_Bps: float | None = None
    algbw_Bps: float | None = None
    backend: str | None = None
    clock: str | None = None
    link: dict | None = None
    waiting: tuple[Waiting, ...] = ()

    @classmethod
    def from_dict(cls, d: dict | None) -> "Communication | None":
        if not isinstance(d, dict) or d.get("rank") is None:
            return None
        return cls(**{**_pick(cls, d), "waiting": _waiting(d.get("waiting"))})


@dataclass(frozen=True)
class JobCollectives:
    """FSDP2's collectives for the job: the rank that waited least (what they cost), every rank's wait."""

    rank: int
    exposed_s: float | None = None
    step_s: float | None = None
    micro_steps: int | None = None
    by_kind: dict = field(default_factory=dict)  # kind -> CollectiveKind
    world: int | None = None
    backend: str | None = None
    clock: str | None = None
    waiting: tuple[Waiting, ...] = ()

    @classmethod
    def from_dict(cls, d: dict | None) -> "JobCollectives | None":
        if not isinstance(d, dict) or d.get("rank") is None:
            return None
        return cls(**{**_pick(cls, d), "by_kind": _kinds(d.get("by_kind")), "waiting": _waiting(d.get("waiting"))})


@dataclass(frozen=True)
class DistributedStats:
    """A merged run's ranks together (gpuprof.analysis.distributed.distributed_stats)."""

    world_size: int
    ranks: tuple[RankRow, ...] = ()
    absent_ranks: tuple[int, ...] = ()
    failed_ranks: tuple[int, ...] = ()
    method: str | None = None
    slowest: Slowest | None = None
    communication: Communication | None = None  # DDP
    collectives: JobCollectives | None = None  # FSDP2

    def rank(self, rank: int) -> RankRow | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def to_dict(self) -> dict:
        """The JSON form (tuples as lists), as saved in `analysis.distributed`."""
        return _lists(asdict(self))

    @classmethod
    def from_dict(cls, d: dict | None) -> "DistributedStats | None":
        if not isinstance(d, dict):
            return None
        return cls(world_size=int(d.get("world_size") or 1),
                   ranks=tuple(RankRow.from_dict(r) for r in d.get("ranks") or () if isinstance(r, dict)),
                   absent_ranks=tuple(d.get("absent_ranks") or ()), failed_ranks=tuple(d.get("failed_ranks") or ()),
                   method=d.get("method"), slowest=Slowest.from_dict(d.get("slowest")),
                   communication=Communication.from_dict(d.get("communication")),
                   collectives=JobCollectives.from_dict(d.get("collectives")))


# The rule by which gpuprof.merge chose the rank a merged profile shows (MergedView.rule).
VIEW_SLOWEST = "slowest-rank"  # the busiest rank (DistributedStats.slowest)
VIEW_LOWEST = "lowest-rank-with-profile"  # no slowest rank: the ranks' communication was not measured on 2


@dataclass(frozen=True)
class MergedView:
    """Whose steps and measurements the top level of a merged profile holds, as gpuprof.merge
    stored them in `run.view`: the rank, the rule that chose it, and each rank's busy seconds per
    step (the figure the slowest-rank rule compares; ranks without it are left out). A profile
    merged before these were stored kept a sentence: `text`, with the rank and rule read from it."""

    rank: int | None
    rule: str | None = None
    busy_s: dict = field(default_factory=dict)  # rank (int) -> busy seconds per step
    text: str | None = None  # an older profile's sentence, as it was stored

    @property
    def slowest(self) -> bool:
        return self.rule == VIEW_SLOWEST

    def to_dict(self) -> dict:
        """The stored form (`run.view`): JSON keys are strings."""
        return {"rank": self.rank, "rule": self.rule, "busy_s": {str(r): s for r, s in self.busy_s.items()}}

    @classmethod
    def of_run(cls, run: dict | None) -> "MergedView | None":
        """The view of a merged profile's `run` (None for a single process's profile)."""
        v = (run or {}).get("view")
        if isinstance(v, str) and v:
            rule = VIEW_SLOWEST if "slowest" in v else VIEW_LOWEST if "lowest" in v else None
            rank = (run or {}).get("rank")
            return cls(rank=rank if isinstance(rank, int) else None, rule=rule, text=v)
        if not isinstance(v, dict):
            return None
        busy = {}
        for r, s in (v.get("busy_s") or {}).items():
            try:
                busy[int(r)] = float(s)
            except (TypeError, ValueError):
                continue
        rank = v.get("rank")
        return cls(rank=rank if isinstance(rank, int) else None, rule=v.get("rule"), busy_s=busy)
