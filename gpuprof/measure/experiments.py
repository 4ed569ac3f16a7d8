"""Experiment steps: each fix gpuprof can switch from outside (gpuprof.measure.switches) timed in
the script's own loop, on its own steps, after the measured ones and before the script is stopped.

A saving timed on a copy of the model after the run has to be carried to the script's step (the
copy runs eagerly, alone, without the script's data, copies and Python), and the interval that
honestly spans both readings held zero for savings of 9%, while the copy missed what the script's
own step did (bf16 slower in the script, not in the copy). Here the script's next steps are the
measurement: for each applicable fix, `warmup_steps` steps with it on (a compile, autocast's
caches), then paired steps in ABBA order (A = as the script runs, B = the fix on), each timed step
after a step of its own way (experiment_plan.schedule: a way's first step after a switch runs cold, and timing it
put a 7% SDPA saving at 22%). The step's ratio B/A per pair gives the fix's
saving as a share of the script's own step, with its sign-test interval
(gpuprof.measure.paired), at the transfer factor 1. A fix that changes only some phases (its
switch's `phases`: the fused optimizer the optimizer's step) is compared on them: each pair's B
step is taken as its A step with those phases as B ran them (`paired_steps`), so the noise of the
phases it leaves alone is not in the ratio (series 10-12 of docs/measurements/
2026-12-07-loop-experiments.md: fused AdamW decided at 8 pairs within ±2.5 points, 13-64 pairs and
±3.4-5.3 before).

Bounded: the experiments share the post-run budget ("experiments", gpuprof.measure.budget),
planned on the measured steps' median host time, most promising first; an experiment that
cannot get MIN_PAIRS pairs is skipped and said. Never under --no-stop or watch (the training
itself is not altered there), nor in a data-parallel run (every rank would have to switch alike).
The hooks call `next_step()` at each step closed after the measured ones; it records that step's
way and sets the next one's, and answers False once done, with every switch restored.
"""

from __future__ import annotations

import time
from typing import Callable

from gpuprof.measure.experiment_plan import DECIDED_AFTER, MIN_PAIRS, _Planned, decided_width, plan_one
from gpuprof.measure.paired import paired_ratio_interval
from gpuprof.stats import median


class _PerForward:
    """A per-forward switch as one of the forward hooks' watchers (armed at each training
    forward's start, disarmed at its end: gpuprof.measure.forward_hooks)."""

    done = False

    def __init__(self, switch):
        self.switch = switch

    def arm(self) -> None:
        self.switch.enter()

    def disarm(self) -> None:
        self.switch.leave()


class Experiments:
    """The experiment steps of one script run (see the module doc).

    candidates() -> [Switch]: the fixes to try, most promising first (called once, when the
    measured steps are done). budget() -> (PostRunBudget): the run's post-run budget, made then.
    """

    def __init__(self, candidates: Callable[[], list], budget: Callable[[], object],
                 clock: Callable[[], float] = time.perf_counter, host_phases: bool = False):
        self._candidates = candidates
        # the host's phase times are the step's own (CPU): a fix's `phases` may be compared while
        # the steps run; on CUDA the host's phases are launch times, and only the GPU timeline read
        # after the run holds them
        self.host_phases = host_phases
        self._budget = budget
        self._clock = clock
        self.planned: list[_Planned] | None = None
        self.skipped: list[str] = []
        self.not_applicable: dict[str, str] = {}
        self.records: list[dict] = []  # each experiment step: index, experiment, way, timed, host_s
        self.errors: list[str] = []
        self.failures: list[dict] = []  # the script raised in an experiment step
        self._queue: list[tuple[int, str, bool]] = []  # (planned index, way, timed) still to run
        self._waiting: list = []  # switches not planned yet
        self.step_s: float | None = None
        self._open: tuple[int, str, bool] | None = None  # the step running now
        self._on: int | None = None  # the planned index whose fix is on
        self._watcher: _PerForward | None = None
        self._watcher_of: int | None = None  # the planned index whose switch the watcher enters
        self._deadline: float | None = None
        self._hooks = None
        self.allotted_s: float | None = None
        self.started: float | None = None
        self.ended: float | None = None
        self.stopped_early: str | None = None

    # -- the hooks' entry point ----------------------------------------------------------------

    def next_step(self, hooks) -> bool:
        """A step closed after the measured ones: record it, set the next one's way. False when
        the experiments are done (every switch restored): the hooks then stop the script."""
        try:
            if self.planned is None:
                self._start(hooks)
            else:
                self._record(hooks)
            if self._queue and self._clock() > self._deadline:
                self._cut("the experiments' share of the post-run budget ran out")
            if not self._queue:
                self._plan_next()
            if not self._queue:
                self.finish()
                return False
            self._open = self._queue.pop(0)
            self._apply(*self._open[:2])
            return True
        except Exception as exc:  # noqa: BLE001 - an experiment never fails the user's run
            self.errors.append(f"{exc.__class__.__name__}: {exc}")
            self.finish()
            return False

    def running(self) -> bool:
        """Between the first experiment step's start and the end of the experiments."""
        return self.planned is not None and self.ended is None

    def failed(self, error: dict) -> None:
        """The script raised during an experiment step (under the fix then on, or not): recorded
        with that experiment, every switch restored."""
        which = self.planned[self._open[0]].switch.id if self._open is not None else None
        self.failures.append({"experiment": which, "way": self._open[1] if self._open else None,
                              "error": f"{error.get('type')}: {error.get('message')}",
                              "where": f"{error.get('file')}:{error.get('line')}"})
        self.finish()

    def _start(self, hooks) -> None:
        self._hooks = hooks
        self._counts = dict(hooks.counts)  # the run's own counts: experiment steps are not the run's
        budget = self._budget()
        self.allotted_s = budget.allot("experiments") if budget is not None else 0.0
        self.started = self._clock()
        self._deadline = self.started + self.allotted_s
        walls = hooks.timer.host_walls()
        step_s = median(walls[-10:]) if walls else 0.0
        switches = []
        for sw in self._candidates():
            why = sw.why_not()
            if why is None:
                switches.append(sw)
            else:
                self.not_applicable[sw.id] = why
        self.step_s = step_s
        self.planned = []
        self._waiting = switches  # planned one at a time, each on the time the ones before left
        self._plan_next()
        if hooks.timer is not None:
            hooks.timer.listener = None  # the live display counts the measured steps, not these

    def _plan_next(self) -> None:
        """Queue the next experiment that fits its part of what is left of the share (what is left
        divided among the fixes still waiting; the ones that do not fit, said)."""
        while self._waiting and not self._queue:
            sw = self._waiting.pop(0)
            part = (self._deadline - self._clock()) / (len(self._waiting) + 1)
            planned, why = plan_one(sw, self.step_s, part)
            if planned is None and self._waiting:  # the later ones would not fit either: try it on all of it
                planned, why = plan_one(sw, self.step_s, self._deadline - self._clock())
            if planned is None:
                self.skipped.append(why)
                continue
            self.planned.append(planned)
            i = len(self.planned) - 1
            self._queue = [(i, way, timed) for way, timed in planned.steps]

    def _record(self, hooks) -> None:
        i, way, timed = self._open
        walls = hooks.timer.host_walls()
        rec = {"index": hooks.timer.last_index(), "experiment": self.planned[i].switch.id,
               "way": way, "timed": timed, "host_s": walls[-1] if walls else None}
        if self.planned[i].switch.phases and self.host_phases:  # the decision's own figures: host phases
            rec["host_phases"] = hooks.timer.last_host_phases()
        counts = getattr(hooks.timer, "last_counts", dict)()
        if counts:  # the step's page faults and kernel time (the allocator's state differs by way)
            rec.update(counts)
        self.records.append(rec)
        self._open = None
        if timed and self._decided(self.planned[i].switch.id):
            self._queue = [q for q in self._queue if q[0] != i]  # this fix is decided: the next one

    def _decided(self, exp_id: str) -> bool:
        """After a complete pair, from DECIDED_AFTER pairs on: the host times' ratio interval is
        decided (`decided_width`: ±DECIDED_HALF of the step, or a third of the saving it shows; one
        holding no change must also rule out RULED_OUT either way). The profile's step times decide
        the result; these only end the timing early."""
        timed = [r for r in self.records if r["experiment"] == exp_id and r["timed"]]
        if len(timed) % 2 or len(timed) // 2 < DECIDED_AFTER:
            return False
        phases = next(p.switch.phases for p in self.planned if p.switch.id == exp_id)
        a, b = paired_steps(timed, {r["index"]: r["host_s"] for r in timed},
                            {r["index"]: r.get("host_phases") for r in timed} if phases and self.host_phases else None,
                            phases)[:2]
        if len(a) < DECIDED_AFTER:
            return False
        return decided_width(paired_ratio_interval(a, b))

    def _cut(self, why: str) -> None:
        """Stop early, at a pair's end: the step that completes an open pair still runs, what
        follows it is dropped."""
        keep = []
        last = self.records[-1] if self.records else None
        if last is not None and self._queue:
            n = sum(1 for r in self.records if r["experiment"] == last["experiment"] and r["timed"])
            if n % 2 == 1:  # a pair is open (its queue is this one's): on to its second timed step, lead first
                upto = next((j for j, q in enumerate(self._queue) if q[2]), None)
                keep = self._queue[:upto + 1] if upto is not None else []
        self.stopped_early = why
        self._queue = keep
        self.skipped += [f"{sw.id}: not started, the experiments' share of the budget was spent" for sw in self._waiting]
        self._waiting = []

    def _apply(self, i: int, way: str) -> None:
        if self._on is not None and (self._on != i or way == "a"):
            self._switch_off()
        if self._watcher is not None and self._watcher_of != i:
            self._unwatch()
        sw = self.planned[i].switch
        # A per-forward switch is entered around each training forward while on; one that runs
        # `both_ways` (attention_switch: a torch function mode whose dispatch costs the same both
        # ways) is entered in its `a` steps too, off.
        if sw.per_forward and self._watcher is None and (way == "b" or getattr(sw, "both_ways", False)):
            self._watcher = _PerForward(sw)
            self._watcher_of = i
            self._hooks.forward_watchers.append(self._watcher)
        if way == "b" and self._on is None:
            sw.on()
            self._on = i

    def _unwatch(self) -> None:
        if self._watcher is not None:
            self._watcher.disarm()  # a step closed inside a forward: leave what the watcher entered
            if self._watcher in self._hooks.forward_watchers:
                self._hooks.forward_watchers.remove(self._watcher)
        self._watcher = self._watcher_of = None

    def _switch_off(self) -> None:
        sw = self.planned[self._on].switch
        if not getattr(sw, "both_ways", False):
            self._unwatch()
        sw.off()
        self._on = None

    def finish(self) -> None:
        """Every switch back to the script's own settings (idempotent)."""
        if self.ended is not None:
            return
        self.ended = self._clock()
        if self._hooks is not None and getattr(self, "_counts", None) is not None:
            self._hooks.counts.clear()
            self._hooks.counts.update(self._counts)
        if self._on is not None:
            try:
                self._switch_off()
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"restoring: {exc.__class__.__name__}: {exc}")
        if self._hooks is not None:
            self._unwatch()
        for p in self.planned or []:
            try:
                p.switch.restore()
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"restoring {p.switch.id}: {exc.__class__.__name__}: {exc}")
        budget = self._budget() if self.planned is not None else None
        if budget is not None:
            budget.done("experiments", list(self.skipped) + ([self.stopped_early] if self.stopped_early else []))

    # -- the profile ---------------------------------------------------------------------------

    def indices(self) -> set[int]:
        return {r["index"] for r in self.records}

    def section(self, step_seconds: dict[int, float], step_phases: dict[int, dict] | None = None) -> dict:
        """measurements.experiments, from each experiment step's time as the profile measures a
        step (`step_seconds`: index -> seconds, GPU timeline where there is one) and its phases
        (`step_phases`, the same timeline; None where it holds none: CUDA without its GPU
        timeline)."""
        out = {"method": ("experiment steps in the run's own loop (the script's, or the built-in one) after its measured steps: per fix, "
                          "warm-up steps with it on, then paired steps in ABBA order "
                          "(a = as the script runs, b = the fix on), each timed step after a step of its own way "
                          "(a way's first step after a switch runs cold and is not timed); the ratio b/a per pair, "
                          "its median and sign-test interval"),
               "allotted_s": self.allotted_s, "step_s": self.step_s,
               "spent_s": (self.ended - self.started) if self.started is not None and self.ended else None,
               "skipped": list(self.skipped), "not_applicable": dict(self.not_applicable),
               "steps": [dict(r, seconds=step_seconds.get(r["index"])) for r in self.records],
               "results": []}
        if self.stopped_early:
            out["stopped_early"] = self.stopped_early
        if self.errors:
            out["errors"] = self.errors[:5]
        if self.failures:
            out["failures"] = self.failures
        for p in self.planned or []:
            out["results"].append(self._result(p, step_seconds, step_phases))
        return out

    def _result(self, p: _Planned, step_seconds: dict[int, float], step_phases: dict[int, dict] | None) -> dict:
        sw = p.switch
        mine = [r for r in self.records if r["experiment"] == sw.id]
        timed = [r for r in mine if r["timed"]]
        a, b, b_whole = paired_steps(timed, step_seconds, step_phases, sw.phases)
        failed = next((f for f in self.failures if f["experiment"] == sw.id), None)
        if failed is not None:
            return {**sw.describe(), "pairs": len(a), "planned_pairs": p.pairs, "failed": failed,
                    "not_measured": f"the script raised in a step with the fix {'on' if failed['way'] == 'b' else 'off'}: "
                                    f"{failed['error']} ({failed['where']})"}
        local = b_whole is not None
        # the untimed steps: the warm-up with the fix on, and each way's first step after a switch
        res = {**sw.describe(), "pairs": len(a), "planned_pairs": p.pairs, "a_s": a, "b_s": b_whole if local else b,
               "warmup_s": [step_seconds.get(r["index"]) for r in mine if not r["timed"]]}
        if local:
            res.update(phases=list(sw.phases), b_local_s=b)
        if getattr(sw, "compile_s", None) is not None:
            res["compile_wrapper_s"] = sw.compile_s
        kernel = {w: [r["kernel_s"] for r in timed if r["way"] == w and isinstance(r.get("kernel_s"), (int, float))]
                  for w in ("a", "b")}
        if kernel["a"] and kernel["b"]:  # each way's kernel time per step (mean: tick-accounted) and faults
            res["kernel_s"] = {w: sum(v) / len(v) for w, v in kernel.items()}
            res["minor_faults"] = {w: median([r["minor_faults"] for r in timed if r["way"] == w
                                              and isinstance(r.get("minor_faults"), int)]) for w in ("a", "b")}
        idle = getattr(sw, "ineffective", lambda: None)()  # the fix on changed nothing (said why)
        if idle:
            res["not_measured"] = idle
        elif len(a) >= MIN_PAIRS:
            iv = paired_ratio_interval(a, b)
            res.update(ratio=iv.estimate, interval=iv.as_dict(), a_median_s=median(a), b_median_s=median(b))
            if local:  # the whole steps too: what the pairs show with every phase's noise in them
                whole = paired_ratio_interval(a, b_whole)
                res.update(step_ratio=whole.estimate, step_interval=whole.as_dict())
        else:
            res["not_measured"] = f"{len(a)} complete pairs, fewer than {MIN_PAIRS}"
        return res


def host_phases_hold(device) -> bool:
    """The host's phase times are the step's own on a CPU; on CUDA they are launch times (the
    GPU's work runs behind them), and only the GPU timeline holds a step's phases."""
    return str(device).startswith("cpu")


def step_figures(records, indices: set, device) -> tuple[dict, dict | None]:
    """The experiment steps' figures for `section`: index -> seconds and index -> phases, on the
    GPU timeline where a step has one; the host's phases only on a CPU (on CUDA without its GPU
    timeline, the host's phases are launch times: None, and every pair compares whole steps)."""
    on_cpu = host_phases_hold(device)
    seconds, phases = {}, {}
    for r in records:
        if r.index not in indices:
            continue
        gpu = r.gpu_s is not None
        seconds[r.index] = r.gpu_s if gpu else r.wall_s
        if gpu and r.gpu_phases:
            phases[r.index] = r.gpu_phases
        elif not gpu and on_cpu:
            phases[r.index] = r.phases
    return seconds, (phases or None)


def paired_steps(timed: list[dict], seconds: dict, phases: dict | None,
                 touched: tuple[str, ...] | None) -> tuple[list, list, list | None]:
    """The pairs of one experiment's timed steps (records in order, two adjacent steps each):
    (a, b, None) with each step's `seconds`; or, for a fix that changes only the phases `touched`
    and with every paired step's `phases` known, (a, b_local, b) where b_local = a − a's touched
    phases + b's: the pair compares the phases the fix changes, the rest of its `b` step taken as
    its `a` step's, so that the noise of the phases it leaves alone (the data, the Python between,
    the host's load) is not in the ratio."""
    pairs = []  # (a's index, b's index, a's seconds, b's seconds)
    for first, second in zip(timed[0::2], timed[1::2]):
        ways = {first["way"]: first["index"], second["way"]: second["index"]}
        sa, sb = seconds.get(ways.get("a")), seconds.get(ways.get("b"))
        if sa and sb:
            pairs.append((ways["a"], ways["b"], sa, sb))
    a, whole = [p[2] for p in pairs], [p[3] for p in pairs]
    if not touched or phases is None:
        return a, whole, None
    local = []
    for ia, ib, sa, _ in pairs:
        pa, pb = phases.get(ia), phases.get(ib)
        if not pa or not pb:  # a pair without its phases: every pair compares whole steps
            return a, whole, None
        ta, tb = (sum(float(ph.get(k, 0.0)) for k in touched) for ph in (pa, pb))
        if sa - ta + tb <= 0:
            return a, whole, None
        local.append(sa - ta + tb)
    return a, local, whole
