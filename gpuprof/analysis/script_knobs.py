"""A fix in the script's own terms: which of its command-line flags, configurator keys or
environment variables sets each setting a fix changes (pure: no torch).

The fixes speak nanoGPT's configurator keys (`batch_size`, `gradient_accumulation_steps`,
`block_size`, `dtype`, `compile`: gpuprof.analysis.corrected.NANOGPT_KEYS). A script takes them
as it defines them: nanoGPT's own globals (`--batch_size=16`), an argparse flag
(`--device-batch-size=16`), or an environment variable it reads (`MINICHAT_DTYPE=bfloat16`).
What the script read is in its profile (`config.script_inputs`: each argparse option with its dest
and parsed value, and the environment variables it read); a flag is taken for a setting only when
its name says so *and* its value is the one the run was measured with (the micro-batch the first
forward received, the micro-steps counted per optimizer step), so a `--batch-size` that means
something else in that script is not used. Accumulation that the script derives from a total
batch (nanochat's `--total-batch-size` in tokens) follows the micro-batch by itself: the change is
the micro-batch flag alone, and the words say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BATCH = re.compile(r"^(?:device_|micro_|per_device_train_|per_device_|train_|local_)?(?:batch_size|bs|batch)$|"
                    r"^(?:device|micro)_?(?:batch|bs)$", re.I)
_ACCUM = re.compile(r"^(?:gradient|grad)_?acc(?:um(?:ulation)?)?(?:_steps|_iters)?$|^accum(?:ulation)?_steps$", re.I)
_TOTAL = re.compile(r"^(?:total|global|effective)_batch(?:_size)?(?:_tokens)?$|^tokens_per_(?:step|batch)$|"
                    r"^batch_tokens$", re.I)
_BLOCK = re.compile(r"^(?:block_size|seq_len|max_seq_len|sequence_length|max_seq_length|context_length|ctx_len|"
                    r"n_ctx|seq_length)$", re.I)
_DTYPE = re.compile(r"dtype|precision|^amp$|mixed", re.I)
_COMPILE = re.compile(r"^(?:use_)?compile$|^torch_compile$", re.I)
TORCH_STYLE = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
SHORT_STYLE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class Knob:
    """Where one setting lives in the script: `kind` flag | env | global; `name` as the user writes it
    (`--device-batch-size`, `MINICHAT_DTYPE`, `batch_size`); its value in this run."""

    setting: str
    kind: str
    name: str
    value: object = None

    def assign(self, value) -> str:
        if self.kind == "flag":
            return f"{self.name}={value}"
        if self.kind == "env":
            return f"{self.name}={value}"
        return f"--{self.name}={value}"  # nanoGPT's configurator: `python train.py --batch_size=16`


@dataclass(frozen=True)
class Knobs:
    """The script's settings gpuprof can name. `total`: a total batch the script derives its
    accumulation from (tokens or sequences per optimizer step), when found."""

    by_setting: dict
    total: Knob | None = None
    total_unit: str | None = None  # "tokens" | "sequences"
    accum: int | None = None  # the run's micro-steps per optimizer step

    def get(self, setting: str) -> Knob | None:
        return self.by_setting.get(setting)

    def __bool__(self) -> bool:
        return bool(self.by_setting) or self.total is not None


def _options(config: dict) -> list[dict]:
    inputs = config.get("script_inputs") or {}
    return [o for o in inputs.get("argparse") or [] if isinstance(o, dict) and o.get("dest")]


def _flag(option: dict) -> str | None:
    flags = [f for f in option.get("flags") or [] if isinstance(f, str) and f.startswith("--")]
    return max(flags, key=len) if flags else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def find_knobs(config: dict, world_size: int = 1) -> Knobs:
    """The script's own knobs for the run's settings (see the module docstring)."""
    found: dict[str, Knob] = {}
    batch, block, accum = config.get("batch_size"), config.get("block_size"), config.get("grad_accum")
    tokens = config.get("tokens_per_step")
    total, unit = None, None
    for o in _options(config):
        dest, value, flag = o["dest"], o.get("value"), _flag(o)
        if flag is None:
            continue
        if _BATCH.match(dest) and _int(value) is not None and value == batch:
            found.setdefault("batch_size", Knob("batch_size", "flag", flag, value))
        elif _ACCUM.match(dest) and _int(value) is not None and value == accum:
            found.setdefault("gradient_accumulation_steps", Knob("gradient_accumulation_steps", "flag", flag, value))
        elif _BLOCK.match(dest) and _int(value) is not None and value == block:
            found.setdefault("block_size", Knob("block_size", "flag", flag, value))
        elif _TOTAL.match(dest) and _int(value) is not None and value > 0:
            per_seq = (block or 0)
            if tokens and value == tokens * world_size:
                total, unit = Knob("total_batch", "flag", flag, value), "tokens"
            elif batch and accum and value == batch * accum * world_size:
                total, unit = Knob("total_batch", "flag", flag, value), "sequences"
            elif per_seq and batch and accum and value == batch * accum * per_seq * world_size:
                total, unit = Knob("total_batch", "flag", flag, value), "tokens"
        elif _DTYPE.search(dest) and (value is None or isinstance(value, str)):
            found.setdefault("dtype", Knob("dtype", "flag", flag, value))
        elif _COMPILE.match(dest) and isinstance(value, bool):
            found.setdefault("compile", Knob("compile", "flag", flag, value))
    env = (config.get("script_inputs") or {}).get("env") or {}
    if "dtype" not in found:
        for name, value in env.items():
            if re.search(r"DTYPE|PRECISION", name) and (value is None or isinstance(value, str)):
                found["dtype"] = Knob("dtype", "env", name, value)
                break
    own = config.get("script_globals") or {}
    for key in ("batch_size", "gradient_accumulation_steps", "block_size", "dtype", "compile"):
        if key in own and key not in found:
            found[key] = Knob(key, "global", key, own[key])
    return Knobs(found, total, unit, _int(accum))


def dtype_value(knob: Knob, dtype: str) -> str:
    """`dtype` ('bfloat16') in the vocabulary the script's setting uses ('bf16' if it holds 'fp32')."""
    current = str(knob.value or "").lower()
    if current in SHORT_STYLE.values() or current in ("bf16-mixed", "16-mixed", "32"):
        return SHORT_STYLE.get(dtype, dtype)
    return TORCH_STYLE.get(dtype, dtype)


def in_script_terms(overrides: dict, knobs: Knobs) -> tuple[str, dict] | None:
    """The change as the script takes it (e.g. "--device-batch-size=16; gradient accumulation
    follows from --total-batch-size=1024: 4 -> 1 micro-steps"), and the assignments
    ({"--device-batch-size": 16}); None when a setting the change needs has no knob in the script."""
    parts, assigns = [], {}
    changes = dict(overrides)
    new_accum = changes.pop("gradient_accumulation_steps", None)
    for key, value in changes.items():
        knob = knobs.get(key)
        if knob is None:
            return None
        if key == "dtype":
            value = dtype_value(knob, str(value))
        if key == "compile" and knob.kind == "flag" and isinstance(knob.value, bool):
            parts.append(knob.name if value else f"drop {knob.name}")
            assigns[knob.name] = bool(value)
            continue
        parts.append(knob.assign(value))
        assigns[knob.name] = value
    if new_accum is not None:
        knob = knobs.get("gradient_accumulation_steps")
        if knob is not None:
            parts.append(knob.assign(new_accum))
            assigns[knob.name] = new_accum
        elif knobs.total is not None and "batch_size" in overrides:
            t, old = knobs.total, knobs.accum
            parts.append(f"gradient accumulation follows from {t.name}={t.value} ({knobs.total_unit} per step): "
                         f"{'' if old is None else f'{old} -> '}{new_accum} micro-step{'s' if new_accum != 1 else ''}")
        else:
            return None
    text = "; ".join(p for p in parts if p)
    env = [k for k in knobs.by_setting.values() if k.kind == "env" and k.name in assigns]
    if env:
        text += " (environment: the script reads it at start)"
    return text, assigns


_PLAIN = {"batch_size": lambda v: f"a micro-batch of {v} sequences",
          "gradient_accumulation_steps": lambda v: f"{v} micro-step{'s' if v != 1 else ''} per optimizer step",
          "block_size": lambda v: f"a sequence length of {v}",
          "dtype": lambda v: f"computing in {v}",
          "compile": lambda v: "the model compiled (torch.compile)" if v else "the model not compiled"}


def worded(finding, config: dict, world_size: int = 1, knobs: Knobs | None = None):
    """The finding with its change in the script's own terms (a profiled script only): its flags,
    environment variables or configurator keys where they were found; where a setting has none, the
    change in plain words, never in names the script does not have. Returns the finding unchanged
    when it has no config change or the script is nanoGPT-shaped (its own keys are the fix's)."""
    from dataclasses import replace

    overrides = finding.config_overrides or getattr(finding, "settings", None) or {}
    if not overrides or not finding.fix:
        return finding
    knobs = knobs if knobs is not None else find_knobs(config, world_size)
    own = config.get("script_globals") or {}
    if all(k in own for k in overrides):
        return finding  # nanoGPT's configurator takes the keys as they are
    terms = in_script_terms(overrides, knobs)
    if terms is not None:
        text, assigns = terms
        return replace(finding, fix=text, evidence={**finding.evidence, "script_change": assigns},
                       note=_join(finding.note, f"in nanoGPT's names: {finding.fix}"))
    plain = ", ".join(_PLAIN[k](v) for k, v in overrides.items() if k in _PLAIN)
    return replace(finding, fix=f"{plain} (the script sets these in its own code: gpuprof found no flag or "
                                f"environment variable for them)",
                   note=_join(finding.note, f"in nanoGPT's names: {finding.fix}"))


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else a or b
