"""The flight recorder: an instrument of the watched run that turns each closed step into windows,
changes and periodic events, and hands each to the events file, the metrics and the display.

It hooks the timer's listener at start (each closed step's host figures: index, wall_s, phases,
tokens, micro_steps) and keeps only the open window's steps and the last HISTORY_WINDOWS
windows' (gpuprof.watch.changes): memory is bounded however long the run goes. A window closes at
the end of the first step past its length; its figures are computed and written on the training
thread, between two steps (about a millisecond, plus an fsync, once per window), so that a window
is on disk before the next step starts: what a `kill -9` keeps. Nothing here may end the user's
run: a failure is counted and reported, never raised.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from gpuprof.watch.causes import likely_causes
from gpuprof.watch.changes import HISTORY_WINDOWS, RULE, ChangeDetector, PeriodicFinder
from gpuprof.watch.counters import BoundedNvml, FirstOpens, WindowCounters, nvml_window
from gpuprof.watch.windows import Every, OpenWindow, window_figures

MAX_CHANGES = 1000  # kept for the final report (all are in the events file)
# this rank's last changes matched with the other ranks' (a peer's change is confirmed within a
# window or two of this rank's: eight leave room for a run of several close changes)
PEER_WINDOW_CHANGES = 8


def _filesystem(path: str) -> dict:
    from gpuprof.disk.fs import filesystem_info

    fs = filesystem_info(path)
    return {"fstype": fs.type, "fs_kind": fs.kind, "mountpoint": fs.mountpoint}


class Recorder:
    """Instrument `watch`. every: the window length; warmup: steps before the first window;
    sinks: callables given each event as it is made (the events file, the metrics, the display);
    mfu_basis(ctx) -> (flops per token, peak FLOP/s) or a reason string (no MFU)."""

    name = "watch"

    def __init__(self, every: Every, warmup: int, sinks: list[Callable[[dict], None]] | None = None, *,
                 mfu_basis: Callable | None = None, clock: Callable[[], float] = time.monotonic,
                 counters: WindowCounters | None = None, peers=None):
        self.every = every
        self.warmup = warmup
        self.sinks = list(sinks or [])
        self._mfu_basis = mfu_basis
        self._clock = clock
        self.counters = counters or WindowCounters(clock=clock)
        self.opens = FirstOpens(clock=clock)
        self.detector = ChangeDetector()
        self.periodic = PeriodicFinder()
        self.recent: deque = deque(maxlen=HISTORY_WINDOWS)  # the last windows' events
        self.changes: list[dict] = []
        self.changes_total = 0
        self.windows = 0
        self.steps_seen = 0
        self.errors: dict[str, int] = {}
        self.last_error: str | None = None
        self._open: OpenWindow | None = None
        self._t0 = clock()
        self._nvml: BoundedNvml | None = None
        self._basis: tuple | str | None = None
        self._timer = None
        self._listener = None
        self.peers = peers  # gpuprof.watch.ranks.PeerChanges under torchrun: the other ranks' changes, live
        self.stragglers = 0
        self._latest: deque = deque(maxlen=PEER_WINDOW_CHANGES)  # this rank's last changes, for the peers

    # -- instrument ------------------------------------------------------------------------------

    def start(self, ctx) -> None:
        """At the run's first forward: hook the timer's listener, read the counters once."""
        self._timer = ctx.timer
        self._listener = ctx.timer.listener
        ctx.timer.listener = self._on_step_safe
        self.counters.start()
        self.opens.__enter__()
        if self._mfu_basis is not None:
            try:
                self._basis = self._mfu_basis(ctx)
            except Exception as exc:  # noqa: BLE001
                self._basis = f"{exc.__class__.__name__}: {exc}"

    def attach_nvml(self, nvml: BoundedNvml | None) -> None:
        self._nvml = nvml

    def stop(self, ctx) -> dict:
        """After the run: the last, partial window, then the recorder's section of the profile."""
        self.opens.__exit__(None, None, None)
        if self._timer is not None and self._timer.listener is self._on_step_safe:
            self._timer.listener = self._listener
        if self._open is not None and self._open.n:
            self._close(self._clock(), partial=True)
        return self.section()

    def section(self) -> dict:
        """measurements.watch: the windows' length, counts, the changes and periodic events."""
        kept = None
        if self._timer is not None and getattr(self._timer, "keep_steps", None) is not None:
            kept = {"steps_closed": self._timer.steps_closed, "keep_steps": self._timer.keep_steps,
                    "sample": "the warmup steps, then a uniform random sample of the measured steps "
                              "(reservoir sampling, seeded): bounded memory over a run of any length"}
        return {"every": self.every.to_dict(), "windows": self.windows, "steps_in_windows": self.steps_seen,
                "change_rule": RULE, "changes": list(self.changes), "changes_total": self.changes_total,
                "periodic": list(self.periodic.known.values()), "kept": kept,
                "stragglers_live": self.stragglers if self.peers is not None else None,
                "errors": dict(self.errors), "last_error": self.last_error}

    # -- per step --------------------------------------------------------------------------------

    def _on_step_safe(self, rec: dict) -> None:
        if self._listener is not None:
            try:
                self._listener(rec)
            except Exception:  # noqa: BLE001 - the display's own listener: dropped, as the timer would
                self._listener = None
        try:
            self.on_step(rec)
        except Exception as exc:  # noqa: BLE001 - a recorder never ends the user's run
            self._error("step", exc)

    def on_step(self, rec: dict) -> None:
        """A closed step (the timer's listener record). Warmup steps open no window."""
        if rec["index"] < self.warmup:
            if rec["index"] == self.warmup - 1:
                self._restart_counters()
            return
        now = self._clock()
        if self._open is None:
            self._open = OpenWindow(self.windows + 1, self._since(now) - rec["wall_s"])
        self._open.add(rec)
        self.steps_seen += 1
        if self._open.full(self.every, self._since(now)):
            self._close(now)

    def _restart_counters(self) -> None:
        """The first window's counters start where the measured steps do."""
        self.counters.read()
        self.opens.take()
        if self._nvml is not None:
            self._nvml.take_window()

    def _since(self, now: float) -> float:
        return now - self._t0

    # -- per window ------------------------------------------------------------------------------

    def _close(self, now: float, partial: bool = False) -> None:
        w, self._open = self._open, None
        self.windows = w.number
        ev = window_figures(w, self._since(now), partial=partial)
        ev["time_unix"] = time.time()
        self._mfu(ev)
        ev["host"] = self.counters.read()
        if self._nvml is not None:
            ev["nvml"] = nvml_window(self._nvml.take_window())
        else:
            ev["nvml"] = {"not_measured": "no GPU sampled (a CPU run, --no-samplers, or NVML unavailable)"}
        new, more = self.opens.take()
        ev["files_opened"] = [{"path": p, "t_s": round(t - self._t0, 3)} for t, p in new]
        if more:
            ev["files_opened_more"] = more
        self.publish(w, ev, partial=partial)

    def publish_empty(self, number: int, ev: dict) -> None:
        """A window in which no complete step was seen (`watch --pid`: an eval or a checkpoint
        longer than the window): written to the sinks; nothing for the change test."""
        self.windows = number
        self.recent.append(ev)
        self._emit(ev)

    def publish(self, w: OpenWindow, ev: dict, *, partial: bool = False) -> None:
        """A closed window's event, complete with its samplers' figures: written to the sinks, then
        the periodic spikes and the change test over its steps (`watch --pid` closes its windows
        from outside the target and hands them here: one rule for both)."""
        self.windows = w.number
        self.recent.append(ev)
        self._emit(ev)
        for p in self.periodic.add(ev["irregular"]):
            p["window"] = w.number
            self._emit(p)
        change = self.detector.add(w.number, w.steps) if not partial else None
        if change is not None:
            self._changed(change, w.number)
        if self.peers is not None:
            try:
                self._check_peers(w.number)
            except Exception as exc:  # noqa: BLE001 - a peer's file never ends the user's run
                self._error("peers", exc)

    def _check_peers(self, window: int) -> None:
        """Under torchrun, once per window: the other ranks' changes so far (read from their events
        files) against this rank's recent ones; a rank that fell behind, newly seen, is added to
        the change's causes and is a `straggler` event of its own (gpuprof.watch.ranks)."""
        from gpuprof.watch.ranks import add_causes, straggler_causes

        others = self.peers.poll()
        if not any(others.values()):
            return
        for c in self._latest:
            for cause in add_causes(c, straggler_causes(self.peers.rank, c, others)):
                self.stragglers += 1
                self._emit({"kind": "straggler", "window": window, "rank": self.peers.rank,
                            "change_at_step": c["at_step"], "change_phase": c["phase"],
                            "direction": c["direction"], "cause": cause})

    def _changed(self, change, window: int) -> None:
        ev = change.to_event()
        ev["window"] = window
        ev["first_window_after"] = change.first_window_after
        before = [e for e in self.recent if e["window"] < change.first_window_after]
        after = [e for e in self.recent if e["window"] >= change.first_window_after]
        for w in (*before, *after):  # name the filesystems of the files opened, once
            for f in w.get("files_opened") or []:
                if "fstype" not in f:
                    try:
                        f.update(_filesystem(f["path"]))
                    except Exception:  # noqa: BLE001
                        f["fstype"] = None
        ev["causes"] = likely_causes(before, after)
        ev["periodic_known"] = [{"phase": p["phase"], "every_steps": p["every_steps"]}
                                for p in self.periodic.known.values()]
        self.changes_total += 1
        self._latest.append(ev)
        if len(self.changes) < MAX_CHANGES:
            self.changes.append(ev)
        self._emit(ev)

    def _mfu(self, ev: dict) -> None:
        basis = self._basis
        if isinstance(basis, tuple) and ev.get("tokens_per_s"):
            per_token, peak = basis
            ev["mfu"] = ev["tokens_per_s"] * per_token / peak
        else:
            ev["mfu"] = None
            ev["mfu_not_measured"] = basis if isinstance(basis, str) else (
                "no token count" if not ev.get("tokens_per_s") else "no FLOP count or peak")

    def _emit(self, ev: dict) -> None:
        for sink in self.sinks:
            try:
                sink(ev)
            except Exception as exc:  # noqa: BLE001
                self._error(getattr(sink, "__name__", "sink"), exc)

    def end(self, ended: str) -> None:
        """The run's end: the last event."""
        self._emit({"kind": "end", "ended": ended, "windows": self.windows, "steps_in_windows": self.steps_seen,
                    "changes": self.changes_total, "time_unix": time.time()})

    def _error(self, where: str, exc: Exception) -> None:
        self.errors[where] = self.errors.get(where, 0) + 1
        self.last_error = f"{where}: {exc.__class__.__name__}: {exc}"
