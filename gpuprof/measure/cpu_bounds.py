"""No CPU figure leaves its physical bound (a core busy 0-100%, a process at most its machine's
cores): the rate the host sampler derives from a cumulative counter (CpuRate, which carries an
excess within the counters' tick resolution into the next interval), and the checks a stored host
report is held to (cpu_out_of_bounds; within_cores drops a figure above its bound)."""

from __future__ import annotations

# A tick-truncated counter's difference over an interval can be off by up to this many ticks.
TICKS_OFF_PER_COUNTER = 2


class CpuRate:
    """A cumulative CPU-seconds counter as cores used per interval, never above the core count.

    The /proc counters are truncated to clock ticks, so a difference can move up to a few ticks of
    CPU between neighbouring intervals: an excess within that resolution is reported at the core
    count and carried into the next interval (no CPU time is lost); a larger one is out of bounds
    and the caller drops the sample."""

    def __init__(self, total_s: float):
        self.counted = total_s  # CPU seconds reported so far (or discarded with a dropped sample)

    def propose(self, total_s: float, dt: float, cores: int, resolution_s: float) -> tuple[float, str]:
        """(cores used, 'ok' | 'carried' | 'over') for the interval ending at `total_s`."""
        avail = max(0.0, total_s - self.counted)
        rate = avail / dt
        if rate <= cores + 1e-9:
            return rate, "ok"
        if avail - cores * dt <= resolution_s:
            return float(cores), "carried"
        return rate, "over"

    def commit(self, total_s: float, used_cores: float | None, dt: float) -> None:
        """Advance: count what was reported (None: the sample was dropped, its interval discarded)."""
        self.counted = total_s if used_cores is None else min(total_s, self.counted + used_cores * dt)


def within_cores(report: dict) -> dict:
    """The report with every CPU figure above its physical bound dropped (None) and listed under
    `dropped_above_bound`: a rate from a sample interval too short to mean anything. The
    producer keeps its figures possible; the analysis never edits a measurement."""
    dropped = []
    for where, key, (limit, value) in list(cpu_out_of_bounds(report, report.get("cpu_count"))):
        section, _, name = where.partition(".")
        if section == "summary":
            report["summary"][name][key] = None
        else:
            report["phases"][name][key] = None
        dropped.append(f"{where}.{key} {value:.4g}% above {limit:.0f}%")
    if dropped:
        report["dropped_above_bound"] = dropped
    return report


CPU_TOL = 1.0 + 1e-6  # no CPU figure above its cores, not even by rounding


def cpu_out_of_bounds(host: dict, cores: float | None):
    """(where, key, (limit, value)) of a host report's CPU figures above their bound: machine CPU
    above 100% (per core too), this process above cores × 100%."""
    limits = {"cpu_pct": 100.0, "cpu_pct_max_core": 100.0}
    if cores:
        limits["proc_cpu_pct"] = 100.0 * cores
    for key, limit in limits.items():
        figures = (host.get("summary") or {}).get(key) or {}
        for stat in ("mean", "max", "p50", "p90"):
            v = figures.get(stat)
            if isinstance(v, (int, float)) and v > limit * CPU_TOL:
                yield f"summary.{key}", stat, (limit, v)
        for phase, e in (host.get("phases") or {}).items():
            v = (e or {}).get(key)
            if isinstance(v, (int, float)) and v > limit * CPU_TOL:
                yield f"phases.{phase}", key, (limit, v)
