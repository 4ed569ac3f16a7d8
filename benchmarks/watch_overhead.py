"""What `gpuprof watch` costs a long run: the step overhead against the plain script, and
gpuprof's resident memory as the run goes on (issue #30: overhead goal ≤ 1.01, bar 1.05; memory
bounded however long it runs).

The nanoGPT-style fixture (tests/fixtures/nanogpt_train.py, on a generated token file) runs as a
whole process, plain (`python train.py ...`), under `python -m gpuprof diagnose --no-stop
--post-budget 0 train.py ...` and under `python -m gpuprof watch --every 30s --events FILE
--post-budget 0 train.py ...` (the samplers on, as by default), in ABCCBA order (plain, diagnose,
watch, watch, diagnose, plain): one *group* (`--no-diagnose`: ABBA, plain and watch only). Every
run lasts the same number of iterations, calibrated first so that each lasts `--minutes` × 60 ÷
(runs per group × --pairs) seconds. The issue's bar is watch's overhead no higher than
diagnose's: both are measured in the same groups. Step times are the
fixture's own printed `time T ms` and `cpu C ms` (its dt and process CPU per iteration), so both
sides are timed by the same code; the first 5% of each run's iterations are skipped (iter 0 holds
the eval and allocator warm-up). Per group: median(watch iterations) ÷ median(plain iterations), and
the same for diagnose, for wall time, its 10th percentiles (other processes only add time) and
CPU time.

Memory: each run's resident set size (psutil, the process's RSS: the script and, under watch,
gpuprof with it) every --rss-every seconds. Reported: watch's RSS minus plain's at the same
fraction of the run (gpuprof's own memory), and each run's growth from 50% to 90% of its wall
time (MiB per hour, least squares over its RSS samples; the last tenth holds the report): a bounded recorder levels
off, where one that keeps every step would grow linearly with the steps.

Side by side (`--memory-only SECONDS --with-plain`): the plain script and the script under watch
run at the same time, one core each, for as many iterations; each iteration's line is stamped
as it arrives, and over each `--bucket` seconds of their common span the ratio of their median
iterations (wall and CPU) is taken; the median of those ratios is the overhead. Runs one after
another meet a machine whose speed drifts by several percent over minutes (its other tenants,
its clock: plain runs of one group differed by 3.5%); runs side by side meet the same machine
in each bucket. What side by side cannot give: watch's sampler threads need CPU, and on a
2-core machine with both cores busy the scheduler takes it from either process, so the wall
ratio can understate watch's cost by up to that; the CPU ratio (each process's own CPU per
iteration, its threads included) does not. `--with-diagnose` puts `diagnose --no-stop` in the
plain script's place: the issue's bar, watch's overhead no higher than diagnose's, as one ratio
(watch ÷ diagnose) measured in the same seconds.

    python benchmarks/watch_overhead.py --memory-only 1200 --with-plain   # 20 min side by side
    python benchmarks/watch_overhead.py --memory-only 1200 --with-diagnose  # watch beside diagnose --no-stop
    python benchmarks/watch_overhead.py --minutes 20          # the long run (≈20 min)
    python benchmarks/watch_overhead.py --minutes 2           # a short check
    python benchmarks/watch_overhead.py --minutes 2 --json out.json

Run it on a quiet machine (`nice` it on a shared one); the figures depend on the host's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "nanogpt_train.py"
MODELS = {
    "mid": ["--n_layer=2", "--n_head=4", "--n_embd=128", "--block_size=64", "--batch_size=4"],  # ~70 ms here
    "tiny": [],  # the fixture's defaults: ~17 ms here
}
ITER = re.compile(r"^iter (\d+): loss \S+, time ([\d.]+)ms, mfu [-\d.]+%(?:, cpu ([\d.]+)ms)?", re.M)


def script_args(data_dir: Path, out_dir: Path, model: str, iters: int) -> list[str]:
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--threads=1", "--cpu_time=True",
            "--eval_interval=1000000000", f"--max_iters={iters}", *MODELS[model]]


def run(cmd: list[str], cwd: Path, rss_every: float) -> dict:
    """Run one command; its iterations (index, wall s, cpu s, when its line arrived: monotonic s)
    and its RSS samples (fraction of the run's wall time, bytes)."""
    import psutil

    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ))
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    rss: list[tuple[float, int]] = []
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            rss.append((time.monotonic() - t0, ps.memory_info().rss))
        except psutil.Error:
            pass
        time.sleep(rss_every)
    reader.join()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... exited with {proc.returncode}")
    its = []
    for at, line in lines:
        m = ITER.match(line)
        if m:
            its.append((int(m[1]), float(m[2]) / 1e3, float(m[3]) / 1e3 if m[3] else None, at))
    skip = max(1, len(its) // 20)
    return {"wall_s": wall, "iters": its[skip:], "rss": [(t / wall, b) for t, b in rss]}


def side_by_side(watch: dict, plain: dict, bucket_s: float) -> dict:
    """The step overhead of two runs that ran at the same time (one core each): in each bucket of
    `bucket_s` seconds of their common span, the median iteration of each (wall and CPU) and
    their ratio; the median and quartiles of those ratios. Both runs meet the same machine (its
    other tenants, its clock) in each bucket, which whole runs one after another do not."""
    lo = max(watch["iters"][0][3], plain["iters"][0][3])
    hi = min(watch["iters"][-1][3], plain["iters"][-1][3])
    rows = []
    t = lo
    while t + bucket_s <= hi + 1e-9:
        w = [it for it in watch["iters"] if t <= it[3] < t + bucket_s]
        p = [it for it in plain["iters"] if t <= it[3] < t + bucket_s]
        if len(w) >= 5 and len(p) >= 5:
            row = {"t_s": round(t - lo, 1), "watch_ms": statistics.median(x[1] for x in w) * 1e3,
                   "other_ms": statistics.median(x[1] for x in p) * 1e3}
            row["wall_ratio"] = row["watch_ms"] / row["other_ms"]
            if w[0][2] is not None and p[0][2] is not None:
                row["cpu_ratio"] = statistics.median(x[2] for x in w) / statistics.median(x[2] for x in p)
            rows.append(row)
        t += bucket_s

    def summary(key):
        xs = [r[key] for r in rows if r.get(key) is not None]
        if not xs:
            return None
        q = np.quantile(xs, [0.25, 0.5, 0.75])
        return {"median": float(q[1]), "q1": float(q[0]), "q3": float(q[2]), "min": min(xs), "max": max(xs),
                "buckets": len(xs)}

    return {"bucket_s": bucket_s, "common_s": hi - lo, "wall_ratio": summary("wall_ratio"),
            "cpu_ratio": summary("cpu_ratio"), "buckets": rows}


def rss_at(r: dict, frac: float) -> float | None:
    pts = [b for f, b in r["rss"] if f <= frac]
    return float(pts[-1]) if pts else None


def growth_mib_per_h(r: dict) -> float | None:
    """Least-squares slope of RSS from half to 90% of the run, MiB per hour (the last tenth holds
    the end of the script and, under watch, the report: not the training's memory)."""
    pts = [(f * r["wall_s"], b) for f, b in r["rss"] if 0.5 <= f <= 0.9]
    if len(pts) < 3:
        return None
    t, b = np.array(pts, dtype=float).T
    return float(np.polyfit(t, b, 1)[0]) * 3600 / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0, help="Total wall time of the measured runs (default 20).")
    ap.add_argument("--pairs", type=int, default=1, help="ABCCBA groups (6 runs each, 4 with --no-diagnose; default 1).")
    ap.add_argument("--model", choices=sorted(MODELS), default="mid")
    ap.add_argument("--every", default="30s", help="watch's window (default 30s).")
    ap.add_argument("--rss-every", type=float, default=2.0, help="Seconds between RSS samples (default 2).")
    ap.add_argument("--no-diagnose", action="store_true", help="ABBA of plain and watch only (no diagnose runs).")
    ap.add_argument("--json", type=Path, help="Also write the figures here.")
    ap.add_argument("--with-plain", action="store_true",
                    help="With --memory-only: the plain script beside the watch run, as long, for its RSS.")
    ap.add_argument("--with-diagnose", action="store_true",
                    help="With --memory-only: `diagnose --no-stop` beside the watch run instead (watch ÷ diagnose).")
    ap.add_argument("--bucket", type=float, default=60.0,
                    help="With --memory-only --with-plain/--with-diagnose: seconds per bucket of the side-by-side "
                         "ratio (default 60).")
    ap.add_argument("--memory-only", type=float, metavar="SECONDS",
                    help="Only gpuprof's memory: one watch run of about this long (no plain runs), its RSS over time.")
    a = ap.parse_args()
    if a.with_plain and a.with_diagnose:
        raise SystemExit("--with-plain and --with-diagnose: one beside the watch run, not both (two cores)")
    if a.memory_only:
        return memory_only(a)
    if a.minutes <= 0 or a.pairs < 1:
        raise SystemExit("--minutes must be positive and --pairs at least 1")
    with tempfile.TemporaryDirectory(prefix="gpuprof-watch-bench-") as tmp:
        tmp = Path(tmp)
        train, step = prepare(tmp, a)
        plain = [sys.executable, str(train)]
        order = ("plain", "watch", "watch", "plain") if a.no_diagnose else (
            "plain", "diagnose", "watch", "watch", "diagnose", "plain")
        run_s = a.minutes * 60 / (len(order) * a.pairs)
        iters = max(50, int(run_s / step))
        print(f"calibration: {step * 1e3:.1f} ms per iteration; {len(order) * a.pairs} runs of {iters} iterations "
              f"(~{run_s:.0f} s each)", flush=True)
        watch = [sys.executable, "-m", "gpuprof", "watch", "--every", a.every, "--events", str(tmp / "ev.jsonl"),
                 "--post-budget", "0", str(train)]
        diagnose = [sys.executable, "-m", "gpuprof", "diagnose", "--no-stop", "--post-budget", "0", str(train)]
        commands = {"plain": plain, "watch": watch, "diagnose": diagnose}
        pairs = []
        for p in range(a.pairs):
            runs = {"plain": [], "watch": [], "diagnose": []}
            for side in order:
                cmd = commands[side] + script_args(tmp / "data", tmp / "out", a.model, iters)
                r = run(cmd, tmp, a.rss_every)
                runs[side].append(r)
                print(f"group {p + 1}: {side}: {len(r['iters'])} iterations in {r['wall_s']:.0f} s, median "
                      f"{statistics.median(it[1] for it in r['iters']) * 1e3:.2f} ms, RSS at 90% "
                      f"{(rss_at(r, 0.9) or 0) / 2**20:.0f} MiB", flush=True)
            pairs.append(runs)
        events = (tmp / "ev.jsonl").read_text().count('"kind": "window"')
    rows = []
    for runs in pairs:
        def pooled(side, k):
            return [it[k] for r in runs[side] for it in r["iters"] if it[k] is not None]
        pw, ww, dw = pooled("plain", 1), pooled("watch", 1), pooled("diagnose", 1)
        pc, wc, dc = pooled("plain", 2), pooled("watch", 2), pooled("diagnose", 2)
        mem = {}
        for frac in (0.25, 0.5, 0.9):
            diffs = [rss_at(w, frac) - rss_at(p, frac) for w, p in zip(runs["watch"], runs["plain"])
                     if rss_at(w, frac) is not None and rss_at(p, frac) is not None]
            mem[f"gpuprof_rss_mib_at_{int(frac * 100)}pct"] = statistics.fmean(diffs) / 2**20 if diffs else None
        rows.append({
            "wall_ratio": statistics.median(ww) / statistics.median(pw),
            "p10_ratio": float(np.quantile(ww, 0.1) / np.quantile(pw, 0.1)),
            "cpu_ratio": statistics.median(wc) / statistics.median(pc) if pc and wc else None,
            "diagnose_wall_ratio": statistics.median(dw) / statistics.median(pw) if dw else None,
            "diagnose_p10_ratio": float(np.quantile(dw, 0.1) / np.quantile(pw, 0.1)) if dw else None,
            "diagnose_cpu_ratio": statistics.median(dc) / statistics.median(pc) if dc and pc else None,
            "plain_median_ms": statistics.median(pw) * 1e3, "watch_median_ms": statistics.median(ww) * 1e3,
            "iterations_per_side": len(ww),
            "watch_rss_mib_at_90pct": [rss_at(r, 0.9) / 2**20 for r in runs["watch"]],
            "plain_rss_mib_at_90pct": [rss_at(r, 0.9) / 2**20 for r in runs["plain"]],
            "watch_growth_mib_per_h": [growth_mib_per_h(r) for r in runs["watch"]],
            "plain_growth_mib_per_h": [growth_mib_per_h(r) for r in runs["plain"]],
            **mem,
        })
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "model": a.model, "minutes": a.minutes, "pairs": a.pairs, "every": a.every,
              "iterations_per_run": iters, "windows_in_last_watch_run": events, "rows": rows,
              "command": " ".join(["python", "benchmarks/watch_overhead.py", *sys.argv[1:]])}
    for i, r in enumerate(rows, 1):
        print(f"group {i}: watch: wall median ratio {r['wall_ratio']:.4f} (plain {r['plain_median_ms']:.2f} ms, watch "
              f"{r['watch_median_ms']:.2f} ms), p10 ratio {r['p10_ratio']:.4f}, CPU ratio "
              f"{r['cpu_ratio']:.4f}"
              + (f"; diagnose --no-stop: wall {r['diagnose_wall_ratio']:.4f}, p10 {r['diagnose_p10_ratio']:.4f}, "
                 f"CPU {r['diagnose_cpu_ratio']:.4f}" if r["diagnose_wall_ratio"] is not None else "")
              + f"; gpuprof's own RSS (watch − plain) at 25/50/90% of the run: "
              + ", ".join(f"{r[k]:.1f}" if r[k] is not None else "n/a" for k in
                          ("gpuprof_rss_mib_at_25pct", "gpuprof_rss_mib_at_50pct", "gpuprof_rss_mib_at_90pct"))
              + " MiB; RSS growth from 50 to 90% of the run (MiB/h): watch "
              + ", ".join(f"{g:.1f}" if g is not None else "n/a" for g in r["watch_growth_mib_per_h"])
              + ", plain " + ", ".join(f"{g:.1f}" if g is not None else "n/a" for g in r["plain_growth_mib_per_h"]))
    if len(rows) > 1:
        print(f"median over {len(rows)} groups: watch wall {statistics.median(r['wall_ratio'] for r in rows):.4f}, "
              f"p10 {statistics.median(r['p10_ratio'] for r in rows):.4f}"
              + (f"; diagnose wall {statistics.median(r['diagnose_wall_ratio'] for r in rows):.4f}"
                 if rows[0]["diagnose_wall_ratio"] is not None else ""))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))


def prepare(tmp: Path, a) -> tuple[Path, float]:
    """The fixture copied into `tmp` with its token files, and one plain iteration's seconds (a
    40-iteration calibration run)."""
    (tmp / "data").mkdir()
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        rng.integers(0, 256, 200_000, dtype=np.uint16).tofile(tmp / "data" / f"{split}.bin")
    train = tmp / "train.py"
    train.write_text(FIXTURE.read_text())
    cal = run([sys.executable, str(train)] + script_args(tmp / "data", tmp / "out", a.model, 40), tmp, a.rss_every)
    return train, statistics.median(it[1] for it in cal["iters"])


def memory_only(a) -> None:
    """One watch run of about `--memory-only` seconds: its RSS at each tenth of the run and its
    growth from 50% to 90% (MiB/h). The caps (steps kept, sampler samples, the live panel's steps)
    fill within the first ~2 minutes; after that a bounded recorder levels off. --with-plain runs
    the plain script beside it, at the same time and for as many iterations (one thread each, one
    core each), so that what grows in both (the script, torch) is told from what grows under
    watch only (gpuprof)."""
    with tempfile.TemporaryDirectory(prefix="gpuprof-watch-mem-") as tmp:
        tmp = Path(tmp)
        train, step = prepare(tmp, a)
        iters = max(50, int(a.memory_only / step))
        watch = [sys.executable, "-m", "gpuprof", "watch", "--every", a.every, "--events", str(tmp / "ev.jsonl"),
                 "--post-budget", "0", str(train)]
        cmds = {"watch": watch + script_args(tmp / "data", tmp / "out", a.model, iters)}
        if a.with_plain:
            cmds["plain"] = [sys.executable, str(train)] + script_args(tmp / "data", tmp / "out-plain", a.model, iters)
        elif a.with_diagnose:  # the same script under diagnose, run to its end (its samplers at diagnose's rates)
            cmds["diagnose"] = [sys.executable, "-m", "gpuprof", "diagnose", "--no-stop", "--post-budget", "0",
                                str(train)] + script_args(tmp / "data", tmp / "out-diagnose", a.model, iters)
        results: dict = {}
        threads = [threading.Thread(target=lambda k=k, c=c: results.__setitem__(k, run(c, tmp, a.rss_every)))
                   for k, c in cmds.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    out = {}
    for name, r in results.items():
        tenths = {f"{k * 10}%": (rss_at(r, k / 10) or 0) / 2**20 for k in range(1, 10)}
        growth = growth_mib_per_h(r)
        print(f"{name}, {len(r['iters'])} iterations in {r['wall_s']:.0f} s: RSS (MiB) at "
              + ", ".join(f"{k} {v:.1f}" for k, v in tenths.items())
              + (f"; growth from 50 to 90% {growth:.1f} MiB/h" if growth is not None else ""))
        out[name] = {"seconds": r["wall_s"], "iterations": len(r["iters"]), "rss_mib": tenths,
                     "growth_mib_per_h": growth}
    overhead = None
    other = next((k for k in ("plain", "diagnose") if k in results), None)
    if other is not None:
        overhead = side_by_side(results["watch"], results[other], a.bucket)
        overhead["against"] = other
        for key in ("wall_ratio", "cpu_ratio"):
            v = overhead[key]
            if v:
                print(f"side by side, {v['buckets']} buckets of {a.bucket:g} s: watch ÷ {other} {key.split('_')[0]} "
                      f"median {v['median']:.4f} (IQR {v['q1']:.4f}–{v['q3']:.4f}; min–max {v['min']:.4f}–{v['max']:.4f})")
    if a.json:
        a.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": a.model,
                                      "runs": out, "side_by_side": overhead,
                                      "command": " ".join(["python", "benchmarks/watch_overhead.py", *sys.argv[1:]])},
                                     indent=2))


if __name__ == "__main__":
    main()
