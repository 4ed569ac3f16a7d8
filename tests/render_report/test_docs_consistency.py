"""README.md and docs/*.md against what has been measured (issue #43), fast, nothing run: every
relative link reaches a file (and a heading, when it names one); no page says no GPU has run while
docs/measurements holds a GPU report; the README fits a first screen (≤ 120 lines) and cites no
file a user does not have; a figure quoted on several pages is docs/measurements.md's (or the GPU
report's); every generated example carries its stamp, and all were regenerated within one week."""

from __future__ import annotations

import datetime
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _regenerate_module():
    """benchmarks/regenerate_examples.py (benchmarks/ is not a package): its markers and names."""
    spec = importlib.util.spec_from_file_location("regenerate_examples", ROOT / "benchmarks" / "regenerate_examples.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("regenerate_examples", mod)
    spec.loader.exec_module(mod)
    return mod


_regen = _regenerate_module()
BLOCK, EXAMPLES, STAMP = _regen.BLOCK, _regen.EXAMPLES, _regen.STAMP
MEASURED = ROOT / "docs" / "measurements"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
IDS = [str(p.relative_to(ROOT)) for p in PAGES]
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Pages that said no GPU had run, in the words they used (the before-stop hook's, and more).
NO_GPU = re.compile(r"no GPU has (?:been lent|run)|nothing yet\W+no GPU|(?:has|have) never (?:been )?run on "
                    r"(?:a |any )?GPUs?\b|not yet (?:been )?run on a GPU|no GPU run so far", re.I)
NOT_FOR_USERS = re.compile(r"FACTS\.md|STYLE\.md|\.\./shared\b")


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def prose(page: Path) -> str:
    """The page without its code blocks and generated examples (program output, not claims)."""
    t = BLOCK.sub("", text(page))
    return re.sub(r"```.*?```", "", t, flags=re.S)


def sentences(page: Path) -> list[str]:
    """The page's prose as sentences, each on one line (wrapped lines joined)."""
    out = []
    for para in re.split(r"\n\s*\n", prose(page)):
        flat = " ".join(para.split())
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z(`*\[])|(?<=\|)\s+(?=\|)", flat)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces → -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", prose(page), re.M)}


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    for target in LINK.findall(re.sub(r"```.*?```", "", text(page), flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: link to {target}: no such heading in {dest.name}"


def gpu_reports() -> list[Path]:
    return [p for p in MEASURED.iterdir() if re.search(r"gpu|nvidia|h100|h200", p.name, re.I) and p.suffix == ".md"]


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_page_says_no_gpu_has_run_when_a_gpu_report_exists(page):
    assert gpu_reports(), "docs/measurements has no GPU report: this test's premise changed"
    said = [s for s in sentences(page) if NO_GPU.search(s)]
    assert not said, f"{page.name} says no GPU has run, but {gpu_reports()[0].name} exists: {said}"


def test_the_readme_is_a_first_screen():
    lines = text(ROOT / "README.md").splitlines()
    assert len(lines) <= 120, f"README.md has {len(lines)} lines"
    top = "\n".join(lines[:8])
    # the two set-up commands stay on top; .ci/run runs the second
    assert "pip install torch==2.13.0 && pip install -e . && gpuprof diagnose" in top
    assert 'pip install -e ".[test,trainers]" && python -m pytest -q -n 2' in top
    assert "python -m pytest -q -n 2" in text(ROOT / ".ci" / "run")


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_page_cites_files_users_do_not_have(page):
    assert not NOT_FOR_USERS.search(text(page)), page.name


# ------------------------------------------------------------------------- figures, one source
def canonical(pattern: str) -> str:
    """A claim's figure as docs/measurements.md states it (its first statement)."""
    m = re.search(pattern, " ".join(text(ROOT / "docs" / "measurements.md").split()))
    assert m, f"docs/measurements.md no longer states {pattern}"
    return m.group(1)


def gpu_results() -> set[tuple[int, int]]:
    """(passed, checks) of every GPU report's `result:` line."""
    out = set()
    for p in gpu_reports():
        m = re.search(r"^- result: (\d+) PASS, (\d+) FAIL, (\d+) SKIP", text(p), re.M)
        assert m, f"{p.name} has no result line"
        passed, failed, skipped = map(int, m.groups())
        out.add((passed, passed + failed + skipped))
    return out


ATTACH_SHARE = r"data shares? (?:[^.;|]*? )?within ±?([\d.]+) points"
PRECISION = r"precision(?:-slow| promise)\b[^.;|]*?\b(\d+ of \d+)"
CLAIMS = {  # claim: (the pattern a page quotes it in, which sentences are about it, its one figure)
    "attach's data share": (ATTACH_SHARE, lambda page, s: "attach" in s.lower() or page.name == "attach.md",
                            lambda: canonical(r"sampled " + ATTACH_SHARE)),
    "the precision promise": (PRECISION, lambda page, s: True, lambda: canonical(PRECISION)),
}


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "measurements.md"],
                         ids=[i for i in IDS if i != "docs/measurements.md"])
@pytest.mark.parametrize("claim", list(CLAIMS))
def test_a_figure_quoted_without_a_date_is_the_measurements_page_s(page, claim):
    """A sentence that dates itself (or links a dated report) is history; one that does not
    claims the present, and must quote docs/measurements.md's figure."""
    pattern, about, figure = CLAIMS[claim]
    want = figure()
    for s in sentences(page):
        if DATE.search(s) or not about(page, s):
            continue
        for got in re.findall(pattern, s):
            assert got == want, f"{page.name} quotes {claim} as {got}, docs/measurements.md as {want}: {s}"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_the_gpu_checks_passed_are_the_gpu_reports(page):
    results = gpu_results()
    flat = " ".join(prose(page).split())
    for m in re.finditer(r"passed (\d+) of (\d+) checks|(\d+) of (\d+) checks passed|(\d+) PASS, (\d+) FAIL", flat):
        g = [int(x) for x in m.groups() if x is not None]
        quoted = (g[0], g[0] + g[1]) if "PASS" in m.group(0) else (g[0], g[1])
        assert quoted in results, f"{page.name}: {m.group(0)!r}, the GPU reports say {sorted(results)}"


# ---------------------------------------------------------------------- generated examples
def blocks() -> list[tuple[str, str, str]]:
    return [(p.name, m["name"], m["body"]) for p in PAGES for m in BLOCK.finditer(text(p))]


def test_every_example_is_generated_stamped_and_from_the_same_week():
    found = blocks()
    assert {"diagnose-script", "html-screenshot"} <= {name for _, name, _ in found}  # README's first screen
    dates = []
    for page, name, body in found:
        assert name in EXAMPLES, f"{page}: example {name} is not one of benchmarks/regenerate_examples.py's"
        m = STAMP.match(body)
        assert m, f"{page}: example {name} has no stamp: run python benchmarks/regenerate_examples.py {name}"
        assert f"run by `python benchmarks/regenerate_examples.py {name}`." in body.splitlines()[0]
        dates.append(datetime.date.fromisoformat(m["date"]))
    assert max(dates) - min(dates) <= datetime.timedelta(days=7), sorted(set(dates))


def test_the_readme_s_report_is_a_first_screen_of_at_most_25_lines():
    body = next(b for page, name, b in blocks() if page == "README.md" and name == "diagnose-script")
    lines = body.split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("gpuprof diagnosis"))
    hint = next(i for i, line in enumerate(lines) if line.startswith("more with --details"))
    assert hint - start <= 25
    assert lines[start + 1].startswith("step ")  # the run, the step (up to 3 lines), then the verdict
    assert any(line.startswith("Verdict:") for line in lines[start + 2:start + 5])
    assert max(len(line) for line in lines) <= 100
