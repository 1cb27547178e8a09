"""Checkpoint bytes of a model: parameters x bytes per parameter (weights plus optimizer state).

The preset shapes are copied from trainer/reference/model.py PRESETS (this package must not import the
trainer, which needs torch); tests/sizing checks the parameter counts against the trainer's own `num_params`.
"""

from __future__ import annotations

# (dim, n_layers, n_heads, n_kv_heads, vocab_size, ffn_hidden) of trainer/reference/model.py PRESETS.
PRESET_SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "tiny": (128, 4, 4, 2, 2048, 384),
    "small": (512, 8, 8, 4, 32000, 1536),
    "1b": (2048, 16, 32, 8, 128256, 8192),
    "8b": (4096, 32, 32, 8, 128256, 14336),
    "70b": (8192, 80, 64, 8, 128256, 28672),
}

# Bytes per element of the weights the checkpoint holds.
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
# AdamW keeps two fp32 moments per parameter; "none" is a weights-only checkpoint (inference exports).
OPTIMIZER_STATE_BYTES = {"adamw": 8, "none": 0}
# Weights kept in bf16 with AdamW need an fp32 master copy for the update (mixed precision training).
MASTER_WEIGHTS_BYTES = 4


def _count(dim: int, n_layers: int, n_heads: int, n_kv_heads: int, vocab: int, ffn: int) -> int:
    """The trainer's exact count: untied embedding and output, GQA attention, SwiGLU, two norms a block."""
    kv = n_kv_heads * (dim // n_heads)
    attention = 2 * dim * dim + 2 * dim * kv
    block = attention + 3 * dim * ffn + 2 * dim
    return 2 * vocab * dim + n_layers * block + dim


PRESET_PARAMETERS: dict[str, int] = {name: _count(*shape) for name, shape in PRESET_SHAPES.items()}


def parameters_of_preset(preset: str) -> int:
    if preset not in PRESET_PARAMETERS:
        raise ValueError(f"unknown model preset {preset!r} (one of {', '.join(PRESET_PARAMETERS)})")
    return PRESET_PARAMETERS[preset]


def bytes_per_parameter(weights_dtype: str = "fp32", optimizer: str = "adamw") -> int:
    """What one parameter costs in a checkpoint: the trainer's default (fp32 weights, AdamW) is 12."""
    if weights_dtype not in DTYPE_BYTES:
        raise ValueError(f"weights_dtype must be one of {', '.join(DTYPE_BYTES)}, got {weights_dtype!r}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZER_STATE_BYTES)}, got {optimizer!r}")
    master = MASTER_WEIGHTS_BYTES if optimizer != "none" and weights_dtype != "fp32" else 0
    return DTYPE_BYTES[weights_dtype] + master + OPTIMIZER_STATE_BYTES[optimizer]


def checkpoint_bytes(parameters: int, weights_dtype: str = "fp32", optimizer: str = "adamw") -> int:
    """Bytes of one whole-job checkpoint (model and optimizer state; the trainer state is negligible)."""
    if parameters < 1:
        raise ValueError(f"parameters must be >= 1, got {parameters}")
    return parameters * bytes_per_parameter(weights_dtype, optimizer)
