"""gpu_check: reading figures out of a profile dict, "not measured" (and why) when one is absent.

Pure: the checks (gpu_check_checks*.py) and the verdicts (gpu_check_verdicts*.py) read a
profile's figures with these."""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("data", "h2d", "forward", "backward", "optimizer", "other", "eval")


@dataclass(frozen=True)
class Missing:
    """A figure the profile does not have, and why ("key missing: a.b", "a.b is null", ...)."""

    why: str

    def __str__(self) -> str:
        return f"not measured ({self.why})"


def lookup(d, path: str):
    """The value at a dotted path of a profile dict, or Missing saying why it is absent.

    A section that failed after the run is `{"not_measured": reason}`: its reason is kept."""
    cur = d
    for i, part in enumerate(path.split(".")):
        if isinstance(cur, dict) and part not in cur and "not_measured" in cur:
            where = ".".join(path.split(".")[:i])
            return Missing(f"{where} not measured: {cur['not_measured']}")
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return Missing(f"key missing: {path}")
    if cur is None:
        return Missing(f"{path} is null")
    if isinstance(cur, dict) and set(cur) == {"not_measured"}:
        return Missing(f"{path} not measured: {cur['not_measured']}")
    return cur


def _num(p, path: str, problems: list[str]) -> float | None:
    v = lookup(p, path)
    if isinstance(v, Missing):
        problems.append(v.why)
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        problems.append(f"{path} is {v!r}, not a number")
        return None
    return float(v)


def _value(p, path: str, problems: list[str]):
    v = lookup(p, path)
    if isinstance(v, Missing):
        problems.append(v.why)
        return None
    return v


def findings(p) -> list[dict]:
    """The findings of the analysis saved with the profile (schema 2: under `analysis`)."""
    analysis = p.get("analysis") if isinstance(p.get("analysis"), dict) else {}
    return [f for f in (analysis.get("findings") or []) if isinstance(f, dict)]


def finding_ids(p) -> list[str]:
    return [f.get("id") for f in findings(p)]


def run_figures(p) -> dict:
    """The figures of a diagnose run: step, phases, MFU, ceiling, timer, precision, findings."""
    fig = {k: lookup(p, k) for k in (
        "environment.device_name", "run.config.model", "run.config.batch_size", "run.config.block_size",
        "run.config.grad_accum", "run.config.dtype", "run.config.compile", "measurements.precision",
        "analysis.steps.step_s", "analysis.steps.timeline", "analysis.steps.spread", "analysis.steps.tokens_per_s")}
    phases = lookup(p, "analysis.steps.phases")
    if isinstance(phases, dict):
        for ph in [x for x in PHASES if x in phases] + sorted(set(phases) - set(PHASES)):
            fig[f"analysis.steps.phases.{ph}.seconds"] = lookup(p, f"analysis.steps.phases.{ph}.seconds")
            fig[f"analysis.steps.phases.{ph}.share"] = lookup(p, f"analysis.steps.phases.{ph}.share")
    else:
        fig["analysis.steps.phases"] = phases
    for k in ("analysis.mfu.mfu", "analysis.mfu.dtype", "analysis.mfu.peak_tflops", "analysis.mfu.peak_source",
              "analysis.mfu.achieved_tflops", "analysis.mfu.mfu_vs_ceiling", "analysis.mfu.flops_per_step",
              "analysis.mfu.flops_agreement", "measurements.probe.tflops", "measurements.probe.dtype",
              "measurements.probe.size", "measurements.timer.gpu_timeline", "measurements.timer.events_recorded",
              "measurements.timer.events_created_in_steps",
              "measurements.timer.steps_unresolved", "measurements.timer.reasons",
              "measurements.syncs.per_step", "measurements.syncs.calls"):
        fig[k] = lookup(p, k)
    fig["findings"] = ", ".join(i for i in finding_ids(p) if i) or "none"
    return fig
