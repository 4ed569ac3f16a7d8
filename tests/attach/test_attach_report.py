"""An attached run's profile stores figures (the phase shares, NVML's utilization); the report
derives what they say about the GPU and words it (gpuprof.report.attach). An older profile that
stored the sentences (measurements.attach.gpu_inference, h2d_note) still reads."""

from __future__ import annotations

import math

import pytest

from gpuprof.attach.phases import UNIT_SURE
from gpuprof.profile import Profile, StepRecord
from gpuprof.report import attach as ra
from gpuprof.report.words import what_ran


def _attached(nvml: dict, data_share: float = 0.4, **attach) -> Profile:
    steps = [StepRecord(index=i, wall_s=1.0, phases={"data": data_share, "other": 1 - data_share})
             for i in range(3)]
    shares = {"data": {"share": data_share}, "other": {"share": 1 - data_share}}
    return Profile(run={"mode": "attach", "pid": 42, "command": ["python", "train.py"], "config": {}},
                   steps=steps, measurements={"attach": {"shares": shares, **attach}, "nvml": nvml})


def _nvml(util: float | None) -> dict:
    summary = {"gpu_util_pct": {"mean": util}} if util is not None else {}
    return {"available": True, "gpus": [{"name": "NVIDIA H200", "summary": summary}], "summary": summary}


@pytest.mark.parametrize("nvml, reading, util", [
    ({"available": False, "reason": "no NVML"}, ra.NO_READING, None),
    (_nvml(None), ra.NO_UTILIZATION, None),
    (_nvml(97.0), ra.GPU_PACES, 97.0),
    (_nvml(90.0), ra.GPU_PACES, 90.0),
    (_nvml(41.0), ra.GPU_WAITS, 41.0),
])
def test_the_gpu_inference_is_derived_from_the_figures(nvml, reading, util):
    prof = _attached(nvml, data_share=0.4)
    g = ra.gpu_inference(prof)
    assert (g.reading, g.util_pct, g.data_share) == (reading, util, 0.4)
    rows = dict(what_ran(prof, prof.stats))
    assert rows["GPU"] == ra.gpu_inference_text(g)
    assert ra.EXACT in rows["GPU"]
    assert rows["h2d"] == ra.H2D_NOTE


def test_an_older_profiles_sentences_still_read():
    old = "GPU busy 95% of the time: the host's 40% in data is hidden behind GPU work; ..."
    prof = _attached(_nvml(12.0), gpu_inference=old, h2d_note=ra.H2D_NOTE)
    g = ra.gpu_inference(prof)
    assert g.text == old and g.reading is None  # what the older gpuprof judged, shown as it was
    assert dict(what_ran(prof, prof.stats))["GPU"] == old


def _steps_found(steps: int, gaps: int, split: int, margin: float | None) -> dict:
    return {"steps": steps, "gaps": gaps, "gaps_split": split, "boundaries": gaps + 1, "typical_micro_steps": 4,
            "unit_margin": margin}


@pytest.mark.parametrize("found, says", [
    # 2026-12-08: 5 boundaries seen in ~78 steps, 10 of 11 steps from split gaps, the unit 3.3x likelier
    # than the next: the step read 215 ms for the target's 129 ms
    (_steps_found(11, 4, 3, math.log(3.3)), "an estimate: 10 of the 11 steps inferred from gaps between the 5 step "
                                            "boundaries seen, by a micro-steps-per-step figure (4) that is uncertain"),
    (_steps_found(40, 10, 8, None), "an estimate: 38 of the 40 steps inferred"),  # unit given: no "uncertain"
    (_steps_found(40, 30, 5, math.log(400)), None),  # most steps between boundaries seen, the unit sure
    (_steps_found(40, 30, 5, math.log(3.0)), "uncertain"),  # few inferred, but the unit that splits them unsure
    (_steps_found(30, 30, 0, math.log(2.0)), "an estimate: each gap between the 31 step boundaries seen counted as "
                                             "one step, by a micro-steps-per-step figure (4) that is uncertain"),
])
def test_an_attached_step_mostly_inferred_says_it_is_an_estimate(found, says):
    from gpuprof.analysis.pipeline import analyze
    from gpuprof.report.model import build_report

    prof = _attached({"available": False, "reason": "no NVML"}, steps=found)
    line = build_report(prof, analyze(prof)).step_statistic
    assert line.startswith("mean of 3 measured steps")
    if says is None:
        assert "estimate" not in line and "uncertain" not in line
    else:
        assert says in line
        assert ("uncertain" in line) == (found["unit_margin"] is not None and found["unit_margin"] < UNIT_SURE)
    assert build_report(_attached({"available": False, "reason": "no NVML"}), analyze(prof)).step_statistic \
        == line.split("; an estimate")[0]  # a profile without the figures (an older one, or diagnose): as before
