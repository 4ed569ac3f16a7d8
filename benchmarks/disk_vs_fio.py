"""Does `gpuprof bench-disk` agree with fio? Run both on the same file and print the ratios.

    python benchmarks/disk_vs_fio.py [--dir .] [--size BYTES (default 1 GiB)] [--runtime 3] [--rounds 3]
                                     [--bench-size auto|256Mi|...]

Needs fio (`apt-get install -y fio`). Writes one test file (--size) in --dir and removes it.
By default bench-disk reads that same file. With --bench-size, bench-disk is run on --dir
instead, writing its own test file of that --size each round, as a user's `gpuprof
bench-disk DIR` does: that compares bench-disk's default (auto) or an old one (256Mi)
against fio on the --size file.
Rounds alternate fio and bench-disk, in ABBA order (fio first in odd rounds, bench-disk
first in even ones), so a slow patch or a drift of a noisy machine hits both alike. Each
side's figure is the median over rounds (bench-disk's own figure per round is already the
median of its --repeats runs). Printed: the ratio of those medians (the goal: every one
within 0.85-1.15), the median of the per-round paired ratios, and fio's own round-to-round
spread, which is the noise floor of the comparison.

Equivalents (psync = one blocking pread per thread, what bench-disk's readers do):
  sequential 1 MiB direct   fio --rw=read --bs=1M --direct=1 --ioengine=psync
  random 4 KiB / 2 KiB QD1  fio --rw=randread --bs=4k|2k --direct=1 --ioengine=psync
  random 4 KiB, N readers   fio ... --numjobs=N --thread --group_reporting
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys

GOAL = (0.85, 1.15)


def fio_cmd(path: str, rw: str, bs: str, runtime: float, numjobs: int = 1) -> list[str]:
    cmd = ["fio", "--name=cmp", f"--filename={path}", "--readonly", f"--rw={rw}", f"--bs={bs}",
           "--direct=1", "--ioengine=psync", "--iodepth=1", "--norandommap",
           "--time_based", f"--runtime={runtime}", "--output-format=json"]
    if numjobs > 1:
        cmd += [f"--numjobs={numjobs}", "--thread", "--group_reporting"]
    return cmd


def run_fio(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    read = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    pct = read["clat_ns"].get("percentile", {})
    return {"iops": read["iops"], "mb_s": read["bw_bytes"] / 1e6,
            "p50_ms": pct.get("50.000000", 0) / 1e6, "p99_ms": pct.get("99.000000", 0) / 1e6}


def run_bench(path: str, runtime: float, readers: int, size: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "gpuprof", "bench-disk", path, "--json",
           "--duration", str(runtime), "--readers", str(readers)]
    if size is not None:
        cmd += ["--size", size]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def make_file(directory: str, size: int) -> str:
    path = os.path.join(directory, f".gpuprof-fio-compare-{os.getpid()}.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        chunk = 8 << 20
        written = 0
        while written < size:
            written += os.write(fd, os.urandom(min(chunk, size - written)))
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".", help="where the test file goes")
    ap.add_argument("--size", type=int, default=1 << 30, help="test file bytes (1 GiB)")
    ap.add_argument("--runtime", type=float, default=3.0, help="seconds per fio job and per "
                    "bench-disk cold run")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--readers", type=int, default=8, help="parallel readers = fio numjobs")
    ap.add_argument("--bench-size", default=None, help="run bench-disk on --dir with this "
                    "--size (its own test file, e.g. auto or 256Mi) instead of on fio's file")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        print("fio not found: apt-get install -y fio", file=sys.stderr)
        return 2
    fio_version = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout
    path = make_file(args.dir, args.size)
    rt = int(args.runtime) if float(args.runtime).is_integer() else args.runtime
    jobs = {  # name -> (fio command, how to read bench-disk's figure, unit)
        "sequential 1MiB direct MB/s": (fio_cmd(path, "read", "1M", rt), "mb_s",
                                        lambda b: b["sequential"]["read_mb_s"]),
        "random 4KiB QD1 IOPS": (fio_cmd(path, "randread", "4k", rt), "iops",
                                 lambda b: b["random"]["4KiB"]["qd1"]["iops"]),
        "random 2KiB QD1 IOPS": (fio_cmd(path, "randread", "2k", rt), "iops",
                                 lambda b: b["random"]["2KiB"]["qd1"]["iops"]),
        f"random 4KiB {args.readers} readers IOPS": (
            fio_cmd(path, "randread", "4k", rt, args.readers), "iops",
            lambda b: b["random"]["4KiB"]["parallel"]["iops"]),
        f"random 2KiB {args.readers} readers IOPS": (
            fio_cmd(path, "randread", "2k", rt, args.readers), "iops",
            lambda b: b["random"]["2KiB"]["parallel"]["iops"]),
    }
    bench_path = path if args.bench_size is None else args.dir

    def bench() -> dict:
        return run_bench(bench_path, args.runtime, args.readers, args.bench_size)

    fio_vals = {k: [] for k in jobs}
    bench_files = []
    below = []
    bench_vals = {k: [] for k in jobs}
    lat = {"fio 4KiB QD1 p50/p99 ms": [], "bench 4KiB QD1 p50/p99 ms": []}
    last = None
    try:
        run_fio(fio_cmd(path, "read", "1M", 2))  # one untimed pass: same cache state for both
        for r in range(args.rounds):
            fio_first = r % 2 == 0
            if not fio_first:
                b = bench()
            for name, (cmd, key, _) in jobs.items():
                res = run_fio(cmd)
                fio_vals[name].append(res[key])
                if name.startswith("random 4KiB QD1"):
                    lat["fio 4KiB QD1 p50/p99 ms"].append((res["p50_ms"], res["p99_ms"]))
            if fio_first:
                b = bench()
            last = b
            bench_files.append(b["measured_file_bytes"])
            bc = b.get("below_cache") or {}
            below.append((bc.get("reread_speedup"), bc.get("tail_speedup"), bc.get("status")))
            for name, (_, _, get) in jobs.items():
                bench_vals[name].append(get(b))
            q = b["random"]["4KiB"]["qd1"]
            lat["bench 4KiB QD1 p50/p99 ms"].append((q["p50_ms"], q["p99_ms"]))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        os.unlink(path)

    fs = last["filesystem"]
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"machine: {platform.node()} {platform.platform()}, {os.cpu_count()} CPUs; "
          f"{fio_version.strip()}")
    print(f"file: {args.size / 2**30:g} GiB on {fs['type']} {fs['device']} "
          f"(mounted at {fs['mountpoint']}); bench-disk cache method {last['cache_method']}")
    if args.bench_size is not None:
        print(f"bench-disk: on {args.dir} with --size {args.bench_size}: its own test file of "
              + ", ".join(sorted({f"{n / 2**20:g} MiB" for n in bench_files})))
    print(f"rounds: {args.rounds}, {args.runtime:g} s per fio job and per bench-disk cold run "
          f"(bench-disk: median of {last['settings']['repeats']} runs per round)")
    print()
    print(f"{'measurement':<30} {'fio':>8} {'bench-disk':>10} {'ratio':>6}  goal  "
          f"{'paired':>6}  {'fio spread':>10}")
    misses = 0
    for name in jobs:
        fv, bv = fio_vals[name], bench_vals[name]
        f, b = statistics.median(fv), statistics.median(bv)
        ratio = b / f if f else float("nan")
        paired = statistics.median(x / y for x, y in zip(bv, fv) if y)
        ok = GOAL[0] <= ratio <= GOAL[1]
        misses += not ok
        spread = (max(fv) - min(fv)) / f * 100 if f else float("nan")
        print(f"{name:<30} {f:>8,.0f} {b:>10,.0f} {ratio:>6.2f}  {'ok  ' if ok else 'MISS'}  "
              f"{paired:>6.2f}  {spread:>9.0f}%")
    print()
    print("per round (fio / bench-disk):")
    for name in jobs:
        print(f"  {name}: " + " ".join(f"{v:,.0f}" for v in fio_vals[name]) + " / "
              + " ".join(f"{v:,.0f}" for v in bench_vals[name]))
    print()
    for k, v in lat.items():
        print(f"{k}: " + ", ".join(f"{a:.3f}/{c:.3f}" for a, c in v))
    print("bench-disk below-cache check per round (re-read speedup / last-written quarter "
          "speedup / status): " + ", ".join(
              "/".join("-" if v is None else (f"{v:.2f}" if isinstance(v, float) else v)
                       for v in t) for t in below))
    print()
    print("fio command lines:")
    for name, (cmd, _, _) in jobs.items():
        print("  " + " ".join(cmd).replace(path, "FILE"))
    print("bench-disk: " + " ".join(
        [f"python -m gpuprof bench-disk {'FILE' if args.bench_size is None else args.dir} "
         "--json", "--duration", str(args.runtime), "--readers", str(args.readers)]
        + ([] if args.bench_size is None else ["--size", args.bench_size])))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
