"""The per-rank section of a merged data-parallel profile (measurements.distributed)."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuprof.units import bytes_per_s, nbytes, pct, seconds


def distributed_panel(profile) -> Panel | None:
    d = profile.measurements.get("distributed")
    if not d:
        return None
    t = Table(box=None, padding=(0, 1), expand=False)
    for name in ("rank", "step", "data", "fwd", "bwd", "all-reduce", "waits", "busy"):
        t.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    waiting = {w["rank"]: w["waiting_s"] for w in (d.get("communication") or {}).get("waiting", [])}
    slow = (d.get("slowest") or {}).get("rank")
    for r in d.get("ranks", []):
        mark = " *" if r["rank"] == slow else (" !" if r.get("status") != "ok" else "")
        if r.get("step_s") is None:
            t.add_row(f"{r['rank']}{mark}", *["—"] * 7)
            continue
        own = r.get("own_phases") or {}
        ph = r.get("phases") or {}
        comm = r.get("comm") or {}
        t.add_row(
            f"{r['rank']}{mark}", seconds(r["step_s"]), seconds(own.get("data", ph.get("data"))),
            seconds(own.get("forward", ph.get("forward"))), seconds(own.get("backward", ph.get("backward"))),
            seconds(comm.get("exposed_s")) if comm else "—",
            seconds(waiting.get(r["rank"])) if r["rank"] in waiting else "—",
            seconds(r.get("busy_s")) if r.get("busy_s") is not None else "—",
        )
    lines = [t]
    caption = ("* slowest rank, ! failed. Medians over the measured steps: bwd = backward without the "
               "all-reduce wait; all-reduce = its exposed time (after the rank's own backward compute); "
               "waits = exposed beyond the rank that waited least (waiting for a slower rank); "
               "busy = step − all-reduce")
    lines.append(Text(caption, style="dim"))
    if d.get("slowest"):
        s = d["slowest"]
        lines.append(Text(f"slowest: rank {s['rank']}, {seconds(s['extra_s'])} busier per step than the "
                          f"median other rank ({pct(s.get('extra_share'))} of the step), most in "
                          f"{s.get('phase') or 'no single phase'}"))
    c = d.get("communication")
    if c:
        link = c.get("link") or {}
        nominal = link.get("nominal_Bps")
        bw = c.get("busbw_Bps")
        bw_text = f"bus bandwidth {bytes_per_s(bw)}" if bw else "bus bandwidth not measured"
        if bw and nominal:
            bw_text += f" = {pct(bw / nominal)} of {bytes_per_s(nominal)} ({link.get('name')})"
        else:
            bw_text += f" (link: {link.get('name', 'not measured')}; no nominal figure)"
        lines.append(Text(
            f"all-reduce ({c.get('backend')}, {c.get('clock')} clock): {c.get('rounds_per_step'):g} per step, "
            f"{nbytes(c.get('bytes_per_round'))} each, in flight {seconds(c.get('in_flight_s'))}, exposed "
            f"{seconds(c.get('exposed_s'))} on rank {c['rank']}"
            + (f" ({pct(c['overlap_share'])} overlapped)" if c.get("overlap_share") is not None else "")
            + f"; {bw_text}"))
    problems = [r for r in d.get("ranks", []) if r.get("status") != "ok"]
    for r in problems:
        lines.append(Text(f"rank {r['rank']} {r.get('status')}: {r.get('error') or 'no profile'}", style="red"))
    if d.get("absent_ranks"):
        lines.append(Text(f"ranks not in this profile: {', '.join(map(str, d['absent_ranks']))} (other nodes: "
                          f"join their files with `gpuprof merge`)", style="yellow"))
    for r in d.get("ranks", []):
        if r.get("comm_not_measured"):
            lines.append(Text(f"rank {r['rank']}: all-reduce not measured: {r['comm_not_measured']}", style="yellow"))
            break
    title = f"data parallel: {d.get('world_size')} ranks"
    return Panel(Group(*lines), title=title, title_align="left")
