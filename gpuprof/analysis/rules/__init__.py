"""The registry of rules. Each module holds one family; each rule is `rule(ctx) -> [Finding]`."""

from gpuprof.analysis.rules.phases import dominant_phase

RULES = [dominant_phase]
