"""The corrected config: fixes merged, conflicts resolved by rank, written in nanoGPT format."""

import runpy

import pytest

from gpuprof.analysis.corrected import merge
from gpuprof.analysis.findings import Finding
from gpuprof.errors import GpuprofError
from gpuprof.recommend.config import write_config


def test_merge_takes_higher_ranked_values_and_only_nanogpt_keys():
    ranked = [
        Finding("micro-batch-too-small", "a", 1.0, 0.5, {}, config_overrides={"batch_size": 32, "gradient_accumulation_steps": 2}),
        Finding("no-tensor-cores", "b", 0.5, 0.2, {}, config_overrides={"dtype": "bfloat16"}),
        Finding("other", "c", 0.1, 0.1, {}, config_overrides={"batch_size": 8, "pin_memory": True}),
        Finding("compute-bound", "d", None, None, {}, kind="verdict", config_overrides={"compile": True}),
    ]
    cc = merge(ranked, {"batch_size": 4, "grad_accum": 16, "dtype": "fp32"})
    assert cc.overrides == {"batch_size": 32, "gradient_accumulation_steps": 2, "dtype": "bfloat16"}
    assert cc.sources["dtype"] == "no-tensor-cores"
    assert cc.overridden == [("other", "batch_size", 8)]
    assert cc.current == {"batch_size": 4, "gradient_accumulation_steps": 16, "dtype": "fp32"}


def test_written_file_reads_back_through_python_and_refuses_overwrite(tmp_path):
    cc = merge([Finding("x", "t", 1.0, 0.1, {}, config_overrides={"batch_size": 64, "compile": True})])
    path = tmp_path / "corrected.py"
    write_config(path, cc.overrides, cc.header())
    assert {k: v for k, v in runpy.run_path(str(path)).items() if not k.startswith("__")} == {"batch_size": 64, "compile": True}
    before = path.read_text()
    with pytest.raises(GpuprofError, match="already exists"):
        write_config(path, {"batch_size": 1}, "")
    assert path.read_text() == before


def test_a_script_gets_only_the_settings_it_defines():
    f = Finding("precision-slow", "t", 0.1, 0.5, {}, config_overrides={"dtype": "float32"})
    g = Finding("micro-batch-too-small", "t", 0.05, 0.2, {}, config_overrides={"batch_size": 16})
    nanogpt = merge([f, g], {"script_globals": {"dtype": "bfloat16", "batch_size": 4}})
    assert nanogpt.overrides == {"dtype": "float32", "batch_size": 16}
    argparse_script = merge([f, g], {"script_globals": {}})  # settings come from its flags
    assert argparse_script.overrides == {}
    assert merge([f], {}).overrides == {"dtype": "float32"}  # the built-in loop
