"""torch.compile's own records of the run (measure/dynamo.py): `dynamo` -- the graph breaks,
recompilations, recompile-limit hits and compilations dynamo reported while the run went on."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.sections.base import Record, Section, items, mapping


@dataclass(frozen=True)
class GraphBreak(Record):
    """One place dynamo split the compiled code. `file`/`line`: the innermost frame of the user's
    code (not torch's) on the stack dynamo reported; `dynamo_file`/`dynamo_line`: dynamo's own
    innermost frame when it is elsewhere (inside torch)."""

    reason: str | None = None  # dynamo's one-line reason ("Data-dependent branching")
    explanation: str | None = None
    hints: list = field(default_factory=list)  # dynamo's own hints, as it words them
    gb: str | None = None  # dynamo's graph-break page code ("gb0124")
    eager_fallback: bool | None = None  # dynamo gave up on the whole function: it runs eagerly
    file: str | None = None
    line: int | None = None
    where: str | None = None  # "train.py:42"
    user_code: bool | None = None
    dynamo_file: str | None = None
    dynamo_line: int | None = None
    count: int | None = None  # how often dynamo met it while compiling (not per call)
    step_index: int | None = None  # the step it was first met in (warm-up included)
    phase: str | None = None


@dataclass(frozen=True)
class Recompile(Record):
    """One recompilation: the function (its code's file:line), the guard that failed."""

    function: str | None = None  # a code name: "forward", "torch_dynamo_resume_in_forward_at_42"
    code_file: str | None = None
    code_line: int | None = None
    file: str | None = None  # the user's frame (the code's own when it is the user's)
    line: int | None = None
    where: str | None = None
    user_code: bool | None = None
    reason: str | None = None  # the first failed guard: "tensor 'x' size mismatch at index 0. expected 4, actual 8"
    reasons: list = field(default_factory=list)  # every failed guard dynamo listed (newest entry first)
    resume_of: dict | None = None  # {"function", "line"}: the code resumed after a graph break
    step_index: int | None = None
    phase: str | None = None
    compile_id: str | None = None
    compile_s: float | None = None  # how long that recompilation took


@dataclass(frozen=True)
class LimitHit(Record):
    """A function that hit a dynamo recompile limit: it runs eagerly from then on."""

    limit: str | None = None  # "recompile_limit"
    value: str | None = None
    function: str | None = None
    file: str | None = None
    line: int | None = None
    where: str | None = None
    reason: str | None = None
    step_index: int | None = None
    phase: str | None = None


@dataclass(frozen=True)
class Compilation(Record):
    compile_id: str | None = None
    seconds: float | None = None
    step_index: int | None = None
    phase: str | None = None
    trigger: str | None = None  # "dynamo" | "lazy_backward" | ...


@dataclass(frozen=True)
class DynamoSection(Section):
    """measurements.dynamo: what torch.compile reported during the run. `compiled` False (and no
    events): nothing was compiled in the run."""

    compiled: bool | None = None
    graphs: int | None = None  # graphs compiled in the run (counters stats.unique_graphs)
    frames: int | None = None  # frames compiled (counters frames.ok)
    frames_attempted: int | None = None
    compile_s: float | None = None  # time in dynamo compilations during the run
    warmup: int | None = None  # the run's warm-up steps when the run said (step indices count them)
    method: str | None = None
    reason: str | None = None  # why nothing could be compiled
    not_captured: str | None = None  # why breaks and recompiles were not recorded (totals only)
    breaks: tuple[GraphBreak, ...] = ()
    recompiles: tuple[Recompile, ...] = ()
    limit_hits: tuple[LimitHit, ...] = ()
    compiles: tuple[Compilation, ...] = ()
    dropped: dict = field(default_factory=dict)  # events over the caps, by kind

    @classmethod
    def _nested(cls, d: dict) -> dict:
        def read(key, record):
            return tuple(record.from_dict(x) for x in items(d.get(key)) if isinstance(x, dict))

        return {"breaks": read("breaks", GraphBreak), "recompiles": read("recompiles", Recompile),
                "limit_hits": read("limit_hits", LimitHit), "compiles": read("compiles", Compilation),
                "dropped": mapping(d.get("dropped"))}
