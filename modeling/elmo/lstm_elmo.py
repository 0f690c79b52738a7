"""The recurrent kernel of the ELMo-style BiLM: its LSTM stacks and how they run (imported by ``modeling_elmo.py``).

* :class:`RecurrentLayer` -- one layer of one direction: ``nn.LSTM(cell_size, proj_size=projection_dim)`` (LSTM with
  a projection, Sak et al. 2014), or ``nn.GRU`` + a linear projection; :class:`DirectionalStack` -- the
  ``num_layers`` layers of one direction, with the dropout on each layer's input and the residual flag.
* :func:`run_bilm_layer` -- one layer of both directions (residual from the second layer on); on CPU in
  :class:`BiLSTMProjectionFunction`, the forward and backward LSTMs of a layer stepped together with hand-written
  backpropagation through time (:func:`fused_lstm_applies` says when), else cuDNN / PyTorch's kernel, or
  :func:`recurrence`, the step-by-step loop (bilm-tf's cell and projection clipping; under ``torch.export`` a
  ``scan`` whose length stays symbolic). The modeling file calls it from one ``GradientCheckpointingLayer`` per layer
  (gradient checkpointing recomputes each layer in the backward pass).
* :func:`token_slots` -- where each kept token goes when a row's tokens are packed to the left and read forwards or
  backwards (static shapes: any mask layout, no host read); :func:`bilm_positions` -- the four permutations a layer
  reads; :func:`full_precision` -- how the LSTMs run under autocast (float32, autocast off).

Saved folders carry this file: ``modeling_elmo.py`` imports it relatively, and transformers copies a model file's
relative imports with it (``trust_remote_code``). Imports only torch and the sibling configuration file.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_elmo import SesameElmoConfig


def full_precision(x: torch.Tensor, module: nn.Module):
    """``(x cast to module's parameter dtype, a context with autocast disabled on x's device)``: how the LSTMs
    and the adaptive softmax run under mixed precision (float32 parameters -> float32 computation)."""
    dtype = next(module.parameters()).dtype
    return x.to(dtype), torch.autocast(device_type=x.device.type, enabled=False)


def _steps(step, init, xs: torch.Tensor) -> torch.Tensor:
    """Run ``step(carry, x_t) -> (carry, out_t)`` over ``xs (T, ...)`` from ``init``: ``(T, ...)``, the stacked outputs.

    A Python loop; under ``torch.export`` (``torch.compiler.is_exporting()``) torch's ``scan`` higher-order operator,
    which keeps the number of steps symbolic (a loop would fix it to the example's length) and which the ONNX
    exporter writes as one ``Scan`` node.
    """
    if torch.compiler.is_exporting():
        from torch._higher_order_ops.scan import scan

        def body(carry, x):
            carry, out = step(carry, x)
            return carry, out.clone()  # scan's outputs may not alias its carry

        # contiguous: scan traces a view's base too, and its sizes' symbols can pin the batch and length to the example
        return scan(body, init, xs.contiguous())[1]
    carry, outs = init, []
    for x in xs.unbind(0):
        carry, out = step(carry, x)
        outs.append(out)
    return torch.stack(outs)


def recurrence(
    rnn: nn.LSTM | nn.GRU,
    x: torch.Tensor,
    reverse: bool = False,
    cell_clip: float | None = None,
    proj_clip: float | None = None,
) -> torch.Tensor:
    """One direction of the first layer of ``rnn`` (``nn.LSTM``, with or without ``proj_size``, or ``nn.GRU``) over
    ``x (B, T, I)`` float (batch first, whatever ``rnn.batch_first`` says) from zero states, step by step: ``(B, T,
    P)`` (``P`` = ``proj_size`` or ``hidden_size``), in ``x``'s dtype.

    The same parameters, gate order and equations as PyTorch's kernels (LSTM: input, forget, cell, output; GRU: reset,
    update, new), so with no clipping it equals ``rnn(x)[0]`` (the direction's half of it). ``reverse`` reads the
    ``*_reverse`` parameters of a bidirectional ``rnn`` (``x`` must already be in the order that direction reads).
    ``cell_clip`` / ``proj_clip`` (LSTM only): bilm-tf's clipping of the memory cell and of the projected output to
    ``[-clip, clip]``. Used for clipping, and under ``torch.export`` (see :func:`_steps`), where ``nn.LSTM`` /
    ``nn.GRU`` fix the sequence length and the ONNX LSTM operator has no projection. The steps read the recurrent
    weights from the module (not from a local variable): a tensor a ``scan`` body closes over gets symbolic sizes,
    which ``torch.export`` may unify with the batch or the length (duck sizing) and then fix.
    """
    sfx = "_l0_reverse" if reverse else "_l0"

    def weight(name: str) -> torch.Tensor | None:
        return getattr(rnn, name + sfx, None)

    b = x.shape[0]
    if isinstance(rnn, nn.GRU):
        gates_x = F.linear(x, weight("weight_ih"), weight("bias_ih")).transpose(0, 1)  # (T, B, 3H)

        def gru_step(h, gx):
            r, z, n = gx.chunk(3, dim=-1)
            hr, hz, hn = F.linear(h, weight("weight_hh"), weight("bias_hh")).chunk(3, dim=-1)
            r, z = torch.sigmoid(r + hr), torch.sigmoid(z + hz)
            h = (1 - z) * torch.tanh(n + r * hn) + z * h
            return h, h

        return _steps(gru_step, x.new_zeros(b, rnn.hidden_size), gates_x).transpose(0, 1)
    bias = weight("bias_ih") + weight("bias_hh") if weight("bias_ih") is not None else None
    gates_x = F.linear(x, weight("weight_ih"), bias).transpose(0, 1)  # (T, B, 4H)
    projected = weight("weight_hr") is not None

    def lstm_step(state, gx):
        h, c = state
        i, f, g, o = (gx + F.linear(h, weight("weight_hh"))).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        if cell_clip is not None:
            c = c.clamp(-cell_clip, cell_clip)
        h = torch.sigmoid(o) * torch.tanh(c)
        if projected:
            h = F.linear(h, weight("weight_hr"))
        if proj_clip is not None:
            h = h.clamp(-proj_clip, proj_clip)
        return (h, c), h

    init = (x.new_zeros(b, rnn.proj_size or rnn.hidden_size), x.new_zeros(b, rnn.hidden_size))  # two tensors
    return _steps(lstm_step, init, gates_x).transpose(0, 1)


class BiLSTMProjectionFunction(torch.autograd.Function):
    """The forward and the backward LSTM with projection (Sak et al. 2014) of one biLM layer, stepped together.

    Each direction has its own weights and its own input (the backward one already reversed within each
    sequence), so the two recurrences are independent: they are batched over a leading direction axis, one
    ``bmm`` per time step for both (on 2 threads each core takes one direction's small GEMM). The backward
    pass is backpropagation through time written out: per step only the gate gradients and the two
    recurrent products; the weight gradients are one large GEMM each over all time steps, instead of one
    small GEMM per step (inner dimension = batch size). Same equations and gate order (input, forget, cell, output) as
    ``nn.LSTM(proj_size=P)`` with zero initial states:

        g_t = W_ih x_t + W_hh h_{t-1} + b;  i, f, o = sigmoid(g_i, g_f, g_o);  u = tanh(g_u)
        c_t = f * c_{t-1} + i * u;  h_t = W_hr (o * tanh(c_t))

    Args (``apply``):
        x: ``(2, B, T, I)`` float, direction-major inputs.
        weight_ih: ``(2, 4H, I)``; weight_hh: ``(2, 4H, P)``; bias: ``(2, 4H)`` (``bias_ih + bias_hh``);
        weight_hr: ``(2, P, H)``.

    Returns:
        ``(2, B, T, P)``: the projected outputs ``h_t`` of each direction.
    """

    @staticmethod
    def forward(ctx, x, weight_ih, weight_hh, bias, weight_hr):
        _, b, t, i_size = x.shape
        p, h_size = weight_hr.shape[1], weight_hr.shape[2]
        x_tm = x.transpose(1, 2).reshape(2, t * b, i_size)  # time-major rows per direction
        gates_x = torch.baddbmm(bias.unsqueeze(1), x_tm, weight_ih.transpose(1, 2)).view(2, t, b, 4 * h_size)
        gates_x = gates_x.transpose(0, 1)  # (T, 2, B, 4H) view
        gates = x.new_empty(t, 2, b, 4 * h_size)  # activations i, f, u, o
        tanh_cells = x.new_empty(t, 2, b, h_size)
        cells = x.new_empty(t, 2, b, h_size)
        out = x.new_empty(t, 2, b, p)
        h, c = x.new_zeros(2, b, p), x.new_zeros(2, b, h_size)
        w_hh_t, w_hr_t = weight_hh.transpose(1, 2), weight_hr.transpose(1, 2)
        for s in range(t):
            g = torch.baddbmm(gates_x[s], h, w_hh_t, out=gates[s])
            g[..., : 2 * h_size].sigmoid_()
            g[..., 2 * h_size : 3 * h_size].tanh_()
            g[..., 3 * h_size :].sigmoid_()
            i, f, u, o = g.chunk(4, dim=-1)
            c = torch.addcmul(f * c, i, u, out=cells[s])
            tc = torch.tanh(c, out=tanh_cells[s])
            h = torch.bmm(o * tc, w_hr_t, out=out[s])
        ctx.save_for_backward(x_tm, weight_ih, weight_hh, weight_hr, gates, cells, tanh_cells, out)
        return out.permute(1, 2, 0, 3)

    @staticmethod
    def backward(ctx, grad_out):
        x_tm, weight_ih, weight_hh, weight_hr, gates, cells, tanh_cells, out = ctx.saved_tensors
        t, _, b, h_size = cells.shape
        p = weight_hr.shape[1]
        grad_out = grad_out.permute(2, 0, 1, 3)  # (T, 2, B, P)
        grad_gates = torch.empty_like(gates)  # w.r.t. the pre-activations
        grad_h = torch.empty_like(out)  # total gradient of each h_t
        dh_next, dc_next = out.new_zeros(2, b, p), out.new_zeros(2, b, h_size)
        for s in range(t - 1, -1, -1):
            dh = torch.add(grad_out[s], dh_next, out=grad_h[s])
            d_hc = torch.bmm(dh, weight_hr)  # gradient of o * tanh(c)
            i, f, u, o = gates[s].chunk(4, dim=-1)
            tc = tanh_cells[s]
            dc = torch.addcmul(dc_next, d_hc * o, 1 - tc * tc)
            di, df, du, do = grad_gates[s].chunk(4, dim=-1)
            torch.mul(dc * u, i * (1 - i), out=di)
            if s > 0:
                torch.mul(dc * cells[s - 1], f * (1 - f), out=df)
            else:
                df.zero_()
            torch.mul(dc * i, 1 - u * u, out=du)
            torch.mul(d_hc * tc, o * (1 - o), out=do)
            dc_next = dc * f
            dh_next = torch.bmm(grad_gates[s], weight_hh)
        # weight gradients: one GEMM each over all (t, b) rows, per direction
        gg = grad_gates.transpose(0, 1).reshape(2, t * b, 4 * h_size)
        h_prev = torch.cat([out.new_zeros(1, 2, b, p), out[:-1]]).transpose(0, 1).reshape(2, t * b, p)
        hc = (gates[..., 3 * h_size :] * tanh_cells).transpose(0, 1).reshape(2, t * b, h_size)
        grad_weight_hr = torch.bmm(grad_h.transpose(0, 1).reshape(2, t * b, p).transpose(1, 2), hc)
        grad_weight_hh = torch.bmm(gg.transpose(1, 2), h_prev)
        grad_weight_ih = torch.bmm(gg.transpose(1, 2), x_tm)
        grad_x = torch.bmm(gg, weight_ih).view(2, t, b, -1).transpose(1, 2)
        return grad_x, grad_weight_ih, grad_weight_hh, gg.sum(1), grad_weight_hr


def fused_lstm_applies(config: SesameElmoConfig, x: torch.Tensor) -> bool:
    """Whether :class:`BiLSTMProjectionFunction` runs the LSTM layers: ``config.fused_cpu_lstm``, LSTM cells
    with a projection (``projection_dim < cell_size``), no clipping, a CPU float32/float64 input, no autocast, not
    under ``torch.export`` (the exported graph runs :func:`recurrence`, the same function)."""
    return (
        config.fused_cpu_lstm
        and config.cell_type == "lstm"
        and config.projection_dim < config.cell_size
        and config.cell_clip is None
        and config.proj_clip is None
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_exporting()
    )


class RecurrentLayer(nn.Module):
    """One recurrent layer of a direction: LSTM with projection, or GRU + linear projection.

    ``(B, T, P)`` -> ``(B, T, P)``; causal (position ``t`` depends only on inputs ``<= t``).
    """

    def __init__(self, config: SesameElmoConfig):
        super().__init__()
        self.config = config
        p, h = config.projection_dim, config.cell_size
        if config.cell_type == "lstm":  # LSTM with projection when P < H; a plain LSTM (+ linear) otherwise
            self.rnn = nn.LSTM(p, h, batch_first=True, proj_size=p if p < h else 0)
            self.proj = nn.Linear(h, p, bias=False) if p > h else None
        else:
            self.rnn = nn.GRU(p, h, batch_first=True)
            self.proj = nn.Linear(h, p, bias=False) if h != p else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if cfg.cell_type == "lstm" and (cfg.cell_clip is not None or cfg.proj_clip is not None):
            out = recurrence(self.rnn, x, cell_clip=cfg.cell_clip, proj_clip=cfg.proj_clip)
        elif torch.compiler.is_exporting():  # nn.LSTM / nn.GRU would fix the sequence length of the graph
            out = recurrence(self.rnn, x)
        else:
            out = self.rnn(x)[0]
        return self.proj(out) if self.proj is not None else out


class DirectionalStack(nn.Module):
    """The ``num_layers`` recurrent layers of one direction (each ``(B, T, P) -> (B, T, P)``), with the dropout
    on each layer's input and the residual flag. A container: :func:`run_bilm_layer` runs layer ``j`` of both
    directions' stacks at once (residual from the second layer on)."""

    def __init__(self, config: SesameElmoConfig):
        super().__init__()
        self.layers = nn.ModuleList(RecurrentLayer(config) for _ in range(config.num_layers))
        self.dropout = nn.Dropout(config.dropout)
        self.use_residual = config.use_residual


def token_slots(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each position of a ``(B, T)`` 0/1 ``mask`` goes when the kept tokens of each row are packed to the left,
    in order (any layout of the mask: right or left padding, holes): ``(forward, backward)``, ``(B, T)`` long.

    ``forward[b, t]`` is the slot of position ``t`` in the packed row (the ``n_b`` kept tokens in slots
    ``0 .. n_b - 1``, then the masked positions in order); ``backward[b, t]`` its slot in the packed row read
    backwards (kept token ``k`` in slot ``n_b - 1 - k``: the backward LM's order, padding still last). Both rows are
    permutations of ``0 .. T - 1``, computed with cumulative sums (static shapes, no host read). For a right-padded
    mask ``forward`` is the identity.
    """
    keep = mask.bool()
    n = keep.sum(1, keepdim=True)
    forward = torch.where(keep, keep.cumsum(1) - 1, n + (~keep).cumsum(1) - 1)
    return forward, torch.where(forward < n, n - 1 - forward, forward)


def inverse_permutation(slots: torch.Tensor) -> torch.Tensor:
    """The inverse of the row permutations ``slots (B, T)`` long (position -> slot): ``order[b, slots[b, t]] = t``."""
    arange = torch.arange(slots.shape[1], device=slots.device).expand_as(slots)
    return torch.empty_like(slots).scatter_(1, slots, arange)


def permute_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x (B, T, D)`` reordered along ``T``: ``out[b, i] = x[b, index[b, i]]`` (``index (B, T)`` long)."""
    return x.gather(1, index.unsqueeze(-1).expand_as(x))


class BiLMPositions(NamedTuple):
    """Where the tokens of a ``(B, T)`` mask go when each row's kept tokens are packed to the left
    (:func:`bilm_positions`): four ``(B, T)`` long row permutations, computed once per batch and read by every layer.

    Attributes:
        forward_slots / backward_slots: position -> slot in the packed row read forwards / backwards
            (:func:`token_slots`).
        forward_order / backward_order: slot -> position, their inverses (:func:`inverse_permutation`).
    """

    forward_slots: torch.Tensor
    backward_slots: torch.Tensor
    forward_order: torch.Tensor
    backward_order: torch.Tensor


def bilm_positions(mask: torch.Tensor) -> BiLMPositions:
    """The :class:`BiLMPositions` of a ``(B, T)`` 0/1 ``mask`` (any layout; static shapes, no host read)."""
    slot_f, slot_b = token_slots(mask)
    return BiLMPositions(slot_f, slot_b, inverse_permutation(slot_f), inverse_permutation(slot_b))


def run_bilm_layer(
    config: SesameElmoConfig,
    forward_stack: DirectionalStack,
    backward_stack: DirectionalStack,
    index: int,
    h: torch.Tensor,
    mask: torch.Tensor,
    positions: BiLMPositions,
) -> torch.Tensor:
    """Layer ``index`` of the BiLM, both directions: dropout on its input, the residual from the second layer on.

    It reads the layer below as returned (``[forward h; backward h]``, 0 at masked positions), so every layer is in the
    graph of the layers above it. The kept tokens of each row are packed to the left (``positions``) and the backward
    direction reads them in reverse; masked positions never reach a kept token's state. The two directions run in one
    :class:`BiLSTMProjectionFunction` call when :func:`fused_lstm_applies`, else as two :class:`RecurrentLayer`
    calls; under autocast in float32 (:func:`full_precision`). The modeling file runs it once per layer, each time in a
    ``GradientCheckpointingLayer`` (``modeling_elmo.SesameElmoBiLMLayer``).

    Args:
        config: the model's config (``fused_cpu_lstm``, clipping, sizes).
        forward_stack / backward_stack: the two directions' :class:`DirectionalStack` (their ``index``-th layers, their
            dropout and residual flag are used).
        index: the layer, ``0 .. num_layers - 1``.
        h: ``(B, T, 2P)`` float, the layer below: for ``index`` 0, ``[x; x]`` with ``x`` the token representations (0
            at masked positions): the forward direction reads its first half, the backward direction its second.
        mask: ``(B, T)`` 0/1, the tokens (any layout).
        positions: :func:`bilm_positions` of ``mask``.

    Returns:
        ``(B, T, 2P)``: ``[forward h; backward h]`` at each position (the forward half has read the kept tokens up to
        it, the backward half those from it on), 0 at masked positions, in the parameters' dtype.
    """
    fwd, bwd = forward_stack, backward_stack
    p = config.projection_dim
    slot_f, slot_b, order_f, order_b = positions
    xf, no_autocast = full_precision(permute_rows(h[..., :p], order_f), fwd)
    xb = permute_rows(h[..., p:], order_b).to(xf.dtype)
    with no_autocast:  # the LSTMs run in float32 under autocast (see modeling_elmo's module docstring)
        lf, lb = fwd.layers[index], bwd.layers[index]
        inputs = (fwd.dropout(xf), bwd.dropout(xb))
        if fused_lstm_applies(config, xf):
            rf, rb = lf.rnn, lb.rnn
            of, ob = BiLSTMProjectionFunction.apply(
                torch.stack(inputs),
                torch.stack([rf.weight_ih_l0, rb.weight_ih_l0]),
                torch.stack([rf.weight_hh_l0, rb.weight_hh_l0]),
                torch.stack([rf.bias_ih_l0 + rf.bias_hh_l0, rb.bias_ih_l0 + rb.bias_hh_l0]),
                torch.stack([rf.weight_hr_l0, rb.weight_hr_l0]),
            ).unbind(0)
        else:
            of, ob = lf(inputs[0]), lb(inputs[1])
        if fwd.use_residual and index > 0:
            of, ob = of + xf, ob + xb
        keep = mask.unsqueeze(-1)
        return torch.cat([permute_rows(of, slot_f), permute_rows(ob, slot_b)], dim=-1) * keep.to(of.dtype)
