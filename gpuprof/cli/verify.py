"""`gpuprof diagnose --verify`: run again with the top config fix applied, and say whether the
saving it predicted was realised (gpuprof.analysis.compare), in one go.

Which fix: the highest-ranked finding of kind `fix` with a saving and nanoGPT config overrides
(session.top_config_fix). How it is applied: the built-in loop's options
(session.loop_config_with), or a script's `--key=value` arguments for the keys it defines
(session.script_args_with); a script that does not take them is said, not guessed at.
"""

from __future__ import annotations

from typing import Callable, Optional

from rich.console import Console

from gpuprof.analysis.pipeline import AnalysisOptions, analyze
from gpuprof.errors import GpuprofError
from gpuprof.session import top_config_fix
from gpuprof.units import seconds


def run_verify(before, before_analysis, options: AnalysisOptions, err: Console,
               rerun: Callable[[dict], Optional[object]], describe: str, console: Console | None = None) -> None:
    """Run `rerun(overrides)` (-> the AFTER profile, or None when it could not run), analyse it
    with the same options, and print the comparison on `console` (stdout when not given)."""
    from gpuprof.analysis.compare import compare
    from gpuprof.render.compare import render_comparison
    from gpuprof.report.compare import verify_line

    fix = top_config_fix(before_analysis)
    if fix is None:
        err.print("gpuprof: --verify: nothing to verify: no finding of this run is a config fix with a "
                  "saving", highlight=False, markup=False)
        return
    # in the script's own terms where the fix was worded in them (analysis/script_knobs.py)
    shown = (fix.evidence or {}).get("script_change") or fix.config_overrides
    text = ", ".join(f"{k}={v}" for k, v in shown.items())
    err.print(f"gpuprof: --verify: running {describe} again with {text} (the fix of `{fix.id}`, "
              f"predicted to save {seconds(fix.saving_s)} per step)", highlight=False, markup=False)
    try:
        after = rerun(fix.config_overrides)
    except GpuprofError as exc:  # the fixed run refused (memory, an hour-long run): this run stands
        err.print(f"gpuprof: --verify: not run: {exc}", highlight=False, markup=False)
        return
    if after is None:
        return
    after_analysis = analyze(after, options)
    result = compare(before, before_analysis, after, after_analysis, before_name="this run",
                     after_name=f"with {text}")
    console = console if console is not None else Console()
    render_comparison(result, console)
    outcome = next((o for o in result.outcomes if o.id == fix.id), None)
    if outcome is not None and outcome.achieved_s is not None:
        console.print(verify_line(outcome), highlight=False, markup=False)
