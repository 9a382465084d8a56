"""Model FLOPs and MFU: training FLOPs per token, and the peak FLOP/s of a GPU by model and dtype.

Formula (nanoGPT ``estimate_mfu``, torchtitan ``get_dense_model_nparams_and_flops``): a training
step costs ``6 N`` FLOPs per token for the matmuls (2 forward + 4 backward per parameter, ``N``
= non-embedding parameters) plus ``12 L H Q T`` for attention scores and values (``L`` layers,
``H`` heads, ``Q`` head dim, ``T`` sequence length; no causal discount, no recompute). With frozen
weights (LoRA) the weight-gradient third is skipped for them: ``6 N (2 + r) / 3`` with ``r`` the
trainable fraction. The formula's name travels with every value (``train_run.mfu_formula``)
because tools disagree on the attention term.

Peaks are dense (no sparsity) datasheet numbers; name matching is by pattern on the CUDA device
name, most specific first ("h200" before "h20"). Override with ``Run(peak_flops=...)`` or
``GPULSE_PEAK_FLOPS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

FORMULA_6N = "6N"
FORMULA_6N_ATTN = "6N+12LHQT"
FORMULA_LORA = "6N(2+r)/3+12LHQT"

DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
_DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "tensorfloat32": "tf32",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}


def _peaks(bf16: float, tf32: float | None = None, fp32: float | None = None, fp8: float | None = None) -> dict:
    out = {"bf16": bf16, "fp16": bf16}
    if tf32:
        out["tf32"] = tf32
    if fp32:
        out["fp32"] = fp32
    if fp8:
        out["fp8"] = fp8
    return out


#: (pattern on the lower-cased device name, label, dense peak FLOP/s by dtype). First match wins.
PEAK_TABLE: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"gb300", "GB300", _peaks(2.5e15, 1.25e15, None, 5.0e15)),
    (r"gb200", "GB200", _peaks(2.5e15, 1.25e15, 80e12, 5.0e15)),
    (r"b300", "B300", _peaks(2.25e15, 1.1e15, None, 4.5e15)),
    (r"b200", "B200", _peaks(2.25e15, 1.1e15, 80e12, 4.5e15)),
    (r"gh200", "GH200", _peaks(989e12, 494.7e12, 66.9e12, 1.979e15)),
    (r"h200.*nvl", "H200 NVL", _peaks(835e12, 418e12, 60e12, 1.67e15)),
    (r"h200", "H200 SXM", _peaks(989e12, 494.7e12, 66.9e12, 1.979e15)),
    (r"h100.*pcie", "H100 PCIe", _peaks(756e12, 378e12, 51.2e12, 1.513e15)),
    (r"h100.*nvl", "H100 NVL", _peaks(835e12, 418e12, 60e12, 1.67e15)),
    (r"h100|h800", "H100 SXM", _peaks(989e12, 494.7e12, 66.9e12, 1.979e15)),
    (r"\bh20\b", "H20", _peaks(148e12, 74e12, 44e12, 296e12)),
    (r"a100|a800", "A100", _peaks(312e12, 156e12, 19.5e12)),
    (r"l40s", "L40S", _peaks(362e12, 183e12, 91.6e12, 733e12)),
    (r"\bl4\b", "L4", _peaks(121e12, 60e12, 30.3e12, 242e12)),
    (r"\ba10\b", "A10", _peaks(125e12, 62.5e12, 31.2e12)),
    (r"v100", "V100", {"fp16": 125e12, "fp32": 15.7e12}),
    (r"mi300x", "MI300X", _peaks(1307.4e12, 653.7e12, 163.4e12, 2614.9e12)),
)


def normalize_dtype(dtype: Any) -> str:
    """``torch.bfloat16``, ``"bfloat16"`` and ``"bf16"`` all become ``"bf16"``."""
    name = str(dtype).lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {DTYPES}")
    return name


def lookup_peak(device_name: str, dtype: Any = "bf16") -> tuple[str, float] | None:
    """``(label, dense peak FLOP/s)`` for a CUDA device name and compute dtype, or ``None`` if unknown."""
    name = device_name.lower()
    dt = normalize_dtype(dtype)
    for pattern, label, peaks in PEAK_TABLE:
        if re.search(pattern, name):
            value = peaks.get(dt)
            return None if value is None else (label, value)
    return None


@dataclass(frozen=True)
class FlopsModel:
    """Training FLOPs per token of a model: ``6 N · lora + 12 L H Q T``.

    ``seq_len`` may be left ``None`` and given per step (tokens / samples), since the attention
    term grows with the sequence actually processed.
    """

    n_params: int
    n_layers: int = 0
    n_heads: int = 0
    head_dim: int = 0
    seq_len: int | None = None
    trainable_fraction: float = 1.0

    @property
    def formula(self) -> str:
        if self.trainable_fraction < 1.0:
            return FORMULA_LORA
        return FORMULA_6N_ATTN if self.n_layers and self.n_heads and self.head_dim else FORMULA_6N

    def per_token(self, seq_len: float | None = None) -> float:
        """Training FLOPs for one token at sequence length ``seq_len`` (default: the model's)."""
        dense = 6.0 * self.n_params
        if self.trainable_fraction < 1.0:
            dense *= (2.0 + self.trainable_fraction) / 3.0
        t = seq_len if seq_len is not None else self.seq_len
        if t and self.n_layers and self.n_heads and self.head_dim:
            dense += 12.0 * self.n_layers * self.n_heads * self.head_dim * t
        return dense

    def describe(self) -> dict[str, Any]:
        return {
            "formula": self.formula,
            "N": self.n_params,
            "L": self.n_layers,
            "H": self.n_heads,
            "Q": self.head_dim,
            "T": self.seq_len,
            "trainable_fraction": round(self.trainable_fraction, 6),
        }


_CONFIG_KEYS = {
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "n_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "head_dim": ("head_dim", "attention_head_size"),
    "seq_len": ("max_position_embeddings", "n_positions", "max_seq_len", "block_size"),
}


def _config_value(config: Any, keys: tuple[str, ...]) -> int:
    for key in keys:
        v = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def from_model(model: Any, seq_len: int | None = None, config: Any = None) -> FlopsModel:
    """Count a ``torch.nn.Module``'s parameters (minus embeddings) and read L, H, Q from its config.

    The config is ``model.config`` (Hugging Face) unless given. Tied weights are counted once.
    ``seq_len`` is left ``None`` by default: the run fills it per step from tokens / samples.
    """
    import torch

    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.numel()
        total += n
        if p.requires_grad:
            trainable += n
    embedding = 0
    emb_seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and id(module.weight) not in emb_seen:
            emb_seen.add(id(module.weight))
            embedding += module.weight.numel()
    n_params = max(total - embedding, 0)
    config = config if config is not None else getattr(model, "config", None)
    n_layers = n_heads = head_dim = 0
    if config is not None:
        n_layers = _config_value(config, _CONFIG_KEYS["n_layers"])
        n_heads = _config_value(config, _CONFIG_KEYS["n_heads"])
        head_dim = _config_value(config, _CONFIG_KEYS["head_dim"])
        hidden = _config_value(config, _CONFIG_KEYS["hidden"])
        if not head_dim and hidden and n_heads:
            head_dim = hidden // n_heads
    fraction = trainable / total if total else 1.0
    return FlopsModel(n_params, n_layers, n_heads, head_dim, seq_len, min(fraction, 1.0))


def throughput(flops_per_token: float, tokens: float, seconds: float, peak: float | None) -> tuple[float, float | None]:
    """``(TFLOP/s, MFU)`` for ``tokens`` processed in ``seconds``; MFU is ``None`` without a peak."""
    if seconds <= 0:
        return 0.0, None
    rate = flops_per_token * tokens / seconds
    return rate / 1e12, (rate / peak if peak else None)
