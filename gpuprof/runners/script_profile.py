"""From a finished script run to its Profile: the steps, the configuration that was read or
inferred, the data attribution, and the script's own section (hooks, sampler, parsed log)."""

from __future__ import annotations

import os

from gpuprof.measure.budget import PostRunBudget
from gpuprof.measure.cuda import is_cuda, memory_stats
from gpuprof.measure.instruments import stop_instruments
from gpuprof.measure.precision import with_observed_matmul
from gpuprof.measure.sharding import describe_sharding
from gpuprof.measure.timer import GPU_UNFINISHED
from gpuprof.measure.environment import environment
from gpuprof.measure.experiments import step_figures
from gpuprof.profile import Profile
from gpuprof.stats import median
from gpuprof.steplog import derive_step_times, reported_summary


def _build_profile(run, ended: str, error: dict | None, run_wall: float) -> Profile | None:
    timer = run.timer
    if timer is None:
        return None
    ended_in = timer.open_step() if ended != "finished" else None
    timer.abandon_step()
    experiments = run.hooks.experiments  # experiment steps after the measured ones (measure/experiments.py)
    if experiments is not None:
        experiments.finish()  # every switch restored, however the run ended
    every = timer.steps(stopped=ended in ("failed", "interrupted"))  # a bounded wait for the GPU
    trial = experiments.indices() if experiments is not None else set()
    records = [r for r in every if r.index not in trial]
    if not records:
        # no complete step: nothing to measure, but every instrument stops (dynamo's restores the
        # log state it changed, the samplers their threads)
        try:
            stop_instruments(run.instruments, run.ctx, PostRunBudget.none("no complete step"))
        except Exception:  # noqa: BLE001 - the run's own error line is what the user gets
            pass
        return None
    gpu_collectives = run.hooks.collective_events.into_steps(records) if run.hooks.collective_events else None
    w = run.warmup if len(records) > run.warmup else len(records) - 1
    warm, measured = records[:w], records[w:]
    attribution = _attribute_data(run, measured)
    cfg = run.config
    micro = median(r.micro_steps for r in measured)
    if cfg.get("grad_accum") is None:
        cfg["grad_accum"], run.source["grad_accum"] = int(micro), "measured: backward calls per optimizer step"
    tokens = int(median(r.tokens for r in measured))
    if tokens:
        cfg["tokens_per_step"], run.source["tokens_per_step"] = tokens, "measured: token ids into the training forwards of a step"
    elif all(cfg.get(k) for k in ("batch_size", "block_size", "grad_accum")):
        cfg["tokens_per_step"] = cfg["batch_size"] * cfg["block_size"] * cfg["grad_accum"]
        run.source["tokens_per_step"] = "batch_size × block_size × grad_accum"
    cfg["source"] = run.source
    inputs = getattr(run, "inputs", None)  # gpuprof.runners.script_inputs: what the script read
    if inputs is not None:
        try:
            cfg["script_inputs"] = inputs.to_dict()
        except Exception:  # noqa: BLE001 - a recording, never the profile
            pass
    run_info = {
        "mode": "script",
        "command": run.command,
        "script_file": run.file,  # the script's (or the -m module's) source file
        "rank": int(os.environ.get("RANK", 0)),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
        "data_path": cfg.pop("data_path", None),
        "run_wall_s": run_wall,
        "ended": ended,
        "partial": ended in ("failed", "interrupted"),
        "error": error,
        "ended_in": ended_in,  # the unfinished step where a stopped or failed run was
        "warmup_used": w,
        "config": cfg,
    }
    profile = Profile(run=run_info, steps=measured, warmup_steps=warm,
                      environment=environment(run.device))
    profile.measurements["script"] = _script_section(run, attribution, profile.stats.step_s)
    if run.hooks.collective_kinds:
        profile.measurements["collectives"] = _collectives_section(run, gpu_collectives)
    gpu_report = timer.gpu_report()
    if gpu_report:
        profile.measurements["timer"] = gpu_report
    if run.ctx is not None:
        run.ctx.profile = profile
        _observed_precision(run, cfg)
        if run.ctx.precision:
            profile.measurements["precision"] = run.ctx.precision
        if run.ctx.optimizer is None:  # the first optimizer seen stepping
            primary = getattr(run.hooks, "_primary_opt", None)
            run.ctx.optimizer = primary() if primary is not None else None
        # Read after the run: FSDP2 settles its root's resharding at its first forward, and the
        # optimizer's state exists once it has stepped.
        try:
            run.sharding = run.ctx.sharding = describe_sharding(run.ctx.model, run.ctx.optimizer)
        except Exception as exc:  # noqa: BLE001 - a reading, never the profile
            run.sharding = {"error": f"{exc.__class__.__name__}: {exc}"}
        if run.sharding:
            profile.measurements["sharding"] = run.sharding
    if is_cuda(run.device) and not timer.gpu_unfinished:  # the process's peak (the script's own allocations, warmup included)
        try:
            profile.measurements["memory"] = memory_stats(run.device)
        except Exception as exc:  # noqa: BLE001 - a reading, never the profile
            profile.measurements["memory"] = {"not_measured": f"{exc.__class__.__name__}: {exc}"}
    # Post-run measurements are guarded and share one time budget: a failure is "not measured",
    # never a lost profile.
    # Ctrl-C (or the launcher stopping this rank) wants out now: no post-run measurements.
    post_budget = 0.0 if ended == "interrupted" else run.post_budget_s
    if timer.gpu_unfinished:
        budget = PostRunBudget.none(GPU_UNFINISHED, on_progress=run.on_progress)
    elif ended == "failed" and run.ctx is not None and getattr(run.ctx, "ddp", None) is not None:
        budget = PostRunBudget.none(DDP_FAILED, on_progress=run.on_progress)
    else:
        budget = run.budget if run.budget is not None and ended != "interrupted" else \
            PostRunBudget.for_run(run_wall, post_budget, on_progress=run.on_progress)
    if experiments is not None and experiments.planned is not None:
        section = experiments.section(*step_figures(every, trial, run.device))
        profile.measurements["experiments"] = section
        if run.ctx is not None:  # a fix measured on the loop needs no timing on a copy after the run
            run.ctx.experimented = frozenset(r["id"] for r in section["results"] if r.get("interval"))
    profile.measurements.update(stop_instruments(run.instruments, run.ctx, budget))
    _precision_from_count(run, profile)
    if budget.interrupted:  # Ctrl-C during the post-run work: the steps stand, the run was stopped
        run_info["ended"], run_info["partial"] = "interrupted", True
    for name, why in run.not_started.items():
        profile.measurements.setdefault(name, {"not_measured": why})
    if run.instrument_errors:
        profile.measurements["script"]["instrument_errors"] = run.instrument_errors
    return profile


# torch 2.11's Reducer (reducer.cpp): DDP.forward sets expect_autograd_hooks_, and only the end of
# a complete backward clears it. A rank that failed between the two (a peer's death surfacing in
# the loss, an .item() or a forward collective) keeps it set, and then any backward through the
# same parameters -- even on ddp.module, as the micro-batch curve and precision timing run --
# launches the gradient all-reduces, which wait for a peer that is gone.
DDP_FAILED = ("a data-parallel rank that failed: DDP's reducer may still expect a backward, and one "
              "on its model would launch an all-reduce no peer answers, so nothing after the run runs the model")


def _observed_precision(run, cfg: dict) -> None:
    """The precision read at the first forward's entry, corrected by the dtype the largest matmul
    layer computed in (autocast applied inside forward is invisible at its entry)."""
    watch = run.matmul_watch
    if watch is None:
        return
    watch.remove()
    run.ctx.precision = with_observed_matmul(run.ctx.precision or {}, watch.dtype, watch.layer, run.device)


def _precision_from_count(run, profile) -> None:
    """A compiled model has no hook on its layers (script_state: a hook would recompile it), so the
    dtype its matmuls compute in is read from the FLOP count's eager forward after the run (the
    aten matmuls OpTrace saw, by their FLOPs): a model that casts to bf16 inside its forward, with
    no autocast, is then not taken for fp32."""
    trace = getattr(run.ctx, "op_trace", None) if run.ctx is not None else None
    observed = trace.get("matmul_dtype") if isinstance(trace, dict) else None
    if run.matmul_watch is not None or not observed or not run.ctx.precision:
        return
    run.ctx.precision = with_observed_matmul(run.ctx.precision, observed, "its matmuls (seen in the FLOP count's eager forward)",
                                             run.device)
    profile.measurements["precision"] = run.ctx.precision


def _collectives_section(run, gpu: dict | None) -> dict:
    """How FSDP2's and DTensor's collectives were measured (gpuprof.measure.collective_hooks,
    funcol_hooks; on CUDA collective_events: `gpu`, what was read); the counts are in each step's
    `extra.collectives`."""
    hooks = run.hooks
    cuda = run.device.startswith("cuda")
    return {
        "wrapped": list(hooks.collective_kinds),
        "group": dict(hooks.collective_group) or None,
        "clock": "host (CUDA: the calls enqueue; the copy-out's wait is on the GPU timeline)" if cuda else "host",
        "method": ("FSDP2's foreach_all_gather, foreach_all_gather_copy_out and foreach_reduce, and DTensor's "
                   "functional collectives (their issue and their wait_tensor), wrapped for the run: each call is "
                   "the `comm` phase on the script's thread; calls, bytes and host seconds per step"),
        "errors": list(hooks.collective_errors)[:5],
        **(gpu or {}),
    }


def _attribute_data(run, measured) -> dict:
    """Second data method: `other` time the sampler finds inside an unwrapped data-like user
    function (a get_batch closure, a loader in another module) moves to `data`, in proportion
    to the share of `other` samples taken inside one."""
    s = run.sampler
    other = s.labelled.get("other", 0) if s else 0
    marked = s.marked.get("other", 0) if s else 0
    share = marked / other if other else 0.0
    if share > 0:
        for r in measured:
            for phases in (r.phases, r.gpu_phases):
                if phases and phases.get("other"):
                    moved = phases["other"] * share
                    phases["other"] -= moved
                    phases["data"] = phases.get("data", 0.0) + moved
    found = getattr(run, "loader", None)
    return {
        "method": ("timed: the calls that produced the first training forward's inputs, followed back from its "
                   "call site (a function, a method, next() of an iterator or generator: "
                   "gpuprof.runners.loader_discovery), else the script's get_batch-like functions, and "
                   "DataLoader iteration, are timed as `data`; plus sampled: `other` time whose stack samples "
                   "fall in a loader that cannot be timed (a generator a for loop resumes) or an unwrapped "
                   "data-like user function moves to `data` by its sample share"),
        "discovered": found.to_dict() if found is not None else None,
        "wrapped": list(run.hooks.wrapped),
        "dropped": sorted(run.hooks.disqualified),
        "other_samples": other,
        "other_samples_in_data_functions": marked,
        "other_moved_to_data_share": share,
    }


def _script_section(run, attribution: dict, gpuprof_step_s: float | None = None) -> dict:
    iters = run.iter_lines
    if run.keep_steps is not None:  # a sample of the lines (script_state): in the order printed
        iters = sorted(iters, key=lambda x: -1 if x.step is None else x.step)
    iters = derive_step_times(iters)  # modded-nanogpt prints a running total, not a step time
    # The script's own step lines (any format gpuprof.steplog reads) beside gpuprof's step.
    reported = reported_summary(iters, skip_first=run.warmup, gpuprof_step_s=gpuprof_step_s)
    counts = dict(run.hooks.counts)
    hooks = {"counts": counts}
    if not run.hooks.accelerator:
        hooks["h2d_note"] = "no accelerator available to torch: a CPU-only run has no host-to-device copies"
    elif counts["h2d_copies"] == 0:
        hooks["h2d_note"] = "no host-to-device copies seen"
    section = {
        # What ended each step (gpuprof.measure.step_rules), and the call that showed it.
        "steps": {"rule": run.hooks.step_rule, "marker": run.hooks.step_marker,
                  "optimizers_alive": run.hooks.optimizers_alive},
        "reported": reported,
        "iter_lines": [x.to_dict() for x in iters],
        "eval_lines": [vars(x) for x in run.eval_lines],
        "hooks": hooks,
        "data_attribution": attribution,
    }
    if run.sampler is not None:
        # paths as the user names them: from the script's folder, or for `-m` the folder it ran from
        base = os.getcwd() if run.command[:1] == ["-m"] else os.path.dirname(run.file)
        section["sampler"] = run.sampler.stats()
        section["top_functions"] = {p: run.sampler.top(p, 5, relative_to=base)
                                    for p in run.sampler.counts}
    return section
