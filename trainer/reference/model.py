"""A Llama-style decoder-only transformer with FSDP2 sharding and named size presets.

The model is deliberately plain PyTorch (RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU feed-forward) so that everything resilience-related lives elsewhere.

Initialisation is deterministic *and independent of the world size*: every parameter is drawn from a
generator seeded by (seed, parameter name) as a full tensor, and each rank keeps only its own shard. A run
on 2 ranks and a run on 1 rank with the same seed therefore start from the same weights, which is what
makes resharded resume and bitwise exact-resume tests meaningful. The model is built on the meta device
first, so no rank ever holds more than one full parameter at a time (the 70B preset would not fit
otherwise).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer. Validated on construction; errors name the field."""

    dim: int
    """Hidden size (residual stream width)."""
    n_layers: int
    """Number of transformer blocks (each block is one FSDP2 unit)."""
    n_heads: int
    """Attention (query) heads; must divide `dim`."""
    n_kv_heads: int
    """Key/value heads for grouped-query attention; must divide `n_heads`."""
    vocab_size: int
    """Token vocabulary size (embedding rows and output logits)."""
    ffn_hidden: int
    """Hidden width of the SwiGLU feed-forward network."""
    max_seq_len: int
    """Longest sequence the rotary tables are built for."""
    rope_theta: float = 10000.0
    """Rotary embedding base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Standard deviation of the normal weight initialisation."""

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_hidden", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"n_heads: must divide dim={self.dim}, got {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: must divide n_heads={self.n_heads}, got {self.n_kv_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"n_heads: head dim {self.dim // self.n_heads} (dim/n_heads) must be even")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta: must be > 0, got {self.rope_theta}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps: must be > 0, got {self.norm_eps}")
        if not self.init_std > 0:
            raise ValueError(f"init_std: must be > 0, got {self.init_std}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def num_params(self) -> int:
        """Exact parameter count of `Transformer(self)` (untied embedding and output)."""
        kv = self.n_kv_heads * self.head_dim
        attn = self.dim * self.dim * 2 + self.dim * kv * 2  # wq, wo, wk, wv
        ffn = 3 * self.dim * self.ffn_hidden
        block = attn + ffn + 2 * self.dim  # two RMSNorm weights
        return 2 * self.vocab_size * self.dim + self.n_layers * block + self.dim

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# Named presets. "tiny" and "small" are for CPU tests and demos; "1b", "8b" and "70b" follow the published
# Llama 3 shapes (grouped-query attention with 8 KV heads, 128k vocabulary).
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        dim=128, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=2048, ffn_hidden=384, max_seq_len=512
    ),
    "small": ModelConfig(
        dim=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=32000, ffn_hidden=1536, max_seq_len=2048
    ),
    "1b": ModelConfig(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        ffn_hidden=8192,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
    "8b": ModelConfig(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        ffn_hidden=14336,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
    "70b": ModelConfig(
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        vocab_size=128256,
        ffn_hidden=28672,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 even under bf16 mixed precision: the mean of squares underflows in bf16.
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(head_dim: int, max_seq_len: int, theta: float, device: torch.device) -> torch.Tensor:
    """cos/sin tables, shape [max_seq_len, head_dim // 2, 2], fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rotary(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of x [B, H, T, D] by the position angles in tables [T, D/2, 2]."""
    pairs = x.float().unflatten(-1, (-1, 2))
    cos, sin = tables[..., 0], tables[..., 1]
    real = pairs[..., 0] * cos - pairs[..., 1] * sin
    imag = pairs[..., 0] * sin + pairs[..., 1] * cos
    return torch.stack((real, imag), dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        gqa = self.n_heads != self.n_kv_heads
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """tokens [B, T] (int64) -> logits [B, T, vocab_size]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        # A ModuleDict with string keys keeps parameter names stable ("layers.3.attn.wq.weight"), which the
        # name-seeded init and the checkpoint keys rely on.
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        # Not persistent: derived from the config, so never part of a checkpoint.
        self.rope: torch.Tensor
        self.register_buffer("rope", torch.empty(cfg.max_seq_len, cfg.head_dim // 2, 2), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len={self.cfg.max_seq_len}")
        rope = self.rope[:t]
        x = self.embed(tokens)
        for layer in self.layers.values():
            x = layer(x, rope)
        return self.output(self.norm(x))

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Fill every parameter deterministically from (seed, name), shard-aware; rebuild the rope table."""
        self.rope.copy_(
            rotary_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta, self.rope.device)
        )
        # Residual projections get the GPT-2 style 1/sqrt(2 * n_layers) scaling so activations stay O(1).
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                full = torch.ones(param.shape, dtype=param.dtype, device=param.device)
            else:
                std = residual_std if name.endswith(("wo.weight", "w2.weight")) else self.cfg.init_std
                gen = torch.Generator(device=param.device)
                gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
                full = torch.empty(param.shape, dtype=param.dtype, device=param.device)
                full.normal_(0.0, std, generator=gen)
            _copy_full_into(param, full)


def _copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full (unsharded) tensor into a plain or DTensor parameter, keeping only the local shard."""
    if isinstance(param, DTensor):
        # src_data_rank=None: every rank already holds the same full tensor, so split locally, no comms.
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)


def build_model(cfg: ModelConfig, *, mesh: DeviceMesh | None, device: torch.device, seed: int) -> nn.Module:
    """Build the transformer on `device`, deterministically initialised from `seed`.

    With a mesh, each block and then the root are wrapped with FSDP2 `fully_shard` (parameters become
    DTensors sharded on dim 0). On CUDA the FSDP2 policy computes in bf16 and reduces gradients in fp32;
    on CPU everything stays fp32 (bf16 matmuls on CPU are slow and make exact-resume tests fragile).
    """
    with torch.device("meta"):
        model = Transformer(cfg)
    if mesh is not None:
        if device.type == "cuda":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            policy = MixedPrecisionPolicy()
        for block in model.layers.values():
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)
    model.init_weights(seed)
    return model
