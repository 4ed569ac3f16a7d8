"""`gpuprof attach PID`: a run that is already going, measured from outside for a window.

py-spy samples the target's stacks (gpuprof.attach.pyspy), psutil reads the process and its
workers (gpuprof.attach.process), NVML the GPU it uses (gpuprof.attach.gpu). The training
thread's stacks become phases and steps (gpuprof.attach.phases), and the result is a Profile
with mode "attach": its steps are the complete optimizer steps in the window, with host phase
times from the samples; it goes through the same analysis and reports as `diagnose`. Nothing
is injected into the target and nothing in it changes. The profile holds the figures only (the
phase shares, the sampler, the process, NVML's readings); what they say together about the GPU is
the report's (gpuprof.report.attach).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from gpuprof.attach import phases as ph
from gpuprof.attach.cost import BEFORE_S, CostWatch
from gpuprof.attach.gentle import choice as gentle_choice
from gpuprof.attach.gpu import GpuWatch
from gpuprof.attach.loops import find_shape
from gpuprof.attach.process import ProcessWatch, open_process
from gpuprof.attach.pyspy import NICENESS, Recording, pyspy_binary, pyspy_version
from gpuprof.attach.quality import SamplerQuality
from gpuprof.errors import GpuprofError, InterruptedEmpty
from gpuprof.profile import Profile, StepRecord

METHOD = ("py-spy record --idle --format speedscope (the training thread's stacks in sample order, each one "
          "sampling period); each stack's phase from the functions in it; steps from the loop's once-per-step "
          "lines (its source), else from the ends of the optimizer's steps")
MAX_SYSTEMATIC = 0.10  # the widest a share's interval is made for late samples


@dataclass
class AttachResult:
    profiles: list[Profile]  # one per process, in the order given
    interrupted: bool
    ended: list[int]  # the PIDs that ended during the window


def attach(pids: list[int], duration_s: float, *, rate: int = 100, nonblocking: bool = True, nvml=None,
           grad_accum: int | None = None,
           on_tick: Callable[[dict], None] | None = None, poll_s: float = 0.2,
           cost_before_s: float = BEFORE_S, on_start: Callable[[], None] | None = None) -> AttachResult:
    """Sample every process in `pids` at once for `duration_s` (Ctrl-C ends it early) and build
    one Profile per process. cost_before_s: the seconds before sampling (gpuprof idle) whose
    waits for a CPU are the baseline of what attaching costs the target (gpuprof.attach.cost).
    on_start(): called as sampling starts (after that baseline).

    GpuprofError (one line, exit 2): no such process, py-spy cannot read one (not Python, no
    permission), or one made no complete optimizer step in the window (then where its time went)."""
    if duration_s <= 0:
        raise GpuprofError(f"--duration must be positive, got {duration_s:g}")
    if not 1 <= rate <= 1000:
        raise GpuprofError(f"--rate must be 1 to 1000 samples per second, got {rate}")
    if grad_accum is not None and grad_accum < 1:
        raise GpuprofError(f"--grad-accum must be positive, got {grad_accum}")
    if len(set(pids)) != len(pids):
        raise GpuprofError("a PID is given twice")
    procs = [open_process(pid) for pid in pids]
    exe = pyspy_binary()
    folder = tempfile.mkdtemp(prefix="gpuprof-attach-")
    interrupted = False
    recs: list[Recording] = []
    try:
        watches = [ProcessWatch(p) for p in procs]
        gpus = [GpuWatch(pid, nvml) for pid in pids]
        costs = [CostWatch(pid) for pid in pids]
        if cost_before_s > 0:  # the targets' waits for a CPU with gpuprof idle, as the baseline
            for c in costs:
                c.before(cost_before_s / len(costs))
        for w, g, c in zip(watches, gpus, costs):
            w.start()
            g.start()
            c.start()
        t0 = time.monotonic()
        quality = SamplerQuality(rate, NICENESS)
        quality.start()
        recs = [Recording(pid, duration_s, os.path.join(folder, f"stacks-{pid}.json"), rate=rate,
                          nonblocking=nonblocking, exe=exe) for pid in pids]
        if on_start is not None:
            on_start()  # sampling starts now
        try:
            while any(r.running() for r in recs):
                time.sleep(poll_s)
                for w, r in zip(watches, recs):
                    w.poll()
                    if w.ended_at is not None:
                        r.stop()  # the target is gone: what was sampled stands
                if on_tick is not None:
                    on_tick({"elapsed_s": time.monotonic() - t0, "duration_s": duration_s,
                             "ended": [w.p.pid for w in watches if w.ended_at is not None],
                             "so_far": {w.p.pid: w.so_far() for w in watches if w.ended_at is None}})
        except KeyboardInterrupt:
            interrupted = True
            for r in recs:
                r.stop()
        if not interrupted and time.monotonic() - t0 < duration_s - 1:
            # py-spy stopped early: its target is exiting (it may still be finishing for a moment)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and any(w.ended_at is None for w in watches):
                for w in watches:
                    w.poll()
                time.sleep(0.05)
        results = [r.result() for r in recs]
        sampling = quality.stop()
        facts = [w.stop() for w in watches]
        for f, c in zip(facts, costs):
            f["cost"] = c.stop()
            f["cost"]["gpuprof_priority"] = gentle_choice()
        nvml_sections = [g.stop() for g in gpus]
    finally:
        for r in recs:
            if r.running():
                r.proc.kill()
        shutil.rmtree(folder, ignore_errors=True)
    window = time.monotonic() - t0
    version = pyspy_version(exe)
    try:
        profiles = [build_profile(pid, tl, info, f, nv, rate=rate, window_s=window, nonblocking=nonblocking,
                                  version=version, interrupted=interrupted, grad_accum=grad_accum, quality=sampling)
                    for pid, (tl, info), f, nv in zip(pids, results, facts, nvml_sections)]
    except GpuprofError as exc:
        if interrupted:  # Ctrl-C before a complete step: say what was sampled, exit 130
            raise InterruptedEmpty(f"interrupted: {exc}") from None
        raise
    return AttachResult(profiles, interrupted, [f["pid"] for f in facts if f.get("ended_at_s") is not None])


def _where(shares: dict) -> str:
    top = sorted(((v["share"], k) for k, v in shares.items() if v["share"] > 0.005), reverse=True)
    return ", ".join(f"{k} {s:.0%}" for s, k in top) or "no samples"


def build_profile(pid: int, timelines: dict, info: dict, facts: dict, nvml_section: dict, *, rate: int,
                  window_s: float, nonblocking: bool, version: str | None, interrupted: bool,
                  grad_accum: int | None = None, quality: dict | None = None) -> Profile:
    """The Profile of an attached run from its samples and readings (pure: tests feed it)."""
    tl = ph.main_thread(timelines)
    if tl is None or not tl.spans:
        raise GpuprofError(f"no stacks sampled from process {pid} in {window_s:.1f} s"
                           + (" (it ended)" if facts.get("ended_at_s") is not None else ""))
    spans = ph.phase_spans(tl)
    sampled_s = sum(b - a for a, b, _ in spans)
    quality = dict(quality or {})
    # a sample late by more than a period may fall in another phase than the one it was due in
    shares = ph.shares(spans, rate, systematic=min(quality.get("late_share") or 0.0, MAX_SYSTEMATIC))
    shape = find_shape(st for _, _, st in tl.spans)
    marks = ph.loop_marks(tl, shape) if shape is not None and shape.micro_loop is not None else None
    found, how = ph.find_steps(spans, blip_s=2.5 / rate, grad_accum=grad_accum, marks=marks,
                               structural_unit=1 if shape is not None and shape.micro_loop is None else None)
    if shape is not None:
        how["loop"] = {"file": shape.file, "function": shape.function, "step_loop_lines": list(shape.step_loop),
                       "micro_loop_lines": list(shape.micro_loop) if shape.micro_loop else None}
    steps = found
    if not steps:
        seen = how["optimizer_ends"]
        hint = ("no optimizer step at all: is it training?" if seen == 0 else
                "one optimizer step: a step is longer than half the window, so sample longer (--duration)")
        raise GpuprofError(f"process {pid}: no complete training step in {sampled_s:.1f} s of samples ({hint}); "
                           f"where its time went: {_where(shares)}")
    micro = how["typical_micro_steps"] or 1
    records = [StepRecord(index=i, wall_s=s["wall_s"], phases={k: s["phases"].get(k, 0.0) for k in ph.PHASES},
                          tokens=0, micro_steps=int(round(s["micro_steps"])) or int(micro), start_s=s["start_s"],
                          # the order the phases ran in, as sampled (not for a gap split evenly)
                          extra={"spans": s["spans"]} if s.get("spans") else {})
               for i, s in enumerate(steps)]
    data_files = facts.get("files") or []
    data_path = max(data_files, key=lambda f: f["size_bytes"])["path"] if data_files else None
    ended = facts.get("ended_at_s") is not None
    run = {
        "mode": "attach",
        "command": facts.get("command"),
        "pid": pid,
        "rank": facts.get("rank", 0),
        "world_size": facts.get("world_size", 1),
        "data_path": data_path,
        "run_wall_s": window_s,
        "ended": "interrupted" if interrupted else "finished",
        "partial": interrupted or ended,
        # when the target ended inside the window (seconds into it), else None: report/attach words it
        "target_ended_at_s": facts.get("ended_at_s") if ended else None,
        # where each config value came from (provenance, as a script run's config.source)
        "config": {"grad_accum": int(micro),
                   "source": {"grad_accum": "--grad-accum" if grad_accum else "py-spy stacks"}},
    }
    from gpuprof.measure.environment import environment

    # this machine (no torch: ours is not the target's); the device is the GPU NVML finds it on, if any
    env = environment("cpu", torch_fields=False)
    env["device"] = None
    gpus = nvml_section.get("gpus") or []
    on_gpu = bool(nvml_section.get("available") and gpus)
    if on_gpu:
        env.update(device="cuda", device_name=gpus[0].get("name"), device_memory_bytes=gpus[0].get("memory_total_bytes"))
    # the device the run computes on, as far as NVML can tell: a GPU it has a context on, else the CPU
    run["config"]["device"] = f"cuda:{(nvml_section.get('gpus_of_process') or [{}])[0].get('index', 0)}" if on_gpu else "cpu"
    run["config"]["source"]["device"] = "NVML: a context on this GPU" if on_gpu else "no GPU reading"
    profile = Profile(run=run, steps=records, environment=env)
    profile.measurements["attach"] = {
        "method": METHOD,
        "sampler": {"tool": "py-spy", "version": version, "rate_hz": rate, "nonblocking": nonblocking,
                    "niceness": NICENESS, "format": "speedscope (sample order; time = samples / rate)",
                    "samples": info.get("samples"), "errors": info.get("errors"), "thread": tl.tid,
                    "expected_samples": round(rate * window_s), "behind_warnings": info.get("behind", 0),
                    "behind_max_s": info.get("behind_max_s"), "quality": quality,
                    "threads": len(timelines), "sampled_s": sampled_s,
                    # the wall-clock interval the training thread was sampled over (Unix time)
                    "window": [info.get("started_at", 0) + spans[0][0], info.get("started_at", 0) + spans[-1][1]]},
        "shares": shares,
        "steps": how,
        "process": facts,
    }
    profile.measurements["nvml"] = nvml_section
    if data_path:
        from gpuprof.measure.storage import StorageFacts

        storage = StorageFacts(data_path).stop(None)
        if storage:
            profile.measurements["storage"] = storage
    return profile


def merged(result: AttachResult) -> Profile:
    """One profile: the only process's, or every process as a rank (gpuprof.merge), by the RANK
    each was launched with (torchrun) or else in the order given."""
    if len(result.profiles) == 1:
        return result.profiles[0]
    import socket

    from gpuprof.merge import merge_entries

    ranks = [p.run.get("rank") for p in result.profiles]
    if len(set(ranks)) != len(ranks):  # not one job's ranks (or RANK unreadable): the order given
        ranks = list(range(len(result.profiles)))
    entries = [{"rank": r, "local_rank": r, "node_rank": 0, "host": socket.gethostname(),
                "world_size": len(result.profiles), "status": "interrupted" if result.interrupted else "ok",
                "error": None, "profile": p.to_dict()} for r, p in zip(ranks, result.profiles)]
    return merge_entries(entries)
