"""Windows: --every parsed (one line, exit 2 for anything else), a window's figures from
gpuprof.stats, its step sample bounded."""

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.watch.windows import Every, OpenWindow, parse_every, window_figures


@pytest.mark.parametrize("text, want", [("30s", Every(seconds=30.0)), ("2m", Every(seconds=120.0)),
                                        ("1h", Every(seconds=3600.0)), ("0.5 s", Every(seconds=0.5)),
                                        ("100steps", Every(steps=100)), ("1 step", Every(steps=1))])
def test_every_parses_durations_and_step_counts(text, want):
    assert parse_every(text) == want


@pytest.mark.parametrize("text", ["", "30", "steps", "0s", "0steps", "1.5steps", "10 parsecs", "-3s"])
def test_every_refuses_anything_else_in_one_line(text):
    with pytest.raises(GpuprofError) as e:
        parse_every(text)
    assert "\n" not in str(e.value) and str(e.value).startswith("--every")


def _rec(i, wall, data, tokens=32):
    return {"index": i, "wall_s": wall, "phases": {"data": data, "forward": wall - data}, "tokens": tokens,
            "micro_steps": 1}


def test_window_figures_are_the_typical_step_of_its_steps():
    w = OpenWindow(1, t_start=0.0)
    for i in range(10):  # 9 steps of 10 ms (4 ms data), one eval-like step of 100 ms
        w.add(_rec(i, 0.100 if i == 5 else 0.010, 0.004))
    ev = window_figures(w, t_end=0.19)
    assert ev["steps"] == [0, 9] and ev["n_steps"] == 10 and ev["window"] == 1
    assert ev["step_s"] == pytest.approx(0.010) and ev["median_s"] == pytest.approx(0.010)
    assert ev["mean_s"] == pytest.approx(0.19 / 10)
    assert ev["phases"]["data"]["share"] == pytest.approx(0.4)
    assert ev["tokens_per_s"] == pytest.approx(32 / 0.010)
    assert ev["window_tokens_per_s"] == pytest.approx(320 / 0.19)
    assert [s["step"] for s in ev["irregular"]] == [5]


def test_a_window_keeps_a_bounded_sample_of_its_steps_and_exact_counts():
    w = OpenWindow(1, t_start=0.0, cap=50)
    for i in range(1000):
        w.add(_rec(i, 0.01, 0.004))
    assert len(w.steps) == 50 and w.n == 1000 and (w.first, w.last) == (0, 999)
    assert max(r["index"] for r in w.steps) > 500  # a sample over the whole window, not its start
    assert w.full(Every(steps=1000), now=0.0) and not w.full(Every(steps=1001), now=0.0)
    assert w.full(Every(seconds=5.0), now=5.0) and not w.full(Every(seconds=5.0), now=4.9)


def test_the_live_panel_holds_the_recent_steps_and_redraws_at_most_4_times_a_second():
    import io

    from rich.console import Console

    from gpuprof.render import watch as rw

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    drawn = []
    with rw.WatchDisplay(console, what="train.py", warmup=0, steps=None, live=True, clock=clock) as d:
        d._render = lambda *a, _r=d._render: drawn.append(1) or _r(*a)
        for i in range(2000):
            d.on_step(_rec(i, 0.01, 0.004))
            clock.t += 0.01  # 2000 steps of 10 ms: 20 s
    assert 2 * rw.RECENT_STEPS >= len(d._records) >= rw.RECENT_STEPS
    assert len(drawn) <= 20 / rw.RENDER_EVERY_S + 2
