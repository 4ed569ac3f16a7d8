"""The throughput model: a micro-step costs a fixed part plus a part per token.

    micro_step_s(B) = fixed_s + per_token_s × B × T
    step_s(B, A)    = A × micro_step_s(B) + optimizer_s

`fixed_s` is what a micro-step costs whatever its size (fetching a batch, kernel launches,
Python); `per_token_s` is the forward + backward compute per token; `optimizer_s` is paid once
per optimizer step (clip, AdamW, zero_grad). Fewer, bigger micro-steps save (A − A') × fixed_s
and nothing else: the per-token work of an optimizer step is the same for every split.

Three sources, each saying what it is:
- `from_profile`: one measured run. Its data + h2d phases are taken as the fixed part, forward +
  backward as the per-token part; the range runs from that split to "nothing is fixed".
- `from_points`: a least-squares line through measured (tokens, seconds) micro-steps (`--measure`).
- `from_flops`: no measurement: FLOPs per token ÷ (dense peak × MFU) with MFU 30-50%, a fixed
  1 ms per micro-step and a memory-bound AdamW — an estimate, and labelled so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from gpuprof.errors import GpuprofError
from gpuprof.hardware import PLANNED_MFU, GpuSpec
from gpuprof.dims import ADAMW_CLIPPED_BYTES_PER_PARAM, GPTConfig, flops_per_token, param_count

ASSUMED_FIXED_S = 0.001  # per micro-step when nothing was measured: batch fetch + host overhead


@dataclass(frozen=True)
class ThroughputModel:
    fixed_s: float
    per_token_s: float
    optimizer_s: float
    source: str  # "profile" | "measured" | "flops"
    note: str
    per_token_s_low: float | None = None  # optimistic end of the range (None: same as central)
    per_token_s_high: float | None = None
    fixed_s_low: float | None = None
    fixed_s_high: float | None = None

    def micro_step_s(self, batch_size: int, block_size: int) -> float:
        return self.fixed_s + self.per_token_s * batch_size * block_size

    def step_s(self, batch_size: int, block_size: int, grad_accum: int) -> float:
        return grad_accum * self.micro_step_s(batch_size, block_size) + self.optimizer_s

    def step_range(self, batch_size: int, block_size: int, grad_accum: int) -> tuple[float, float]:
        """(fast, slow) ends of the model's range for one optimizer step."""
        tok = batch_size * block_size
        lo = grad_accum * (_or(self.fixed_s_low, self.fixed_s)
                           + _or(self.per_token_s_low, self.per_token_s) * tok) + self.optimizer_s
        hi = grad_accum * (_or(self.fixed_s_high, self.fixed_s)
                           + _or(self.per_token_s_high, self.per_token_s) * tok) + self.optimizer_s
        return min(lo, hi), max(lo, hi)

    def scaled(self, factor: float, note: str) -> "ThroughputModel":
        """Per-token costs × factor (another block size or model, by its FLOPs per token)."""
        return replace(
            self,
            per_token_s=self.per_token_s * factor,
            per_token_s_low=None if self.per_token_s_low is None else self.per_token_s_low * factor,
            per_token_s_high=None if self.per_token_s_high is None else self.per_token_s_high * factor,
            note=f"{self.note}; {note}",
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_profile(cls, profile) -> "ThroughputModel":
        """Fit from one measured run (a gpuprof Profile).

        Per optimizer step the profile's typical step (gpuprof.stats) has phase seconds,
        micro_steps and tokens_per_step. data + h2d per micro-step → fixed_s; forward + backward
        per token → per_token_s; optimizer + other + eval → optimizer_s. Phases are scaled so
        that the model reproduces the measured typical step exactly. The slow end of the
        range puts data + h2d into the per-token part as well (no gain from amortizing)."""
        stats = profile.stats
        if stats is None or not stats.phases or stats.micro_steps <= 0 or stats.tokens_per_step <= 0 \
                or stats.step_s <= 0:
            raise GpuprofError("profile has no measured step with phases, micro-steps and tokens; cannot fit "
                               "a throughput model from it")
        micro, tokens, step = stats.micro_steps, stats.tokens_per_step, stats.step_s
        sec = {k: v.seconds for k, v in stats.phases.items()}
        total = sum(sec.values())
        if total <= 0:
            raise GpuprofError("profile phases add up to zero seconds; cannot fit a throughput model")
        scale = step / total
        fixed_step = (sec.get("data", 0.0) + sec.get("h2d", 0.0)) * scale
        compute = (sec.get("forward", 0.0) + sec.get("backward", 0.0)) * scale
        per_step = step - fixed_step - compute
        fixed = fixed_step / micro
        per_token = compute / tokens
        timeline = stats.timeline
        return cls(
            fixed_s=fixed, per_token_s=per_token, optimizer_s=per_step, source="profile",
            note=(f"fitted to a measured step of {step:.3g} s ({micro} micro-steps, {tokens:,} "
                  f"tokens, {timeline} timeline): data+h2d per micro-step fixed, "
                  f"forward+backward per token"),
            per_token_s_high=(compute + fixed_step) / tokens, fixed_s_high=0.0,
        )

    @classmethod
    def from_points(cls, points: list[tuple[int, float]], optimizer_s: float = 0.0,
                    source: str = "measured", note: str = "") -> "ThroughputModel":
        """Least-squares line seconds = fixed + per_token × tokens through measured micro-steps.

        A negative intercept (noise) is clamped to zero and the slope refitted through the
        origin. The range spans the worst relative residual (at least ±5%)."""
        pts = [(float(t), float(s)) for t, s in points if t > 0 and s > 0]
        if not pts:
            raise GpuprofError("no measured micro-steps to fit a throughput model to")
        if len({t for t, _ in pts}) == 1:
            t0 = pts[0][0]
            mean = sum(s for _, s in pts) / len(pts)
            fixed, slope = 0.0, mean / t0
        else:
            n = len(pts)
            mt = sum(t for t, _ in pts) / n
            ms = sum(s for _, s in pts) / n
            var = sum((t - mt) ** 2 for t, _ in pts)
            slope = sum((t - mt) * (s - ms) for t, s in pts) / var
            fixed = ms - slope * mt
            if fixed < 0 or slope <= 0:
                fixed = 0.0
                slope = sum(t * s for t, s in pts) / sum(t * t for t, _ in pts)
        worst = max(abs(fixed + slope * t - s) / s for t, s in pts)
        rel = max(worst, 0.05)
        return cls(fixed_s=fixed, per_token_s=slope, optimizer_s=optimizer_s, source=source,
                   note=note or f"line through {len(pts)} measured micro-steps",
                   per_token_s_low=slope * (1 - rel), per_token_s_high=slope * (1 + rel),
                   fixed_s_low=fixed * (1 - rel), fixed_s_high=fixed * (1 + rel))

    @classmethod
    def from_flops(cls, cfg: GPTConfig, gpu: GpuSpec, dtype: str, mfu: tuple = PLANNED_MFU
                   ) -> "ThroughputModel":
        """Estimate without measurement: FLOPs/token ÷ (dense peak × MFU), MFU low..high."""
        key = "tf32" if dtype == "fp32" and gpu.peak_tflops("tf32") else dtype
        peak = gpu.peak_tflops(key)
        if not peak:
            raise GpuprofError(f"{gpu.name} has no {key} peak in the hardware table; "
                               f"measure with --measure or pass --from a profile")
        fpt = flops_per_token(cfg)
        lo, mid, hi = mfu
        per = lambda m: fpt / (peak * 1e12 * m)  # noqa: E731
        # clip + fused AdamW, memory-bound: the optimizer step as nanoGPT runs it
        opt = ADAMW_CLIPPED_BYTES_PER_PARAM * param_count(cfg, non_embedding=False) / (gpu.hbm_tb_s * 1e12)
        return cls(
            fixed_s=ASSUMED_FIXED_S, per_token_s=per(mid), optimizer_s=opt, source="flops",
            note=(f"not measured: {fpt / 1e9:.3g} GFLOP/token ÷ {gpu.name} {key} peak "
                  f"{peak:g} TFLOP/s at {mid:.0%} MFU (range {lo:.0%}-{hi:.0%}), "
                  f"{ASSUMED_FIXED_S * 1e3:g} ms fixed per micro-step assumed"),
            per_token_s_low=per(hi), per_token_s_high=per(lo),
        )


def _or(x, default):
    return default if x is None else x
