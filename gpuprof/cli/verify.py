"""`gpuprof diagnose --verify`: run again with the top config fix applied, and say whether the
saving it predicted was realised (gpuprof.analysis.compare), in one go.

Which fix: the highest-ranked finding of kind `fix` with a saving and nanoGPT config overrides.
How it is applied:
- the built-in loop: the overrides mapped onto its options (batch_size, gradient_accumulation_steps,
  block_size, dtype, compile, pin_memory);
- a script: nanoGPT's configurator convention, `--key=value` appended to its arguments (later
  overrides win), for the keys the script itself defines; a script that does not take them fails
  its re-run, and that is said.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from rich.console import Console

from gpuprof.errors import GpuprofError
from gpuprof.units import seconds

# nanoGPT config key -> (built-in loop option, value mapping)
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
LOOP_KEYS = {"batch_size": ("batch_size", int), "gradient_accumulation_steps": ("grad_accum", int),
             "block_size": ("block_size", int), "dtype": ("dtype", lambda v: _DTYPES[str(v)]),
             "compile": ("compile", bool), "pin_memory": ("pin_memory", bool)}


def top_config_fix(findings: list) -> Optional[object]:
    for f in findings:
        d = f.to_dict() if hasattr(f, "to_dict") else f
        if d.get("kind") == "fix" and d.get("config_overrides") and (d.get("saving_s") or 0) > 0:
            return d
    return None


def loop_config_with(cfg, overrides: dict):
    """The built-in loop's config with the overrides applied; GpuprofError for a key it has not."""
    changes = {}
    for key, value in overrides.items():
        if key not in LOOP_KEYS:
            raise GpuprofError(f"--verify: the built-in loop has no option for `{key}`")
        name, conv = LOOP_KEYS[key]
        changes[name] = conv(value)
    return dataclasses.replace(cfg, **changes)


def script_args_with(args: list[str], overrides: dict, defined: dict) -> tuple[list[str], dict]:
    """The script's arguments with `--key=value` appended for the keys the script defines."""
    usable = {k: v for k, v in overrides.items() if k in defined}
    return [*args, *(f"--{k}={v}" for k, v in usable.items())], usable


def verify(before, findings, rerun: Callable[[dict], object], console: Console, err: Console,
           describe: str) -> None:
    """Run `rerun(overrides)` (-> the AFTER profile, analysed) and print the comparison."""
    from gpuprof.analysis.compare import compare
    from gpuprof.render.compare import render_comparison

    fix = top_config_fix(findings)
    if fix is None:
        err.print("gpuprof: --verify: nothing to verify: no finding of this run is a config fix with a "
                  "saving", highlight=False)
        return
    overrides = fix["config_overrides"]
    text = ", ".join(f"{k}={v}" for k, v in overrides.items())
    err.print(f"gpuprof: --verify: running {describe} again with {text} (the fix of `{fix['id']}`, "
              f"predicted to save {seconds(fix['saving_s'])} per step)", highlight=False)
    try:
        after = rerun(overrides)
    except GpuprofError as exc:  # the fixed run refused (memory, an hour-long run): this run stands
        err.print(f"gpuprof: --verify: not run: {exc}", highlight=False)
        return
    if after is None:
        return
    result = compare(before, after, before_name="this run", after_name=f"with {text}")
    render_comparison(result, console)
    outcome = next((o for o in result.outcomes if o.id == fix["id"]), None)
    if outcome is not None and outcome.achieved_s is not None:
        ratio = f" (achieved / predicted {outcome.ratio:.2f})" if outcome.ratio is not None else ""
        console.print(f"--verify: `{fix['id']}` predicted {seconds(outcome.predicted_s)}, achieved "
                      f"{seconds(outcome.achieved_s)} per step{ratio}", highlight=False)
