"""Scenarios: runnable situations with a known bottleneck and the diagnosis they must produce.

A scenario is a TOML file (the top-level scenarios/ folder):

    name = "slow-storage"
    description = "..."
    kind = "run"            # run: the built-in loop; log: a nanoGPT log analysed without running
    device = "cpu"          # cpu | cuda: where a run scenario can run
    post_budget = 4         # optional: seconds for the post-run measurements (as --post-budget);
                            # default: diagnose's, max(15 s, 25% of the run)
    [config]                # LoopConfig fields (model, batch_size, block_size, grad_accum, ...)
    [inject]                # read_latency_s, read_bandwidth_bytes_s, batch_delay_s,
                            # sync_every_micro, eval_every_step, pin_memory = false
    [expect]
    top = "data-loading-exposed"   # the id that must rank first
    phase = "data"                 # optional: where the injected seconds must appear ...
    tolerance = 0.03               # ... within this many share points of the injected share

A log scenario has `log = "file.log"` (relative to the TOML), `gpu`, and [config] with nanoGPT
keys. Running a scenario never modifies anything but the cache's generated token file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from gpuprof.analysis.mfu_results import LogAnalysis
from gpuprof.errors import GpuprofError
from gpuprof.files import read_user_text
from gpuprof.measure.cuda import is_cuda

INJECT_KEYS = {"read_latency_s", "read_bandwidth_bytes_s", "batch_delay_s", "sync_every_micro",
               "eval_every_step", "pin_memory"}


@dataclass
class Scenario:
    name: str
    path: Path
    description: str
    kind: str
    device: str
    config: dict
    inject: dict
    expect: dict
    log: Path | None = None
    gpu: str | None = None
    post_budget: float | None = None


@dataclass
class ScenarioResult:
    scenario: Scenario
    passed: bool
    top: str | None
    findings: list = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)  # (what, ok, detail)
    skipped: str | None = None
    profile: object | None = None
    log_result: LogAnalysis | None = None


def default_folder() -> Path:
    """./scenarios if present, else the scenarios/ folder next to the installed package."""
    here = Path.cwd() / "scenarios"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parent.parent / "scenarios"


def load(path: str | Path) -> Scenario:
    path = Path(path)
    text = read_user_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GpuprofError(f"scenario {path}: not valid TOML ({exc})") from None
    kind = data.get("kind", "run")
    if kind not in ("run", "log"):
        raise GpuprofError(f"scenario {path}: kind must be 'run' or 'log', got {kind!r}")
    expect = data.get("expect") or {}
    if "top" not in expect:
        raise GpuprofError(f"scenario {path}: [expect] needs `top` (the finding id that must rank first)")
    inject = data.get("inject") or {}
    unknown = set(inject) - INJECT_KEYS
    if unknown:
        raise GpuprofError(f"scenario {path}: unknown [inject] keys {sorted(unknown)}")
    post_budget = data.get("post_budget")
    if post_budget is not None and (isinstance(post_budget, bool) or not isinstance(post_budget, (int, float))
                                    or post_budget < 0):
        raise GpuprofError(f"scenario {path}: post_budget must be seconds (a number, 0 or more), got {post_budget!r}")
    log = None
    if kind == "log":
        if "log" not in data:
            raise GpuprofError(f"scenario {path}: a log scenario needs `log = \"file.log\"`")
        log = (path.parent / data["log"]).resolve()
    return Scenario(name=data.get("name", path.stem), path=path, description=data.get("description", ""),
                    kind=kind, device=data.get("device", "cpu"), config=data.get("config") or {},
                    inject=inject, expect=expect, log=log, gpu=data.get("gpu"),
                    post_budget=None if post_budget is None else float(post_budget))


def discover(folder: str | Path | None = None) -> list[Scenario]:
    folder = Path(folder) if folder else default_folder()
    if not folder.is_dir():
        raise GpuprofError(f"no scenarios folder at {folder}")
    return [load(p) for p in sorted(folder.glob("*.toml"))]


def resolve(name_or_path: str, folder: str | Path | None = None) -> Scenario:
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return load(p)
    for sc in discover(folder):
        if sc.name == name_or_path or sc.path.stem == name_or_path:
            return sc
    raise GpuprofError(f"no scenario named {name_or_path!r} (see `gpuprof scenario list`)")


def injected_seconds_per_step(sc: Scenario) -> float | None:
    """Seconds the injected loader delays add to one optimizer step, from the injection itself."""
    inj, cfg = sc.inject, sc.config
    per_read = float(inj.get("read_latency_s", 0.0))
    bw = float(inj.get("read_bandwidth_bytes_s", 0.0))
    if bw:
        per_read += (int(cfg.get("block_size", 256)) + 1) * 2 / bw
    per_batch = float(inj.get("batch_delay_s", 0.0)) + per_read * int(cfg.get("batch_size", 8))
    if not per_batch:
        return None
    return per_batch * int(cfg.get("grad_accum", 4))  # one get_batch per micro-step


def run(sc: Scenario, *, on_step=None, instruments=None) -> ScenarioResult:
    """Run (or analyse) the scenario and compare the diagnosis with its expectation."""
    if sc.kind == "log":
        return _run_log(sc)
    import torch

    from gpuprof.analysis.pipeline import analyze
    from gpuprof.measure.instruments import default_instruments
    from gpuprof.runners.builtin import LoopConfig, LoopFaults, run_builtin
    from gpuprof.runners.data import LoaderFaults

    if is_cuda(sc.device) and not torch.cuda.is_available():
        return ScenarioResult(sc, passed=True, top=None, skipped="needs a CUDA device; none here")
    inj = sc.inject
    try:
        cfg = LoopConfig(**{**sc.config, "device": sc.device,
                            "pin_memory": bool(inj.get("pin_memory", sc.config.get("pin_memory", True)))})
    except TypeError as exc:
        raise GpuprofError(f"scenario {sc.path}: bad [config] ({exc})") from None
    bad = {k: v for k, v in sc.config.items() if k in ("batch_size", "block_size", "grad_accum", "steps", "warmup")
           and not isinstance(v, int)}
    if bad:
        raise GpuprofError(f"scenario {sc.path}: [config] values must be integers: {bad}")
    faults = LoopFaults(
        loader=LoaderFaults(read_latency_s=float(inj.get("read_latency_s", 0.0)),
                            read_bandwidth_bytes_s=float(inj.get("read_bandwidth_bytes_s", 0.0)),
                            batch_delay_s=float(inj.get("batch_delay_s", 0.0))),
        sync_every_micro=bool(inj.get("sync_every_micro", False)),
        eval_every_step=int(inj.get("eval_every_step", 0)),
    )
    if instruments is None:
        instruments = default_instruments(sc.device, cfg.data, probe=False)
    profile = run_builtin(cfg, instruments=instruments, on_step=on_step, faults=faults, post_budget_s=sc.post_budget)
    profile.run["scenario"] = sc.name
    findings = list(analyze(profile).findings)
    top = findings[0].id if findings else None
    checks = [("top finding", top == sc.expect["top"], f"expected {sc.expect['top']}, got {top}")]
    phase = sc.expect.get("phase")
    injected = injected_seconds_per_step(sc)
    if phase and injected:
        tol = float(sc.expect.get("tolerance", 0.03))
        # Shares are of the typical step, so the truth uses it too.
        truth = injected / profile.stats.step_s
        measured = profile.stats.share(phase)
        checks.append((f"{phase} share", abs(measured - truth) <= tol,
                       f"measured {measured:.1%} vs injected {truth:.1%} (±{tol * 100:.0f} points)"))
    return ScenarioResult(sc, passed=all(ok for _, ok, _ in checks), top=top, findings=findings,
                          checks=checks, profile=profile)


def _run_log(sc: Scenario) -> ScenarioResult:
    from gpuprof.analysis.engine import rank
    from gpuprof.analysis.logs import analyze_log
    from gpuprof.analysis.rules.logs import log_findings

    result = analyze_log(sc.log, gpu=sc.gpu, config=sc.config)
    findings = rank(log_findings(result))
    top = findings[0].id if findings else None
    checks = [("top finding", top == sc.expect["top"], f"expected {sc.expect['top']}, got {top}")]
    for key in ("verdict",):
        if key in sc.expect:
            got = result.verdict.id if result.verdict is not None else None
            checks.append((key, got == sc.expect[key], f"expected {sc.expect[key]}, got {got}"))
    if "true_mfu" in sc.expect:
        want, got = float(sc.expect["true_mfu"]), result.true_mfu or 0.0
        checks.append(("true MFU", abs(got - want) <= 0.01, f"expected {want:.1%}, got {got:.1%}"))
    return ScenarioResult(sc, passed=all(ok for _, ok, _ in checks), top=top, findings=findings,
                          checks=checks, log_result=result)
