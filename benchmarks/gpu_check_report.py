"""gpu_check's report: the header's facts about the machine (host, GPU, software; read without
creating a CUDA context here), the Markdown (one table row per check, then each check's
commands and figures) and its file, DAY-GPU.md, never overwritten."""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Callable

from gpu_check_plan import CHECK_WHAT
from gpu_check_profile import Missing
from gpu_check_run import REPO, TAIL_CHARS, Check, Ctx


# ------------------------------------------------------------------------------- the machine
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _nvml_versions() -> dict:
    out = {}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        return {"nvml": f"not measured ({exc.__class__.__name__})"}
    try:
        for key, fn in (("driver", "nvmlSystemGetDriverVersion"), ("nvml", "nvmlSystemGetNVMLVersion"),
                        ("cuda_driver", "nvmlSystemGetCudaDriverVersion_v2")):
            try:
                v = getattr(pynvml, fn)()
                v = v.decode() if isinstance(v, bytes) else v
                out[key] = f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) else str(v)
            except Exception:  # noqa: BLE001
                out[key] = "not measured"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


# Read in a child so that this process never creates a CUDA context of its own (a GPU in
# EXCLUSIVE_PROCESS compute mode would then refuse every check's process).
DEVICE_FACTS = """import json, torch
p = torch.cuda.get_device_properties(0)
u = getattr(p, "uuid", None)
print(json.dumps({"name": p.name, "total_memory": p.total_memory, "capability": f"{p.major}.{p.minor}",
                  "uuid": None if u is None else str(u), "count": torch.cuda.device_count(),
                  "torch_cuda": torch.version.cuda}))"""


def device_facts(ctx: Ctx) -> dict:
    """torch's view of device 0 (name, memory, capability, UUID), or {"error": ...}."""
    proc = ctx.run([sys.executable, "-c", DEVICE_FACTS], 90)
    try:
        return json.loads(proc.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": proc.tail(600).strip() or f"exit code {proc.rc}"}


def describe(ctx: Ctx, torch_version: str, facts: dict | None, budget_s: float) -> dict:
    """Command, date, host, GPU and software lines for the report header; sets ctx.gpu_name/uuid."""
    import gpuprof

    env_pp = os.environ.get("PYTHONPATH")
    cmd = (f"PYTHONPATH={env_pp} " if env_pp else "") + shlex.join([Path(sys.executable).name, *sys.argv])
    try:
        import psutil

        phys, ram = psutil.cpu_count(logical=False), f", {psutil.virtual_memory().total / 2**30:.1f} GiB RAM"
    except Exception:  # noqa: BLE001
        phys, ram = None, ""
    meta = {
        "command": f"`{cmd}`",
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": f"{_cpu_model()}, {os.cpu_count()} logical cores" + (f" ({phys} physical)" if phys else "")
                + f"{ram}, {platform.platform()}",
        "software": (f"torch {torch_version}, Python {platform.python_version()} ({sys.executable}), "
                     f"gpuprof {getattr(gpuprof, '__version__', 'unknown')}, commit {_git_commit()}"),
        "budget_s": budget_s,
    }
    if ctx.smoke or facts is None:
        meta["title"] = "CPU smoke (no GPU figures)"
        meta["gpu"] = "none: --cpu-smoke runs the plumbing on the CPU; checks that need CUDA are SKIPped"
        return meta
    nv = _nvml_versions()
    versions = (f"driver {nv.get('driver', 'not measured')}, CUDA {nv.get('cuda_driver', 'not measured')} (driver) / "
                f"{facts.get('torch_cuda', 'not measured')} (torch build), NVML {nv.get('nvml', 'not measured')}")
    if "error" in facts:
        meta["title"] = "unknown GPU"
        meta["gpu"] = f"not measured: torch could not read device 0 ({facts['error'][-300:]}); {versions}"
        return meta
    ctx.gpu_name, ctx.torch_uuid = facts.get("name"), facts.get("uuid")
    meta["title"] = str(ctx.gpu_name)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    meta["gpu"] = (f"{ctx.gpu_name}, {facts['total_memory'] / 2**30:.1f} GiB, "
                   f"compute capability {facts.get('capability')}, {facts.get('count')} visible "
                   f"(CUDA_VISIBLE_DEVICES={visible}), "
                   f"torch uuid {ctx.torch_uuid}, {versions}")
    return meta


# ------------------------------------------------------------------------------- the report
def scrubber(tmp: Path) -> Callable[[str], str]:
    """Text for the report: the temp folder as $TMP (it is gone by then), checkout paths relative."""
    def scrub(text: str) -> str:
        return str(text).replace(str(tmp), "$TMP").replace(str(REPO) + os.sep, "")
    return scrub


def show(argv: list[str]) -> str:
    """A command line as run, with this interpreter written `python`."""
    return shlex.join(["python" if a == sys.executable else a for a in argv])


def render_report(meta: dict, checks: list[Check], total_s: float) -> str:
    """The markdown report: header, one table row per check, then each check's commands and figures."""
    scrub = meta.get("scrub") or str
    counts = {s: sum(c.status == s for c in checks) for s in ("PASS", "FAIL", "SKIP")}
    out = [f"# gpuprof GPU check: {meta['title']}", ""]
    for key in ("command", "date", "host", "gpu", "software", "note"):
        if meta.get(key):
            out.append(f"- {key}: {meta[key]}")
    out.append(f"- result: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP "
               f"in {total_s:.1f} s (budget {meta.get('budget_s', 0):.0f} s)")
    out += ["", "| check | result | wall | reason |", "|---|---|---|---|"]
    out += [f"| {c.name} | {c.status} | {c.wall_s:.1f} s | {_cell(scrub(c.reason))} |" for c in checks]
    for c in checks:
        out += ["", f"## {c.name}: {c.status}", "", f"{CHECK_WHAT.get(c.name, '')}", "",
                f"Reason: {scrub(c.reason)}", ""]
        if c.runs:
            out += ["| command | wall | exit |", "|---|---|---|"]
            for r in c.runs:
                end = f"timed out after {r.timeout_s:.0f} s" if r.timed_out else str(r.rc)
                out.append(f"| `{_cell(scrub(show(r.argv)))}` | {r.wall_s:.1f} s | {end} |")
            out.append("")
        if c.figures:
            out += ["| figure | value |", "|---|---|"]
            out += [f"| {_cell(k)} | {_cell(scrub(fmt(v)))} |" for k, v in c.figures.items()]
            out.append("")
        if c.status == "FAIL":  # the output of the runs that failed; of all runs when the verdict did
            broken = [r for r in c.runs if r.timed_out or r.rc != 0] or c.runs
            for r in broken:
                out += [f"Output tail of `{_cell(scrub(show(r.argv)))}`:", "", "```text",
                        scrub(r.tail(TAIL_CHARS if len(broken) == 1 else TAIL_CHARS // 2)).rstrip(), "```", ""]
        if c.error:
            out += ["The check itself raised:", "", "```text", c.error.rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def fmt(v) -> str:
    """A figure for the report: 4 significant digits, mappings as compact JSON."""
    if isinstance(v, Missing):
        return str(v)
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str, separators=(", ", ": "))
    return str(v)


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def slugify(name: str | None) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'."""
    s = re.sub(r"[^a-z0-9]+", "-", str(name or "").lower()).strip("-")
    return s or "unknown-gpu"


def report_path(folder: Path, day: str, name: str, suffix: int = 1) -> Path:
    base = f"{day}-{slugify(name)}"
    return Path(folder) / (f"{base}.md" if suffix == 1 else f"{base}-{suffix}.md")


def write_report(folder: Path, day: str, name: str, text: str) -> Path:
    """Write the report as DAY-NAME.md, or -2, -3 ... when that exists (never overwrites)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = report_path(folder, day, name, n)
        try:
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
            return path
        except FileExistsError:
            n += 1
