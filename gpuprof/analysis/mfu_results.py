"""The typed results of the MFU analysis: a measured run's (MfuResult, from
gpuprof.analysis.mfu.compute_mfu) and a training log's (LogAnalysis, from
gpuprof.analysis.logs.analyze_log), and what both say about an MFU a script printed
(MisreportCause).

Frozen dataclasses, so nothing downstream changes a figure after it is judged (the bounds check
makes a new MfuResult with dataclasses.replace). `to_dict()` gives the JSON they are saved and
printed as, key for key and in the same order as the dicts they replace (`analysis.mfu` in a
profile file, `gpuprof analyze --log --json`); `from_dict` reads it back, a key an older file
lacks reading as None (an empty tuple for a list), a key this version does not know left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

# A printed MFU's causes (MisreportCause.cause), as analysis.mfu.explain_misreport names them.
AGREES, CANNOT_CHECK, IMPOSSIBLE = "agrees", "cannot_check", "impossible"


def _known(cls, d: dict | None) -> dict:
    """The keys of `d` that are fields of `cls`, every field present (None when `d` lacks it)."""
    d = d or {}
    return {f.name: d.get(f.name) for f in fields(cls)}


@dataclass(frozen=True)
class MisreportCause:
    """One reason a printed MFU differs from the true one (or that it agrees, or cannot be
    checked): a cause id, the sentence, and the figures it rests on.

    Not a Finding: a cause is one piece of the evidence of the `mfu-misreported` finding (whose
    note joins their sentences), it has no saving, fix or rank of its own, and it is saved as
    {cause, text, evidence}."""

    cause: str  # agrees | a100_constant | unsynchronized_timing | a100_constant+unsynchronized_timing
    #             | sparse_peak | unexplained | a100_constant_possible | cannot_check | impossible
    text: str
    evidence: dict = field(default_factory=dict)  # reported_pct, true_pct, ratio, peak_tflops, predicted_ratio

    def to_dict(self) -> dict:
        return {"cause": self.cause, "text": self.text, "evidence": dict(self.evidence)}

    @classmethod
    def from_dict(cls, d: dict) -> "MisreportCause":
        return cls(cause=str(d.get("cause") or ""), text=str(d.get("text") or ""),
                   evidence=dict(d.get("evidence") or {}))


def _causes(items) -> tuple[MisreportCause, ...]:
    return tuple(MisreportCause.from_dict(m) for m in items or () if isinstance(m, dict))


@dataclass(frozen=True)
class MfuResult:
    """True MFU of a measured run: fractions (0.31), not percentages, except reported_mfu_pct.
    The field order is the saved JSON's key order."""

    device: str | None = None  # the profile's environment.device ("cuda:0", "cpu")
    device_name: str | None = None
    gpu_key: str | None = None  # the GPU table's row (hardware.py), when one matched
    gpu_name: str | None = None
    dtype: str | None = None  # the dtype whose peak is the denominator
    peak_tflops: float | None = None  # None: no datasheet peak (CPU, a GPU not in the table)
    peak_source: str | None = None  # "datasheet (...)" or "--peak-tflops"
    bandwidth_tb_s: float | None = None  # the table row's memory bandwidth; saved only when set
    flops_per_step: float | None = None
    flops_method: str | None = None  # analytic | counted
    flops_analytic_per_step: float | None = None
    flops_counted_per_step: float | None = None
    flops_agreement: float | None = None  # counted / analytic
    tokens_per_step: int | None = None
    step_s: float | None = None  # the typical step
    timeline: str | None = None  # the clock of step_s: gpu | host
    achieved_tflops: float | None = None
    mfu: float | None = None  # vs the datasheet peak
    ceiling_tflops: float | None = None  # the measured matmul ceiling in the step's dtype
    ceiling_method: str | None = None
    ceiling_dtype: str | None = None
    ceiling_share_of_peak: float | None = None
    mfu_vs_ceiling: float | None = None
    floor_s: float | None = None  # FLOPs ÷ peak: the fastest this step can run here
    floor_s_ceiling: float | None = None  # FLOPs ÷ measured ceiling
    expected_step_s: dict | None = None  # "40%" -> the step at that MFU (hardware.EXPECTED_MFU)
    step_over_floor: float | None = None
    warnings: tuple[str, ...] = ()
    reported_mfu_pct: float | None = None  # an MFU the script printed or --reported-mfu gave, in %
    reported_source: str | None = None  # "script output" | "--reported-mfu"
    reported_step_s: float | None = None  # the step time the script printed
    misreport: tuple[MisreportCause, ...] = ()  # why reported_mfu_pct differs from mfu
    reported_impossible: bool | None = None  # reported_mfu_pct above 100%

    @property
    def device_label(self) -> str | None:
        """The GPU's table name, else the device's reported name."""
        return self.gpu_name or self.device_name

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "bandwidth_tb_s" and v is None:
                continue  # only a datasheet row has one: the dict never held the key otherwise
            if f.name == "warnings":
                v = list(v)
            elif f.name == "misreport":
                v = [m.to_dict() for m in v]
            elif f.name == "expected_step_s" and v is not None:
                v = dict(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> "MfuResult | None":
        """The result saved as `analysis.mfu`; None when there is none."""
        if not isinstance(d, dict):
            return None
        kw = _known(cls, d)
        kw["warnings"] = tuple(str(w) for w in d.get("warnings") or ())
        kw["misreport"] = _causes(d.get("misreport"))
        if kw["expected_step_s"] is not None:
            kw["expected_step_s"] = dict(kw["expected_step_s"])
        return cls(**kw)


@dataclass(frozen=True)
class LogVerdict:
    """The logged step against its FLOP floor (analysis.logs.STEP_VERDICTS)."""

    id: str  # impossible | suspicious | healthy | fair | slow
    text: str


@dataclass(frozen=True)
class SizeRow:
    """The log's "if the model were…" table: one GPT-2 size at the logged step time."""

    model: str
    params: int
    flops_per_token: float
    floor_s: float
    true_mfu_at_step: float | None = None
    nanogpt_mfu_at_step: float | None = None


@dataclass(frozen=True)
class LogAnalysis:
    """What a training log alone implies (analysis.logs.analyze_log). The field order is the
    JSON's key order (`gpuprof analyze --log --json`, where the CLI adds the findings)."""

    path: str
    format: str | None = None  # the log's format (gpuprof.steplog): nanogpt, build-nanogpt, llm.c, hf-trainer
    iter_lines: int = 0
    eval_lines: int = 0
    skipped_lines: int = 0
    steady_lines: int = 0
    first_iter: int | None = None
    last_iter: int | None = None
    tokens_per_s_printed: float | None = None
    step_s_median: float | None = None
    step_s_p10: float | None = None
    step_s_p90: float | None = None
    reported_mfu_pct: float | None = None  # nanoGPT's printed MFU (median), in %
    reported_mfu_lines: int = 0
    last_loss: float | None = None
    tokens_per_step: int | None = None  # per GPU
    world_size: int = 1
    gpu_key: str | None = None
    gpu_name: str | None = None
    dtype: str | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None
    flops_per_step: float | None = None
    flops_source: str | None = None
    flops_per_token: float | None = None
    flops_per_token_config: float | None = None
    config_consistency: float | None = None  # printed FLOPs per token ÷ the config's
    implied_params: float | None = None
    implied_params_method: str | None = None
    nearest_gpt2: str | None = None
    true_mfu: float | None = None
    floor_s: float | None = None
    expected_step_s: dict | None = None  # "40%" -> the step at that MFU
    best_achievable_step_s: float | None = None
    step_over_floor: float | None = None
    verdict: LogVerdict | None = None
    misreport: tuple[MisreportCause, ...] = ()
    size_table: tuple[SizeRow, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "verdict" and v is not None:
                v = {"id": v.id, "text": v.text}
            elif f.name == "misreport":
                v = [m.to_dict() for m in v]
            elif f.name == "size_table":
                v = [{g.name: getattr(r, g.name) for g in fields(r)} for r in v]
            elif f.name == "warnings":
                v = list(v)
            elif f.name == "expected_step_s" and v is not None:
                v = dict(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "LogAnalysis":
        kw = {k: v for k, v in _known(cls, d).items() if v is not None}  # missing: the default
        v = d.get("verdict")
        kw["verdict"] = LogVerdict(str(v.get("id")), str(v.get("text") or "")) if isinstance(v, dict) else None
        kw["misreport"] = _causes(d.get("misreport"))
        kw["size_table"] = tuple(SizeRow(**_known(SizeRow, r)) for r in d.get("size_table") or () if isinstance(r, dict))
        kw["warnings"] = tuple(str(w) for w in d.get("warnings") or ())
        kw["path"] = str(d.get("path") or "")
        return cls(**kw)
