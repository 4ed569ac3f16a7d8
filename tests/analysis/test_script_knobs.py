"""A fix in the script's own terms (gpuprof/analysis/script_knobs.py): its argparse flags found by
their names *and* the values the run was measured with, its environment variables, nanoGPT's keys
left as they are, and plain words where the script has no knob."""

from gpuprof.analysis.findings import Finding
from gpuprof.analysis.script_knobs import find_knobs, in_script_terms, worded


def _opt(flag, dest, value, given=False):
    return {"flags": [flag], "dest": dest, "value": value, "default": value, "given": given}


# nanochat's base_train.py: per-device micro-batch and a total batch in tokens; accumulation derived
NANOCHAT = {
    "batch_size": 4, "block_size": 64, "grad_accum": 4, "tokens_per_step": 1024,
    "script_globals": {},
    "script_inputs": {"argparse": [_opt("--device-batch-size", "device_batch_size", 4),
                                   _opt("--total-batch-size", "total_batch_size", 1024),
                                   _opt("--max-seq-len", "max_seq_len", 64),
                                   _opt("--warmup-steps", "warmup_steps", 5)],
                      "env": {"MINICHAT_DTYPE": None, "HOME": None}},
}
MICRO = Finding(id="micro-batch-too-small", title="t", saving_s=0.02,
                fix="batch_size=16, gradient_accumulation_steps=1 (same 1,024 tokens per step)",
                config_overrides={"batch_size": 16, "gradient_accumulation_steps": 1})


def test_nanochat_flags_are_found_by_name_and_measured_value():
    k = find_knobs(NANOCHAT)
    assert k.get("batch_size").name == "--device-batch-size" and k.get("block_size").name == "--max-seq-len"
    assert k.total.name == "--total-batch-size" and k.total_unit == "tokens" and k.accum == 4
    assert k.get("gradient_accumulation_steps") is None
    assert (k.get("dtype").kind, k.get("dtype").name) == ("env", "MINICHAT_DTYPE")


def test_the_micro_batch_fix_reads_in_the_scripts_flags_with_the_accumulation_it_implies():
    f = worded(MICRO, NANOCHAT)
    assert f.fix == ("--device-batch-size=16; gradient accumulation follows from --total-batch-size=1024 "
                     "(tokens per step): 4 -> 1 micro-step")
    assert f.evidence["script_change"] == {"--device-batch-size": 16}
    assert "batch_size=16" not in f.fix and "in nanoGPT's names: batch_size=16" in f.note


def test_a_flag_whose_value_is_not_the_measured_one_is_not_taken_for_the_setting():
    cfg = dict(NANOCHAT, script_inputs={"argparse": [_opt("--batch-size", "batch_size", 512)], "env": {}})
    assert find_knobs(cfg).get("batch_size") is None
    f = worded(MICRO, cfg)  # no knob: plain words, never names the script does not have
    assert f.fix.startswith("a micro-batch of 16 sequences, 1 micro-step per optimizer step (the script sets")
    assert "batch_size=" not in f.fix


def test_an_accumulation_flag_is_set_beside_the_batch_flag():
    cfg = {"batch_size": 4, "block_size": 128, "grad_accum": 2, "tokens_per_step": 1024, "script_globals": {},
           "script_inputs": {"argparse": [_opt("--batch_size", "batch_size", 4),
                                          _opt("--grad_accumulation_steps", "grad_accumulation_steps", 2)]}}
    assert worded(MICRO, cfg).fix == "--batch_size=16; --grad_accumulation_steps=1"


def test_nanogpt_configurator_keys_stay_as_they_are():
    cfg = {"batch_size": 4, "grad_accum": 4, "script_globals": {"batch_size": 4, "gradient_accumulation_steps": 4}}
    assert worded(MICRO, cfg) is MICRO


def test_a_precision_change_is_the_environment_variable_in_the_scripts_own_vocabulary():
    f = Finding(id="precision-slow", title="t", fix="dtype = 'bfloat16'", config_overrides={"dtype": "bfloat16"})
    text, assigns = in_script_terms(f.config_overrides, find_knobs(NANOCHAT))
    assert text == "MINICHAT_DTYPE=bfloat16 (environment: the script reads it at start)"
    short = dict(NANOCHAT, script_inputs={"argparse": [_opt("--dtype", "dtype", "fp32")], "env": {}})
    assert worded(f, short).fix == "--dtype=bf16" and worded(f, short).evidence["script_change"] == {"--dtype": "bf16"}


def test_a_store_true_compile_flag():
    cfg = {"script_globals": {}, "script_inputs": {"argparse": [_opt("--compile", "compile", False)]}}
    f = Finding(id="compile-missing", title="t", fix="compile = True", config_overrides={"compile": True})
    assert worded(f, cfg).fix == "--compile"


def test_verify_reruns_with_the_scripts_own_flag_and_environment_variable():
    from gpuprof.session import script_change

    args = ["--depth=2", "--device-batch-size=4"]
    args2, env = script_change(args, {"batch_size": 16, "gradient_accumulation_steps": 1}, NANOCHAT)
    assert args2 == [*args, "--device-batch-size=16"] and env == {}  # argparse: the last one wins
    assert script_change(args, {"dtype": "bfloat16"}, NANOCHAT) == (args, {"MINICHAT_DTYPE": "bfloat16"})
    assert script_change(args, {"block_size": 128, "vocab_size": 320}, NANOCHAT) is None  # no knob for vocab
