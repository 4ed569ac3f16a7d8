"""Check gpuprof's memory model against measured peaks; print the figures.

    python benchmarks/memory_model.py            # all sections that this machine can run
    python benchmarks/memory_model.py --quick    # fewer configurations

Sections:
  tracker  real CPU training steps, live tensor storages counted by a TorchDispatchMode
           (gpuprof.recommend.tracker) — what torch.cuda.max_memory_allocated counts on a GPU
  fake     the same steps under FakeTensorMode: GPT-2 shapes, nothing allocated
  rss      real CPU steps, peak RSS of a fresh process per configuration (every allocation,
           torch.compile's generated kernels included); Linux only
  cuda     torch.cuda.max_memory_allocated on a GPU, when one is present

Each row: the model's tensor peak (peak_allocated_bytes, device="cpu": no CUDA context or
allocator overhead, which no CPU measurement can see), the measured peak, and the error.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gpuprof.recommend.memory import estimate_memory  # noqa: E402
from gpuprof.recommend.probe import measured_peak, measured_rss_peak  # noqa: E402
from gpuprof.dims import GPTConfig, preset_config  # noqa: E402


def small(L, d, H, V, T):
    return GPTConfig(n_layer=L, n_embd=d, n_head=H, vocab_size=V, block_size=T)


def label(cfg: GPTConfig, name: str | None = None) -> str:
    return name or f"L{cfg.n_layer} d{cfg.n_embd} H{cfg.n_head} V{cfg.vocab_size} T{cfg.block_size}"


TRACKER = [  # (name, cfg, batch, dtype, flash, checkpointing, accum)
    (None, small(2, 128, 4, 4096, 256), 8, "fp32", True, False, 2),
    (None, small(2, 128, 4, 4096, 256), 8, "bf16", True, False, 2),
    (None, small(2, 128, 4, 4096, 256), 8, "fp32", False, False, 2),
    (None, small(2, 128, 4, 4096, 256), 8, "bf16", False, False, 2),
    (None, small(2, 128, 4, 4096, 256), 8, "bf16", True, True, 2),
    (None, small(2, 128, 4, 4096, 256), 8, "fp32", True, False, 1),
    (None, small(4, 256, 8, 512, 128), 4, "fp32", True, True, 2),
    (None, small(6, 384, 6, 2048, 256), 2, "bf16", True, False, 2),
    (None, small(8, 512, 8, 8192, 128), 2, "bf16", True, False, 2),
    (None, small(2, 128, 4, 4096, 256), 8, "fp16", True, False, 2),
    (None, small(4, 256, 4, 1024, 64), 2, "bf16", True, True, 2),
    (None, small(4, 256, 4, 256, 128), 8, "bf16", True, True, 2),
]
FAKE = [
    ("gpt2", preset_config("gpt2", 1024), 1, "bf16", True, False, 2),
    ("gpt2", preset_config("gpt2", 1024), 16, "bf16", True, False, 2),
    ("gpt2", preset_config("gpt2", 1024), 16, "fp32", True, False, 2),
    ("gpt2", preset_config("gpt2", 1024), 16, "bf16", False, False, 2),
    ("gpt2", preset_config("gpt2", 1024), 16, "bf16", True, True, 2),
    ("gpt2 T=256", preset_config("gpt2", 256), 4, "bf16", True, True, 2),
    ("gpt2", preset_config("gpt2", 1024), 256, "bf16", True, False, 4),
    ("gpt2-medium", preset_config("gpt2-medium", 1024), 8, "bf16", True, False, 2),
    ("gpt2-xl", preset_config("gpt2-xl", 1024), 4, "bf16", True, False, 2),
]
RSS = [  # (name, cfg, batch, dtype, compile)
    (None, small(2, 128, 4, 4096, 256), 16, "bf16", False),
    (None, small(2, 128, 4, 4096, 256), 16, "bf16", True),
    (None, small(2, 128, 4, 4096, 256), 16, "fp32", True),
    (None, small(4, 256, 8, 2048, 256), 4, "fp32", False),
    (None, small(4, 256, 8, 2048, 256), 4, "fp32", True),
    (None, small(4, 256, 8, 512, 128), 8, "bf16", True),
    # not looked at while deriving the compiled terms:
    (None, small(3, 192, 6, 3072, 192), 6, "bf16", True),
    (None, small(2, 256, 4, 16384, 128), 4, "bf16", True),
    (None, small(3, 192, 6, 3072, 192), 6, "bf16", False),
]


def row(section, name, cfg, batch, dtype, extra, model_b, meas_b, secs):
    err = (model_b / meas_b - 1) * 100
    print(f"{section:7} {label(cfg, name):28} B={batch:<4} {dtype:4} {extra:22} "
          f"model {model_b / 1e6:12,.1f} MB  measured {meas_b / 1e6:12,.1f} MB  "
          f"error {err:+6.2f}%  ({secs:.1f} s)", flush=True)
    return err


def _rss_in_fresh_process(index: int) -> int:
    # Peak RSS needs a process whose heap has no memory freed by earlier measurements: glibc
    # would hand that out again without RSS rising.
    out = subprocess.run([sys.executable, __file__, "--rss-one", str(index)], check=True,
                         capture_output=True, text=True).stdout
    return int(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="tracker,fake,cuda,rss")
    ap.add_argument("--rss-one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_one is not None:
        name, cfg, b, dt, comp = RSS[args.rss_one]
        print(measured_rss_peak(cfg, b, dt, compile=comp))
        return
    sections = args.sections.split(",")
    print(f"# memory model check, {datetime.date.today()}, torch {torch.__version__}, "
          f"{platform.machine()}, python {platform.python_version()}")
    errors = []
    pick = (lambda xs: xs[:3]) if args.quick else (lambda xs: xs)

    if "tracker" in sections:
        for name, cfg, b, dt, flash, ckpt, acc in pick(TRACKER):
            t = time.perf_counter()
            meas = measured_peak(cfg, b, dt, flash=flash, checkpointing=ckpt, accum=acc)
            est = estimate_memory(cfg, b, dtype=dt, flash=flash, checkpointing=ckpt,
                                  grad_accum=acc, device="cpu")
            extra = f"{'flash' if flash else 'math'}{' ckpt' if ckpt else ''} accum={acc}"
            errors.append(row("tracker", name, cfg, b, dt, extra, est.peak_allocated_bytes, meas,
                              time.perf_counter() - t))

    if "fake" in sections:
        for name, cfg, b, dt, flash, ckpt, acc in pick(FAKE):
            t = time.perf_counter()
            meas = measured_peak(cfg, b, dt, flash=flash, checkpointing=ckpt, accum=acc, fake=True)
            est = estimate_memory(cfg, b, dtype=dt, flash=flash, checkpointing=ckpt,
                                  grad_accum=acc, device="cpu")
            extra = f"{'flash' if flash else 'math'}{' ckpt' if ckpt else ''} accum={acc}"
            errors.append(row("fake", name, cfg, b, dt, extra, est.peak_allocated_bytes, meas,
                              time.perf_counter() - t))

    if "cuda" in sections and torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        print(f"# cuda: {name}")
        for cfgname, cfg, b, dt in [("tiny", preset_config("tiny", 256), 8, "bf16"),
                                    ("gpt2", preset_config("gpt2", 1024), 8, "bf16"),
                                    ("gpt2", preset_config("gpt2", 1024), 16, "bf16"),
                                    ("gpt2", preset_config("gpt2", 1024), 16, "fp32")]:
            t = time.perf_counter()
            meas = measured_peak(cfg, b, dt, device="cuda")
            est = estimate_memory(cfg, b, dtype=dt, device="cpu", fused_adamw=False)
            errors.append(row("cuda", cfgname, cfg, b, dt, "flash accum=2",
                              est.peak_allocated_bytes, meas, time.perf_counter() - t))

    if "rss" in sections:
        if not Path("/proc/self/clear_refs").exists():
            print("# rss: skipped (needs Linux /proc/self/clear_refs)")
        else:
            for i, (name, cfg, b, dt, comp) in enumerate(pick(RSS)):
                t = time.perf_counter()
                meas = _rss_in_fresh_process(i)
                est = estimate_memory(cfg, b, dtype=dt, compile=comp, device="cpu")
                errors.append(row("rss", name, cfg, b, dt, "compiled" if comp else "eager",
                                  est.peak_allocated_bytes, meas, time.perf_counter() - t))

    if errors:
        worst = max(errors, key=abs)
        print(f"# {len(errors)} configurations, worst error {worst:+.2f}%, "
              f"mean |error| {sum(abs(e) for e in errors) / len(errors):.2f}%")


if __name__ == "__main__":
    main()
