"""The MLM head's loss.

:func:`linear_cross_entropy` is the output layer and the cross-entropy of a language-model head in one step, in
chunks of rows, without the (N, V) logits of the whole batch in the autograd graph (the "fused linear cross-entropy"
of Liger Kernel, Hsu et al. 2024, sec. 3.2, and of Cut Cross-Entropy, Wijmans et al. 2025, written in torch
operations so that it runs on every device). Imports only torch: with the modeling file it is copied into saved
folders for ``trust_remote_code``.
"""

from __future__ import annotations

import torch

#: Logit elements (rows x V) computed at once by :func:`linear_cross_entropy` on the CPU: 2^22 (16 MB in float32),
#: 139 rows of a 30k vocabulary. Measured on the CPU at one thread, forward + backward, medians of 10 interleaved
#: repeats: N 1229, E 128 (modernbert-tiny's 32 x 128 tokens at 30%): 2^21 515 ms, 2^22 472 ms, 2^23 469 ms,
#: 2^24 508 ms; N 614, E 256: 479, 438, 420 and 441 ms (``F.linear`` + ``F.cross_entropy``: 490 ms there). 2^22 is
#: within 1% of the best at the CPU default's width, with half 2^23's buffers.
CPU_CHUNK_ELEMENTS = 1 << 22
#: The same on other devices (2^26 elements: 256 MB of float32 logits), where larger matrix products pay.
DEVICE_CHUNK_ELEMENTS = 1 << 26


def _compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype autocast would give a matrix product on ``device``, else ``dtype``."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


def _chunked_nll(hidden, weight, bias, targets, chunk_rows: int, want: tuple[bool, bool, bool]):
    """The summed NLL and, where ``want`` (hidden, weight, bias) says, the gradients of the summed NLL: (N, E) in
    ``hidden``'s dtype, (V, E) and (V,) in float32. Products in autocast's dtype where it is on; one logits and one
    probabilities buffer serve every chunk.

    Per chunk one float32 softmax gives both the gradient and the loss: at a row's largest logit ``m`` the softmax
    is ``1 / sum exp(x - m)``, its largest value, so ``logsumexp(x) = max(x) - log max(softmax(x))`` (a probability
    of at least 1 / V, exact to float32 rounding, where the target's own probability may underflow), and the NLL is
    ``logsumexp(x) - x[target]``. One exponential per logit, where ``log_softmax`` then ``exp`` took two."""
    dtype = _compute_dtype(hidden.device, hidden.dtype)
    w = weight.to(dtype)
    b = None if bias is None else bias.to(dtype)
    # the gradients' products: float16 has too little range for softmax - one-hot before any loss scaling
    # (probabilities under 6e-8 would flush to 0), so they run in float32 there; bfloat16 has float32's range
    grad_dtype = torch.float32 if dtype == torch.float16 else dtype
    w_grad = w if grad_dtype == dtype else weight.to(grad_dtype)
    grad_hidden = torch.empty_like(hidden) if want[0] else None
    grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want[1] else None
    grad_bias = torch.zeros_like(bias, dtype=torch.float32) if want[2] and bias is not None else None
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    size = (min(chunk_rows, hidden.shape[0]), weight.shape[0])
    logits_buffer = torch.empty(size, dtype=dtype, device=hidden.device)
    probs_buffer = torch.empty(size, dtype=torch.float32, device=hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, hidden.shape[0], chunk_rows):
            h = hidden[start : start + chunk_rows].to(dtype)
            y = targets[start : start + chunk_rows]
            rows = torch.arange(y.shape[0], device=y.device)
            logits = logits_buffer[: y.shape[0]]
            if b is None:
                torch.mm(h, w.t(), out=logits)
            else:
                torch.addmm(b, h, w.t(), out=logits)
            probs = torch.softmax(logits, -1, dtype=torch.float32, out=probs_buffer[: y.shape[0]])
            # the largest probability is the largest logit's, 1 / sum exp(x - max); amax, not max with indices (CPU,
            # one thread, 128 x 30,000: 0.24 against 3.3 ms)
            log_sum_exp = logits.amax(-1).float() - probs.amax(-1).log()
            loss += (log_sum_exp - logits[rows, y].float()).sum()
            if not any(want):
                continue
            dlogits = probs  # softmax - one-hot = d(sum NLL) / d(logits), in place
            dlogits[rows, y] -= 1
            if grad_bias is not None:
                grad_bias += dlogits.sum(0)
            dlogits, h = dlogits.to(grad_dtype), h.to(grad_dtype)
            if grad_hidden is not None and grad_hidden.dtype == grad_dtype:
                torch.mm(dlogits, w_grad, out=grad_hidden[start : start + chunk_rows])
            elif grad_hidden is not None:
                grad_hidden[start : start + chunk_rows] = dlogits @ w_grad
            if grad_weight is not None and grad_dtype == torch.float32:
                grad_weight.addmm_(dlogits.t(), h)
            elif grad_weight is not None:
                grad_weight += dlogits.t() @ h
    return loss, grad_hidden, grad_weight, grad_bias


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward: the summed NLL, with the gradients of the hidden states, weight and bias computed in the same pass
    and kept (a (N, E) and a (V, E) tensor instead of the (N, V) logits and their log-softmax); backward scales them
    by the incoming gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_rows: int):
        want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2])
        loss, *grads = _chunked_nll(hidden, weight, bias, targets, chunk_rows, want)
        ctx.save_for_backward(*grads)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        ctx.consumed = False
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        if ctx.consumed:
            raise RuntimeError(
                "linear_cross_entropy: a second backward through the same loss (retain_graph=True); its gradients are "
                "scaled in place by the first: compute the loss again instead"
            )
        ctx.consumed = True
        weight_dtype, bias_dtype = ctx.dtypes
        grads = []
        for grad, dtype in zip(ctx.saved_tensors, (None, weight_dtype, bias_dtype)):
            if grad is not None:  # in place: no new (V, E) tensor to allocate (and fault in) per step
                grad = grad.mul_(grad_loss.to(grad.dtype)).to(dtype or grad.dtype)
            grads.append(grad)
        return (*grads, None, None)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    chunk_elements: int | None = None,
) -> torch.Tensor:
    """The summed negative log-likelihood of ``targets`` under ``softmax(hidden @ weight.T + bias)`` (nats), computed
    in chunks of rows with the gradients taken in the same pass: the logits of the whole batch are never kept.

    Equals ``F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="sum")`` and its gradients up
    to float rounding (the softmax in float32, as the log-softmax there; the products in autocast's dtype when it is
    on, except the gradients' products under float16, which run in float32 for its range; the weight's and bias's
    gradients accumulated in float32 across chunks). The gradient of the logits is
    ``softmax - one_hot(target)`` (Bishop 2006, eq. 4.109), formed in place of the probabilities and multiplied
    into the hidden states' and the weight's gradients at once. Memory: one chunk of (rows, V) float32 logits plus a
    (N, E) and a (V, E) gradient kept for the backward, instead of (N, V) logits and their log-softmax. Under
    ``torch.compile`` tracing (a loop over a data-dependent N) the plain two-step computation is used.

    Args:
        hidden: (N, E) float, the states after the head's transform (any float dtype).
        weight: (V, E) float, the output embedding (tied to the input embedding in BERT).
        bias: (V,) float or ``None``.
        targets: (N,) long in [0, V); every row counts (select the predicted rows first).
        chunk_elements: logit elements per chunk (default :data:`CPU_CHUNK_ELEMENTS` on the CPU,
            :data:`DEVICE_CHUNK_ELEMENTS` elsewhere).

    Returns:
        A 0-d float32 tensor, differentiable once with respect to ``hidden``, ``weight`` and ``bias`` (no double
        backward).

    Raises:
        ValueError: ``hidden`` not (N, E), ``targets`` not (N,), or ``weight`` not (V, E).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: expected hidden (N, E) and weight (V, E), got "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")  # fmt: skip
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"linear_cross_entropy: expected targets ({hidden.shape[0]},), got {tuple(targets.shape)}")
    if torch.compiler.is_compiling():
        logits = torch.nn.functional.linear(hidden, weight, bias)
        return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    if chunk_elements is None:
        chunk_elements = CPU_CHUNK_ELEMENTS if hidden.device.type == "cpu" else DEVICE_CHUNK_ELEMENTS
    chunk_rows = max(1, chunk_elements // weight.shape[0])
    tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not tracked:
        return _chunked_nll(hidden, weight, bias, targets, chunk_rows, (False, False, False))[0]
    return _LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_rows)
