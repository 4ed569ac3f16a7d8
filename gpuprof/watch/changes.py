"""When the typical step changed, and the spikes that recur: the statistics of `gpuprof watch`.
Pure numpy; no I/O.

The rule (stated in docs/watch.md):

1. The series is the per-step wall times of the windows since the last change (at most
   HISTORY_WINDOWS windows), in step order.
2. Pettitt's rank test (Pettitt 1979, a non-parametric change-point test) finds the split k that
   maximises |U_k| = |2·Σ_{i≤k} r_i − k(n+1)| (r: the ranks of the times) and its p-value,
   p ≈ 2·exp(−6K²/(n³+n²)). Ranks make it blind to how large a spike is: an eval step, a
   garbage collection or a checkpoint moves one rank, not the split. The split is then placed
   where the steps above and below the midpoint of the two levels separate best, the levels
   re-taken from each side of the new split until it stays (`locate`).
3. A change needs all of: p < P_MAX; at least MIN_BEFORE_WINDOWS windows' worth of steps before the
   split and one whole window after it (the new level must hold for a window: a one-window
   stall is not a change); and an effect |median after − median before| above EFFECT_NOISES ×
   the run's own window-to-window noise: 1.4826 × the MAD of the medians of the windows before
   the split, and at least the standard error of one window's median (1.2533 × 1.4826 × the MAD
   of their steps ÷ √steps per window), so that a quiet run with few windows does not call
   jitter a change; and above EFFECT_SPREAD × the steps' own spread (1.4826 × the MAD of the
   steps before the split): a shift smaller than what one step varies from the next by (a host
   busier for a while) is not a change a user can act on. No fixed percentage.
4. And settled: the median of the window just closed within SETTLE_SHARE of the shift from the
   after level's median; otherwise the test waits (at most SETTLE_WINDOWS windows, then reports
   what is there: a steady drift never settles). A small shift followed by a larger one would
   otherwise be one change at the first, its after level a mix of both.

Periodic events: a step far slower than its window's others (gpuprof.stats' irregular rule) is
remembered with its phase; when at least PERIODIC_MIN of them, in one phase, fall at one step
interval of 2 or more (other slow steps between them allowed, as long as they are fewer than
half the chain), they are periodic (an eval or checkpoint every N steps): named once,
and never a change, since the rank test does not see them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from gpuprof.stats import MAD_TO_SIGMA, step_stats

P_MAX = 1e-3
EFFECT_NOISES = 5.0
MIN_BEFORE_WINDOWS = 2
EFFECT_SPREAD = 2.0  # the shift, in robust standard deviations of the steps before it
HISTORY_WINDOWS = 12
SETTLE_SHARE = 0.5  # the window just closed within this share of the shift from the after level
SETTLE_WINDOWS = 2  # windows a change waits for its level to settle, at most
MEDIAN_SE = 1.2533  # the standard error of a median ÷ (σ/√n), for normal data
PERIODIC_MIN = 3
RULE = (f"Pettitt's rank test over the step times of the windows since the last change (p < {P_MAX:g}), "
        f"at least {MIN_BEFORE_WINDOWS} windows before the split and one whole window after it, and a "
        f"median shift over {EFFECT_NOISES:g}× the run's window-to-window noise (1.4826 × MAD of the "
        f"window medians, at least one window median's standard error) and over {EFFECT_SPREAD:g}× the "
        f"steps' own step-to-step spread (1.4826 × MAD of the steps before it); reported once the window "
        f"just closed is within {SETTLE_SHARE:g}× the shift of the new level (waiting {SETTLE_WINDOWS} windows at most)")


def pettitt(x) -> tuple[int, float, float]:
    """(k, K, p): the split after position k (0-based: the first k+1 values before it), the
    statistic max|U_k| and its approximate two-sided p-value."""
    x = np.asarray(x, dtype=float)
    n = x.size
    if n < 3:
        return 0, 0.0, 1.0
    # average ranks (ties share theirs), 1..n
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(n)
    ranks[order] = np.arange(1, n + 1)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    if counts.max() > 1:
        sums = np.bincount(inv, weights=ranks)
        ranks = (sums / counts)[inv]
    k = np.arange(1, n)
    u = 2.0 * np.cumsum(ranks)[:-1] - k * (n + 1)
    i = int(np.argmax(np.abs(u)))
    big_k = float(abs(u[i]))
    p = float(min(1.0, 2.0 * np.exp(-6.0 * big_k ** 2 / (n ** 3 + n ** 2))))
    return i, big_k, p


def locate(x, split: int, rounds: int = 8) -> int:
    """Where the new level begins, refined: Pettitt's rank sums place a split a few steps off when
    values near it sit between the two levels, so the split is moved to the one that best
    separates the steps above the midpoint of the two medians from those below (the most steps on
    their side; a spike on the wrong side costs one step, however large). The medians are those
    of the split being refined, so the move is repeated with the new split's medians until it
    stays (at most `rounds` times): a first split far off (its "after" holding many old-level
    steps) puts the midpoint near the old level and the split early, with the old level's
    slowest steps counted as new."""
    x = np.asarray(x, dtype=float)
    for _ in range(rounds):
        b, a = float(np.median(x[:split])), float(np.median(x[split:]))
        mid = (a + b) / 2
        after_like = (x > mid) if a > b else (x < mid)
        before_ok = np.cumsum(~after_like)[:-1]  # steps 0..k-1 that look like the old level, k = 1..n-1
        after_ok = after_like.sum() - np.cumsum(after_like)[:-1]  # steps k..n-1 that look like the new one
        moved = int(np.argmax(before_ok + after_ok)) + 1
        if moved == split:
            break
        split = moved
    return split


def _mad(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(np.median(np.abs(x - np.median(x)))) if x.size else 0.0


@dataclass(frozen=True)
class Change:
    """A change of the typical step: where it began (the first step after the split), the level
    before and after (the typical step, gpuprof.stats, of the steps each side), the phase that
    moved most and its seconds each side, and the test's figures."""

    at_step: int
    before_s: float
    after_s: float
    before_median_s: float
    after_median_s: float
    phase: str
    phase_before_s: float
    phase_after_s: float
    phases_before: dict
    phases_after: dict
    p_value: float
    noise_s: float
    steps_before: int
    steps_after: int
    first_window_after: int  # the window that holds at_step

    @property
    def slower(self) -> bool:
        return self.after_median_s > self.before_median_s

    def to_event(self) -> dict:
        delta = self.after_s - self.before_s
        return {"kind": "change", "at_step": self.at_step, "direction": "slower" if self.slower else "faster",
                "phase": self.phase, "before_s": self.before_s, "after_s": self.after_s,
                "before_median_s": self.before_median_s, "after_median_s": self.after_median_s,
                "phase_before_s": self.phase_before_s, "phase_after_s": self.phase_after_s,
                "phases_before": self.phases_before, "phases_after": self.phases_after,
                # what undoing the change would save per step (negative: the change made it faster)
                "saving_s": delta, "saving_share": delta / self.after_s if self.after_s else None,
                "test": {"rule": "pettitt", "p_value": self.p_value, "noise_s": self.noise_s,
                         "effect_noises": abs(self.after_median_s - self.before_median_s) / self.noise_s
                         if self.noise_s else None,
                         "steps_before": self.steps_before, "steps_after": self.steps_after}}


class ChangeDetector:
    """Windows in, changes out. `add(number, steps)` takes a closed window's listener records (a
    sample, in any order) and returns the Change it confirms, or None."""

    def __init__(self, history: int = HISTORY_WINDOWS):
        self._windows: deque = deque(maxlen=history)  # (number, records sorted by step)
        self._waited = 0  # windows the current candidate has waited for its level to settle

    def add(self, number: int, steps: list[dict]) -> Change | None:
        recs = sorted(steps, key=lambda r: r["index"])
        if not recs:
            return None
        self._windows.append((number, recs))
        change = self._test()
        if change is None:
            return None
        # the new level is the next baseline: keep the windows from the one holding the split on
        while self._windows and self._windows[0][0] < change.first_window_after:
            self._windows.popleft()
        return change

    def _test(self) -> Change | None:
        waited, self._waited = self._waited, 0
        if len(self._windows) < MIN_BEFORE_WINDOWS + 1:
            return None
        series = [r for _, rs in self._windows for r in rs]
        times = np.array([r["wall_s"] for r in series])
        k, _, p = pettitt(times)
        if p >= P_MAX:
            return None
        split = locate(times, k + 1)  # the first step after the split
        sizes = [len(rs) for _, rs in self._windows]
        bounds = np.cumsum(sizes)
        last_start = int(bounds[-2])
        if split > last_start:  # the new level has not held for a whole window yet
            return None
        before_windows = int(np.searchsorted(bounds, split, side="right"))  # whole windows before
        if before_windows < MIN_BEFORE_WINDOWS:
            return None
        before, after = times[:split], times[split:]
        meds = [float(np.median([r["wall_s"] for r in rs])) for _, rs in list(self._windows)[:before_windows]]
        per_window = max(1.0, float(np.mean(sizes[:before_windows])))
        noise = max(MAD_TO_SIGMA * _mad(meds),
                    MEDIAN_SE * MAD_TO_SIGMA * _mad(before) / np.sqrt(per_window))
        b_med, a_med = float(np.median(before)), float(np.median(after))
        if noise <= 0 or abs(a_med - b_med) <= EFFECT_NOISES * noise:
            return None
        # and larger than the steps' own jitter: a shift inside what one step to the next varies
        # by (a busier host for a while) is a level, not a change a user can act on
        if abs(a_med - b_med) <= EFFECT_SPREAD * MAD_TO_SIGMA * _mad(before):
            return None
        # and settled: the window just closed sits at the after level, not still moving away from
        # it (a small shift then a larger one, a busier host and then the loader, would otherwise
        # be one change whose after level mixes the two); a few windows at most, since a steady
        # drift never settles and is still a change
        if abs(float(np.median(times[last_start:])) - a_med) > SETTLE_SHARE * abs(a_med - b_med) \
                and waited < SETTLE_WINDOWS:
            self._waited = waited + 1
            return None
        return self._describe(series, split, p, noise, b_med, a_med)

    def _describe(self, series: list[dict], split: int, p: float, noise: float, b_med: float,
                  a_med: float) -> Change:
        from gpuprof.watch.windows import records

        sb, sa = step_stats(records(series[:split])), step_stats(records(series[split:]))
        names = set(sb.phases) | set(sa.phases)
        grew = {ph: sa.seconds(ph) - sb.seconds(ph) for ph in names}
        phase = (max if a_med > b_med else min)(grew, key=grew.get)
        at = series[split]["index"]
        window = next(num for num, rs in self._windows if rs[-1]["index"] >= at)
        return Change(at_step=int(at), before_s=sb.step_s, after_s=sa.step_s, before_median_s=b_med,
                      after_median_s=a_med, phase=phase, phase_before_s=sb.seconds(phase),
                      phase_after_s=sa.seconds(phase),
                      phases_before={k: v.seconds for k, v in sb.phases.items()},
                      phases_after={k: v.seconds for k, v in sa.phases.items()},
                      p_value=p, noise_s=noise, steps_before=split, steps_after=len(series) - split,
                      first_window_after=window)


class PeriodicFinder:
    """Irregular steps in, periodic events out: `add(irregular)` takes a window's irregular steps
    ({"step", "seconds", "phase", "phase_extra_s"}) and returns the periodic events it newly
    recognises ({"kind": "periodic", "every_steps", "phase", "first_step", "occurrences",
    "extra_s"}), each (phase, interval) once."""

    def __init__(self, keep: int = 64):
        self._seen: dict[str, deque] = {}
        self._keep = keep
        self.known: dict[tuple[str, int], dict] = {}

    def add(self, irregular: list[dict]) -> list[dict]:
        new = []
        for s in irregular:
            q = self._seen.setdefault(s["phase"], deque(maxlen=self._keep))
            q.append((int(s["step"]), float(s["phase_extra_s"])))
            ev = self._periodic(s["phase"], list(q))
            if ev is not None:
                # a missed occurrence doubles the interval it finds: a multiple of a known one is it
                known = next((g for ph, g in self.known if ph == s["phase"] and ev["every_steps"] % g == 0), None)
                key = (s["phase"], known or ev["every_steps"])
                if key in self.known:
                    self.known[key].update(occurrences=max(self.known[key]["occurrences"], ev["occurrences"]),
                                           extra_s=ev["extra_s"])
                else:
                    self.known[key] = ev
                    new.append(dict(ev))
        return new

    def periodic_steps(self) -> set[int]:
        return {s for ph in self._seen.values() for s, _ in ph}

    @staticmethod
    def _periodic(phase: str, occ: list[tuple[int, float]]) -> dict | None:
        """The interval g (2 steps or more) at which the latest occurrence s is preceded by the most
        occurrences exactly one interval apart (s − g, s − 2g, ...), when that chain holds
        PERIODIC_MIN or more; a spike between them (a garbage collection) does not break it, but
        slow steps in most of its span make it a slow stretch, not a period."""
        if len(occ) < PERIODIC_MIN:
            return None
        steps = [s for s, _ in occ]
        seen = set(steps)
        last = steps[-1]
        best: tuple[int, int, list[int]] | None = None  # (chain length, -g, chain)
        for g in sorted({last - s for s in steps[:-1] if last - s >= 2}):
            chain, at = [last], last
            while True:
                prev = at - g
                if prev not in seen:
                    break
                chain.append(prev)
                at = prev
            if len(chain) >= PERIODIC_MIN and (best is None or len(chain) > best[0]):
                best = (len(chain), -g, chain)
        if best is None:
            return None
        chain = sorted(best[2])
        if sum(chain[0] <= s <= last for s in steps) > 1.5 * len(chain):
            return None  # slow steps in most of the span: a slow stretch, not a period
        extra = {s: e for s, e in occ}
        every = int(round(float(np.median(np.diff(chain)))))
        return {"kind": "periodic", "phase": phase, "every_steps": every, "first_step": chain[0],
                "occurrences": len(chain), "extra_s": float(np.median([extra[s] for s in chain]))}
