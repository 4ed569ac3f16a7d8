"""The charts' axes and the rank table are decided in the report model (gpuprof.report.charts):
the HTML page writes the figures the Chart holds and the header the RankTable holds."""

from gpuprof.report import charts as ch
from gpuprof.units import NM, UNKNOWN


def test_a_chart_holds_its_axes_figures():
    steps = ch.Chart("steps", (ch.Series("measured", (0, 1, 2), (0.5, None, 1.25)),), ch.SECONDS, x_label="step",
                     steps_axis=True, bars=True)
    assert steps.points == ((0, 0.5), (2, 1.25))
    assert steps.x_ends == (0, 2) and steps.x_span == (-0.5, 2.5)  # half a slot either side of the bars
    assert (steps.y_top, steps.y_top_text, steps.y_zero_text) == (1.25, "1.25 s", "0")
    assert steps.x_end_texts == ("0", "2") and steps.tip("measured", 2, 1.25) == "measured: 2: 1.25 s"
    util = ch.Chart("util", (ch.Series("GPU busy %", (0.05, 0.15), (10.0, 99.0)),), ch.PERCENT, y_max=100.0)
    assert (util.y_top_text, util.y_zero_text) == ("100%", "0%")
    assert util.x_end_texts == ("0.05", "0.15")  # enough digits to tell the ends apart
    cores = ch.Chart("cores", (ch.Series("this run", (0.0, 10.0), (0.0, 0.0)),), ch.CORES)
    assert cores.y_top == 1.0 and cores.y_top_text == "1.00" and cores.x_end_texts == ("0", "10")
    assert ch.Chart("empty", (ch.Series("x", (0,), (None,)),), ch.BYTES).points == ()


def test_the_rank_table_holds_its_header_and_marks_what_an_entry_lacks():
    t = ch.rank_table([{"rank": 1, "host": "b", "local_rank": 0, "status": "failed"}, {"rank": 0}])
    assert t.header == ch.RANK_HEADER == ("rank", "host", "local rank", "status")
    assert [(r.rank, r.host, r.local_rank, r.status, r.ok) for r in t.rows] == [
        (0, NM, NM, UNKNOWN, False), (1, "b", "0", "failed", False)]


def test_the_page_footer_and_the_phase_bar_label_are_the_reports():
    from gpuprof.analysis.pipeline import analyze
    from gpuprof.render.html import render_html
    from gpuprof.report.model import build_report
    from render_report.profiles import cpu_profile

    p = cpu_profile([{"data": 0.1, "forward": 0.3, "backward": 0.6}] * 3)
    a = analyze(p)
    r = build_report(p, a)
    assert r.footer.startswith(f"gpuprof {p.tool.get('version', '')}, profile schema {p.schema_version}. ")
    assert f"\u201c{NM}\u201d" in r.footer
    page = render_html(p, a)
    assert f'<p class="dim">{r.footer}</p>' in page and f'aria-label="{r.phase_bar_label}"' in page
