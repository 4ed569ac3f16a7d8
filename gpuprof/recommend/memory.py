"""The memory model: peak bytes of one nanoGPT training configuration, term by term.

The peak of a nanoGPT step is not at the end of the forward: it is at the start of the backward,
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

and then what the caching allocator and CUDA add on top: allocator overhead (10% of the
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

from gpuprof.runners.gpt import GPTConfig, param_count

GIB = 1024**3
CUDA_CONTEXT_BYTES = 1 * GIB
ALLOCATOR_OVERHEAD = 0.10
DEFAULT_MARGIN = 0.05
ADAMW_STATE_BYTES = 8
BATCH_BYTES_PER_TOKEN = 32  # idx + targets, int64, the current pair and the prefetched next pair

_ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def compute_bytes(dtype: str) -> int:
    """Bytes per activation element: 2 under bf16/fp16 autocast, 4 in fp32."""
    try:
        return _ACT_BYTES[dtype]
    except KeyError:
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

    @property
    def headroom_bytes(self) -> int | None:
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.margin_bytes - self.total_bytes

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

    weights = MemoryTerm("weights", 4 * P, f"{P:,} params × 4 B (fp32)")
    grads_full = 4 * P
    optimizer = MemoryTerm("optimizer", ADAMW_STATE_BYTES * P, f"AdamW 2 states × {P:,} × 4 B")
    ddp = 4 * P if world_size > 1 else 0
    # Under checkpointing the blocks' weight casts are recomputed, not saved; lm_head's stays.
    copies = 0
    if s == 2:
        copies = 2 * (V * d if checkpointing else matmul_params(cfg))

    layer = layer_bytes_per_token(cfg, dtype, flash, compile)
    final = 4 * d + 8 + s * d  # ln_f input, stats, ln_f output (lm_head's saved input)
    loss = loss_bytes_per_token(cfg, dtype, compile)
    batch = BATCH_BYTES_PER_TOKEN * tokens
    attn_note = "flash" if flash else "math attention (B·H·T·T probs)"
    fixed = weights.bytes + optimizer.bytes + ddp

    # Moment 1: the loss backward. Gradients exist from the previous micro-step (accum > 1);
    # with accum == 1 they were freed by zero_grad(set_to_none=True) and none exist yet.
    grads_m1 = grads_full if grad_accum > 1 else 0
    if checkpointing:
        saved_layers = L * 4 * d * tokens  # each block keeps only its fp32 input
        layers_note = f"checkpointing: {L} × 4d B/token block inputs"
    else:
        saved_layers = L * layer * tokens
        layers_note = f"{L} layers × {layer:,} B/token ({dtype}, {attn_note}{', compiled' if compile else ''})"
    acts = saved_layers + final * tokens
    loss_total = (loss["logits"] + loss["loss_saved"] + loss["loss_grad"]) * tokens
    m1 = fixed + grads_m1 + copies + acts + loss_total + batch

    # Moment 2 (checkpointing): recomputing the last block in the backward. The loss buffers
    # are gone except the held logits; one block's activations plus their gradients exist.
    m2 = copies_m2 = 0
    if checkpointing:
        grad_tmp = (4 * d + s * 4 * d) * tokens  # residual grad (fp32) + MLP hidden grad
        copies_m2 = copies + (2 * 12 * d * d if s == 2 else 0)  # the recomputed block's casts
        m2 = (fixed + grads_full + copies_m2 + saved_layers + (layer + final) * tokens
              + loss["logits"] * tokens + grad_tmp + batch)

    # Moment 3: the optimizer step: all gradients, the held logits, optimizer temporaries.
    largest = V * d
    opt_tmp = 0 if fused_adamw else 3 * 4 * largest  # for-loop AdamW: a few param-sized temps
    m3 = fixed + grads_full + loss["logits"] * tokens + batch + opt_tmp

    peak, moment = max((m1, "loss backward"), (m2, "recompute (checkpointing)"),
                       (m3, "optimizer step"))
    terms = [weights]
    if moment == "loss backward":
        g = grads_m1
    else:
        g = grads_full
    terms.append(MemoryTerm("gradients", g, "fp32, accumulated across micro-steps" if g
                            else "none yet (accum=1, set_to_none)"))
    terms.append(optimizer)
    if ddp:
        terms.append(MemoryTerm("ddp_buckets", ddp, "DDP gradient buckets (4 B/param)"))
    if moment == "optimizer step":
        terms.append(MemoryTerm("logits", loss["logits"] * tokens, f"B·T·V × {s} B held by caller"))
        terms.append(MemoryTerm("batch", batch, "idx/targets int64, current + prefetched"))
        if opt_tmp:
            terms.append(MemoryTerm("temporaries", opt_tmp, "for-loop AdamW temporaries"))
    else:
        c = copies if moment == "loss backward" else copies_m2
        if c:
            terms.append(MemoryTerm("autocast_copies", c, f"{dtype} copies of matmul weights"))
        if moment == "loss backward":
            terms.append(MemoryTerm("activations", acts, layers_note + " + final LayerNorm"))
            terms.append(MemoryTerm("logits", loss["logits"] * tokens,
                                    f"B·T·V × {s} B, held by `logits, loss = model(X, Y)`"))
            if loss["loss_saved"]:
                terms.append(MemoryTerm("loss_fp32", loss["loss_saved"] * tokens,
                                        "cross_entropy's fp32 log-probs (upcast), saved"))
            terms.append(MemoryTerm("loss_backward", loss["loss_grad"] * tokens,
                                    "gradient buffers of the compiled loss backward" if compile
                                    else "fp32 gradient buffers of the loss backward"))
        else:
            terms.append(MemoryTerm("activations", saved_layers + (layer + final) * tokens,
                                    layers_note + " + one recomputed block"))
            terms.append(MemoryTerm("logits", loss["logits"] * tokens, "held by the caller"))
            terms.append(MemoryTerm("temporaries", grad_tmp, "activation gradients of one block"))
        terms.append(MemoryTerm("batch", batch, "idx/targets int64, current + prefetched"))
    assert sum(t.bytes for t in terms) == peak, (terms, peak)

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
