"""A GPT with nanoGPT's architecture (our own code): token + position embeddings, pre-LayerNorm
blocks, causal self-attention through scaled_dot_product_attention, GELU MLP, weight-tied head."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

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


# Model presets. Dimensions are GPT-2's published ones (as in nanoGPT's from_pretrained);
# `tiny` is ours: small enough that the default diagnose finishes in seconds on a CPU.
PRESETS: dict[str, dict] = {
    "tiny": dict(n_layer=2, n_head=4, n_embd=128, vocab_size=4096),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}


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


def flops_per_token(cfg: GPTConfig) -> int:
    """nanoGPT/PaLM analytic training FLOPs per token: 6N + 12·L·H·Q·T (N without wpe)."""
    q = cfg.n_embd // cfg.n_head
    return 6 * param_count(cfg) + 12 * cfg.n_layer * cfg.n_head * q * cfg.block_size


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.dropout = cfg.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        # Flash/memory-efficient kernels where the backend has them.
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        validate_config(cfg)
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
                ln_f=LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx, targets=None):
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss
