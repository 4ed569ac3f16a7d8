"""nanoGPT config files: read without executing, written so nanoGPT's configurator reads the
same values back, refused when they contain code, never overwriting a user's file."""

import ast
import os

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.recommend.config import flags, format_config, parse_config, read_config, write_config

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

# nanoGPT train.py-style globals that configurator.py overrides.
DEFAULTS = dict(batch_size=12, block_size=1024, gradient_accumulation_steps=40, n_layer=12,
                n_head=12, n_embd=768, dtype="bfloat16", compile=True, learning_rate=6e-4,
                out_dir="out", wandb_run_name="gpt2")


def nanogpt_configurator(args: list[str], defaults: dict) -> dict:
    """What karpathy/nanoGPT's configurator.py does to train.py's globals (re-implemented)."""
    g = dict(defaults)
    for arg in args:
        if "=" not in arg:
            assert not arg.startswith("--")
            with open(arg) as f:
                exec(f.read(), {}, g)  # noqa: S102 - the test plays nanoGPT, which execs
        else:
            key, val = arg[2:].split("=", 1)
            assert key in g, key
            try:
                attempt = ast.literal_eval(val)
            except (SyntaxError, ValueError):
                attempt = val
            assert type(attempt) == type(g[key]), (key, attempt)  # noqa: E721
            g[key] = attempt
    return g


VALUES = dict(batch_size=64, gradient_accumulation_steps=16, block_size=1024,
              dtype="bfloat16", compile=False, learning_rate=3e-4, out_dir="out dir/with 'quotes'",
              wandb_run_name="True")


def test_round_trip_through_nanogpt_configurator(tmp_path):
    path = tmp_path / "corrected.py"
    write_config(path, VALUES, "written by a test\nsecond line")
    text = path.read_text()
    assert text.startswith("# written by a test\n# second line\n")
    got = nanogpt_configurator([str(path)], DEFAULTS)
    for key, value in VALUES.items():
        assert got[key] == value and type(got[key]) is type(value)
    assert read_config(path) == VALUES


def test_flags_round_trip_through_nanogpt_configurator():
    import shlex

    args = shlex.split(flags(VALUES))
    got = nanogpt_configurator(args, DEFAULTS)
    for key, value in VALUES.items():
        assert got[key] == value and type(got[key]) is type(value)
    assert flags({"batch_size": 32, "gradient_accumulation_steps": 32}) == \
        "--batch_size=32 --gradient_accumulation_steps=32"


def test_reads_nanogpt_train_gpt2_with_arithmetic():
    values = read_config(os.path.join(FIXTURES, "nanogpt_train_gpt2.py"))
    assert values["gradient_accumulation_steps"] == 40  # `5 * 8`
    assert values["batch_size"] == 12 and values["weight_decay"] == 0.1
    assert values["wandb_run_name"] == "gpt2-124M"


def test_code_is_refused_with_line_number():
    with pytest.raises(GpuprofError) as exc:
        read_config(os.path.join(FIXTURES, "finetune_with_code.py"))
    msg = str(exc.value)
    assert "finetune_with_code.py:2" in msg and "import" in msg and "\n" not in msg


@pytest.mark.parametrize("text, fragment", [
    ("x = open('f').read()\n", "not a literal"),
    ("x = y\n", "not a literal"),
    ("x = __import__('os').system('true')\n", "not a literal"),
    ("if True:\n    x = 1\n", "if statement"),
    ("def f():\n    pass\n", "function"),
    ("x += 1\n", "augmented"),
    ("a, b = 1, 2\n", "only `key = literal`"),
    ("x = 2 ** 100000\n", "not a literal"),
    ("x = = 1\n", "not valid Python"),
])
def test_non_literal_forms(text, fragment):
    with pytest.raises(GpuprofError) as exc:
        parse_config(text, "c.py")
    assert fragment in str(exc.value)


def test_literal_forms():
    assert parse_config("'''doc'''\na = -1\nb = 1e-1\nc = [1, 2]\nd: int = 3\ne = None\n") == \
        dict(a=-1, b=0.1, c=[1, 2], d=3, e=None)


def test_write_refuses_existing_file_unless_forced(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("batch_size = 12\n")
    with pytest.raises(GpuprofError) as exc:
        write_config(path, {"batch_size": 64})
    assert "already exists" in str(exc.value) and "--force" in str(exc.value)
    assert path.read_text() == "batch_size = 12\n"  # untouched
    write_config(path, {"batch_size": 64}, force=True)
    assert read_config(path) == {"batch_size": 64}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # no temp files left


def test_write_into_missing_folder(tmp_path):
    with pytest.raises(GpuprofError) as exc:
        write_config(tmp_path / "nope" / "c.py", {"batch_size": 1})
    assert "does not exist" in str(exc.value)


def test_format_config_aligns_and_rejects_bad_values():
    assert format_config({"a": 1, "bbb": "x"}) == "a   = 1\nbbb = 'x'\n"
    with pytest.raises(TypeError):
        format_config({"a": object()})
