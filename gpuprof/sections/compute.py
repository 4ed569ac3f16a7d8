"""The post-run measurements of what the device computes (measure/probe.py, precisions.py,
flops.py, microbatch.py, copies.py, syncs.py) and the CUDA memory figures (measure/cuda.py):
`probe`, `flops`, `microbatch`, `memory`, `copies`, `syncs`."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.sections.base import Record, Section, items, key, mapping, number


@dataclass(frozen=True)
class Switch(Section):
    """probe.precisions.switch: the model itself timed in the faster dtype (None figures and a
    `not_measured` reason when it could not be)."""

    from_: str | None = key("from")
    to: str | None = None
    # "matmul rate": `to` multiplies markedly faster; "runner-up": no dtype does and `to` is the
    # full precision timed beside a half-precision CPU run (hardware.runner_up); None: older profile
    chosen_by: str | None = None
    ratio: float | None = None  # the faster dtype's forward+backward time ÷ the run's
    fwd_bwd_per_micro_s: float | None = None
    run_fwd_bwd_per_micro_s: float | None = None
    # the run's dtype timed eagerly beside it (paired rounds; before them: a compiled run only)
    eager_fwd_bwd_per_micro_s: float | None = None
    method: str | None = None
    # Paired rounds (measure/paired.py): the ratio's interval (Interval.as_dict), the rounds, and
    # each round's seconds per dtype (per call). None in profiles written before them: the ratio
    # then compared the faster dtype's best of 2 with the run's own forward+backward.
    interval: dict | None = None
    rounds: int | None = None
    round_seconds: dict | None = None
    round_s: float | None = None  # one round's planned seconds, its untimed calls included (measure/settle.py)


@dataclass(frozen=True)
class MatmulShape(Record):
    k: int | None = None
    n: int | None = None
    flops_share: float | None = None


@dataclass(frozen=True)
class Precisions(Section):
    """probe.precisions: the matmul rate of each dtype at the model's own shapes."""

    method: str | None = None
    m: int | None = None
    covered_share: float | None = None
    tflops: dict[str, float] = field(default_factory=dict)  # dtype -> TFLOP/s (empty: not measured)
    shapes: tuple[MatmulShape, ...] = ()
    skipped: dict = field(default_factory=dict)
    # a half precision decided slower than the run's dtype (`reference`) before all its shapes
    # were timed: dtype -> at least this many times the reference's matmul time (no rate for it)
    slower: dict = field(default_factory=dict)
    reference: str | None = None
    switch: Switch = field(default_factory=Switch)

    @classmethod
    def _nested(cls, d: dict) -> dict:
        rates = {k: v for k, v in mapping(d.get("tflops")).items() if number(v) is not None}
        shapes = tuple(MatmulShape.from_dict(s) for s in items(d.get("shapes")) if isinstance(s, dict))
        return {"tflops": rates, "shapes": shapes, "switch": Switch.from_dict(d.get("switch"))}

    def rate(self, dtype: str) -> float | None:
        return self.tflops.get(dtype)


@dataclass(frozen=True)
class ProbeSection(Section):
    """measurements.probe: the square-matmul ceiling of the device in the run's dtype, and the
    precisions at the model's shapes (`not_measured` says why the ceiling is missing; the
    precisions may still be there)."""

    tflops: float | None = None
    tflops_mean: float | None = None
    method: str | None = None
    dtype: str | None = None
    requested_dtype: str | None = None
    device: str | None = None
    error: str | None = None
    seconds: float | None = None
    precisions: Precisions = field(default_factory=Precisions)

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"precisions": Precisions.from_dict(d.get("precisions"))}


@dataclass(frozen=True)
class FlopsSection(Section):
    """measurements.flops: analytic and counted model FLOPs per optimizer step, and which is used."""

    used: str | None = None  # "analytic" | "counted"
    analytic_per_step: float | None = None
    analytic_per_token: float | None = None
    counted_per_step: float | None = None
    counted_per_token: float | None = None
    agreement: float | None = None  # counted ÷ analytic
    tokens_per_step: int | None = None
    micro_steps_per_step: int | None = None


@dataclass(frozen=True)
class MicrobatchPoint(Record):
    batch_size: int | None = None
    seconds: float | None = None  # forward+backward of one micro-batch of that size


@dataclass(frozen=True)
class MicrobatchPair(Section):
    """microbatch.pair: the run's micro-batch (b2/B micro-steps) against one of b2, the same
    tokens, in paired rounds: the ratio larger/run, its interval (measure/paired.py
    Interval.as_dict), the rounds and each round's seconds. Absent in profiles written before
    them."""

    batch_size: int | None = None
    new_batch_size: int | None = None
    micro_steps_each: int | None = None
    ratio: float | None = None
    interval: dict | None = None
    rounds: int | None = None
    round_seconds: dict | None = None
    round_s: float | None = None  # one round's planned seconds, its untimed calls included (measure/settle.py)
    method: str | None = None


@dataclass(frozen=True)
class MicrobatchSection(Section):
    """measurements.microbatch: forward+backward time per micro-batch size, and its line fit."""

    method: str | None = None
    batch_size: int | None = None
    fixed_s: float | None = None
    per_sample_s: float | None = None
    fixed_share_at_batch: float | None = None
    points: tuple[MicrobatchPoint, ...] = ()
    pair: MicrobatchPair = field(default_factory=MicrobatchPair)

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"points": tuple(MicrobatchPoint.from_dict(p) for p in items(d.get("points")) if isinstance(p, dict)),
                "pair": MicrobatchPair.from_dict(d.get("pair"))}

    def seconds_by_batch(self) -> dict:
        """batch size -> measured seconds of one micro-batch."""
        return {p.batch_size: p.seconds for p in self.points}


@dataclass(frozen=True)
class MemorySection(Section):
    """measurements.memory (CUDA): the peak memory the run allocated and the device's capacity."""

    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    capacity_bytes: int | None = None
    device: str | None = None


@dataclass(frozen=True)
class CopiesSection(Section):
    """measurements.copies (CUDA): host-to-device bandwidth from pageable and pinned memory."""

    pageable_bytes_s: float | None = None
    pinned_bytes_s: float | None = None
    pageable_copies: int | None = None
    pinned_copies: int | None = None


@dataclass(frozen=True)
class SyncsSection(Section):
    """measurements.syncs: host-device synchronizations in the measured steps."""

    per_step: float | None = None  # outside the copies' own
    per_phase: dict | None = None  # phase -> total over the measured steps
    measured_steps: int | None = None
    total: int | None = None
    in_copies_per_step: float | None = None
    calls: dict | None = None
    torch_own_in_steps: int | None = None  # torch's own syncs (cudagraph_trees recording), apart
    torch_own_places: dict | None = None


@dataclass(frozen=True)
class AttentionCall(Record):
    """One attention in the traced forward: by hand (masked/causal/dropout as seen) or an SDPA call
    (backend: the kernel torch ran; refused: why flash was not allowed, CUDA)."""

    module: str | None = None
    shape: list = field(default_factory=list)  # (B, H, T, head dim)
    dtype: str | None = None
    masked: bool | None = None
    causal: bool | None = None
    mask: bool | None = None
    is_causal: bool | None = None
    dropout_p: float | None = None
    backend: str | None = None
    refused: list = field(default_factory=list)
    # torch's own attention (gpuprof.measure.optrace): "nn.MultiheadAttention", the need_weights it
    # was called with, and the user's call site (file:line); None for the user's own code
    torch_module: str | None = None
    need_weights: bool | None = None
    call_site: str | None = None


@dataclass(frozen=True)
class AttentionTiming(Section):
    """One attention layer timed by hand and through SDPA, forward and backward."""

    by_hand_forward_s: float | None = None
    by_hand_backward_s: float | None = None
    sdpa_forward_s: float | None = None
    sdpa_backward_s: float | None = None
    rounds: int | None = None
    shape: list = field(default_factory=list)
    dtype: str | None = None
    method: str | None = None
    per: str | None = None  # "model": the whole model's forward+backward (need_weights); else one layer
    # Paired rounds (measure/pair_rounds.py): the interval of sdpa ÷ by_hand, forward+backward
    # (Interval.as_dict), and each round's seconds per way (per layer, or per model); the
    # seconds above are then the rounds' medians. None in profiles written before them (best of each).
    interval: dict | None = None
    round_seconds: dict | None = None
    # the user's by-hand attention timed in the whole model (measure/attention_rewrite.py): how many
    # calls ran through SDPA per forward; else why the model was not timed (the layers were, alone)
    layers_rewritten: int | None = None
    model_not_timed: str | None = None


@dataclass(frozen=True)
class AttentionSection(Section):
    """kernels.attention: how the traced forward computes attention, and the by-hand timing."""

    by_hand: tuple[AttentionCall, ...] = ()
    sdpa: tuple[AttentionCall, ...] = ()
    layers: int | None = None
    timed_layers: int | None = None
    method: str | None = None
    error: str | None = None
    timing: AttentionTiming = field(default_factory=AttentionTiming)  # the user's own by-hand layers
    # torch's nn.MultiheadAttention called with need_weights=True: `by_hand_*` with it, `sdpa_*` without
    mha_timing: AttentionTiming = field(default_factory=AttentionTiming)

    @classmethod
    def _nested(cls, d: dict) -> dict:
        calls = {k: tuple(AttentionCall.from_dict(c) for c in items(d.get(k)) if isinstance(c, dict))
                 for k in ("by_hand", "sdpa")}
        return {**calls, "timing": AttentionTiming.from_dict(d.get("timing")),
                "mha_timing": AttentionTiming.from_dict(d.get("mha_timing"))}


@dataclass(frozen=True)
class PairTiming(Section):
    """A timed pair: the run's way and the changed way (vocab_s/padded_s, current_s/fused_s)."""

    vocab_s: float | None = None
    padded_s: float | None = None
    current_s: float | None = None
    fused_s: float | None = None
    tokens: int | None = None
    parameters: int | None = None
    rounds: int | None = None
    method: str | None = None
    # Paired rounds (measure/pair_rounds.py): the interval of the changed way ÷ the run's
    # (padded ÷ vocab, fused ÷ current; Interval.as_dict) and each round's seconds per way; the
    # seconds above are then the rounds' medians. None in profiles written before them (best of each).
    interval: dict | None = None
    round_seconds: dict | None = None


@dataclass(frozen=True)
class VocabSection(Section):
    """kernels.vocab: the output projection's vocabulary and, when not a multiple of 64, timed padded."""

    vocab: int | None = None
    width: int | None = None
    module: str | None = None
    multiple: int | None = None
    padded_vocab: int | None = None
    timing: PairTiming = field(default_factory=PairTiming)

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"timing": PairTiming.from_dict(d.get("timing"))}


@dataclass(frozen=True)
class OptimizerSection(Section):
    """kernels.optimizer: the run's Adam/AdamW, how it steps, and a copy timed with fused=True."""

    class_: str | None = key("class")
    mode: str | None = None  # fused | foreach | for-loop (None: not Adam/AdamW)
    fused_unavailable: str | None = None
    timing: PairTiming = field(default_factory=PairTiming)

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"timing": PairTiming.from_dict(d.get("timing"))}


@dataclass(frozen=True)
class KernelsSection(Section):
    """measurements.kernels (measure/kernels.py): attention, vocabulary and optimizer, each as the
    run has it and timed changed."""

    attention: AttentionSection = field(default_factory=AttentionSection)
    vocab: VocabSection = field(default_factory=VocabSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    seconds: float | None = None

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"attention": AttentionSection.from_dict(d.get("attention")),
                "vocab": VocabSection.from_dict(d.get("vocab")),
                "optimizer": OptimizerSection.from_dict(d.get("optimizer"))}


@dataclass(frozen=True)
class CompileSection(Section):
    """measurements.compile (`diagnose --measure-compile`, measure/compiled.py): the eager run's model
    compiled after the run, forward+backward eager vs compiled, and the compile's own time."""

    eager_s: float | None = None
    compiled_s: float | None = None
    compile_s: float | None = None
    rounds: int | None = None
    backend: str | None = None
    method: str | None = None
    # Paired rounds (measure/pair_rounds.py): the interval of compiled ÷ eager (Interval.as_dict)
    # and each round's seconds per way; eager_s/compiled_s are then the rounds' medians. None in
    # profiles written before them (best of each).
    interval: dict | None = None
    round_seconds: dict | None = None
