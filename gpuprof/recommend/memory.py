"""The memory model: peak bytes of one nanoGPT training configuration, term by term.

The peak of a nanoGPT step is usually not at the end of the forward but at the start of the backward,
inside the loss's gradient, when every saved activation is still alive and the loss's
B·T·vocab buffers are at their largest. The model adds, at that moment:

  weights            4 B/param (fp32 master weights; autocast computes in bf16/fp16)
  gradients          4 B/param (fp32; present from the second micro-step of accumulation)
  optimizer          8 B/param (AdamW exp_avg + exp_avg_sq, fp32)
  ddp buckets        4 B/param when world_size > 1 (DDP's gradient bucket copies)
  autocast copies    2 B per matmul weight (bf16/fp16 casts saved for the backward)
  activations        per layer per token, what autograd saves (see `layer_bytes_per_token`)
  logits and loss    B·T·vocab: logits the caller still holds (`logits, loss = model(X, Y)`),
                     the fp32 log-probabilities cross_entropy saves, and two fp32 gradient
                     buffers while the loss backward runs (eager: s·V + 4V + 8V per token)
  batch              idx/targets (int64), current and prefetched: 32 B/token

Other moments are evaluated too and the largest wins: the end of the eager forward (the previous
micro-step's logits still held, autocast's cache holding every weight cast — it wins under
checkpointing with few tokens), the recompute of the last block under checkpointing, and the
optimizer step. Then what the caching allocator and CUDA add on top: allocator overhead (10% of the
allocated peak: block rounding and fragmentation, reserved > allocated) and the CUDA context
(1 GiB: context, kernel images, cuBLAS workspaces). `fits` compares the total against the
capacity minus a stated margin (5%).

Every tensor-level term was checked against a tracker counting live tensor storages during real
training steps on CPU, and against FakeTensorMode runs for GPT-2 shapes (benchmarks/
memory_model.py, figures in docs/recommend.md). CUDA-only behaviour (allocator, context, which
fused attention kernel runs) is modeled, not measured, unless measured on a GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpuprof.dims import GPTConfig, param_count
from gpuprof.hardware import ELEMENT_BYTES, normalize_dtype
from gpuprof.units import GiB

CUDA_CONTEXT_BYTES = 1 * GiB
ALLOCATOR_OVERHEAD = 0.10
DEFAULT_MARGIN = 0.05
ADAMW_STATE_BYTES = 8
BATCH_BYTES_PER_TOKEN = 32  # idx + targets, int64, the current pair and the prefetched next pair


def compute_bytes(dtype: str) -> int:
    """Bytes per activation element: 2 under bf16/fp16 autocast, 4 in fp32."""
    try:
        return ELEMENT_BYTES[normalize_dtype(dtype)]
    except (KeyError, ValueError):
        raise ValueError(f"unknown dtype {dtype!r}") from None


def layer_bytes_per_token(cfg: GPTConfig, dtype: str, flash: bool = True,
                          compile: bool = False) -> int:
    """Bytes autograd keeps per token for one transformer block until its backward.

    Eager with a fused (flash / memory-efficient) attention kernel, s = compute bytes:
      residual inputs of ln_1 and ln_2 (fp32)      2 × 4d
      LayerNorm mean/rstd (fp32)                   2 × 8
      ln_1 out, ln_2 out (matmul inputs)           s·(d + d)
      MLP: c_fc out (GELU input), GELU out         s·(4d + 4d)
      qkv (q, k, v are views of it), attn out      s·(3d + d)
      attention logsumexp (fp32)                   4·H
    The fused kernels write their output in (B, T, H, Q) layout, so `y.transpose(1, 2)
    .contiguous()` is a view and c_proj's input costs nothing extra.
    Without a fused kernel (math path) q, k, v are saved as fp32 copies (the math path upcasts
    half precision unless torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)), the
    fp32 B·H·T·T softmax probabilities are kept, and y is a real copy: 12d + 4·H·T + s·d instead
    of s·4d + 4·H.
    torch.compile (inductor) was measured to save the same set for the fused-attention block.
    """
    d, H, T = cfg.n_embd, cfg.n_head, cfg.block_size
    s = compute_bytes(dtype)
    base = 2 * 4 * d + 2 * 8 + s * (d + d + 4 * d + 4 * d)
    if flash:
        attn = s * (3 * d + d) + 4 * H
    else:
        attn = 12 * d + 4 * H * T + s * d
    return base + attn


def loss_bytes_per_token(cfg: GPTConfig, dtype: str, compile: bool = False) -> dict[str, int]:
    """The B·T·vocab terms at the loss backward, per token.

    Eager: logits (s·V, still held by the caller), cross_entropy's saved fp32 log-probs (4V),
    and during its backward the fp32 gradient of the log-probs and of the logits (8V).
    Compiled (inductor fuses log_softmax + nll and saves the logits themselves): the backward
    gets a zero-filled gradient for the returned logits (AOTAutograd materializes it) and
    writes the logits' gradient, both in the compute dtype: s·V + 2·s·V. Read from inductor's
    generated code and checked against peak RSS on CPU."""
    V = cfg.vocab_size
    s = compute_bytes(dtype)
    if compile:
        return {"logits": s * V, "loss_saved": 0, "loss_grad": 2 * s * V}
    return {"logits": s * V, "loss_saved": 4 * V, "loss_grad": 8 * V}


def matmul_params(cfg: GPTConfig) -> int:
    """Parameters of the Linear weights (attention, MLP, tied lm_head): what autocast copies."""
    d = cfg.n_embd
    return cfg.n_layer * 12 * d * d + cfg.vocab_size * d


@dataclass(frozen=True)
class MemoryTerm:
    name: str
    bytes: int
    detail: str


@dataclass(frozen=True)
class MemoryEstimate:
    """The modeled peak of one configuration; `terms` add up to `total_bytes`."""

    batch_size: int
    block_size: int
    terms: tuple[MemoryTerm, ...]
    peak_allocated_bytes: int  # tensor bytes: what torch.cuda.max_memory_allocated would report
    total_bytes: int  # + allocator overhead + CUDA context
    moment: str  # where in the step the peak falls
    capacity_bytes: int | None = None
    margin_bytes: int = 0

    @property
    def fits(self) -> bool | None:
        if self.capacity_bytes is None:
            return None
        return self.total_bytes <= self.capacity_bytes - self.margin_bytes

    def term(self, name: str) -> int:
        return sum(t.bytes for t in self.terms if t.name == name)

    def to_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "block_size": self.block_size,
            "terms": [asdict(t) for t in self.terms],
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "total_bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
            "margin_bytes": self.margin_bytes,
            "fits": self.fits,
            "moment": self.moment,
        }


def estimate_memory(cfg: GPTConfig, batch_size: int, *, dtype: str = "bf16", flash: bool = True,
                    checkpointing: bool = False, compile: bool = False, grad_accum: int = 2,
                    world_size: int = 1, device: str = "cuda", fused_adamw: bool | None = None,
                    capacity_bytes: int | None = None, margin: float = DEFAULT_MARGIN
                    ) -> MemoryEstimate:
    """Model the peak memory of training `cfg` with micro-batch `batch_size`.

    device="cpu" leaves out the CUDA-only terms (allocator overhead, context), which is what a
    tensor tracker on CPU measures. fused_adamw defaults to True on CUDA (nanoGPT's choice) and
    False on CPU (the for-loop AdamW, whose per-parameter temporaries are counted)."""
    cuda = not device.startswith("cpu")
    if fused_adamw is None:
        fused_adamw = cuda
    d, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    s = compute_bytes(dtype)
    tokens = batch_size * cfg.block_size
    P = param_count(cfg, non_embedding=False)
    Term = MemoryTerm

    state = [Term("weights", 4 * P, f"{P:,} params × 4 B (fp32)")]
    grads = Term("gradients", 4 * P, "fp32, accumulated across micro-steps")
    # With accum == 1 zero_grad(set_to_none=True) freed them and the loss has none yet.
    grads_acc = grads if grad_accum > 1 else Term("gradients", 0, "none yet (accum=1, set_to_none)")
    optimizer = [Term("optimizer", ADAMW_STATE_BYTES * P, f"AdamW 2 states × {P:,} × 4 B")]
    if world_size > 1:
        optimizer.append(Term("ddp_buckets", 4 * P, "DDP gradient buckets (4 B/param)"))
    all_copies = 2 * matmul_params(cfg) if s == 2 else 0
    # Saved for the backward: every matmul weight's cast, or under checkpointing only lm_head's.
    saved_copies = (2 * V * d if checkpointing else all_copies) if s == 2 else 0

    layer = layer_bytes_per_token(cfg, dtype, flash, compile)
    final = (4 * d + 8 + s * d) * tokens  # ln_f input, stats, ln_f output (lm_head's input)
    loss = loss_bytes_per_token(cfg, dtype, compile)
    attn_note = "flash" if flash else "math attention (B·H·T·T probs)"
    if checkpointing:
        saved_layers = L * 4 * d * tokens  # each block keeps only its fp32 input
        layers_note = f"checkpointing: {L} × {4 * d:,} B/token block inputs + final LayerNorm"
    else:
        saved_layers = L * layer * tokens
        layers_note = (f"{L} layers × {layer:,} B/token ({dtype}, {attn_note}"
                       f"{', compiled' if compile else ''}) + final LayerNorm")
    acts = Term("activations", saved_layers + final, layers_note)
    logits = Term("logits", loss["logits"] * tokens,
                  f"B·T·V × {s} B, held by `logits, loss = model(X, Y)`")
    batch = Term("batch", BATCH_BYTES_PER_TOKEN * tokens, "idx/targets int64, current + prefetched")

    def copies(n, what):
        return [Term("autocast_copies", n, f"{dtype} casts of {what}")] if n else []

    moments = {}
    # The loss backward: all saved activations and the largest B·T·V buffers at once.
    lb = [*state, grads_acc, *optimizer, *copies(saved_copies, "matmul weights, saved"), acts,
          logits]
    if loss["loss_saved"]:
        lb.append(Term("loss_fp32", loss["loss_saved"] * tokens,
                       "cross_entropy's fp32 log-probs (upcast), saved"))
    lb.append(Term("loss_backward", loss["loss_grad"] * tokens,
                   "gradient buffers of the compiled loss backward" if compile
                   else "fp32 gradient buffers of the loss backward"))
    moments["loss backward"] = lb + [batch]

    # The end of the forward, inside eager cross_entropy: the previous micro-step's logits are
    # still held, and autocast's cache holds every weight cast until the forward's `with`
    # ends — which wins under checkpointing, where the casts are not saved for the backward.
    if not compile:
        upcast = 4 * V if s == 2 else 0
        moments["loss forward"] = [
            *state, grads_acc, *optimizer, *copies(all_copies, "all matmul weights, cached"),
            acts, Term("logits", 2 * loss["logits"] * tokens,
                       f"B·T·V × {s} B, this and the previous micro-step's (still held)"),
            Term("loss_fp32", (upcast + 4 * V) * tokens,
                 "cross_entropy's fp32 upcast and log-probs" if upcast
                 else "cross_entropy's log-probs"),
            Term("batch", 16 * tokens, "idx/targets int64"),
        ]

    # Recomputing the last block under checkpointing: the loss buffers are gone but the held
    # logits; one block's activations, weight casts and activation gradients exist.
    if checkpointing:
        moments["recompute (checkpointing)"] = [
            *state, grads, *optimizer,
            *copies(saved_copies + (2 * 12 * d * d if s == 2 else 0),
                    "lm_head and the recomputed block"),
            Term("activations", saved_layers + final + layer * tokens,
                 layers_note + " + one recomputed block"),
            logits, Term("temporaries", (4 * d + s * 4 * d) * tokens,
                         "activation gradients of one block"),
            batch,
        ]

    # The optimizer step: all gradients, the held logits, the optimizer's temporaries.
    opt = [*state, grads, *optimizer, logits, batch]
    if not fused_adamw:
        opt.append(Term("temporaries", 3 * 4 * V * d, "for-loop AdamW temporaries"))
    moments["optimizer step"] = opt

    moment, chosen = max(moments.items(), key=lambda kv: sum(t.bytes for t in kv[1]))
    terms = [t for t in chosen if t.bytes or t.name == "gradients"]
    peak = sum(t.bytes for t in terms)

    total = peak
    if cuda:
        overhead = int(ALLOCATOR_OVERHEAD * peak)
        terms.append(MemoryTerm("allocator", overhead,
                                f"{ALLOCATOR_OVERHEAD:.0%} caching-allocator overhead (assumed)"))
        terms.append(MemoryTerm("cuda_context", CUDA_CONTEXT_BYTES,
                                "CUDA context, kernels, cuBLAS workspaces (assumed 1 GiB)"))
        total = peak + overhead + CUDA_CONTEXT_BYTES
    margin_bytes = int(margin * capacity_bytes) if capacity_bytes else 0
    return MemoryEstimate(batch_size, cfg.block_size, tuple(terms), peak, total, moment,
                          capacity_bytes, margin_bytes)


def max_batch_that_fits(cfg: GPTConfig, capacity_bytes: int, limit: int = 1 << 16,
                        **kwargs) -> int:
    """Largest micro-batch whose estimate fits (0 if not even batch 1). Memory grows with B."""
    lo, hi = 0, 1
    while hi <= limit and estimate_memory(cfg, hi, capacity_bytes=capacity_bytes, **kwargs).fits:
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate_memory(cfg, mid, capacity_bytes=capacity_bytes, **kwargs).fits:
            lo = mid
        else:
            hi = mid
    return lo
