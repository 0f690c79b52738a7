"""Training telemetry: model FLOPs utilisation (MFU) and packing efficiency.

**Model FLOPs of a training step** (forward + backward; Kaplan et al. 2020, "Scaling Laws for Neural Language
Models", sec. 2.1; the attention term as in Chowdhery et al. 2022, "PaLM", appendix B), for a micro-batch with R
real (non-padding) tokens in rows of T token slots, of which P are predicted (MLM labels != -100)::

    FLOPs = 6 * N * R  +  6 * d * V * P_head  +  12 * d * R * sum over attention layers l of C_l

* N: the model's parameters that multiply activations: every parameter but those of ``nn.Embedding`` modules (a
  lookup is no multiplication) and but the output embeddings (``get_output_embeddings()``, counted in the second
  term). A forward costs 2 FLOPs per parameter and token, the backward twice that.
* The second term: the output projection (d x V, tied or not) on ``P_head`` rows: the predicted tokens P under
  sparse prediction (``config.sparse_prediction``, in training), else all R real tokens; 0 without output
  embeddings.
* The third: scores (Q K^T) and context (A V), 2 * d * C FLOPs each per token and layer forward, 3x for the
  backward included, with d the attention width (heads x head dimension). C_l is the context a query sees in
  layer l: T for a global layer, ``min(T, local_attention + 1)`` for a local (sliding-window) one, whose band is
  ``|q - k| <= local_attention // 2`` (PaLM's dense-row count: documents packed with document masking attend
  within their own document, so for them this is an upper bound). Models without attention layers (no
  ``num_attention_heads`` in their config, e.g. the ELMo BiLM) have no third term.

Padding slots are not counted (their FLOPs do no useful work); the parameters are counted once per token whatever
the layer type. MFU = model FLOPs of the steps / (seconds x processes x the device's peak FLOP/s).

**Peak FLOP/s** (:func:`peak_flops`): dense (no sparsity) tensor-core peaks from the vendors' data sheets, per GPU
model (:data:`PEAK_TFLOPS`), for 16-bit mixed precision (bf16 / fp16) and for float32 (TF32 tensor cores where the
GPU has them, as ``torch.backends.cuda.matmul.allow_tf32``). On the CPU, an unknown GPU, or any other device the
peak is unknown: MFU is ``None`` there (left out of the progress lines; ``null`` in ``all_results.json``).

**Packing efficiency**: real tokens / token slots (rows x row length) of the training batches, 0-1; 1 for packed
blocks without padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

#: GPU model (a substring of ``torch.cuda.get_device_name``, matched in order) -> dense peak TFLOP/s
#: ``(bf16 / fp16, float32)``; float32 is TF32 on the tensor cores where the GPU has them.
PEAK_TFLOPS: tuple[tuple[str, tuple[float, float]], ...] = (
    ("H200", (989.0, 494.7)),
    ("H100 PCIe", (756.0, 378.0)),
    ("H100", (989.0, 494.7)),  # SXM
    ("GH200", (989.0, 494.7)),
    ("A100", (312.0, 156.0)),
    ("A10G", (70.0, 35.0)),
    ("A10", (125.0, 62.5)),
    ("L40S", (362.0, 183.0)),
    ("L4", (121.0, 60.0)),
    ("RTX 4090", (165.2, 82.6)),
    ("V100", (125.0, 15.7)),  # fp16 tensor cores; no bf16 (bf16 runs slower than this peak)
    ("T4", (65.0, 8.1)),
)


def peak_flops(device: torch.device | str, mixed_precision: str = "no") -> float | None:
    """The device's dense peak FLOP/s for ``mixed_precision`` (``"bf16"`` / ``"fp16"``: the 16-bit peak; otherwise
    float32's) from :data:`PEAK_TFLOPS`; ``None`` for the CPU, other device types and unlisted GPUs."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for model, (half, single) in PEAK_TFLOPS:
        if model in name:
            return 1e12 * (half if mixed_precision in ("bf16", "fp16") else single)
    return None


def _layer_contexts(config) -> list[str]:
    """The attention type of every layer: ``attention_types()`` (SesameBert), ``layer_types``, else every one of
    ``num_hidden_layers`` (0 when absent) global."""
    types = config.attention_types() if hasattr(config, "attention_types") else None
    if types is None:
        types = getattr(config, "layer_types", None) or ["full_attention"] * getattr(config, "num_hidden_layers", 0)
    return list(types)


def _output_embeddings(model: nn.Module):
    """The model's output projection (``get_output_embeddings()``), or ``None`` where it has none or cannot say."""
    try:
        return model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    except (NotImplementedError, AttributeError):
        return None


class FlopCounter:
    """The model FLOPs of a training step on a micro-batch (module docstring), for one model.

    Args:
        model: the (unwrapped) model; its parameters and config are read once.
    """

    def __init__(self, model: nn.Module):
        config = getattr(model, "config", None)
        embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
        output = _output_embeddings(model)
        if not isinstance(output, nn.Module):
            output = None
        out_ids = {id(p) for p in output.parameters()} if output is not None else set()
        seen: set[int] = set()
        self.matmul_params = 0
        for p in model.parameters():
            if id(p) in seen or id(p) in embeddings or id(p) in out_ids:
                continue
            seen.add(id(p))
            self.matmul_params += p.numel()
        self.output_size = output.weight.numel() if output is not None and hasattr(output, "weight") else 0
        self.sparse = bool(getattr(config, "sparse_prediction", False))
        self.attention_width = 0
        self.windows: list[int | None] = []
        if config is not None and getattr(config, "num_attention_heads", None) and getattr(config, "hidden_size", None):
            head_dim = getattr(config, "attention_head_dim", None) or config.hidden_size // config.num_attention_heads
            self.attention_width = config.num_attention_heads * head_dim
            window = getattr(config, "local_attention", None)
            self.windows = [
                window + 1 if kind == "sliding_attention" and window else None for kind in _layer_contexts(config)
            ]

    def attention_context(self, length: int) -> int:
        """Sum over the attention layers of the context C_l a query sees in rows of ``length`` slots."""
        return sum(length if w is None else min(length, w) for w in self.windows)

    def __call__(self, batch: Mapping[str, Any], real_tokens: torch.Tensor | int) -> torch.Tensor:
        """FLOPs (float64, 0-d, on the batch's device: no host read) of a training step on ``batch``
        (``input_ids`` (B, T); ``labels`` with -100 at the positions not predicted), with ``real_tokens`` R."""
        ids = batch.get("input_ids")
        length = int(ids.shape[-1]) if ids is not None and ids.dim() >= 2 else 0
        device = ids.device if ids is not None else None
        real = torch.as_tensor(real_tokens, dtype=torch.float64, device=device)
        head_rows = real
        labels = batch.get("labels")
        if self.sparse and labels is not None and labels.dim() >= 2:
            head_rows = (labels != -100).sum().double()
        flops = 6 * self.matmul_params * real + 6 * self.output_size * head_rows
        if self.attention_width and length:
            flops = flops + 12 * self.attention_width * real * self.attention_context(length)
        return flops


def token_slots(batch: Mapping[str, Any]) -> int:
    """The token slots of a batch: the elements of ``input_ids`` (rows x length), 0 without it (host-side)."""
    ids = batch.get("input_ids")
    return int(ids.numel()) if isinstance(ids, torch.Tensor) else 0


__all__ = ["PEAK_TFLOPS", "FlopCounter", "peak_flops", "token_slots"]
