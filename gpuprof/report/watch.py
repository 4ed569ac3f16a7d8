"""Every sentence of `gpuprof watch` beyond diagnose's report: a window's line, a change, a
periodic event, a change's likely causes, and the section after the final report (what was
watched, the changes in order). gpuprof.render.watch lays them out. Figures come from the events
(gpuprof.watch); nothing here measures or judges."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.units import NM, bytes_per_s, count, gib, pct, seconds, signed_seconds

PLAIN = "gpuprof: "
SECTION = "What changed over the run (gpuprof watch)"


def _shares(phases: dict, n: int = 3) -> str:
    top = sorted(((p, v["share"]) for p, v in (phases or {}).items() if v.get("share", 0) > 0), key=lambda x: -x[1])
    return ", ".join(f"{p} {pct(s, 0)}" for p, s in top[:n])


def window_line(ev: dict) -> str:
    """'window 3 (steps 12-21, 10 steps): step 14.2 ms typical, median 14.0 ms · 1,234 tokens/s ·
    data 62%, forward 20%, backward 12% · MFU not measured (...)'"""
    if not ev.get("n_steps"):
        return f"window {ev['window']}: no complete step seen ({ev.get('no_steps') or 'no steps'})"
    first, last = ev["steps"]
    tps = f"{ev['tokens_per_s']:,.0f} tokens/s" if ev.get("tokens_per_s") else f"tokens/s {NM}"
    mfu = f"MFU {pct(ev['mfu'])}" if ev.get("mfu") is not None else f"MFU {NM}"
    partial = ", the last, partial" if ev.get("partial") else ""
    return (f"window {ev['window']} (steps {first}–{last}, {count(ev['n_steps'])} steps{partial}): step "
            f"{seconds(ev['step_s'])} typical, median {seconds(ev['median_s'])} · {tps} · "
            f"{_shares(ev.get('phases'))} · {mfu}")


def cause_words(c: dict) -> str:
    """One likely cause in words, with its figures."""
    e, kind = c.get("evidence") or {}, c.get("kind")
    if kind == "storage":
        parts = []
        if e.get("read_bytes_s_after") is not None:
            parts.append(f"reads from storage {bytes_per_s(e.get('read_bytes_s_before'))} before, "
                         f"{bytes_per_s(e['read_bytes_s_after'])} after")
        files = e.get("new_files") or []
        if files:
            named = ", ".join(f"{f['path']}" + (f" ({f['fstype']})" if f.get("fstype") else "") for f in files[:3])
            more = len(files) - 3 + (e.get("new_files_more") or 0)
            parts.append(f"files first opened in the change's window: {named}" + (f" and {more} more" if more > 0 else ""))
            fs_after = {f.get("fstype") for f in files if f.get("fstype")}
            before = set(e.get("filesystems_before") or [])
            if before and fs_after and not fs_after & before:
                parts.append(f"another filesystem ({', '.join(sorted(fs_after))}; before: {', '.join(sorted(before))})")
        return "storage: " + "; ".join(parts)
    if kind == "throttle":
        reasons = ", ".join(f"{r} in {pct(s, 0)} of the GPU samples" for r, s in (e.get("reasons") or {}).items())
        clock = (f"SM clock {e['sm_clock_mhz_before']:.0f} → {e['sm_clock_mhz_after']:.0f} MHz"
                 if e.get("sm_clock_mhz_before") and e.get("sm_clock_mhz_after") is not None else "")
        temp = (f"temperature {e['temp_c_before']:.0f} → {e['temp_c_after']:.0f} °C"
                if e.get("temp_c_before") is not None and e.get("temp_c_after") is not None else "")
        return "the GPU throttled: " + "; ".join(x for x in (reasons, clock, temp) if x)
    if kind == "workers":
        return (f"{count(e['children_started'])} child processes started in the change's window (DataLoader "
                f"workers start again at each epoch unless persistent_workers=True)")
    if kind == "contention":
        return (f"other processes used {e['others_cpu_cores_before']:.2f} cores before, "
                f"{e['others_cpu_cores_after']:.2f} after (of {count(e.get('cpu_count'))})")
    if kind == "straggler":
        if e.get("self"):
            ranks = ", ".join(str(r) for r in e.get("waited") or [])
            return f"this rank fell behind: rank(s) {ranks} changed at the same step in the phase where they wait for it"
        grew = (f", {e['phase']} {seconds(e['phase_before_s'])} → {seconds(e['phase_after_s'])}"
                if e.get("phase_before_s") is not None and e.get("phase_after_s") is not None else "")
        return f"rank {e['rank']} fell behind: its {e['phase']} changed at step {e['at_step']}{grew}; this rank waits for it"
    if kind == "memory":
        what = "resident memory" if e.get("what") == "rss_bytes" else "GPU memory used"
        return f"{what} {gib(e['before'])} before, {gib(e['after'])} after"
    return str(kind)


def change_line(ev: dict) -> str:
    """'change at step 40 (found at the close of window 6): slower, 14.2 ms → 26.0 ms per step
    (+11.8 ms); data 8.1 ms → 20.0 ms; undoing it would save 11.8 ms per step (45% of the step now)'"""
    slower = ev["direction"] == "slower"
    delta = ev["after_s"] - ev["before_s"]
    head = (f"change at step {ev['at_step']} (found at the close of window {ev['window']}): "
            f"{'slower' if slower else 'faster'}, {seconds(ev['before_s'])} → {seconds(ev['after_s'])} per step "
            f"({signed_seconds(delta)}); {ev['phase']} {seconds(ev['phase_before_s'])} → "
            f"{seconds(ev['phase_after_s'])}")
    if slower:
        share = f" ({pct(ev['saving_share'], 0)} of the step now)" if ev.get("saving_share") is not None else ""
        head += f"; undoing it would save {seconds(delta)} per step{share}"
    return head


def causes_line(ev: dict) -> str:
    causes = ev.get("causes") or []
    if not causes:
        return "likely causes: none seen by the samplers (storage reads, new files, child processes, other " \
               "processes' CPU, memory, GPU clocks)"
    return "likely causes: " + "; ".join(cause_words(c) for c in causes)


def straggler_line(ev: dict) -> str:
    """'rank 0, its change at step 20 (backward): rank 1 fell behind: its data changed at step 20, ...'"""
    return (f"rank {ev['rank']}, its change at step {ev['change_at_step']} ({ev['change_phase']}): "
            f"{cause_words(ev['cause'])}")


def periodic_line(ev: dict) -> str:
    return (f"periodic, not a change: every {count(ev['every_steps'])} steps (seen {ev['occurrences']} times "
            f"from step {ev['first_step']}) a step is slower, its {ev['phase']} phase +{seconds(ev['extra_s'])}")


def event_lines(ev: dict) -> list[str]:
    """The plain lines of one event, as the run goes (none for the header and the end)."""
    kind = ev.get("kind")
    if kind == "window":
        return [PLAIN + window_line(ev)]
    if kind == "change":
        return [PLAIN + change_line(ev), PLAIN + "  " + causes_line(ev)]
    if kind == "periodic":
        return [PLAIN + periodic_line(ev)]
    if kind == "straggler":
        return [PLAIN + straggler_line(ev)]
    return []


@dataclass(frozen=True)
class WatchSection:
    """The section after diagnose's report: what was watched, then each change in order (its line
    and its causes), the periodic events, and where the events are."""

    title: str
    summary: str
    changes: tuple[tuple[str, str], ...]
    periodic: tuple[str, ...]
    none_line: str | None
    rule: str
    events_line: str | None


def watch_section(section: dict, events_path: str | None = None, events_error: str | None = None) -> WatchSection:
    """From the profile's measurements.watch (gpuprof.watch.recorder.Recorder.section)."""
    every = section.get("every") or {}
    length = f"{every['seconds']:g} s" if every.get("seconds") is not None else f"{count(every.get('steps'))} steps"
    kept = section.get("kept") or {}
    summary = (f"watched {count(section.get('steps_in_windows'))} measured steps in "
               f"{count(section.get('windows'))} windows of {length}")
    if section.get("pid") is not None:
        summary += (f" of process {section['pid']}, from outside (py-spy, {count(section.get('rate_hz'))} samples/s); "
                    f"the report above is attach's over the last window with complete steps")
        if section.get("windows_without_steps"):
            summary += f"; {count(section['windows_without_steps'])} windows had no complete step"
    if kept:
        summary += (f"; the report above is over the warmup steps and a uniform random sample of at most "
                    f"{kept.get('keep_steps'):,} of the {kept.get('steps_closed'):,} steps (bounded memory)")
    changes = tuple((change_line(c), causes_line(c)) for c in section.get("changes") or [])
    total = section.get("changes_total") or 0
    none_line = "no change of the typical step over the run" if not total else None
    if total > len(changes):
        none_line = f"{total - len(changes)} later changes are in the events file only"
    periodic = tuple(periodic_line(p) for p in section.get("periodic") or [])
    events_line = None
    if events_path:
        events_line = f"events (one JSON object per line) written to {events_path}"
        if events_error:
            events_line += f"; a write failed and later events are missing: {events_error}"
    return WatchSection(SECTION, summary, changes, periodic, none_line,
                        f"the rule: {section.get('change_rule')}", events_line)
