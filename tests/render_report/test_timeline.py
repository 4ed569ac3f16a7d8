"""The terminal timeline of a typical step: phases laid out in the loop's order on one axis."""

import pytest
from rich.console import Console

from gpuprof.render.timeline import coverage, glyph, timeline_panel
from gpuprof.report.timeline import build_timeline, layout, typical_step
from render_report.profiles import cpu_profile, gpu_profile


def _text(renderable, width: int) -> str:
    c = Console(width=width, record=True, color_system=None)
    c.print(renderable)
    return c.export_text()


def test_layout_follows_the_builtin_loop_per_micro_step():
    spans = layout({"forward": 0.2, "data": 0.1, "backward": 0.4, "optimizer": 0.1, "other": 0.02}, 2)
    assert [p for p, _, _ in spans] == ["forward", "data", "backward", "forward", "data", "backward",
                                        "optimizer", "other"]
    assert spans[0] == ("forward", 0.0, pytest.approx(0.1))
    assert spans[1][1:] == (pytest.approx(0.1), pytest.approx(0.15))
    assert spans[-1][2] == pytest.approx(0.82)  # the spans add up to the step


def test_layout_of_a_script_and_of_an_unknown_phase():
    spans = layout({"forward": 0.2, "data": 0.1, "comm": 0.05, "optimizer": 0.1}, 1, mode="script")
    assert [p for p, _, _ in spans] == ["data", "forward", "comm", "optimizer"]


def test_coverage_and_glyphs():
    assert coverage([(0.0, 0.5)], 1.0, 4) == [1.0, 1.0, 0.0, 0.0]
    assert coverage([(0.1, 0.2)], 1.0, 4) == [pytest.approx(0.4), 0.0, 0.0, 0.0]
    assert [glyph(c) for c in (0.0, 0.1, 0.3, 0.6, 0.9)] == [" ", "░", "▒", "▓", "█"]


def test_typical_step_is_the_median_one():
    p = cpu_profile([{"forward": 0.5}, {"forward": 0.1}, {"forward": 0.3}])
    step, rank = typical_step(p)
    assert step.wall_s == pytest.approx(0.3) and rank == 2


def test_typical_step_leaves_the_irregular_steps_out():
    # Two pauses among five steps: the median of all steps (0.12 s) would be shifted towards them;
    # the timeline's step is the median of the typical ones (0.10, 0.11, 0.12 s).
    p = cpu_profile([{"forward": t} for t in (0.10, 1.0, 0.11, 1.0, 0.12)])
    assert [s.index for s in p.stats.irregular] == [1, 3] and p.stats.median_s == pytest.approx(0.12)
    step, rank = typical_step(p)
    assert step.wall_s == pytest.approx(0.11) and rank == 2


@pytest.mark.parametrize("width", (80, 120))
def test_gpu_row_shows_the_idle_the_host_exposed(width):
    p = gpu_profile()
    view = build_timeline(p)  # what the report holds (Report.timeline) and the terminal lays out
    assert view.gpu_label == "GPU"
    out = _text(timeline_panel(view), width)
    lines = out.splitlines()
    assert max(len(x) for x in lines) <= width
    gpu = next(x for x in lines if x.startswith(f"{view.gpu_label}  "))
    data = next(x for x in lines if x.startswith("data "))
    assert gpu.count("·") >= 2  # 50 ms of 367 ms idle: ~14% of the bar
    # the host loads while the GPU computes: some data cells sit over busy GPU cells
    col = len("optimizer ")
    assert any(d != " " and g == "█" for d, g in zip(data[col:], gpu[col:]))
    axis = next(x for x in lines if "┤" in x)
    assert axis.rstrip().endswith("367 ms") and len(axis.rstrip()) == width
    assert "not measured" in " ".join(out.split())
