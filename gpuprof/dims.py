"""Model dimensions: the vocabulary every layer shares (runners build models from it, analysis
and recommend compute with it, renderers print it). Pure: no torch.

GPTConfig and the presets; the parameter count and the nanoGPT/PaLM analytic FLOP formula
(6·N + 12·L·H·Q·T training FLOPs per token, N without position embeddings: one definition,
`gpt_flops_per_token`, for a plain dict of dims as profiles store them; `flops_per_token` reads a
GPTConfig through it); the bytes AdamW moves per parameter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpuprof.errors import GpuprofError


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64, as nanoGPT does
    block_size: int = 1024
    dropout: float = 0.0
    bias: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


# The one table of model presets. The gpt2 rows are GPT-2's published shapes (Radford et al.
# 2019, the n_layer/n_head/n_embd of nanoGPT's from_pretrained) with GPTConfig's vocab_size,
# 50304: GPT-2's 50257 padded to a multiple of 64, as nanoGPT trains from scratch. Only
# from_pretrained keeps the unpadded vocabulary (PRETRAINED_VOCAB). `tiny` is ours: small enough
# that the default diagnose finishes in seconds on a CPU.
PRESETS: dict[str, dict] = {
    "tiny": dict(n_layer=2, n_head=4, n_embd=128, vocab_size=4096),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}
GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
PRETRAINED_VOCAB = 50257  # GPT-2's tokenizer, unpadded: what nanoGPT's from_pretrained loads


def preset_dims(name: str) -> dict:
    """A preset's full dims as a dict (n_layer, n_head, n_embd, vocab_size): the preset's row
    with GPTConfig's defaults for what it leaves out. Unknown name: GpuprofError."""
    cfg = preset_config(name)
    return {k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd", "vocab_size")}


def preset_config(name: str, block_size: int = 1024, **overrides) -> GPTConfig:
    """GPTConfig for a preset name, with explicit dims (non-None overrides) applied on top."""
    if name not in PRESETS:
        raise GpuprofError(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}")
    fields = dict(PRESETS[name])
    fields.update({k: v for k, v in overrides.items() if v is not None})
    fields["block_size"] = block_size
    cfg = GPTConfig(**fields)
    validate_config(cfg)
    return cfg


def validate_config(cfg: GPTConfig) -> None:
    for key in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
        if getattr(cfg, key) <= 0:
            raise GpuprofError(f"{key} must be positive, got {getattr(cfg, key)}")
    if cfg.n_embd % cfg.n_head:
        raise GpuprofError(f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")


def param_count(cfg: GPTConfig, non_embedding: bool = True) -> int:
    """Parameter count from dimensions (matches GPT.num_params; the head is tied to wte).

    non_embedding=True leaves out the position embeddings, as nanoGPT's estimate_mfu does."""
    d, L, V, T = cfg.n_embd, cfg.n_layer, cfg.vocab_size, cfg.block_size
    b = 1 if cfg.bias else 0
    per_layer = (
        2 * (d + b * d)  # ln_1, ln_2
        + d * 3 * d + b * 3 * d  # c_attn
        + d * d + b * d  # attn c_proj
        + d * 4 * d + b * 4 * d  # mlp c_fc
        + 4 * d * d + b * d  # mlp c_proj
    )
    n = V * d + L * per_layer + (d + b * d)  # wte + blocks + ln_f
    if not non_embedding:
        n += T * d
    return n


# The GPT-2 family's full dims (a view of PRESETS, vocab 50304 as trained from scratch): used to
# name the model size a FLOP count implies.
GPT2_SIZES: dict[str, dict] = {name: preset_dims(name) for name in GPT2_NAMES}

# Backward costs two forwards (grad wrt inputs + grad wrt weights): training = 3 × forward.
TRAIN_OVER_FORWARD = 3


def gpt_param_count(n_layer: int, n_embd: int, vocab_size: int, bias: bool = True, **_) -> int:
    """param_count for dims given as a dict: nanoGPT GPT parameters without position embeddings."""
    return param_count(GPTConfig(n_layer=n_layer, n_head=1, n_embd=n_embd, vocab_size=vocab_size, bias=bias))


# What the formula needs: the attention term's dims, and the parameter count or what gives it.
FORMULA_DIMS = ("n_layer", "n_embd", "block_size")
PARAM_DIMS = ("n_layer", "n_embd", "vocab_size")


def missing_gpt_dims(dims: dict | None, n_params: int | None = None) -> list[str]:
    """The dims gpt_flops_per_token needs that `dims` lacks (a model that is not GPT-shaped — a
    bigram model is an embedding and a head, with no layers — has no n_layer): [] when complete."""
    dims = dims or {}
    need = FORMULA_DIMS + (() if n_params is not None else PARAM_DIMS)
    return [k for k in dict.fromkeys(need) if not isinstance(dims.get(k), (int, float)) or dims[k] <= 0]


# The 6 in 6N: 2 FLOPs per parameter per token forward (a multiply and an add) × TRAIN_OVER_FORWARD.
TRAIN_FLOPS_PER_PARAM = 2 * TRAIN_OVER_FORWARD


def gpt_flops_per_token(dims: dict, n_params: int | None = None) -> float:
    """6N + 12·L·H·Q·T for a dict with n_layer, n_head, n_embd, block_size (+ vocab_size, bias
    when n_params is not given). Q·H = n_embd. ValueError naming what is missing when the dims
    are not a GPT's (missing_gpt_dims): callers that read dims from a run check first."""
    missing = missing_gpt_dims(dims, n_params)
    if missing:
        raise ValueError(f"not a GPT's dims: no {', '.join(missing)}")
    n = n_params if n_params is not None else gpt_param_count(**dims)
    attention = attention_flops_per_token(dims["n_layer"], dims["n_embd"], dims["block_size"])
    return TRAIN_FLOPS_PER_PARAM * n + attention


def implied_params(flops_per_token: float, n_layer: int, n_embd: int, block_size: int) -> float:
    """gpt_flops_per_token inverted: the parameter count N that gives `flops_per_token` for a GPT
    with these attention dims, (F/token − 12·L·H·Q·T) / 6."""
    return (flops_per_token - attention_flops_per_token(n_layer, n_embd, block_size)) / TRAIN_FLOPS_PER_PARAM


def flops_per_token(cfg: GPTConfig) -> int:
    """gpt_flops_per_token for a GPTConfig: 6N + 12·L·H·Q·T, N without wpe (param_count)."""
    return gpt_flops_per_token(cfg.to_dict())


def attention_flops_per_token(n_layer: int, n_embd: int, block_size: int) -> float:
    """The 12·L·H·Q·T part of the formula (attention scores and weighted sum, fwd + bwd)."""
    return 12 * n_layer * n_embd * block_size


# Bytes an fp32 AdamW step moves through HBM per parameter: reads param, grad, exp_avg,
# exp_avg_sq (16 B), writes param, exp_avg, exp_avg_sq (12 B). The step alone: a floor for the
# optimizer phase whether or not the loop clips.
ADAMW_BYTES_PER_PARAM = 28
# clip_grad_norm_ before it: reads every grad for the norm (4 B), then reads and scales it (8 B).
CLIP_GRAD_BYTES_PER_PARAM = 12
# The step as nanoGPT runs it (grad_clip=1.0, then AdamW): what recommend expects it to cost.
ADAMW_CLIPPED_BYTES_PER_PARAM = ADAMW_BYTES_PER_PARAM + CLIP_GRAD_BYTES_PER_PARAM  # 40
