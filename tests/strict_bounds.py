"""Test machinery, registered by tests/conftest.py: every profile and every analysis a test makes
passes the one physical-bounds checker (gpuprof.analysis.bounds) — no MFU above 100%, no share
outside 0-1, no CPU above the cores, no saving above the step — or the test fails at its teardown,
naming the figures. The library carries no switch for it.

What is watched, installed once for the session (`install`), recording and changing nothing else:
- an Analysis is made in two places only, gpuprof.analysis.pipeline's `analyze` and
  `Analysis.from_dict`: both are wrapped, and each (profile, analysis) is checked with
  `violations(profile, analysis)`. Modules that bound `analyze` before the wrapping are rebound
  to it; test modules are imported later and get it directly.
- a Profile is made by three producers (the built-in loop, a script's run, attach), by
  `from_dict` and by the tests themselves: only its constructor sees them all, so `__init__` is
  wrapped, and a profile with measured steps that no analysis covers is checked with
  `measured_violations` — the producer tests (run_builtin's own) analyse nothing.

Recording starts before a test's fixtures are set up, so what a module-scoped fixture makes is
checked with the first test that sets it up. A test marked `adversarial` builds impossible
profiles on purpose (the repairs are what it tests) and is not checked.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field

import pytest

from gpuprof.analysis import pipeline
from gpuprof.analysis.bounds import measured_violations, violations
from gpuprof.profile import Profile

ADVERSARIAL = "adversarial"


@dataclass
class Made:
    """What the running test made: profiles, and (profile, analysis) pairs."""

    profiles: list = field(default_factory=list)
    analyses: list = field(default_factory=list)

    def problems(self) -> list[tuple[str, str]]:
        """(where, violation) for every figure out of bounds."""
        out = [("analysis", v) for p, a in self.analyses for v in violations(p, a)]
        analysed = {id(p) for p, _ in self.analyses}
        out += [(str(p.run.get("mode")), v) for p in self.profiles
                if p.steps and id(p) not in analysed for v in measured_violations(p)]
        return list(dict.fromkeys(out))


# None between tests and in an adversarial test: nothing is recorded.
_made: Made | None = None


def _analysed(profile, analysis):
    if _made is not None:
        _made.analyses.append((profile, analysis))
    return analysis


def install() -> None:
    """Wrap pipeline.analyze, Analysis.from_dict and Profile.__init__ to record. Once."""
    original = pipeline.analyze
    if getattr(original, "_records_for_strict_bounds", False):
        return

    @functools.wraps(original)
    def analyze(profile, options=None, **kw):
        return _analysed(profile, original(profile, options, **kw))

    analyze._records_for_strict_bounds = True
    for name, module in list(sys.modules.items()):  # names bound before now (`import ... as` too)
        if name.startswith("gpuprof") and module is not None:
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, analyze)

    from_dict = pipeline.Analysis.from_dict.__func__

    @functools.wraps(from_dict)
    def analysis_from_dict(cls, d, profile):
        return _analysed(profile, from_dict(cls, d, profile))

    pipeline.Analysis.from_dict = classmethod(analysis_from_dict)

    init = Profile.__init__

    @functools.wraps(init)
    def profile_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if _made is not None:
            _made.profiles.append(self)

    Profile.__init__ = profile_init


def pytest_configure(config):
    config.addinivalue_line("markers", f"{ADVERSARIAL}: builds impossible profiles on purpose "
                                       "(the bounds check skips it)")
    install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    global _made
    _made = None if item.get_closest_marker(ADVERSARIAL) else Made()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the test's fixtures are torn down: fail it (a teardown error) on any violation."""
    global _made
    made, _made = _made, None  # the check's own rank profiles are not recorded
    bad = made.problems() if made is not None else []
    if bad:
        pytest.fail(f"impossible figures in a profile or analysis this test produced: {bad[:5]}",
                    pytrace=False)
