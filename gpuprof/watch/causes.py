"""The likely causes of a change, from what the samplers saw in the windows before and after it.
Pure: window events in (their `host`, `nvml` and `files_opened`), cause records out, each with
the figures it rests on; gpuprof.report.watch words them.

A cause is listed when its figures moved between the windows before the change and those from
the change on, by these thresholds (each a stated figure, none a guess about the user's job):

- storage: the process read from storage at least READ_RATIO × as fast and READ_MIN_B_S more, or
  opened files for the first time from the change's window on (their paths and filesystems);
- throttle: an NVML clock-event reason other than gpu_idle was set in at least THROTTLE_SET of
  the GPU samples after and at most THROTTLE_CLEAR before, or the SM clock fell CLOCK_DROP or more;
- workers: child processes started (new PIDs: DataLoader workers respawn at an epoch boundary
  unless persistent_workers=True) in the change's window;
- contention: other processes used CONTENTION_CORES more cores;
- memory: the process's resident memory (or the GPU's memory used) grew MEMORY_RATIO or more.
A rank that fell behind is named across the ranks of a data-parallel run, live and after it (gpuprof.watch.ranks).
"""

from __future__ import annotations

import statistics

READ_RATIO = 2.0
READ_MIN_B_S = 1e6
THROTTLE_SET = 0.2
THROTTLE_CLEAR = 0.05
CLOCK_DROP = 0.05
CONTENTION_CORES = 0.5
MEMORY_RATIO = 1.10


def _mean(windows: list[dict], section: str, key: str) -> float | None:
    xs = [(w.get(section) or {}).get(key) for w in windows]
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.fmean(xs) if xs else None


def _throttle(windows: list[dict]) -> dict[str, float]:
    shares: dict[str, list[float]] = {}
    n = 0
    for w in windows:
        ts = (w.get("nvml") or {}).get("throttle_share")
        if ts is None:
            continue
        n += 1
        for r, s in ts.items():
            shares.setdefault(r, []).append(s)
    return {r: sum(v) / n for r, v in shares.items()} if n else {}


def likely_causes(before: list[dict], after: list[dict], *, filesystem=None) -> list[dict]:
    """Cause records ({"kind", "evidence"}) for a change between the `before` windows and the
    `after` ones (the first of them holds the change's step). filesystem(path) -> {"fstype",
    "kind"} names a new file's filesystem (gpuprof.disk.fs; None: not named)."""
    out = []
    rb, ra = _mean(before, "host", "read_bytes_s"), _mean(after, "host", "read_bytes_s")
    cb, ca = _mean(before, "host", "read_chars_s"), _mean(after, "host", "read_chars_s")
    new = [f for w in after[:1] for f in w.get("files_opened") or []]
    more = sum(w.get("files_opened_more") or 0 for w in after[:1])
    reads_grew = rb is not None and ra is not None and ra >= READ_RATIO * rb and ra - rb >= READ_MIN_B_S
    if new or reads_grew:
        files = []
        for f in new[:5]:
            entry = {k: v for k, v in f.items() if k != "t_s"}  # the path, its filesystem when named
            if filesystem is not None and "fstype" not in entry:
                try:
                    entry.update(filesystem(f["path"]))
                except Exception:  # noqa: BLE001 - a fact about a file, never the run
                    pass
            files.append(entry)
        earlier = {f.get("fstype") for w in before for f in w.get("files_opened") or [] if f.get("fstype")}
        out.append({"kind": "storage", "evidence": {
            "read_bytes_s_before": rb, "read_bytes_s_after": ra, "read_chars_s_before": cb,
            "read_chars_s_after": ca, "new_files": files, "new_files_more": more + max(0, len(new) - 5),
            "filesystems_before": sorted(earlier)}})
    tb, ta = _throttle(before), _throttle(after)
    set_now = {r: s for r, s in ta.items() if r != "gpu_idle" and s >= THROTTLE_SET and tb.get(r, 0.0) <= THROTTLE_CLEAR}
    kb, ka = _mean(before, "nvml", "sm_clock_mhz"), _mean(after, "nvml", "sm_clock_mhz")
    clock_fell = kb and ka is not None and ka <= (1 - CLOCK_DROP) * kb
    if set_now or clock_fell:
        out.append({"kind": "throttle", "evidence": {
            "reasons": set_now, "sm_clock_mhz_before": kb, "sm_clock_mhz_after": ka,
            "temp_c_before": _mean(before, "nvml", "temp_c"), "temp_c_after": _mean(after, "nvml", "temp_c")}})
    started = sum((w.get("host") or {}).get("children_started") or 0 for w in after[:1])
    if started:
        out.append({"kind": "workers", "evidence": {
            "children_started": started, "children_before": _mean(before, "host", "children"),
            "children_after": _mean(after, "host", "children")}})
    ob, oa = _mean(before, "host", "others_cpu_cores"), _mean(after, "host", "others_cpu_cores")
    if ob is not None and oa is not None and oa - ob >= CONTENTION_CORES:
        out.append({"kind": "contention", "evidence": {
            "others_cpu_cores_before": ob, "others_cpu_cores_after": oa,
            "cpu_count": _mean(after, "host", "cpu_count")}})
    for section, key in (("host", "rss_bytes"), ("nvml", "mem_used_bytes")):
        mb, ma = _mean(before, section, key), _mean(after, section, key)
        if mb and ma is not None and ma >= MEMORY_RATIO * mb:
            out.append({"kind": "memory", "evidence": {"what": key, "before": mb, "after": ma}})
    return out
