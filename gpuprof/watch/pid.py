"""`gpuprof watch --pid PID`: the flight recorder for a run that is already going, from outside it.

Each window is one `attach` recording (gpuprof.attach.run: py-spy stacks, psutil, NVML) of
`--every` seconds; its steps (complete optimizer steps, host phase times from the samples) become
the window's steps, and the window goes through the same figures, periodic finder and change test
as an in-process watch (gpuprof.watch.recorder.Recorder.publish). Nothing is injected into the
target and nothing in it changes.

What differs from `gpuprof watch SCRIPT`, and is said in each event:
- Steps are numbered from the first one watch saw (the script's own iteration number is not
  readable from outside), and only the steps py-spy saw whole are counted: between two
  recordings py-spy restarts (`unsampled_s` in the next window: typically a fraction of a second)
  and a step that straddles a window's edge is in neither.
- Tokens are not known from outside: no tokens/s and no MFU per window.
- The host figures are the target's (its CPU and its descendants', its reads, its memory, the
  workers it started); the files a window names are the large files the target had open or
  mapped for the first time (attach's data files), not every open.
- A window with no complete step (an eval or a checkpoint longer than the window) is an event
  with `n_steps` 0 and why, not an end.
The final report is attach's over the last window with steps, then the changes over the whole run.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from gpuprof.attach.phases import UNIT_SURE, _unit_fit
from gpuprof.errors import GpuprofError, InterruptedEmpty
from gpuprof.watch.counters import WindowCounters
from gpuprof.watch.recorder import Recorder
from gpuprof.watch.windows import Every, OpenWindow, window_figures

POOL_MIN = 8  # pooled gaps before the pooled unit replaces each window's own guess
UNIT_POOL = 60  # gaps pooled to infer the micro-steps per step (the fit's cost grows with them)
RATE_HZ = 200  # py-spy's samples per second by default, attach's: a step boundary needs a sample in it
NVML_KEYS_MEAN = ("gpu_util_pct", "mem_util_pct", "sm_clock_mhz", "sm_clock_share", "power_w")
NVML_KEYS_MAX = ("temp_c", "mem_used_bytes")


def check_every(every: Every) -> Every:
    if every.seconds is None:
        raise GpuprofError(f"--every {every.text} with --pid: give a duration (30s, 5m): from outside, "
                           f"a window is one py-spy recording of that long")
    if every.seconds < 1:
        raise GpuprofError(f"--every {every.text} with --pid: a window must last at least 1 s "
                           f"(py-spy starts afresh for each)")
    return every


def nvml_of(section: dict | None) -> dict:
    """A window's GPU figures from attach's `nvml` section (the same keys as an in-process window's,
    gpuprof.watch.counters.nvml_window): means, the maxima that matter, the throttle reasons' shares."""
    section = section or {}
    if not section.get("available"):
        return {"not_measured": section.get("reason") or "no GPU sampled"}
    summary = section.get("summary") or {}
    out: dict = {"samples": section.get("samples")}
    for k in NVML_KEYS_MEAN:
        out[k] = (summary.get(k) or {}).get("mean")
    for k in NVML_KEYS_MAX:
        out[k] = (summary.get(k) or {}).get("max")
    out["throttle_share"] = section.get("throttle_share")
    return out


@dataclass
class PidWatchResult:
    recorder: Recorder
    last_profile: object | None  # the last window's attach Profile with steps (the final report's)
    ended: str  # "finished" (the target ended), "interrupted" (Ctrl-C), "windows" (max_windows reached)
    windows_without_steps: int = 0
    reasons: list = field(default_factory=list)


def _alive(pid: int) -> bool:
    import psutil

    try:
        p = psutil.Process(pid)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch_pid(pid: int, every: Every, sinks: list[Callable[[dict], None]] | None = None, *, rate: int = RATE_HZ,
              nonblocking: bool = True, grad_accum: int | None = None, max_windows: int | None = None,
              attach_fn: Callable | None = None, alive: Callable[[int], bool] = _alive,
              counters: WindowCounters | None = None, clock: Callable[[], float] = time.monotonic,
              nvml=None) -> PidWatchResult:
    """Watch process `pid` window after window until it ends (or Ctrl-C, or `max_windows`).
    attach_fn: gpuprof.attach.run.attach (tests pass a fake with its signature)."""
    check_every(every)
    if attach_fn is None:
        from gpuprof.attach.process import open_process
        from gpuprof.attach.run import attach as attach_fn

        open_process(pid, suggest="gpuprof watch --pid {pid}")  # no such process, not Python: one line, exit 2
    recorder = Recorder(every, 0, sinks, clock=clock, counters=counters or WindowCounters(pid, clock=clock))
    recorder.counters.start()
    t0 = clock()
    seen_files: set[str] = set()
    base = 0  # steps seen so far: the next window's first step number
    last_end = 0.0
    last_profile = None
    empty = 0
    reasons: list[str] = []
    ended = "finished"
    number = 0
    # The micro-steps per optimizer step: given, or inferred from the gaps between seen step
    # boundaries pooled over the windows so far (held for the rest of the run once sure). One
    # window sees few boundaries when the once-per-step code is a sliver of the step (a slow
    # loader, a low --rate): its own guess can be several times off, and all its steps with it,
    # so from POOL_MIN pooled gaps on, the pooled guess is used, sure or not, and said so.
    held = grad_accum
    held_source = "--grad-accum" if grad_accum else None
    pool: deque = deque(maxlen=UNIT_POOL)
    guess: tuple[int, str] | None = None  # the pooled unit before this window, and where it came from
    try:
        while max_windows is None or number < max_windows:
            if not alive(pid):
                break
            number += 1
            t_start = clock() - t0
            try:
                unit, unit_source = (held, held_source) if held is not None else guess or (None, None)
                # no idle baseline before each window (attach.cost): a watch's windows follow each other
                res = attach_fn([pid], every.seconds, rate=rate, nonblocking=nonblocking, grad_accum=unit,
                                nvml=nvml, cost_before_s=0.0)
            except InterruptedEmpty:
                ended = "interrupted"
                recorder.windows = number - 1
                break
            except GpuprofError as exc:
                if not alive(pid):
                    break
                empty += 1
                if len(reasons) < 10:
                    reasons.append(str(exc))
                ev = {"kind": "window", "window": number, "steps": [None, None], "n_steps": 0, "sampled_steps": 0,
                      "t_s": [round(t_start, 6), round(clock() - t0, 6)], "no_steps": str(exc),
                      "unsampled_s": round(max(0.0, t_start - last_end), 6), "host": recorder.counters.read(),
                      "time_unix": time.time()}
                last_end = clock() - t0
                recorder.publish_empty(number, ev)
                continue
            profile = res.profiles[0]
            t_end = clock() - t0
            how = (profile.measurements.get("attach") or {}).get("steps") or {}
            if unit is not None and not grad_accum:  # ours, not the user's: say where it came from
                how["unit_source"] = unit_source
                ((profile.run.get("config") or {}).get("source") or {})["grad_accum"] = unit_source
            unit_now = {"value": unit if unit is not None else how.get("typical_micro_steps"),
                        "source": unit_source or how.get("unit_source")}
            if held is None:
                pool.extend(c for c in how.get("gap_micro_steps") or [] if c)
                fit, margin = _unit_fit(list(pool)) if len(pool) >= POOL_MIN else (0, None)
                likelier = f"{math.exp(min(margin, 50)):.1f}× likelier than the next unit" if margin is not None else "the only unit"
                where = f"the {len(pool)} gaps between step boundaries seen in windows 1–{number}"
                if fit and (margin is None or margin >= UNIT_SURE):
                    held, held_source = fit, f"inferred from {where}, {likelier}; held from window {number + 1} on"
                elif fit:
                    guess = (fit, f"inferred from {where}; uncertain: only {likelier} (--grad-accum N sets it)")
            w = OpenWindow(number, t_start)
            for i, s in enumerate(profile.steps):
                w.add({"index": base + i, "wall_s": s.wall_s, "phases": dict(s.phases), "tokens": 0,
                       "micro_steps": s.micro_steps})
            base += len(profile.steps)
            ev = window_figures(w, t_end, partial=bool(res.interrupted or res.ended))
            ev["time_unix"] = time.time()
            ev["unsampled_s"] = round(max(0.0, t_start - last_end), 6)
            last_end = t_end
            ev["mfu"] = None
            ev["mfu_not_measured"] = "no token count from outside the process"
            ev["micro_steps_unit"] = unit_now
            ev["host"] = recorder.counters.read()
            ev["nvml"] = nvml_of(profile.measurements.get("nvml"))
            att = profile.measurements.get("attach") or {}
            samp = att.get("sampler") or {}
            ev["sampler"] = {"tool": "py-spy", "rate_hz": rate, "samples": samp.get("samples"),
                             "expected_samples": samp.get("expected_samples"),
                             "late_share": (samp.get("quality") or {}).get("late_share")}
            files = [f for f in (att.get("process") or {}).get("files") or [] if f.get("path") not in seen_files]
            seen_files.update(f["path"] for f in files)
            ev["files_opened"] = [{"path": f["path"], "fstype": f.get("fs_type"), "fs_kind": f.get("fs_kind"),
                                   "mountpoint": f.get("mountpoint")} for f in files[:20]]
            if len(files) > 20:
                ev["files_opened_more"] = len(files) - 20
            recorder.steps_seen += w.n
            recorder.publish(w, ev, partial=bool(res.interrupted or res.ended))
            last_profile = profile
            if res.interrupted:
                ended = "interrupted"
                break
            if res.ended:
                break
        else:
            ended = "windows"
    except KeyboardInterrupt:
        ended = "interrupted"
    recorder.end(ended)
    return PidWatchResult(recorder, last_profile, ended, empty, reasons)
