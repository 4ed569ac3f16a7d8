"""The registry of rules. Each module holds one family; each rule is `rule(ctx) -> [Finding]`.

Finding ids are part of the JSON contract (documented in docs/rules.md)."""

from gpuprof.analysis.rules.batching import memory_headroom, micro_batch_too_small
from gpuprof.analysis.rules.irregular import irregular_steps
from gpuprof.analysis.rules.gpu import (
    compile_findings,
    h2d_pageable,
    launch_bound,
    no_tensor_cores,
    optimizer_slow,
    sync_in_step,
)
from gpuprof.analysis.rules.host_memory import page_faults
from gpuprof.analysis.rules.machine import cpu_saturated, gpu_throttled, mfu_misreported
from gpuprof.analysis.rules.compile_breaks import graph_breaks, recompiles
from gpuprof.analysis.rules.compute import (
    activation_checkpointing,
    attention_backend,
    attention_by_hand,
    attention_need_weights,
    optimizer_not_fused,
    vocab_not_padded,
)
from gpuprof.analysis.rules.precision import backward_forward_ratio, precision_slow
from gpuprof.analysis.rules.storage import storage_too_slow
from gpuprof.analysis.rules.phases import (
    compute_bound,
    data_loading_exposed,
    dominant_phase,
    eval_in_measured_steps,
)

RULES = [
    irregular_steps,
    data_loading_exposed,
    storage_too_slow,
    eval_in_measured_steps,
    micro_batch_too_small,
    memory_headroom,
    h2d_pageable,
    optimizer_slow,
    precision_slow,
    attention_by_hand,
    attention_need_weights,
    vocab_not_padded,
    optimizer_not_fused,
    no_tensor_cores,
    compile_findings,
    graph_breaks,
    recompiles,
    launch_bound,
    sync_in_step,
    page_faults,
    gpu_throttled,
    cpu_saturated,
    mfu_misreported,
    compute_bound,
    dominant_phase,
    backward_forward_ratio,
    attention_backend,
    activation_checkpointing,
]

# Data-parallel runs (a merged profile's ranks, gpuprof.analysis.distributed).
from gpuprof.analysis.rules.distributed import RULES as _DISTRIBUTED  # noqa: E402

RULES += _DISTRIBUTED
# Sharded runs (FSDP2): their collectives, from the ranks together.
from gpuprof.analysis.rules.sharded import RULES as _SHARDED  # noqa: E402

RULES += _SHARDED
