"""Do paired intervals agree with each other when the same saving is timed again? And which
statistic covers on a noisy machine? (gpuprof.measure.paired, docs/savings-intervals.md)

Real mode (default): a tiny GPT-shaped model (embedding, 2 pre-norm blocks of causal attention and
a GELU MLP, a vocabulary head; forward + backward of a cross-entropy loss) on this machine's CPU,
timed the run's way (fp32, or attention written by hand) against the changed way (bf16 autocast,
or torch's scaled_dot_product_attention) with pairs.alternate_rounds, in R independent repeats
(a fresh warm-up each). For each repeat: the estimate, its interval, the rounds, and the point
figure the old best-of timing would have printed (best b / best a); then whether every two
repeats' intervals overlap, and whether each holds the pooled estimate (all repeats' rounds
together). It assumes nothing about which way is faster.

Simulation mode (--simulate): the sign-test interval against the Hodges-Lehmann/Wilcoxon interval
and a paired t-interval on simulated rounds of a noisy shared machine (a drifting speed both ways
share, 4% noise per run, spikes 1.2-2.5x on either or one variant): coverage of the true ratio,
median width, and how often a real saving is found (the interval excludes 1).

    python benchmarks/paired_intervals.py                      # fp32 vs bf16 autocast, 5 repeats
    python benchmarks/paired_intervals.py --change sdpa        # attention by hand vs SDPA
    python benchmarks/paired_intervals.py --simulate --sims 4000
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np

from gpuprof.measure import paired, pairs

# The 0.95 quantile of Student's t (a two-sided 90% interval), df 1..30; --simulate only.
T95 = [6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
       1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697]


# -- the real model --------------------------------------------------------------------------------

def make_step(change: str, batch: int, seq: int, width: int, heads: int, vocab: int, seed: int = 0):
    """(the run's way, the changed way): each a zero-argument forward + backward of the same model."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
            self.sdpa = False
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, -1))
            if self.sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(d // heads)
                y = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    torch.manual_seed(seed)
    blocks = [Block(), Block()]
    model = nn.Sequential(nn.Embedding(vocab, width), *blocks, nn.LayerNorm(width), nn.Linear(width, vocab))
    ids = torch.randint(0, vocab, (batch, seq))
    tgt = torch.randint(0, vocab, (batch, seq))

    def step(bf16: bool, sdpa: bool):
        def run():
            for blk in blocks:
                blk.sdpa = sdpa
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(ids)
            F.cross_entropy(logits.float().view(-1, vocab), tgt.view(-1)).backward()
            model.zero_grad(set_to_none=True)
        return run

    if change == "bf16":
        return step(False, True), step(True, True)
    return step(False, False), step(False, True)


def real(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    a_name, b_name = {"bf16": ("fp32", "bf16"), "sdpa": ("by_hand", "sdpa")}[args.change]
    run_a, run_b = make_step(args.change, args.batch, args.seq, args.width, args.heads, args.vocab)
    clock = pairs.Clock("cpu")
    print(f"{a_name} -> {b_name}: batch {args.batch} x {args.seq} tokens, width {args.width}, 2 blocks, "
          f"vocab {args.vocab}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"{args.repeats} repeats of up to {args.rounds} rounds, {args.seconds:g} s each; level {args.level:.0%}")
    t0 = time.perf_counter()
    ivs, bests, all_a, all_b = [], [], [], []
    for r in range(args.repeats):
        res = pairs.alternate_rounds(clock, {a_name: [run_a], b_name: [run_b]}, args.seconds,
                                     max_rounds=args.rounds)
        sa, sb = pairs.round_seconds(res, a_name), pairs.round_seconds(res, b_name)
        all_a += sa
        all_b += sb
        iv = paired.paired_ratio_interval(sa, sb, args.level)
        ivs.append(iv)
        best = sum(res["best"][b_name]) / sum(res["best"][a_name])
        bests.append(best)
        print(f"repeat {r + 1}: {b_name}/{a_name} {iv.estimate:.3f} ({iv.low:.3f}-{iv.high:.3f}, {iv.level:.1%}, "
              f"{iv.n} rounds; {a_name} median {np.median(sa) * 1e3:.1f} ms) "
              f"{paired.confidence(iv)}{', within noise' if paired.within_noise(iv) else ''}; best-of ratio {best:.3f}")
    pooled = paired.paired_ratio_interval(all_a, all_b, args.level)
    pairs_overlap = [paired.tied(x, y) for x, y in itertools.combinations(ivs, 2)]
    holds = [iv.low <= pooled.estimate <= iv.high for iv in ivs]
    print(f"pooled ({pooled.n} rounds): {pooled.estimate:.3f} ({pooled.low:.3f}-{pooled.high:.3f}, {pooled.level:.1%})")
    print(f"every two repeats' intervals overlap: {'yes' if all(pairs_overlap) else 'no'} "
          f"({sum(pairs_overlap)} of {len(pairs_overlap)} pairs)")
    print(f"repeats whose interval holds the pooled estimate: {sum(holds)} of {len(holds)}")
    print(f"best-of ratios across repeats (the old point figure): {min(bests):.3f}-{max(bests):.3f}; "
          f"wall {time.perf_counter() - t0:.1f} s")


# -- the simulation --------------------------------------------------------------------------------

def t_interval(d: np.ndarray) -> tuple[float, float, float]:
    n = d.size
    m, half = d.mean(), T95[min(n - 1, len(T95)) - 1] * d.std(ddof=1) / math.sqrt(n)
    return m, m - half, m + half


def simulated(rng, sims: int, n: int, effect: float, spikes_a: float, spikes_b: float) -> tuple[np.ndarray, ...]:
    shape = (sims, n)
    speed = np.cumsum(rng.normal(0, 0.05, shape), axis=1)
    a = speed + rng.normal(0, 0.04, shape)
    b = speed + effect + rng.normal(0, 0.04, shape)
    a += np.where(rng.random(shape) < spikes_a, np.log1p(rng.uniform(0.2, 1.5, shape)), 0.0)
    b += np.where(rng.random(shape) < spikes_b, np.log1p(rng.uniform(0.2, 1.5, shape)), 0.0)
    return np.exp(a), np.exp(b)


def simulate(args) -> None:
    rng = np.random.default_rng(args.seed)
    scenarios = [("clean", 0.0, 0.0), ("spikes 5% both", 0.05, 0.05), ("spikes 10% both", 0.10, 0.10),
                 ("spikes 5% on B", 0.0, 0.05), ("spikes 15% on B", 0.0, 0.15)]
    print(f"true ratio {args.ratio}; {args.sims} simulations per row; level 90%; "
          "cov = covers the true ratio, width = median (high - low), found = excludes 1")
    print(f"{'scenario':16} {'n':>3} | {'sign (median)':^28} | {'wilcoxon (HL)':^28} | {'paired t':^28}")
    effect = math.log(args.ratio)
    for name, pa, pb in scenarios:
        for n in args.n:
            a, b = simulated(rng, args.sims, n, effect, pa, pb)
            cells = []
            for stat in ("sign", "wilcoxon", "t"):
                cov, widths, found = 0, [], 0
                for x, y in zip(a, b):
                    if stat == "t":
                        _, lo, hi = (math.exp(v) for v in t_interval(np.log(y / x)))
                    else:
                        iv = paired.paired_ratio_interval(x, y, 0.90, stat)
                        lo, hi = iv.low, iv.high
                    cov += lo <= args.ratio <= hi
                    widths.append(hi - lo)
                    found += hi < 1 or lo > 1
                cells.append(f"cov {cov / args.sims:.3f} width {np.median(widths):.3f} found {found / args.sims:.2f}")
            print(f"{name:16} {n:>3} | " + " | ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--change", choices=("bf16", "sdpa"), default="bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=16, help="at most, per repeat")
    ap.add_argument("--seconds", type=float, default=20.0, help="the deadline of each repeat")
    ap.add_argument("--level", type=float, default=0.90)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--ratio", type=float, default=0.9, help="--simulate: the true b/a")
    ap.add_argument("--n", type=int, nargs="+", default=[6, 8, 12, 16], help="--simulate: rounds")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    simulate(args) if args.simulate else real(args)


if __name__ == "__main__":
    main()
