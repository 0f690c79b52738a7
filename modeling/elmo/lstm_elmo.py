"""The recurrent kernel of the ELMo-style BiLM: its LSTM stacks and how they run (imported by ``modeling_elmo.py``).

* :class:`RecurrentLayer` -- one layer of one direction: ``nn.LSTM(cell_size, proj_size=projection_dim)`` (LSTM with
  a projection, Sak et al. 2014), or ``nn.GRU`` + a linear projection; :class:`DirectionalStack` -- the
  ``num_layers`` layers of one direction, with the dropout on each layer's input and the residual flag.
* :func:`run_bilm_stacks` -- both directions layer by layer (residual from the second layer on); on CPU in
  :class:`BiLSTMProjectionFunction`, the forward and backward LSTMs of a layer stepped together with hand-written
  backpropagation through time (:func:`fused_lstm_applies` says when), else cuDNN / PyTorch's kernel, or
  :func:`lstm_clipped`, the step-by-step loop with bilm-tf's cell and projection clipping.
* :func:`reverse_padded` -- each sequence reversed within its length (the backward LM's input and output);
  :func:`full_precision` -- how the LSTMs run under autocast (float32, autocast off).

Saved folders carry this file: ``modeling_elmo.py`` imports it relatively, and transformers copies a model file's
relative imports with it (``trust_remote_code``). Imports only torch and the sibling configuration file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_elmo import SesameElmoConfig


def full_precision(x: torch.Tensor, module: nn.Module):
    """``(x cast to module's parameter dtype, a context with autocast disabled on x's device)``: how the LSTMs
    and the adaptive softmax run under mixed precision (float32 parameters -> float32 computation)."""
    dtype = next(module.parameters()).dtype
    return x.to(dtype), torch.autocast(device_type=x.device.type, enabled=False)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each sequence of ``x (B, T, ...)`` within its length (right padding stays in place).

    An involution: ``reverse_padded(reverse_padded(x, n), n) == x``.
    """
    b, t = x.shape[:2]
    pos = torch.arange(t, device=x.device).unsqueeze(0).expand(b, t)
    rev = lengths.unsqueeze(1) - 1 - pos
    idx = torch.where(rev >= 0, rev, pos)
    idx = idx.reshape(b, t, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, idx)


def lstm_clipped(lstm: nn.LSTM, x: torch.Tensor, cell_clip: float | None, proj_clip: float | None) -> torch.Tensor:
    """Run a one-layer ``nn.LSTM(proj_size=P)`` step by step with bilm-tf's clipping of the memory cell to
    ``[-cell_clip, cell_clip]`` and of the projected output to ``[-proj_clip, proj_clip]``.

    Same parameters and gate order (input, forget, cell, output) as ``nn.LSTM``; with no clipping it equals
    ``lstm(x)[0]``. ``x (B, T, I)`` -> ``(B, T, P)``.
    """
    b, t, _ = x.shape
    gates_x = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
    w_hh, w_hr = lstm.weight_hh_l0, getattr(lstm, "weight_hr_l0", None)
    h = x.new_zeros(b, w_hh.shape[1])
    c = x.new_zeros(b, lstm.hidden_size)
    outputs = []
    for step in range(t):
        i, f, g, o = (gates_x[:, step] + F.linear(h, w_hh)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        if cell_clip is not None:
            c = c.clamp(-cell_clip, cell_clip)
        h = torch.sigmoid(o) * torch.tanh(c)
        if w_hr is not None:
            h = F.linear(h, w_hr)
        if proj_clip is not None:
            h = h.clamp(-proj_clip, proj_clip)
        outputs.append(h)
    return torch.stack(outputs, dim=1)


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
    with a projection (``projection_dim < cell_size``), no clipping, a CPU float32/float64 input, no autocast."""
    return (
        config.fused_cpu_lstm
        and config.cell_type == "lstm"
        and config.projection_dim < config.cell_size
        and config.cell_clip is None
        and config.proj_clip is None
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not torch.is_autocast_enabled("cpu")
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
            out = lstm_clipped(self.rnn, x, cfg.cell_clip, cfg.proj_clip)
        else:
            out = self.rnn(x)[0]
        return self.proj(out) if self.proj is not None else out


class DirectionalStack(nn.Module):
    """The ``num_layers`` recurrent layers of one direction (each ``(B, T, P) -> (B, T, P)``), with the dropout
    on each layer's input and the residual flag. A container: :func:`run_bilm_stacks` runs both directions' stacks
    layer by layer (residual from the second layer on)."""

    def __init__(self, config: SesameElmoConfig):
        super().__init__()
        self.layers = nn.ModuleList(RecurrentLayer(config) for _ in range(config.num_layers))
        self.dropout = nn.Dropout(config.dropout)
        self.use_residual = config.use_residual


def run_bilm_stacks(
    config: SesameElmoConfig,
    forward_stack: DirectionalStack,
    backward_stack: DirectionalStack,
    x_forward: torch.Tensor,
    x_backward: torch.Tensor,
    lengths: torch.Tensor,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run both directions' stacks on layer 0: dropout on each layer's input, residual from the second layer on.

    Each layer's two directions run in one :class:`BiLSTMProjectionFunction` call when :func:`fused_lstm_applies`,
    else as two :class:`RecurrentLayer` calls; under autocast in float32 (:func:`full_precision`).

    Args:
        config: the model's config (``fused_cpu_lstm``, clipping, sizes).
        forward_stack / backward_stack: the two directions' :class:`DirectionalStack`.
        x_forward / x_backward: ``(B, T, P)`` float, layer 0 as each direction reads it (in natural order; the
            backward stack's input is reversed within each sequence here).
        lengths: ``(B,)`` long, the number of tokens of each (right-padded) sequence.

    Returns:
        ``(forward_layers, backward_layers)``: ``num_layers`` tensors ``(B, T, P)`` each, in natural order (position
        ``t`` of the forward layers has read tokens ``<= t``, of the backward layers tokens ``>= t``), in the
        parameters' dtype. Padding positions hold values that depend on padding only; the caller masks them.
    """
    fwd, bwd = forward_stack, backward_stack
    x_forward, no_autocast = full_precision(x_forward, fwd)
    x_backward = x_backward.to(x_forward.dtype)
    forward_layers, backward_layers = [], []
    with no_autocast:  # the LSTMs run in float32 under autocast (see modeling_elmo's module docstring)
        fused = fused_lstm_applies(config, x_forward)
        xs = (x_forward, reverse_padded(x_backward, lengths))
        for j, (lf, lb) in enumerate(zip(fwd.layers, bwd.layers)):
            inputs = (fwd.dropout(xs[0]), bwd.dropout(xs[1]))
            if fused:
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
            if fwd.use_residual and j > 0:
                of, ob = of + xs[0], ob + xs[1]
            forward_layers.append(of)
            backward_layers.append(ob)
            xs = (of, ob)
    return forward_layers, [reverse_padded(h, lengths) for h in backward_layers]
