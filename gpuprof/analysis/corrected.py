"""The corrected config: every config-change fix merged into one nanoGPT-format override set.

Only nanoGPT configurator keys are merged (what `python train.py config.py corrected.py`
accepts). When two fixes set the same key, the higher-ranked one wins and the other is
listed as overridden."""

from __future__ import annotations

from dataclasses import dataclass, field

NANOGPT_KEYS = {"batch_size", "block_size", "gradient_accumulation_steps", "dtype", "compile",
                "n_layer", "n_head", "n_embd", "eval_interval", "eval_iters", "log_interval"}


@dataclass
class CorrectedConfig:
    overrides: dict = field(default_factory=dict)  # key -> value, in ranking order
    sources: dict = field(default_factory=dict)  # key -> finding id that set it
    overridden: list = field(default_factory=list)  # (finding id, key, value) that lost a conflict
    current: dict = field(default_factory=dict)  # key -> the run's value, when known

    def header(self) -> str:
        lines = ["gpuprof corrected config: apply on top of your own, e.g.",
                 "  python train.py config/your_config.py corrected.py", ""]
        for key, value in self.overrides.items():
            was = f" (was {self.current[key]!r})" if key in self.current else ""
            lines.append(f"{key} = {value!r}{was}: from finding {self.sources[key]}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"overrides": self.overrides, "sources": self.sources,
                "overridden": [list(x) for x in self.overridden], "current": self.current}


# The run's config uses gpuprof's names; map them to nanoGPT's for the "was" column.
_CURRENT_KEYS = {"batch_size": "batch_size", "block_size": "block_size",
                 "gradient_accumulation_steps": "grad_accum", "dtype": "dtype", "compile": "compile"}


def merge(findings, run_config: dict | None = None) -> CorrectedConfig:
    """Merge the config_overrides of ranked Findings."""
    out = CorrectedConfig()
    run_config = run_config or {}
    # A profiled script takes only the settings it defines itself (nanoGPT's configurator asserts
    # so); an argparse script has none: its fixes stay in the findings' `fix` text.
    own = run_config.get("script_globals")
    for f in findings:
        if f.kind != "fix":
            continue
        for key, value in (f.config_overrides or {}).items():
            if key not in NANOGPT_KEYS or (own is not None and key not in own):
                continue
            if key in out.overrides:
                if out.overrides[key] != value:
                    out.overridden.append((f.id, key, value))
                continue
            out.overrides[key] = value
            out.sources[key] = f.id
            ours = _CURRENT_KEYS.get(key)
            if ours and run_config.get(ours) is not None:
                out.current[key] = run_config[ours]
    return out
