"""The report of one run, decided once from (Profile, Analysis): the headline, the verdict, the
irregular steps, the ranked fixes (saves / change / because / note), the corrected config, the
phase table (which adds up to the headline step), the MFU line, the notes, what ran and, for a
data-parallel run, every rank. The terminal (gpuprof.render.terminal) and the HTML page
(gpuprof.render.html) lay it out; neither words a figure of its own.

How the typical step and the slow ones are shown (said on the page, words.TYPICAL_NOTE): the
headline step is the typical step (gpuprof.stats), labelled with how it was obtained; the phase
table's rows add up to it, with a total row that repeats it; savings are shares of it; irregular
steps get a section of their own with what they cost the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.analysis.findings import Finding
from gpuprof.analysis.pipeline import Analysis
from gpuprof.analysis.rules.sharded import collectives_line, collectives_owner
from gpuprof.profile import Profile
from gpuprof.report import words
from gpuprof.report.attach import inferred_steps_note
from gpuprof.report.timeline import TimelineView, build_timeline
from gpuprof.stats import HOST_ONLY_PHASES, PHASES
from gpuprof.units import EMPTY, NM, bytes_per_s, nbytes, pct, seconds

PHASE_BAR_LABEL = "phase shares"  # what the phase table's bar of shares is, to a screen reader


@dataclass(frozen=True)
class FindingView:
    """One finding as the report shows it: every line already in words."""

    id: str
    kind: str
    title: str
    saves: str | None  # words.saving_text: None for what saves no per-step time of its own
    saves_time: bool  # a positive saving (shown as good news)
    confidence: str
    saves_line: str  # the `saves` line as shown: the saving and its confidence (empty: none)
    change: str
    because: str
    note: str


@dataclass(frozen=True)
class PhaseRow:
    phase: str
    seconds: str
    share: float
    share_text: str
    host: str | None = None  # GPU timeline only
    idle: str | None = None  # GPU timeline only: GPU idle a host-only phase exposed


@dataclass(frozen=True)
class CorrectedView:
    lines: list[tuple[str, str, str]]  # (key = value, was, from finding)
    flags: str
    file_text: str
    conflicts: list[str]


@dataclass(frozen=True)
class RanksView:
    """A merged run's ranks: a table (rows of strings) and sentences."""

    title: str
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]
    caption: str
    lines: list[str]
    problems: list[str]  # failed or absent ranks, comm not measured


@dataclass(frozen=True)
class Report:
    title: str
    run_line: str
    has_steps: bool
    step: str = ""  # the headline step, e.g. "45.2 ms"
    step_statistic: str = ""  # how it was obtained
    throughput: str = ""
    micro: str | None = None
    typical_note: str | None = None
    script_log: str | None = None
    noise: str = ""  # the run's own noise: step spread, other processes' CPU (words.noise_line)
    verdict: FindingView | None = None
    verdict_text: str = ""  # when no finding is the verdict: the sentence that stands for it
    irregular: list[FindingView] = field(default_factory=list)
    fixes: list[FindingView] = field(default_factory=list)
    corrections: list[FindingView] = field(default_factory=list)
    infos: list[FindingView] = field(default_factory=list)
    corrected: CorrectedView | None = None
    phase_title: str = ""
    phase_rows: list[PhaseRow] = field(default_factory=list)
    phase_total: tuple[str, str] = ("", "")  # the total row: the headline step, 100%
    phase_caption: str | None = None
    on_gpu: bool = False
    mfu: str = ""
    notes: list[str] = field(default_factory=list)
    what_ran: list[tuple[str, str]] = field(default_factory=list)
    attribution: list[str] = field(default_factory=list)
    ranks: RanksView | None = None
    headings: words.Headings = words.HEADINGS
    timeline: TimelineView | None = None  # one typical step on a time axis (report.timeline)
    phase_bar_label: str = PHASE_BAR_LABEL
    footer: str = ""  # the page's last line: gpuprof's version, the schema, what NM means (words.HEADINGS.page_footer)


def finding_view(f: Finding) -> FindingView:
    saves = words.saving_text(f)
    line = f"{saves}; confidence {f.confidence}" if saves and f.confidence else (saves or "")
    return FindingView(id=f.id, kind=f.kind, title=f.title or f.id, saves=saves,
                       saves_time=bool(f.kind == "fix" and f.saving_s), confidence=f.confidence or "",
                       saves_line=line, change=f.fix or "", because=words.because_text(f), note=f.note or "")


@dataclass(frozen=True)
class Findings:
    """Findings grouped as the report shows them: the verdict (a `verdict` finding, else a
    sentence naming the top fix), the irregular steps, the fixes in rank order, corrections of
    wrong figures, and what else was found."""

    verdict: FindingView | None
    verdict_text: str
    irregular: list[FindingView]
    fixes: list[FindingView]
    corrections: list[FindingView]
    infos: list[FindingView]
    headings: words.Headings = words.HEADINGS


def group_findings(findings) -> Findings:
    views = [finding_view(f) for f in findings]
    verdicts = [v for v in views if v.kind == "verdict"]
    fixes = [v for v in views if v.kind == "fix"]
    verdict_text = ""
    if not verdicts:
        if fixes:
            top = fixes[0]
            saving = f" saves {top.saves}" if top.saves_time else " is the largest"
            verdict_text = f"{top.title}. Fix 1 below{saving}."
        else:
            verdict_text = "no finding: nothing in this run stands out"
    return Findings(verdicts[0] if verdicts else None, verdict_text,
                    [v for v in views if v.kind == "irregular"], fixes,
                    [v for v in views if v.kind == "correction"],
                    [v for v in views if v.kind not in ("verdict", "fix", "correction", "irregular")] + verdicts[1:])


def _step_statistic(profile: Profile, stats) -> str:
    """How the headline step was obtained; for an attached run whose steps were mostly inferred,
    that it is an estimate (report.attach.inferred_steps_note)."""
    note = inferred_steps_note(profile)
    return words.step_statistic(stats) + (f"; {note}" if note else "")


def build_report(profile: Profile, analysis: Analysis) -> Report:
    title = "gpuprof diagnosis" + (" (partial)" if profile.run.get("partial") else "")
    stats = analysis.stats
    footer = words.HEADINGS.page_footer.format(version=profile.tool.get("version", ""),
                                               schema=profile.schema_version, nm=NM)
    common = dict(title=title, run_line=words.run_line(profile), what_ran=words.what_ran(profile, stats),
                  notes=words.not_measured_lines(profile, analysis), ranks=ranks_view(analysis.distributed), footer=footer)
    if stats is None:
        return Report(has_steps=False, **common)
    g = group_findings(analysis.findings)
    rows = []
    for name in [p for p in PHASES if p in stats.phases] + [p for p in stats.phases if p not in PHASES]:
        e = stats.phases[name]
        gpu = stats.timeline == "gpu"
        rows.append(PhaseRow(name, seconds(e.seconds), e.share, pct(e.share),
                             host=seconds(e.host_seconds) if gpu else None,
                             idle=(seconds(e.idle_exposed_s) if name in HOST_ONLY_PHASES else EMPTY) if gpu else None))
    basis = (f"the mean of {len(stats.typical)} typical steps" if stats.irregular
             else f"the mean of {stats.n_steps} measured steps")
    return Report(
        has_steps=True, step=seconds(stats.step_s), step_statistic=_step_statistic(profile, stats),
        throughput=words.throughput_text(profile, stats), micro=words.micro_text(stats),
        typical_note=words.TYPICAL_NOTE if stats.irregular else None,
        script_log=words.script_log_line(profile, stats), noise=words.noise_line(profile, stats),
        verdict=g.verdict, verdict_text=g.verdict_text, irregular=g.irregular, fixes=g.fixes,
        corrections=g.corrections, infos=g.infos,
        corrected=corrected_view(analysis),
        phase_title=f"Where a typical step's time goes: each phase per step, {basis} ({words.timeline_name(stats)})",
        phase_rows=rows, phase_total=(seconds(stats.step_s), pct(1.0)),
        phase_caption=("GPU idle: time the GPU sat idle while the host ran a host-only phase"
                       if stats.timeline == "gpu" else None),
        on_gpu=stats.timeline == "gpu", mfu=words.mfu_text(analysis.mfu), timeline=build_timeline(profile),
        attribution=words.attribution_lines(profile), **common)


def corrected_view(analysis: Analysis) -> CorrectedView | None:
    from gpuprof.recommend.config import flags, format_config

    cc = analysis.corrected
    if not cc.overrides:
        return None
    lines = [(format_config({k: v}).strip(), f"was {cc.current[k]!r}" if k in cc.current else "", cc.sources[k])
             for k, v in cc.overrides.items()]
    conflicts = [f"{fid} also wanted {key} = {value!r} (a higher-ranked fix wins)" for fid, key, value in cc.overridden]
    return CorrectedView(lines, flags(cc.overrides), format_config(cc.overrides, cc.header()), conflicts)


def _sharded_title(c) -> str:
    """The ranks section's title for a sharded run: FSDP2 when its collectives ran (an FSDP2 model's
    clip_grad_norm_ runs DTensor's too), else tensor parallel (DTensor's alone)."""
    return "sharded (FSDP2)" if collectives_owner(c.by_kind) != "DTensor's" else "tensor parallel (DTensor)"


def ranks_view(d) -> RanksView | None:
    """The ranks of a merged multi-rank run (analysis.distributed: DistributedStats) in words."""
    if d is None:
        return None
    sharded = d.collectives
    job = sharded or d.communication
    waiting = {w.rank: w.waiting_s for w in (job.waiting if job is not None else ())}
    slow = d.slowest.rank if d.slowest is not None else None
    rows = []
    for r in d.ranks:
        mark = " *" if r.rank == slow else (" !" if r.status != "ok" else "")
        if r.step_s is None:
            rows.append((f"{r.rank}{mark}", *[EMPTY] * 7))
            continue
        own, ph = r.own_phases, r.phases
        comm = r.collectives if sharded else r.comm
        rows.append((f"{r.rank}{mark}", seconds(r.step_s), seconds(own.get("data", ph.get("data"))),
                     seconds(own.get("forward", ph.get("forward"))), seconds(own.get("backward", ph.get("backward"))),
                     seconds(comm.exposed_s) if comm is not None else EMPTY,
                     seconds(waiting.get(r.rank)) if r.rank in waiting else EMPTY,
                     seconds(r.busy_s) if r.busy_s is not None else EMPTY))
    if sharded:
        caption = ("* slowest rank, ! failed. step: each rank's typical step; the others are medians over the "
                   "measured steps: fwd, bwd = the rank's own compute, without its collectives; comm = the time "
                   f"in {collectives_owner(sharded.by_kind)} collectives (the `comm` phase); waits = comm beyond the rank "
                   "that waited least (waiting for a slower rank); busy = step − comm")
    else:
        caption = ("* slowest rank, ! failed. step: each rank's typical step; the others are medians over the "
                   "measured steps: bwd = backward without the all-reduce wait; all-reduce = its exposed time "
                   "(after the rank's own backward compute); waits = exposed beyond the rank that waited least "
                   "(waiting for a slower rank); busy = step − all-reduce")
    lines = []
    if d.slowest is not None:
        s = d.slowest
        lines.append(f"slowest: rank {s.rank}, {seconds(s.extra_s)} busier per step than the median other "
                     f"rank ({pct(s.extra_share)} of the step), most in {s.phase or 'no single phase'}")
    c = d.communication
    if c is not None:
        link = c.link or {}
        nominal, bw = link.get("nominal_Bps"), c.busbw_Bps
        bw_text = f"bus bandwidth {bytes_per_s(bw) if bw else NM}"
        if bw and nominal:
            bw_text += f" = {pct(bw / nominal)} of {bytes_per_s(nominal)} ({link.get('name')})"
        else:
            bw_text += f" (link: {link.get('name', NM)}; no nominal figure)"
        lines.append(f"all-reduce ({c.backend}, {c.clock} clock): {c.rounds_per_step:g} per "
                     f"step, {nbytes(c.bytes_per_round)} each, in flight {seconds(c.in_flight_s)}, "
                     f"exposed {seconds(c.exposed_s)} on rank {c.rank}"
                     + (f" ({pct(c.overlap_share)} overlapped)" if c.overlap_share is not None else "")
                     + f"; {bw_text}")
    if sharded:
        lines.append(collectives_line(sharded))
    problems = [f"rank {r.rank} {r.status}: {r.error or 'no profile'}" for r in d.ranks if r.status != "ok"]
    if d.absent_ranks:
        problems.append(f"ranks not in this profile: {', '.join(map(str, d.absent_ranks))} (other nodes: "
                        f"join their files with `gpuprof merge`)")
    missing = None if sharded else next((r for r in d.ranks if r.comm_not_measured), None)
    if missing is not None:
        problems.append(f"rank {missing.rank}: all-reduce {NM}: {missing.comm_not_measured}")
    return RanksView(f"{_sharded_title(sharded) if sharded else 'data parallel'}: {d.world_size} ranks",
                     ("rank", "step", "data", "fwd", "bwd", "comm" if sharded else "all-reduce", "waits", "busy"),
                     rows, caption, lines, problems)
