"""measurements.script (runners/script_profile.py): what a profiled script's own log said
(`reported`, gpuprof.steplog), what the hooks counted (`hooks.counts`), and where the stack
sampler found each phase's time in the user's code (`top_functions`, `sampler`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.sections.base import Record, Section, mapping, number

# What ended each step of a script (gpuprof.measure.step_rules): an optimizer step, a gradient
# reset after a backward with no optimizer step, or a loop iteration holding one backward.
STEP_OPTIMIZER, STEP_ZERO_GRAD, STEP_BACKWARD = "optimizer", "zero_grad", "backward"
STEP_RULES = (STEP_OPTIMIZER, STEP_ZERO_GRAD, STEP_BACKWARD)


@dataclass(frozen=True)
class Reported(Record):
    """The script's own step lines, summarised (steplog.reported_summary)."""

    format: str | None = None
    lines: int | None = None
    step_ms_median: float | None = None
    step_ms_source: str | None = None
    tokens_per_s_median: float | None = None
    mfu_pct_median: float | None = None
    mfu_lines: int | None = None
    skipped_first: int | None = None
    ratio: float | None = None
    note: str | None = None
    mfu_note: str | None = None  # why the printed MFU is not taken as a claim (nanochat's 0 where it has no peak)
    first_step_ms: float | None = None  # older profiles: the script's first iteration


@dataclass(frozen=True)
class TopFunction(Record):
    """A user function the stack samples of one phase fell in."""

    function: str | None = None
    file: str | None = None
    line: int | None = None
    hot_line: int | None = None
    share: float | None = None  # of the phase's samples


@dataclass(frozen=True)
class StackSampler(Record):
    """How the user-code stack sampler ran."""

    method: str | None = None
    interval_s: float | None = None
    samples: int | None = None
    misses: int | None = None
    errors: int | None = None


@dataclass(frozen=True)
class StepRule(Record):
    """What ended each step of the script: `rule` (STEP_RULES) and the call that did, in words
    (`marker`: "AdamW.step()", "TransformerModel.zero_grad()"); None in older profiles (then the
    optimizer step, the only rule they had)."""

    rule: str | None = None
    marker: str | None = None
    optimizers_alive: int | None = None  # torch.optim.Optimizer objects, when counted (the backward rule)


@dataclass(frozen=True)
class ScriptSection(Section):
    steps: StepRule = field(default_factory=StepRule)
    reported: Reported = field(default_factory=Reported)
    counts: dict = field(default_factory=dict)  # hooks.counts: hook -> calls over the run
    h2d_note: str | None = None  # hooks.h2d_note
    top_functions: dict[str, tuple[TopFunction, ...]] = field(default_factory=dict)  # phase -> hottest first
    sampler: StackSampler | None = None  # None when the script ran without the stack sampler
    eval_forwards: int | None = None  # older profiles: evaluation forwards in the profiled steps
    # the calls timed as `data` (data_attribution: those found from the first forward's inputs,
    # else the wrapped get_batch-like functions), e.g. "next(train_loader): gen (loader.py:29)"
    loaders: tuple[str, ...] = ()

    @classmethod
    def _nested(cls, d: dict) -> dict:
        hooks = mapping(d.get("hooks"))
        top = {phase: tuple(TopFunction.from_dict(e) for e in entries if isinstance(e, dict))
               for phase, entries in mapping(d.get("top_functions")).items() if isinstance(entries, list)}
        sampler = d.get("sampler")
        att = mapping(d.get("data_attribution"))
        found = mapping(att.get("discovered")).get("timed") or att.get("wrapped") or ()
        return {"loaders": tuple(x for x in found if isinstance(x, str)), "steps": StepRule.from_dict(d.get("steps")),
                "reported": Reported.from_dict(d.get("reported")), "counts": mapping(hooks.get("counts")),
                "h2d_note": hooks.get("h2d_note") or None, "top_functions": top,
                "sampler": StackSampler.from_dict(sampler) if isinstance(sampler, dict) and sampler else None}

    def loader_call(self) -> str | None:
        """The data call in the user's words: `next(train_loader)`, `get_batch`, `DataLoaderLite.next_batch`."""
        if not self.loaders:
            return None
        label = self.loaders[0]
        return label.split(": ", 1)[0] if label.startswith("next(") else label.split(" (", 1)[0]

    def count(self, hook: str) -> int:
        """Calls the hooks counted (0 when they did not count it)."""
        return number(self.counts.get(hook)) or 0

    def top_function(self, phase: str) -> TopFunction | None:
        """The user function most of the phase's stack samples fell in, None without one."""
        entries = self.top_functions.get(phase)
        return entries[0] if entries else None
