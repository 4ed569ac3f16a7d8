"""The HTML report: self-contained (nothing it could fetch), the run's strings escaped, the figures
the profile's own, and a real headless Chromium that loads it without a console message or a
request."""

import importlib.util
import statistics
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuprof.units import gib, pct, seconds
from gpuprof.render.html import CSP, render_html

REPO = Path(__file__).resolve().parents[2]


class Page(HTMLParser):
    """Every tag with its attributes, and the text, as a browser's parser would see them."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.ends: list[str] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.ends.append(tag)

    def handle_endtag(self, tag):
        self.ends.append(tag)

    def handle_data(self, data):
        self.text.append(data)

    def count(self, tag):
        return sum(1 for t, _ in self.tags if t == tag)


def check_self_contained(text: str) -> Page:
    page = Page(text)
    assert text.startswith("<!DOCTYPE html>")
    assert page.count("script") == 0 and page.count("link") == 0
    assert page.count("iframe") == page.count("object") == page.count("embed") == page.count("img") == 0
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "action", "srcset", "data"):
            assert name not in attrs, (tag, attrs)  # nothing to fetch, not even a relative path
        assert "url(" not in (attrs.get("style") or "")
    style = "".join(t for t in page.text if "{" in t)
    assert "url(" not in style and "@import" not in style
    low = text.lower()
    for needle in ("http://", "https://", 'src="//', "src='//", 'href="//'):
        assert needle not in low
    csp = [a for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and csp[0]["content"] == CSP
    for tag in ("svg", "table", "html", "body", "ol", "pre"):  # closed as often as opened
        assert page.count(tag) == page.ends.count(tag), tag
    return page


def test_builtin_report_is_self_contained_with_the_profiles_figures(builtin_profile, builtin_analysis):
    p, a = builtin_profile, builtin_analysis
    text = render_html(p, a)
    page = check_self_contained(text)
    words = " ".join(page.text)
    flat = " ".join(words.split())
    s = p.stats
    assert a.stats == s  # the analysis judged the profile's own statistics
    # The headline is the typical step, labelled with how it was obtained, then the spread of all steps.
    assert f"step {seconds(s.step_s)}" in flat
    basis = (f"(typical: the mean of {len(s.typical)} of {s.n_steps} measured steps, host wall time;"
             if s.irregular else f"(mean of {s.n_steps} measured steps, host wall time;")
    assert f"step {seconds(s.step_s)} {basis}" in flat
    assert f"median {seconds(s.median_s)}, p10 {seconds(s.p10_s)}, p90 {seconds(s.p90_s)}" in words
    assert f"{s.tokens_per_s:,.0f} tokens/s" in words
    for phase, e in s.phases.items():
        assert f"{phase} {seconds(e.seconds)} {pct(e.share)}" in flat, phase
    # The phase table adds up to the headline step: its total row repeats it.
    assert abs(sum(e.seconds for e in s.phases.values()) - s.step_s) < 1e-9
    assert f"total {seconds(s.step_s)} {pct(1.0)}" in flat
    fixes = [f for f in a.findings if f.kind == "fix" and f.saving_s is not None]
    for f in a.findings:
        assert f.title in words
    for f in fixes:
        assert f"saves: {seconds(f.saving_s)} per step ({pct(f.saving_share)} of the typical step)" in words
    # A CPU run has no NVML sampler: said, not drawn.
    assert "GPU utilization and memory: not measured" in words
    # The host sampler's timeline, drawn: host CPU % and cores over time, a line per run of two or
    # more readings of each series. The fixture's sampler sampled the run through (at least 3
    # samples, tests/render/conftest.py), so there are lines on any machine.
    host = p.measurements["host"]
    tl = host["timeline"]
    assert len(tl["t_s"]) >= 3
    assert "Host CPU (psutil)" in words and f"CPU cores used (of {host['cpu_count']})" in words
    lines = sum(_runs_of_two(tl[k]) for k in ("cpu_pct", "cpu_pct_max_core", "own_cpu_cores", "others_cpu_cores"))
    assert page.count("polyline") >= lines >= 2
    assert "Ranks" not in words  # a single process has no per-rank section


def _runs_of_two(values) -> int:
    """How many lines a chart draws for a series: runs of two or more readings between gaps."""
    runs, n = 0, 0
    for v in list(values) + [None]:
        if v is None:
            runs += n >= 2
            n = 0
        else:
            n += 1
    return runs


def test_an_injected_script_argument_stays_text(script_profile, script_analysis):
    p = script_profile
    injected = "<script>alert(1)</script>"  # the argument tests/render/conftest.py gave the script
    assert injected in " ".join(p.run["command"])
    text = render_html(p, script_analysis)
    page = check_self_contained(text)
    assert injected not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert any(injected in t for t in page.text)  # shown, as text
    assert page.count("script") == 0


def test_merged_report_shows_ranks_escaped_and_the_corrected_config(merged_profile, merged_analysis):
    p = merged_profile
    text = render_html(p, merged_analysis)
    page = check_self_contained(text)
    words = " ".join(page.text)
    assert "NCCL <b>timeout</b>" in words and "&lt;b&gt;timeout&lt;/b&gt;" in text
    assert page.count("b") == text.count("<b>")  # no tag came from the run's strings
    assert "the step waits for <data>" in words and "<i>x</i>" in words
    for r in p.ranks:  # each rank's typical step (its steps are alike: the mean of them all)
        times = [s["gpu_s"] for s in r["profile"]["steps"]]
        assert seconds(statistics.mean(times)) in words
    assert "failed" in words and "node-a" in words
    pre = text.split("<pre>")[1].split("</pre>")[0]
    assert "batch_size = 16" in pre and "(was 8)" in pre
    assert "--batch_size=16" in words
    # The top level is rank 0's view: the page says so above its charts.
    assert "view rank 0 (the lowest rank with a profile)" in words
    assert "NVIDIA H200: utilization (NVML)" in words


def test_gpu_report_draws_the_nvml_timeline(merged_profile):
    from gpuprof.analysis.pipeline import analyze
    from gpuprof.profile import Profile

    rank0 = Profile.from_dict(merged_profile.ranks[0]["profile"])
    a = analyze(rank0)
    text = render_html(rank0, replace(a, findings=()))
    page = check_self_contained(text)
    words = " ".join(page.text)
    assert "NVIDIA H200: utilization (NVML)" in words and "NVIDIA H200: memory used (NVML)" in words
    # The memory chart's top is the GPU's total, from the profile: memory in binary units
    # (units.gib: 3 significant figures).
    assert gib(150_000_000_000) == "140 GiB" and "140 GiB" in words
    assert "GPU idle" in words  # the phase table on the GPU timeline
    assert "no finding: nothing in this run stands out" in words


def _html_render_module():
    spec = importlib.util.spec_from_file_location("html_render", REPO / "benchmarks" / "html_render.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["html_render"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium for this module's tests (benchmarks/html_render.py drives it)."""
    mod = _html_render_module()
    if mod.find_chromium() is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium); the static checks still ran")
    probe = tmp_path_factory.mktemp("chromium-probe") / "probe.html"
    probe.write_text("<!doctype html><title>probe</title><p>probe</p>")
    chromium = None
    try:  # an empty page first: a browser that cannot run here is the environment, not our page
        chromium = mod.Chromium().__enter__()
        chromium.open(probe)
    except Exception as exc:  # installed but cannot start here (a sandbox without /dev/shm, ...)
        if chromium is not None:
            chromium.__exit__(None, None, None)
        pytest.skip(f"chromium is installed but cannot load a page here: {exc.__class__.__name__}: {exc}")
    try:
        yield chromium
    finally:
        chromium.__exit__(None, None, None)


def test_chromium_loads_the_reports_without_console_messages_or_requests(
        browser, builtin_profile, builtin_analysis, script_profile, script_analysis, merged_profile,
        merged_analysis, tmp_path):
    for name, prof, analysis in (("builtin", builtin_profile, builtin_analysis),
                                 ("script", script_profile, script_analysis),
                                 ("merged", merged_profile, merged_analysis)):
        path = tmp_path / f"{name}.html"
        path.write_text(render_html(prof, analysis), encoding="utf-8")
        shot = tmp_path / f"{name}.png"
        res = browser.open(path, shot)
        assert res["console"] == [] and res["errors"] == [] and res["requests"] == [], (name, res)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        assert res["height"] > 800  # the whole report laid out, not an empty page


def test_chromium_check_does_catch_a_request_and_a_script(browser, tmp_path):
    """The detector itself: a page that asks for an image and runs a script is reported."""
    path = tmp_path / "bad.html"
    path.write_text(f'<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="{CSP}">'
                    '</head><body><img src="https://example.invalid/x.png"><script>console.log(1)</script>'
                    "</body></html>", encoding="utf-8")
    res = browser.open(path)
    assert res["requests"] == ["https://example.invalid/x.png"]
    assert any("Content Security Policy" in c for c in res["console"])
    assert any("inline script" in c for c in res["console"])  # the script was refused, not run
