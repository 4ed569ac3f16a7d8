"""storage-too-slow: the storage under the data cannot feed the loop, or is the wrong kind.

Evidence, strongest first: a bench-disk result for the data's storage (requirement headroom
below 1); the data on a network/FUSE filesystem while the step waits for data; a cold page
cache for a file that does not fit in RAM while the step waits for data."""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.rules.common import exposed_s, step_s
from gpuprof.units import number, pct, seconds, times

DATA_EXPOSED_MIN_SHARE = 0.05


def storage_too_slow(ctx: Context) -> list[Finding]:
    total = step_s(ctx)
    if not total:
        return []
    exposed = exposed_s(ctx, "data")
    storage = ctx.sections.storage
    if ctx.disk:
        f = _from_bench(ctx, exposed, total)
        if f:
            return [f]
    if exposed / total < DATA_EXPOSED_MIN_SHARE or not storage.present:
        return []
    fs = storage.filesystem
    reasons, ev = [], {"data_exposed_s": exposed, "share": exposed / total, "filesystem": fs.type,
                       "mountpoint": fs.mountpoint}
    if fs.kind in ("network", "fuse"):
        reasons.append(fs.warning or f"{fs.type} is a {fs.kind} filesystem")
    res = storage.residency_start
    if res.known and res.fraction is not None and res.fraction < 0.5 and not storage.fits_in_ram:
        ev["resident_at_start"] = res.fraction
        ev["file_bytes"] = storage.file_bytes
        ev["ram_available_bytes"] = storage.ram_available_bytes
        reasons.append(f"only {res.fraction:.0%} of the file was in the page cache and it does not "
                       "fit in RAM: most samples are read from the device")
    if not reasons:
        return []
    because = f"the step waits {seconds(exposed)} per step for data ({pct(exposed / total)} of the step)"
    if fs.kind in ("network", "fuse"):
        because += f"; the data is on {fs.type}, a {fs.kind} filesystem at {fs.mountpoint}"
    if "resident_at_start" in ev:
        because += (f"; {pct(ev['resident_at_start'], 0)} of the file was in the page cache at the start and it "
                    "does not fit in RAM")
    return [Finding(
        id="storage-too-slow",
        title=f"the data's storage is suspect while the step waits {exposed / total:.0%} for data",
        saving_s=None, evidence=ev, confidence="low",
        fix="measure it: `gpuprof bench-disk <data file> --profile run.gpuprof.json`; copy the dataset to local NVMe if it cannot keep up",
        because=because,
        note="; ".join(reasons) + ". Without a bench-disk result the I/O part of the data time cannot be separated from the loader's CPU work",
        claims={},
    )]


def _from_bench(ctx: Context, exposed: float, total: float) -> Finding | None:
    from gpuprof.disk.requirement import Need, assess

    block = ctx.config.get("block_size")
    tokens = ctx.stats.tokens_per_step
    if not block or not tokens:
        return None
    # The rate the loop needs once data no longer stalls it: tokens over the compute-only step.
    compute_step = max(total - exposed, 1e-9)
    need = Need(tokens / compute_step, int(block), "profile (step without exposed data time)",
                step_s=compute_step, tokens_per_step=tokens)
    try:
        a = assess(need, ctx.disk)
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    cold_s = a.get("loader_cold_s_per_step")
    ev = {"needs_reads_per_s": a["reads_per_s"], "needs_mb_s": a["mb_s"], "disk_qd1_iops": a["disk_qd1_iops"],
          "headroom": a["headroom"], "loader_cold_headroom": a["loader_cold_headroom"],
          "data_exposed_s": exposed}
    if a["headroom"] >= 1 and a["loader_cold_headroom"] >= 1:
        return None
    saving = min(exposed, cold_s) if cold_s is not None else None
    because = (f"without data stalls the loop needs {number(a['reads_per_s'])} random reads/s "
               f"({number(a['mb_s'])} MB/s); the bench-disk result gives {number(a['disk_qd1_iops'])} reads/s at "
               f"queue depth 1, {times(a['headroom'])} headroom, and the loader reading cold "
               f"{times(a['loader_cold_headroom'])}; the step waits {seconds(exposed)} per step for data")
    return Finding(
        id="storage-too-slow",
        title=f"the storage cannot feed the loop: {a['verdict']}",
        saving_s=saving,
        evidence=ev, confidence="high",
        fix="copy the dataset to local NVMe (or RAM: it is read at random), or read larger sequential chunks",
        note=a.get("loader_verdict", ""), because=because,
        claims={"data": saving} if saving else {},
    )
