"""Issue #29's Done-when: does the same script get the same advice on a rerun, and does each
promised interval cover what the fix achieves when applied?

tests/fixtures/argparse_train.py (an llm.c-style argparse script: its own GPT, AdamW, a headered
token file, a `(N ms |` line per step), compute-bound, in bf16 autocast with a small micro-batch.
`--scenario precision` (batch 2 × 8 accumulation, sequence 128): the precision fix is the top one
(the step runs faster in fp32 on a CPU where bf16 is emulated, and also where bf16 matmuls are
faster but the whole step is not); `--scenario microbatch` (batch 1 × 16, sequence 64): each
micro-step's fixed cost is most of it and one micro-step of 16 in place of 16 of 1 is the top fix.

Each of R runs (default 5), in a row:
  1. `gpuprof diagnose` the script as it is (BEFORE); every profile passes the bounds checker;
     record every fix: id, kind, saving_s, its interval (saving_low_s-saving_high_s), tied_with.
  2. For each of precision-slow and micro-batch-too-small that claims a saving with an interval
     and is not capped by a higher-ranked fix's claim (its figure is then not what it saves alone),
     apply it (precision: `--dtype float32`; micro-batch: the finding's batch_size and
     gradient_accumulation_steps) and time the script plain, without gpuprof, in alternating
     pairs BEFORE, AFTER, AFTER, BEFORE (`--pairs` such rounds): each plain run's median step line
     after its first 2. Each ABBA round's share saved is 1 − (its two AFTER) ÷ (its two BEFORE);
     the achieved share is the median of the rounds' shares (robust to one process that ran at
     another speed: on this VM one plain run took 0.75–1.6× its neighbours while other work shared
     the cores), the mean-based 1 − mean(AFTER) ÷ mean(BEFORE) kept beside it (`share_mean`).
The bars (issue #29): the top fix is the same in every run, or a run says the top two are tied
(`tied_with`); no fix is claimed in one run and absent from another without an interval saying
so (shown as "within noise" information); the promised interval holds the achieved saving in at
least 4 of 5 runs, for each of the two fixes claimed.

The promise is judged as a share of the step: the interval ÷ the diagnosed typical step against
the achieved share of the plain BEFORE step. A seconds figure holds only at the speed the machine
ran at when it was measured; on this VM the plain BEFORE step moved 447-530 ms between runs and
gpuprof's own step 435-666 ms (docs/measurements/2026-12-03-advice-repeat.md), so a saving in
seconds is judged at the diagnosed speed only for information (`covered_s`).

    python benchmarks/advice_repeat.py [--runs 5] [--pairs 2] [--post-budget 20] [--scenario S]

Children run with OMP_NUM_THREADS=1 (benchmarks/precision_fix.py says why). Prints a table per
run, the verdicts, and exits 1 when a bar is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "fixtures" / "argparse_train.py"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))

STEPS, WARMUP, PLAIN_STEPS = 6, 2, 14
# The script's settings per scenario: "precision" (its top fix is the precision switch, the
# micro-batch costing little), "microbatch" (batch 1 of 64 tokens: each micro-step's fixed cost is
# most of it, so fewer, larger micro-steps are the top fix and the precision switch the second).
SCENARIOS = {
    "precision": ["--batch_size", "2", "--grad_accumulation_steps", "8", "--sequence_length", "128",
                  "--dtype", "bfloat16"],
    "microbatch": ["--batch_size", "1", "--grad_accumulation_steps", "16", "--sequence_length", "64",
                   "--dtype", "bfloat16"],
}
BEFORE = SCENARIOS["precision"]
TIMED = ("precision-slow", "micro-batch-too-small")
COVER_BAR = 4 / 5
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def diagnose(tokens: Path, out: Path, post_budget: float) -> dict:
    from gpuprof.analysis.bounds import violations
    from gpuprof.analysis.pipeline import Analysis
    from gpuprof.profile import from_data

    _run([sys.executable, "-m", "gpuprof", "diagnose", "--steps", str(STEPS), "--warmup", str(WARMUP),
          "--out", str(out), "--post-budget", str(post_budget), str(SCRIPT), "--input_bin", str(tokens),
          "--num_iterations", str(STEPS + WARMUP + 6), *BEFORE], out.parent)
    prof = json.loads(out.read_text())
    loaded = from_data(prof)
    bad = violations(loaded, Analysis.from_dict(prof["analysis"], loaded))
    if bad:
        raise SystemExit(f"{out.name}: impossible figures: {bad}")
    return prof


PLAIN_LOG: list = []  # every plain run's step times, for --json


def plain(tokens: Path, args: list[str]) -> float:
    """The script without gpuprof: the median of its step lines after the first 2 (seconds)."""
    r = _run([sys.executable, str(SCRIPT), "--input_bin", str(tokens), "--num_iterations", str(PLAIN_STEPS), *args],
             tokens.parent)
    times = [float(m) / 1e3 for m in re.findall(r"\(([0-9.]+) ms \|", r.stdout)]
    PLAIN_LOG.append({"args": args, "steps_s": times})
    return statistics.median(times[2:])


def applied(fix: dict) -> list[str] | None:
    """BEFORE with the finding's change applied, or None when it names none this script takes."""
    out = dict(zip(BEFORE[::2], BEFORE[1::2]))
    if fix["id"] == "precision-slow":
        if fix["evidence"].get("faster_dtype") != "fp32":
            return None
        out["--dtype"] = "float32"
    else:
        ov = fix.get("config_overrides") or {}
        if "batch_size" not in ov:
            return None
        out["--batch_size"] = str(ov["batch_size"])
        out["--grad_accumulation_steps"] = str(ov.get("gradient_accumulation_steps", 1))
    return [x for kv in out.items() for x in kv]


def achieved(tokens: Path, after: list[str], pairs: int) -> dict:
    """BEFORE, AFTER, AFTER, BEFORE, `pairs` times: each way's plain steps and what the fix saved."""
    runs = {"before": [], "after": []}
    for _ in range(pairs):
        for which in ("before", "after", "after", "before"):
            runs[which].append(plain(tokens, BEFORE if which == "before" else after))
    b, a = runs["before"], runs["after"]
    return {"before": b, "after": a}


def judge(c: dict) -> dict:
    """The achieved share from the plain rounds and whether the promise holds it (c updated)."""
    b, a = c["before"], c["after"]
    rounds = [1 - (a[2 * i] + a[2 * i + 1]) / (b[2 * i] + b[2 * i + 1]) for i in range(len(b) // 2)]
    share = statistics.median(rounds)
    lo, hi = c["share_low"], c["share_high"]
    saved_s = share * statistics.median(b)  # at the plain BEFORE step's speed
    c.update(round_shares=rounds, share=share, share_mean=1 - statistics.mean(a) / statistics.mean(b),
             covered=lo <= share <= hi,
             # the achieved figure is itself measured: its rounds' range (for 4 ABBA rounds, 87.5%
             # for their median) meeting the promise is "consistent"
             share_rounds_low=min(rounds), share_rounds_high=max(rounds),
             consistent=min(rounds) <= hi and lo <= max(rounds),
             covered_mean=lo <= 1 - statistics.mean(a) / statistics.mean(b) <= hi,
             saved_s=saved_s, covered_s=c["low"] <= saved_s <= c["high"])
    return c


def fixes_of(prof: dict) -> list[dict]:
    out = []
    for f in prof["analysis"]["findings"]:
        ev = f.get("evidence") or {}
        if f["kind"] != "fix" and not ev.get("within_noise"):
            continue
        out.append({"id": f["id"], "kind": f["kind"], "saving_s": f.get("saving_s"), "low": ev.get("saving_low_s"),
                    "high": ev.get("saving_high_s"), "level": ev.get("interval_level"), "rounds": ev.get("rounds"),
                    "within_noise": bool(ev.get("within_noise")), "tied_with": f.get("tied_with") or [],
                    "confidence": f.get("confidence"), "overlaps": f.get("overlaps") or [],
                    # capped by a higher-ranked fix's claim (engine.rank notes it): its figure is what
                    # the higher fix left, not what it saves alone
                    "capped": "saving capped from" in (f.get("note") or ""), "finding": f})
    return out


def one_run(k: int, tokens: Path, tmp: Path, pairs: int, post_budget: float, keep: Path | None = None) -> dict:
    prof = diagnose(tokens, tmp / f"run{k}.json", post_budget)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"run{k}.json").write_text(json.dumps(prof))
    del PLAIN_LOG[:]
    fixes = fixes_of(prof)
    claimed = [f for f in fixes if f["saving_s"] is not None]
    top = max(claimed, key=lambda f: f["saving_s"]) if claimed else None
    cover = {}
    for f in fixes:
        if f["id"] not in TIMED or f["saving_s"] is None or f["low"] is None:
            continue
        after = applied(f["finding"])
        if after is None:
            continue
        if f["capped"]:
            continue  # capped by a higher-ranked fix's claim: its figure is not what it saves alone
        got = achieved(tokens, after, pairs)
        step = prof["analysis"]["steps"]["step_s"]
        cover[f["id"]] = judge(dict(got, low=f["low"], high=f["high"], promised=f["saving_s"], step_s=step,
                                    share_low=f["low"] / step, share_high=f["high"] / step, args=after))
    return {"run": k, "step_s": prof["analysis"]["steps"]["step_s"], "fixes": fixes, "plain": list(PLAIN_LOG),
            "top": top["id"] if top else None, "top_tied": top["tied_with"] if top else [], "cover": cover}


def verdicts(runs: list[dict]) -> list[tuple[str, bool, str]]:
    out = []
    tops = {r["top"] for r in runs}
    tied = all(r["top_tied"] for r in runs if r["top"] != runs[0]["top"])
    out.append(("same top fix (or a tie said)", len(tops) == 1 or tied,
                f"top fix per run: {[r['top'] for r in runs]}; tied_with: {[r['top_tied'] for r in runs]}"))
    seen = {f["id"] for r in runs for f in r["fixes"] if f["saving_s"] is not None}
    flips = [(fid, r["run"]) for fid in seen for r in runs if fid not in {f["id"] for f in r["fixes"]}]
    out.append(("no claimed fix vanishes without its interval saying so", not flips,
                f"claimed in some run, absent (not even within noise) in: {flips or 'none'}"))
    for fid in TIMED:
        claimed = [r for r in runs if any(f["id"] == fid and f["saving_s"] is not None for f in r["fixes"])]
        alone = [r for r in claimed
                 if any(f["id"] == fid and not f.get("capped", bool(f.get("overlaps"))) for f in r["fixes"])]
        if not alone:
            out.append((f"{fid}: not judged here (claimed in {len(claimed)} runs, capped by a higher-ranked fix "
                        f"in each: its figure is not what it saves alone)", True, "see the table"))
            continue
        cov = [r["cover"][fid]["covered"] for r in alone if fid in r["cover"]]
        ok = len(cov) == len(alone) and sum(cov) >= COVER_BAR * len(alone)
        secs = sum(r["cover"][fid].get("covered_s", False) for r in runs if fid in r["cover"])
        cons = [r["cover"][fid]["consistent"] for r in alone if fid in r["cover"] and "consistent" in r["cover"][fid]]
        means = [r["cover"][fid]["covered_mean"] for r in alone if fid in r["cover"] and "covered_mean" in r["cover"][fid]]
        out.append((f"{fid}: interval holds the achieved share of the step", ok,
                    f"{sum(cov)} of {len(cov)} timed runs covered ({len(runs)} runs, {len(alone)} with it uncapped; "
                    f"in seconds at the diagnosed "
                    f"step's speed: {secs} of {len(cov)}"
                    + (f"; the achieved rounds' range meets the promise in {sum(cons)} of {len(cons)}" if cons else "")
                    + (f"; the mean-based achieved share inside in {sum(means)} of {len(means)}" if means else "")
                    + ")"))
    return out


def ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def main(argv=None) -> int:
    from argparse_train import write_tokens

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=2, help="ABBA rounds of the plain script per fix and run")
    ap.add_argument("--post-budget", type=float, default=20.0, help="each diagnose's --post-budget")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="precision",
                    help="the script's settings (precision: the precision fix on top; microbatch: the micro-batch one)")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--keep", help="keep each diagnose's profile in this folder (run1.json, ...)")
    ap.add_argument("--verdicts-of", metavar="JSON", help="judge the runs a --json file holds again; nothing run")
    ap.add_argument("--reanalyze", metavar="DIR", help="with --verdicts-of: the --keep folder of those runs; each "
                    "profile is analysed again by today's rules (the promise read anew, the plain rounds as kept)")
    a = ap.parse_args(argv)
    if a.verdicts_of:
        runs = json.loads(Path(a.verdicts_of).read_text())
        for r in runs:  # judged again by today's rule (older files: the mean-based share)
            fresh = _reanalyzed(Path(a.reanalyze) / f"run{r['run']}.json") if a.reanalyze else None
            if fresh is not None:
                r["fixes"] = fresh
                claimed = [f for f in fresh if f["saving_s"] is not None]
                top = max(claimed, key=lambda f: f["saving_s"]) if claimed else None
                r["top"], r["top_tied"] = (top["id"], top["tied_with"]) if top else (None, [])
            for fid, c in r["cover"].items():
                f = next((x for x in (fresh or []) if x["id"] == fid), None)
                if f is not None and f["low"] is not None:
                    step = r["step_s"]
                    c.update(low=f["low"], high=f["high"], promised=f["saving_s"],
                             share_low=f["low"] / step, share_high=f["high"] / step)
                judge(c)
            if a.reanalyze:
                for f in r["fixes"]:
                    c = r["cover"].get(f["id"])
                    print(f"run {r['run']}: {f['id']:24} {f['kind']:4} promised "
                          + (f"{c['share_low']:.1%}-{c['share_high']:.1%}, achieved {c['share']:.1%} "
                             f"(rounds {c['share_rounds_low']:.1%}-{c['share_rounds_high']:.1%}): "
                             f"{'inside' if c['covered'] else 'OUTSIDE'}" if c else "(not timed plain)"))
        return _print_verdicts(runs)
    global BEFORE
    BEFORE = SCENARIOS[a.scenario]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tokens = tmp / "tokens.bin"
        write_tokens(tokens, np.random.default_rng(0).integers(0, 512, 200_000))
        runs = []
        for k in range(1, a.runs + 1):
            runs.append(one_run(k, tokens, tmp, a.pairs, a.post_budget, Path(a.keep) if a.keep else None))
            r = runs[-1]
            print(f"run {k}: step {ms(r['step_s'])} ms; top {r['top']} (tied with {r['top_tied'] or 'none'})")
            for f in r["fixes"]:
                c = r["cover"].get(f["id"])
                got = (f"; achieved {ms(c['saved_s'])} ms (before {ms(statistics.mean(c['before']))}, after "
                       f"{ms(statistics.mean(c['after']))}) = {c['share']:.1%} of the plain step against "
                       f"{c['share_low']:.1%}-{c['share_high']:.1%} promised: {'inside' if c['covered'] else 'OUTSIDE'}"
                       + (f" (rounds {c['share_rounds_low']:.1%}-{c['share_rounds_high']:.1%})" if "share_rounds_low" in c else "")
                       ) if c else ""
                print(f"  {f['id']:24} {f['kind']:4} saves {ms(f['saving_s']):>6} ms ({ms(f['low'])}-{ms(f['high'])}, "
                      f"{f['rounds']} rounds, {f['confidence']}){' within noise' if f['within_noise'] else ''}{got}",
                      flush=True)
    if a.json:
        for r in runs:
            for f in r["fixes"]:
                f.pop("finding")
        Path(a.json).write_text(json.dumps(runs, indent=1))
    return _print_verdicts(runs)


def _reanalyzed(path: Path) -> list[dict] | None:
    """The fixes of a kept profile, analysed again by today's rules (None when it was not kept)."""
    from gpuprof.analysis.pipeline import AnalysisOptions, analyze
    from gpuprof.profile import from_data

    if not path.exists():
        return None
    prof = json.loads(path.read_text())
    prof["analysis"] = analyze(from_data(prof), AnalysisOptions()).to_dict()
    return fixes_of(prof)


def _print_verdicts(runs: list[dict]) -> int:
    results = verdicts(runs)
    for name, ok, why in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {why}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
