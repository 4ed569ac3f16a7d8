"""One reader of a run's compute dtype (gpuprof.analysis.precision): the precision record in
measurements.precision, in run.config.precision (files written before it was a measurement), or
an older profile's claims through hardware.observed_compute_dtype — the same (dtype, TF32) as the
MFU's own reader gave for every config it handled (LEGACY below is analysis/mfu.py's compute_dtype as it
was before the MFU read through the one reader, kept verbatim as the reference)."""

from __future__ import annotations

import pytest

from gpuprof.analysis.precision import compute_dtype_name, run_compute_dtype
from gpuprof.hardware import normalize_dtype
from gpuprof.profile import Profile, StepRecord


def LEGACY(config: dict) -> tuple[str, bool]:
    """analysis/mfu.py compute_dtype(config) before the one reader (verbatim)."""
    prec = config.get("precision") or {}
    if prec.get("compute_dtype"):
        d = normalize_dtype(prec["compute_dtype"])
        return ("fp32", True) if d == "tf32" else (d, bool(prec.get("tf32_matmul")))
    ac = config.get("autocast_dtype")
    tf32 = bool(config.get("tf32_matmul") or config.get("allow_tf32"))
    if ac:
        return normalize_dtype(ac), tf32
    try:
        return normalize_dtype(config.get("dtype") or "fp32"), tf32
    except ValueError:
        return "fp32", tf32


RECORDS = [  # measure.precision.read_precision's record, as runs wrote it
    {"autocast_dtype": "bfloat16", "param_dtype": "float32", "tf32_matmul": False, "compute_dtype": "bf16"},
    {"autocast_dtype": None, "param_dtype": "float32", "tf32_matmul": True, "compute_dtype": "tf32"},
    {"autocast_dtype": None, "param_dtype": "float32", "tf32_matmul": False, "compute_dtype": "fp32"},
    {"autocast_dtype": None, "param_dtype": "bfloat16", "tf32_matmul": True, "compute_dtype": "bf16"},
    {"autocast_dtype": "float16", "param_dtype": "float32", "tf32_matmul": True, "compute_dtype": "fp16"},
    {"autocast_dtype": None, "param_dtype": "float32", "tf32_matmul": True, "compute_dtype": "fp32",
     "tf32_source": "not applicable on cpu"},
]
SETTINGS = [  # what older profiles kept beside or instead of the record
    {"dtype": "bfloat16"}, {"dtype": "float32"}, {"dtype": "fp16"}, {"dtype": "bf16", "device": "cpu"},
    {"dtype": "float32", "device": "cuda:0", "tf32_matmul": True},
    {"dtype": "float32", "device": "cpu", "tf32_matmul": True},
    {"dtype": "float32", "device": "cuda", "allow_tf32": True},
    {"dtype": "tf32"},  # a name no run writes, read as the MFU read it
    {"dtype": "int8"}, {"dtype": "int8", "device": "cuda:0", "tf32_matmul": True},  # an unknown dtype: fp32
    {}, {"dtype": None}, {"device": "cuda:0"},
]
OLD_ONLY = [  # older profiles: the autocast dtype recorded, no precision record
    {"autocast_dtype": "bfloat16", "dtype": "float32"},
    {"autocast_dtype": "float16", "dtype": "bfloat16", "device": "cuda:0"},
    {"autocast_dtype": "float32", "dtype": "bfloat16", "device": "cuda:0", "tf32_matmul": True},
    {"autocast_dtype": "float32", "device": "cpu", "tf32_matmul": True},
    {"autocast_dtype": None, "dtype": "float16"},
    {"autocast_dtype": "bf16", "device": "cuda:0", "tf32_matmul": True},
    {"autocast_dtype": None, "dtype": "bad", "tf32_matmul": True},
    {"precision": {"error": "RuntimeError: no reading"}, "dtype": "bfloat16"},  # a failed reading
]


def _cases():
    for s in SETTINGS:
        for r in RECORDS:
            yield pytest.param({**s, "precision": r}, id=f"config.precision-{r['compute_dtype']}-{s}")
        yield pytest.param(dict(s), id=f"settings-{s}")
    for s in OLD_ONLY:
        yield pytest.param(dict(s), id=f"autocast-{s}")


@pytest.mark.parametrize("config", list(_cases()))
def test_the_reader_gives_what_the_mfu_read_for_every_config(config):
    want = LEGACY(config)
    assert run_compute_dtype(config) == want  # an old file: the record (if any) in the config
    assert run_compute_dtype(config, {}) == want
    if "precision" in config:  # the same record, where runs now write it
        moved = {k: v for k, v in config.items() if k != "precision"}
        assert run_compute_dtype(moved, {"precision": config["precision"]}) == want
        # a profile, both layouts
        for prof in (Profile(run={"config": config}, steps=[]),
                     Profile(run={"config": moved}, steps=[], measurements={"precision": config["precision"]})):
            assert run_compute_dtype(prof) == want


def test_the_measurement_wins_over_an_older_record_in_the_config():
    cfg = {"dtype": "float32", "precision": {"compute_dtype": "fp32", "tf32_matmul": False}}
    assert run_compute_dtype(cfg, {"precision": {"compute_dtype": "bf16", "tf32_matmul": False}}) == ("bf16", False)


def test_a_record_gpuprof_cannot_read_falls_back_to_the_claims():
    cfg = {"dtype": "bfloat16"}
    assert run_compute_dtype(cfg, {"precision": {"compute_dtype": "int4"}}) == ("bf16", False)


@pytest.mark.parametrize("config, measurements, env, name", [
    ({}, {"precision": {"compute_dtype": "tf32", "tf32_matmul": True}}, {}, "tf32"),  # as the probe names it
    ({}, {"precision": {"compute_dtype": "bf16"}}, {}, "bf16"),
    ({"precision": {"compute_dtype": "fp32"}}, {}, {}, "fp32"),  # an older file's record
    ({"dtype": "float32", "tf32_matmul": True, "device": "cuda:0"}, {}, {}, "tf32"),
    ({"dtype": "float32", "tf32_matmul": True}, {}, {"device": "cuda"}, "tf32"),  # the device from the environment
    ({"dtype": "float32", "tf32_matmul": True, "device": "cpu"}, {}, {}, "fp32"),  # TF32 is a CUDA matmul mode
    ({"autocast_dtype": "bfloat16", "device": "cuda:0", "tf32_matmul": True}, {}, {}, "bf16"),
    ({}, {}, {}, "fp32"),
])
def test_the_name_the_precision_probe_uses(config, measurements, env, name):
    prof = Profile(run={"config": config}, steps=[StepRecord(index=0, wall_s=1.0, phases={"other": 1.0})],
                   environment=env, measurements=measurements)
    assert compute_dtype_name(prof) == name


def test_the_mfu_divides_by_the_measured_dtype():
    from gpuprof.analysis.mfu import compute_mfu

    steps = [StepRecord(index=i, wall_s=1.0, phases={"forward": 0.5, "backward": 0.5}, tokens=1024) for i in range(3)]
    for layout in ({"measurements": {"precision": {"compute_dtype": "bf16", "tf32_matmul": False}}, "config": {}},
                   {"measurements": {}, "config": {"precision": {"compute_dtype": "bf16", "tf32_matmul": False}}}):
        prof = Profile(run={"config": {"dtype": "float32", "device": "cuda:0", **layout["config"]}}, steps=steps,
                       environment={"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3"},
                       measurements=layout["measurements"])
        assert compute_mfu(prof).dtype == "bf16"
