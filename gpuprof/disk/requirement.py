"""What the training loop asks of storage, and whether the measured disk can give it.

nanoGPT's get_batch draws every sample at a random offset: one random read of
(block_size + 1) * 2 bytes per sample, so samples/s = tokens/s / block_size, and the reads/s
the disk must sustain equal the samples/s. The time a step's reads take is spent inside the
training loop (get_batch is synchronous), even though the GPU may hide it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gpuprof.disk.bench import TOKEN_BYTES
from gpuprof.errors import GpuprofError

DEFAULT_BLOCK_SIZE = 1024


@dataclass
class Need:
    """The training loop's demand. tokens_per_step is known when the step's shape is."""

    tokens_per_s: float
    block_size: int
    source: str
    step_s: float | None = None
    tokens_per_step: float | None = None
    batch_size: int | None = None

    @property
    def samples_per_s(self) -> float:
        return self.tokens_per_s / self.block_size

    @property
    def reads_per_s(self) -> float:
        return self.samples_per_s  # one random read per sample

    @property
    def bytes_per_read(self) -> int:
        return (self.block_size + 1) * TOKEN_BYTES

    @property
    def mb_s(self) -> float:
        return self.reads_per_s * self.bytes_per_read / 1e6

    @property
    def samples_per_step(self) -> float | None:
        return self.tokens_per_step / self.block_size if self.tokens_per_step else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(samples_per_s=self.samples_per_s, reads_per_s=self.reads_per_s,
                 bytes_per_read=self.bytes_per_read, mb_s=self.mb_s,
                 samples_per_step=self.samples_per_step)
        return d


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise GpuprofError(f"{name} must be a positive number (got {value!r})")
    return float(value)


def load_profile_fields(path: str) -> dict:
    """The five fields bench-disk uses from a gpuprof profile (None where absent): tokens/s and
    the step at the typical step (gpuprof.stats), the batch shape from run.config."""
    from gpuprof.profile import load

    prof = load(path)
    stats, cfg = prof.stats, prof.config
    return {"tokens_per_s": stats.tokens_per_s if stats and stats.tokens_per_step else None,
            "step_s": stats.step_s if stats else None,
            "block_size": cfg.get("block_size"), "batch_size": cfg.get("batch_size"),
            "grad_accum": cfg.get("grad_accum")}


def resolve_need(tokens_per_sec: float | None = None, batch_size: int | None = None,
                 block_size: int | None = None, grad_accum: int | None = None,
                 step_s: float | None = None, profile: str | None = None) -> Need | None:
    """The demand from CLI numbers or a profile (CLI values win), or None if none was asked.

    A requirement is asked for by --tokens-per-sec, --step-s or --profile. Without
    tokens/s it is batch_size * block_size * grad_accum / step_s.
    """
    where = ""
    if profile is not None:
        p = load_profile_fields(profile)
        where = f"profile {profile}: "
        tokens_per_sec = tokens_per_sec if tokens_per_sec is not None else p["tokens_per_s"]
        batch_size = batch_size if batch_size is not None else p["batch_size"]
        block_size = block_size if block_size is not None else p["block_size"]
        grad_accum = grad_accum if grad_accum is not None else p["grad_accum"]
        step_s = step_s if step_s is not None else p["step_s"]
        if block_size is None:
            raise GpuprofError(f"{profile}: run.config.block_size is missing; pass --block-size")
    elif tokens_per_sec is None and step_s is None:
        if grad_accum is not None:
            raise GpuprofError("--grad-accum needs --step-s (and --batch-size) to compute "
                               "the tokens/s the loop needs")
        return None
    block = int(_positive(block_size if block_size is not None else DEFAULT_BLOCK_SIZE,
                          "block_size"))
    tokens_per_step = None
    if batch_size is not None:
        tokens_per_step = (_positive(batch_size, "batch_size") * block
                           * _positive(grad_accum if grad_accum is not None else 1, "grad_accum"))
    if tokens_per_sec is not None:
        src = where + "tokens/s" if profile is not None else "--tokens-per-sec"
        return Need(_positive(tokens_per_sec, "tokens_per_s"), block, src,
                    step_s=_positive(step_s, "step_s") if step_s is not None else None,
                    tokens_per_step=tokens_per_step,
                    batch_size=int(batch_size) if batch_size is not None else None)
    missing = [n for n, v in (("batch_size", batch_size), ("step_s", step_s)) if v is None]
    if missing:
        if profile is not None:
            keys = {"batch_size": "run.config.batch_size", "step_s": "a measured step"}
            raise GpuprofError(f"{profile}: no tokens/s measured, and "
                               f"{', '.join(keys[m] for m in missing)} missing to compute it; "
                               "pass --tokens-per-sec")
        raise GpuprofError("--step-s needs --batch-size (and --grad-accum, --block-size) to "
                           "compute tokens/s; or pass --tokens-per-sec")
    step = _positive(step_s, "step_s")
    src = where + "batch × block × accum ÷ step time" if profile is not None else \
        "--batch-size × --block-size × --grad-accum ÷ --step-s"
    return Need(tokens_per_step / step, block, src, step_s=step,
                tokens_per_step=tokens_per_step, batch_size=int(batch_size))


def _status(headroom: float) -> str:
    if headroom >= 10:
        return "ok"
    if headroom >= 2:
        return "tight"
    if headroom >= 1:
        return "marginal"
    return "too slow"


def _n(x: float) -> str:
    """1050.3 -> '1,050'; 36.2 -> '36'; 2.13 -> '2.1'; 0.042 -> '0.042' (prose numbers)."""
    if x >= 10:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.1f}"
    return f"{x:.2g}"


def assess(need: Need, result: dict) -> dict:
    """Headroom of the measured storage (a bench-disk result dict) over the loop's demand.

    The headline compares reads/s with cold random reads of the loader's sample size at one
    outstanding read (what get_batch does); the loader rows use nanoGPT's memmap sampling.
    """
    label = result["settings"]["read_sizes"][0]
    disk = result["random"][label]
    qd1, par = disk["qd1"]["iops"], disk["parallel"]["iops"]
    need_r, need_mb = need.reads_per_s, need.mb_s
    headroom = qd1 / need_r
    cold = result["loader"]["cold"]["samples_per_s"]
    warm = result["loader"]["warm"]["samples_per_s"]
    out = need.to_dict()
    out.update(
        disk_read_size=label, disk_qd1_iops=qd1, disk_parallel_iops=par,
        headroom=headroom, headroom_parallel=par / need_r,
        headroom_mb_s=disk["qd1"]["mb_s"] / need_mb,
        loader_cold_headroom=cold / need.samples_per_s,
        loader_warm_headroom=warm / need.samples_per_s,
        loader_cold_s_per_step=(need.samples_per_step / cold
                                if need.samples_per_step and cold else None),
        status=_status(headroom),
        loader_status=_status(cold / need.samples_per_s),
    )
    out["verdict"] = (f"needs {_n(need_mb)} MB/s, {_n(need_r)} reads/s; this disk does "
                      f"{_n(qd1)} reads/s at QD1 → {_n(headroom)}× headroom ({out['status']})")
    lc = out["loader_cold_headroom"]
    amp = result["loader"]["cold"].get("read_amplification")
    line = (f"nanoGPT's memmap loader from cold storage: {_n(cold)} samples/s → {_n(lc)}× "
            f"headroom")
    if amp:
        line += f" ({_n(amp)}× read amplification from readahead)"
    line += (f"; from the page cache: {_n(warm)} samples/s → "
             f"{_n(out['loader_warm_headroom'])}×")
    if out["loader_cold_s_per_step"] is not None:
        line += f"; {_n(out['loader_cold_s_per_step'])} s of reads per step while cold"
        if need.step_s:
            line += f" (step: {_n(need.step_s)} s)"
    out["loader_verdict"] = line
    return out


__all__ = ["Need", "resolve_need", "assess", "load_profile_fields"]
