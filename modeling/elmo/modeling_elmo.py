"""ELMo-style bidirectional language model (Peters et al. 2018, "Deep contextualized word representations").

Architecture (as bilm-tf's ``BidirectionalLanguageModel``; AllenNLP's ``_ElmoBiLm`` is the PyTorch reading):

* **Layer 0** -- character CNN: embed the 50 character ids of each token, convolve with filters of widths
  1..7 (2048 filters in the paper), max-pool over the characters, activation, 2 highway layers
  (Srivastava et al. 2015), linear projection to ``projection_dim``. Context-free.
* **Forward and backward LSTM stacks** that never see each other: the forward stack reads left to right,
  the backward stack reads each sequence reversed (within its length, so padding never precedes a token).
  Each layer is ``nn.LSTM(cell_size, proj_size=projection_dim)`` (LSTM with projection, Sak et al. 2014),
  with a residual connection around every layer but the first and dropout on each layer's input.
* **Shared softmax** over the word vocabulary for both directions: the forward state at position ``t``
  predicts token ``t+1``, the backward state at ``t`` predicts token ``t-1``; the loss is
  ``(forward NLL + backward NLL) / 2``. Training softmax: full, sampled (Jean et al. 2015) or adaptive
  (Grave et al. 2017); evaluation always gives the exact normalised NLL.
* :class:`SesameElmoModel` returns the ``num_layers + 1`` layer representations ``(B, T, 2 * projection_dim)``:
  layer 0 duplicated ``[x; x]`` and each LSTM layer ``[forward h; backward h]``, as ELMo does.
* :class:`ScalarMix` (ELMo_k = gamma * sum_j softmax(s)_j h_{k,j}) and downstream heads.

Deviations from bilm-tf (documented on purpose):

* **Clipping**: bilm-tf clips the LSTM cell and projection (``cell_clip=3``, ``proj_clip=3``). ``nn.LSTM``
  cannot clip; with ``cell_clip``/``proj_clip`` set, a step-by-step loop with the *same parameters*
  (``weight_ih_l0``, ``weight_hh_l0``, ``bias_*``, ``weight_hr_l0``) is used instead, which is slower. The
  presets leave clipping off (``None``) to keep the fused kernels (cuDNN on GPU; on CPU
  :class:`BiLSTMProjectionFunction`, or with ``fused_cpu_lstm=False`` PyTorch's native LSTM kernel --
  oneDNN does not take projections and says so in a one-time UserWarning).
* ``nn.LSTM`` has two bias vectors (``bias_ih`` and ``bias_hh``) where TensorFlow's LSTMCell has one:
  4 * cell_size redundant parameters per layer and direction. bilm-tf's forget bias of 1.0 is the
  initial value of the forget slice of ``bias_ih``.
* **Stateless**: each sequence starts from zero states; bilm-tf carries the LSTM states across batches of a
  continuous stream.
* Layer norm of :class:`ScalarMix` is per token over the features; AllenNLP normalises over all unmasked
  elements of the batch.
* The sampled softmax draws its negatives with replacement (one set per batch, shared by both directions)
  and corrects by the expected count ``num_sampled * Q(w)``; TensorFlow's default draws unique candidates.

Mixed precision: under autocast (``accelerate``'s ``--mixed_precision bf16|fp16``) the character CNN, the
highway layers and the softmax projections run in the autocast dtype, but every LSTM (the BiLM's and the heads'
task BiLSTMs) runs in **float32** -- autocast disabled around it, its input cast to the parameters' dtype --
because cuDNN would otherwise run ``nn.LSTM`` in fp16 even under bf16 autocast and backpropagate through time
in fp16 without a loss scaler. The adaptive softmax also runs outside autocast in the parameters' dtype
(``nn.AdaptiveLogSoftmaxWithLoss`` mixes its head's and its clusters' output dtypes in ``index_copy_`` under
CUDA bf16 autocast); losses are computed in float32.

Speed: layer 0 is computed once per distinct token of a batch (``torch.unique`` over the character rows),
5x less work on running text at B=32, T=128; the result is the same as per token.

Imports only torch, transformers and the sibling configuration file (remote code).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput

from .configuration_elmo import SesameElmoConfig

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}


# --------------------------------------------------------------------------------------------- outputs
@dataclass
class SesameElmoModelOutput(ModelOutput):
    """Output of :class:`SesameElmoModel`.

    Args:
        last_hidden_state: ``(B, T, 2P)`` float, the top layer ``[forward h; backward h]`` (0 at padding).
        hidden_states: ``num_layers + 1`` tensors ``(B, T, 2P)``: layer 0 (``[x; x]``) then each LSTM layer.
        mask: ``(B, T)`` long, the attention mask used.
    """

    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    mask: torch.Tensor | None = None


@dataclass
class SesameElmoBiLMOutput(ModelOutput):
    """Output of :class:`SesameElmoForBidirectionalLM`.

    Args:
        loss: scalar, ``(forward_loss + backward_loss) / 2``.
        forward_loss / backward_loss: scalar, mean NLL (nats per predicted token) of each direction: the
            exact normalised NLL in eval mode, the training softmax's loss in train mode.
        forward_num_tokens / backward_num_tokens: long scalars, the number of predicted tokens, so that
            ``sum(loss_d * num_d) / sum(num_d)`` over processes gives the exact corpus NLL (perplexity = exp).
        hidden_states: the layer representations (``num_layers + 1`` x ``(B, T, 2P)``) if requested.
    """

    loss: torch.Tensor | None = None
    forward_loss: torch.Tensor | None = None
    backward_loss: torch.Tensor | None = None
    forward_num_tokens: torch.Tensor | None = None
    backward_num_tokens: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


# --------------------------------------------------------------------------------------------- layer 0
class Highway(nn.Module):
    """Highway layers (Srivastava et al. 2015) as in bilm-tf: ``y = g * relu(W_H x) + (1 - g) * x`` with the
    transform gate ``g = sigmoid(W_T x)``; the gate bias starts at -2 (carry by default)."""

    def __init__(self, dim: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(num_layers))
        for layer in self.layers:
            layer.bias_fill = (dim, 2 * dim, -2.0)  # the transform gate's half: read by _init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            transform, gate = layer(x).chunk(2, dim=-1)
            gate = torch.sigmoid(gate)
            x = gate * torch.relu(transform) + (1 - gate) * x
        return x


class CharCNNEncoder(nn.Module):
    """Layer 0 of ELMo: character embedding -> CNN (max over characters) -> highway -> projection.

    Input ``char_ids (B, T, C)`` long (ELMo ids, 0 = masked token); output ``(B, T, projection_dim)`` float.
    """

    def __init__(self, config: SesameElmoConfig):
        super().__init__()
        self.char_embeddings = nn.Embedding(config.char_vocab_size, config.char_embedding_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(config.char_embedding_dim, n, w) for w, n in config.cnn_filters)
        self.activation = _ACTIVATIONS[config.cnn_activation]
        n_filters = sum(n for _, n in config.cnn_filters)
        self.highway = Highway(n_filters, config.num_highway_layers)
        self.projection = nn.Linear(n_filters, config.projection_dim)

    def encode_words(self, char_ids: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` character ids -> ``(N, projection_dim)``: the per-token computation."""
        x = self.char_embeddings(char_ids).transpose(1, 2).contiguous()  # (N, E, C)
        # bilm-tf: convolution, max over character positions, then the activation (relu is monotone).
        # ``max`` (not ``amax``): its backward scatters through the argmax indices, where ``amax`` re-compares
        # the whole (N, filters, C) output with the maximum -- 37% of this layer's forward + backward time.
        feats = torch.cat([self.activation(conv(x).max(dim=-1).values) for conv in self.convs], dim=-1)
        return self.projection(self.highway(feats))

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        b, t, c = char_ids.shape
        # Layer 0 is context-free: compute it once per distinct token of the batch (a batch of running text
        # holds far fewer distinct words than tokens), then scatter back; gradients add up through the index.
        unique, inverse = torch.unique(char_ids.reshape(b * t, c), dim=0, return_inverse=True)
        return self.encode_words(unique)[inverse].reshape(b, t, -1)


# --------------------------------------------------------------------------------------------- LSTM stacks
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
    on each layer's input and the residual flag. A container: :meth:`SesameElmoModel._bilm_layers` runs both
    directions' stacks layer by layer (residual from the second layer on)."""

    def __init__(self, config: SesameElmoConfig):
        super().__init__()
        self.layers = nn.ModuleList(RecurrentLayer(config) for _ in range(config.num_layers))
        self.dropout = nn.Dropout(config.dropout)
        self.use_residual = config.use_residual


# --------------------------------------------------------------------------------------------- ScalarMix
class ScalarMix(nn.Module):
    """Learned layer mixture of ELMo (Peters et al. 2018, eq. 1): ``gamma * sum_j softmax(s)_j h_j``.

    Args:
        num_layers: number of layer representations mixed (``L + 1``).
        layer_norm: layer-normalise each ``h_j`` (per token, over the features, no affine) before mixing.

    Parameters: ``scalar_parameters`` ``s`` (``num_layers``, init 0: equal weights), ``gamma`` (1, init 1).
    Forward: a sequence of ``num_layers`` tensors of one shape ``(..., D)`` -> the mixture ``(..., D)``.
    """

    def __init__(self, num_layers: int, layer_norm: bool = False):
        super().__init__()
        self.num_layers = num_layers
        self.layer_norm = layer_norm
        self.scalar_parameters = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(1))

    def forward(self, layers: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        if len(layers) != self.num_layers:
            raise ValueError(f"ScalarMix expects {self.num_layers} layers, got {len(layers)}")
        weights = torch.softmax(self.scalar_parameters, dim=0)
        mixed = 0
        for w, h in zip(weights, layers):
            mixed = mixed + w * (F.layer_norm(h, h.shape[-1:]) if self.layer_norm else h)
        return self.gamma * mixed


# --------------------------------------------------------------------------------------------- base model
class SesameElmoPreTrainedModel(PreTrainedModel):
    """Weights initialisation (bilm-tf spirit) and the config class for every SesameElmo model."""

    config_class = SesameElmoConfig
    base_model_prefix = "elmo"
    main_input_name = "char_ids"
    supports_gradient_checkpointing = False

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            fan_in = module.weight[0].numel()
            init.normal_(module.weight, mean=0.0, std=1.0 / math.sqrt(fan_in))
            if module.bias is not None:
                init.zeros_(module.bias)
                fill = getattr(module, "bias_fill", None)  # (start, end, value): Highway's transform-gate bias
                if fill is not None and not getattr(module.bias, "_is_hf_initialized", False):
                    with torch.no_grad():
                        module.bias[fill[0] : fill[1]].fill_(fill[2])
        elif isinstance(module, nn.Embedding):
            init.uniform_(module.weight, -1.0, 1.0)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, (nn.LSTM, nn.GRU)):
            for name, param in module.named_parameters():
                if "weight" in name:
                    init.xavier_uniform_(param)
                else:
                    init.zeros_(param)
            if isinstance(module, nn.LSTM) and not getattr(module.bias_ih_l0, "_is_hf_initialized", False):
                h = module.hidden_size  # forget-gate bias 1 (TensorFlow LSTMCell's forget_bias=1.0)
                with torch.no_grad():
                    for name, param in module.named_parameters():
                        if name.startswith("bias_ih"):
                            param[h : 2 * h].fill_(1.0)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ScalarMix):
            init.zeros_(module.scalar_parameters)
            init.ones_(module.gamma)


def _check_mask(mask: torch.Tensor) -> torch.Tensor:
    if mask.shape[1] > 1 and bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise ValueError("attention_mask must be right-padded (1s then 0s in every row) for the BiLM")
    return mask.sum(dim=1)


class SesameElmoModel(SesameElmoPreTrainedModel):
    """The ELMo BiLM encoder: char-CNN layer 0 + separate forward / backward LSTM stacks.

    Forward args:
        char_ids: ``(B, T, 50)`` long, ELMo character ids (see ``tokenization_elmo.py``).
        attention_mask: ``(B, T)`` 0/1, right-padded; default: tokens whose char ids are not all 0.
        input_ids, token_type_ids: accepted and ignored (the encoder reads characters only).

    Returns:
        :class:`SesameElmoModelOutput` with ``hidden_states`` = ``num_layers + 1`` tensors ``(B, T, 2P)``
        (zeros at padding) and ``last_hidden_state`` = the top one.

    Raises:
        ValueError: a left-padded or holed ``attention_mask``.
    """

    def __init__(self, config: SesameElmoConfig):
        super().__init__(config)
        self.char_encoder = CharCNNEncoder(config)
        self.forward_stack = DirectionalStack(config)
        self.backward_stack = DirectionalStack(config)
        self.post_init()

    def _bilm_layers(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Run both stacks on layer 0 ``x (B, T, P)``: dropout on each layer's input, residual from the second
        layer on. Each layer's two directions run in one :class:`BiLSTMProjectionFunction` call when
        :func:`fused_lstm_applies`, else as two :class:`RecurrentLayer` calls. Returns the forward and the
        backward layer outputs, each ``(B, T, P)``; the backward ones still reversed within each sequence."""
        fwd, bwd = self.forward_stack, self.backward_stack
        x, no_autocast = full_precision(x, fwd)
        forward_layers, backward_layers = [], []
        with no_autocast:  # the LSTMs run in float32 under autocast (see the module docstring)
            fused = fused_lstm_applies(self.config, x)
            xs = (x, reverse_padded(x, lengths))
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
        return forward_layers, backward_layers

    def forward(
        self,
        char_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> SesameElmoModelOutput:
        if attention_mask is None:
            attention_mask = (char_ids != 0).any(dim=-1).long()
        lengths = _check_mask(attention_mask)
        x = self.char_encoder(char_ids)
        keep = attention_mask.unsqueeze(-1).to(x.dtype)
        x = x * keep
        forward_layers, backward_layers = self._bilm_layers(x, lengths)
        backward_layers = [reverse_padded(h, lengths) for h in backward_layers]
        hidden = [torch.cat([x, x], dim=-1)]
        hidden += [torch.cat([f, b], dim=-1) * keep for f, b in zip(forward_layers, backward_layers)]
        return SesameElmoModelOutput(last_hidden_state=hidden[-1], hidden_states=tuple(hidden), mask=attention_mask)


# --------------------------------------------------------------------------------------------- BiLM
def log_uniform_log_prob(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log P(k) of the log-uniform (Zipfian) sampler of TensorFlow's sampled softmax:
    ``P(k) = (log(k + 2) - log(k + 1)) / log(V + 1)``, for ids sorted by decreasing frequency."""
    k = ids.to(torch.float64)
    return (torch.log((k + 2) / (k + 1)) / math.log(vocab_size + 1)).log().to(torch.float32)


class SesameElmoForBidirectionalLM(SesameElmoPreTrainedModel):
    """The BiLM with its shared softmax, for pretraining (``AutoModelForPreTraining``).

    Forward args:
        input_ids: ``(B, T)`` long word ids (``<S> w_1 ... w_n </S>``, right padded).
        char_ids: ``(B, T, 50)`` long character ids.
        attention_mask: ``(B, T)`` 0/1 (default: all ones).
        labels: ``(B, T)`` long word ids to predict, -100 = ignored; default ``input_ids`` with padding
            set to -100. The forward LM at ``t`` predicts ``labels[t + 1]``; the backward LM at ``t``
            predicts ``labels[t - 1]`` (so ``<S>`` is predicted only backward, ``</S>`` only forward).
        output_hidden_states: also return the layer representations.

    Returns:
        :class:`SesameElmoBiLMOutput`: ``loss = (forward_loss + backward_loss) / 2`` (mean NLL of each
        direction over its predicted tokens) and the token counts. In ``eval()`` mode the losses are the exact
        normalised NLL (full softmax, or the adaptive softmax's exact log-probabilities); in training mode
        those of ``config.softmax``: for "sampled", the sampled-softmax loss (Jean et al. 2015) with
        ``num_sampled`` log-uniform negatives shared by the batch, corrected by ``log(num_sampled * Q(w))``,
        accidental hits removed -- as ``tf.nn.sampled_softmax_loss`` (with replacement).
    """

    def __init__(self, config: SesameElmoConfig):
        super().__init__(config)
        self.elmo = SesameElmoModel(config)
        self.dropout = nn.Dropout(config.dropout)
        if config.softmax == "adaptive":
            self.softmax = nn.AdaptiveLogSoftmaxWithLoss(
                config.projection_dim, config.vocab_size, config.resolved_adaptive_cutoffs(),
                div_value=config.adaptive_div_value,
            )
        else:
            self.softmax = nn.Linear(config.projection_dim, config.vocab_size)
        self.post_init()

    # -- softmax helpers
    def _exact_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        if isinstance(self.softmax, nn.AdaptiveLogSoftmaxWithLoss):
            h, no_autocast = full_precision(h, self.softmax)
            with no_autocast:
                return self.softmax.log_prob(h.reshape(-1, h.shape[-1])).reshape(*h.shape[:-1], -1).float()
        return torch.log_softmax(self.softmax(h).float(), dim=-1)

    def _nll_sum(self, h: torch.Tensor, targets: torch.Tensor, samples: torch.Tensor | None) -> torch.Tensor:
        """Sum of NLL of ``targets (N,)`` given states ``h (N, P)``."""
        if targets.numel() == 0:
            return h.sum() * 0.0
        if isinstance(self.softmax, nn.AdaptiveLogSoftmaxWithLoss):
            h, no_autocast = full_precision(h, self.softmax)
            with no_autocast:
                return -self.softmax(h, targets).output.float().sum()
        if samples is None:
            return F.cross_entropy(self.softmax(h).float(), targets, reduction="sum")
        weight, bias = self.softmax.weight, self.softmax.bias
        v, s = self.config.vocab_size, samples.numel()
        true_logit = (h * weight[targets]).sum(-1) + bias[targets] - (math.log(s) + log_uniform_log_prob(targets, v))
        corrected_bias = bias[samples] - (math.log(s) + log_uniform_log_prob(samples, v))
        sampled_logits = torch.addmm(corrected_bias.to(h.dtype), h, weight[samples].t())  # (N, S)
        # remove accidental hits (a negative equal to the target); in place: addmm's backward keeps no output
        sampled_logits.masked_fill_(samples.unsqueeze(0) == targets.unsqueeze(1), float("-inf"))
        true_logit = true_logit.float()
        log_z = torch.logaddexp(true_logit, torch.logsumexp(sampled_logits.float(), dim=1))
        return (log_z - true_logit).sum()

    def _draw_samples(self, device: torch.device) -> torch.Tensor:
        """``num_sampled`` ids from the log-uniform distribution (inverse CDF), with replacement."""
        v = self.config.vocab_size
        u = torch.rand(self.config.num_sampled, device=device, dtype=torch.float64)
        return (torch.exp(u * math.log(v + 1)).floor().long() - 1).clamp_(0, v - 1)

    def _directions(self, top: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor):
        p = self.config.projection_dim
        valid = mask.bool()
        fwd_sel = (labels[:, 1:] != -100) & valid[:, :-1]
        bwd_sel = (labels[:, :-1] != -100) & valid[:, 1:]
        return (
            (top[:, :-1, :p][fwd_sel], labels[:, 1:][fwd_sel]),
            (top[:, 1:, p:][bwd_sel], labels[:, :-1][bwd_sel]),
        )

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        char_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> SesameElmoBiLMOutput:
        if char_ids is None:
            raise ValueError("SesameElmoForBidirectionalLM needs char_ids (B, T, 50)")
        if attention_mask is None:
            attention_mask = (char_ids != 0).any(dim=-1).long()
        out = self.elmo(char_ids, attention_mask=attention_mask)
        if labels is None:
            if input_ids is None:
                raise ValueError("SesameElmoForBidirectionalLM needs input_ids or labels (the words to predict)")
            labels = input_ids.masked_fill(attention_mask == 0, -100)
        top = self.dropout(out.last_hidden_state)
        (hf, tf), (hb, tb) = self._directions(top, labels, attention_mask)
        samples = None
        if self.training and self.config.softmax == "sampled":
            samples = self._draw_samples(top.device)
        nf, nb = torch.tensor(tf.numel(), device=top.device), torch.tensor(tb.numel(), device=top.device)
        forward_loss = self._nll_sum(hf, tf, samples) / nf.clamp(min=1)
        backward_loss = self._nll_sum(hb, tb, samples) / nb.clamp(min=1)
        return SesameElmoBiLMOutput(
            loss=(forward_loss + backward_loss) / 2,
            forward_loss=forward_loss,
            backward_loss=backward_loss,
            forward_num_tokens=nf,
            backward_num_tokens=nb,
            hidden_states=out.hidden_states if output_hidden_states else None,
        )

    @torch.no_grad()
    def log_probs(self, char_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """Exact next-word and previous-word distributions (dropout as the current mode).

        Returns:
            ``(forward_log_probs, backward_log_probs)``, each ``(B, T, V)`` float32: at position ``t`` the
            forward LM's log P(w_{t+1} | w_1..w_t) and the backward LM's log P(w_{t-1} | w_t..w_n).
        """
        top = self.elmo(char_ids, attention_mask=attention_mask).last_hidden_state
        p = self.config.projection_dim
        return self._exact_log_probs(top[..., :p]), self._exact_log_probs(top[..., p:])


# --------------------------------------------------------------------------------------------- heads
class _TaskBiLSTM(nn.Module):
    """One-layer bidirectional LSTM over packed sequences (padding never enters), or identity if size 0."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True, bidirectional=True) if hidden_size else None
        self.output_size = 2 * hidden_size if hidden_size else input_size

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.lstm is None:
            return x
        lengths = mask.sum(1).clamp(min=1).cpu()
        x, no_autocast = full_precision(x, self.lstm)
        with no_autocast:  # float32 under autocast, as the BiLM's LSTMs
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.lstm(packed)
            out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return out * mask.unsqueeze(-1).to(out.dtype)


class _Pooler(nn.Module):
    """Sentence pooling over ``(B, T, D)`` with mask ``(B, T)`` -> ``(B, D')``: "max", "mean",
    "attention" (``softmax(v^T tanh(W h))``-weighted sum) or "cnn" (Kim 2014: convolutions of several
    widths, ReLU, max over time; ``D' = len(widths) * filters``)."""

    def __init__(self, config: SesameElmoConfig, dim: int):
        super().__init__()
        self.kind = config.pooling
        self.output_size = dim
        if self.kind == "attention":
            self.attention = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, 1, bias=False))
        elif self.kind == "cnn":
            self.convs = nn.ModuleList(
                nn.Conv1d(dim, config.cnn_pool_filters, w, padding=w // 2) for w in config.cnn_pool_widths
            )
            self.output_size = config.cnn_pool_filters * len(config.cnn_pool_widths)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = _nonempty(mask)
        if self.kind == "mean":
            return (h * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True).clamp(min=1)
        if self.kind == "attention":
            scores = self.attention(h).squeeze(-1).masked_fill(~m, float("-inf"))
            return (torch.softmax(scores, dim=-1).unsqueeze(-1) * h).sum(1)
        if self.kind == "cnn":
            x = (h * m.unsqueeze(-1)).transpose(1, 2)
            pooled = []
            for conv in self.convs:
                c = torch.relu(conv(x))[..., : h.shape[1]]
                pooled.append(c.masked_fill(~m.unsqueeze(1), float("-inf")).amax(-1))
            return torch.cat(pooled, dim=-1)
        return h.masked_fill(~m.unsqueeze(-1), float("-inf")).amax(1)


def _nonempty(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` as bool, with rows that have no token made all-true (their features are 0), so that
    softmax / max over an empty sentence gives 0 instead of NaN / -inf."""
    m = mask.bool()
    return m | ~m.any(dim=1, keepdim=True)


def split_pair(token_type_ids: torch.Tensor, attention_mask: torch.Tensor, segment: int):
    """Positions of sentence ``segment`` (0 or 1) of each row, packed to the left.

    Returns ``(index (B, T_s) long, mask (B, T_s) long)``: ``index[b, i]`` is the position in the pair of the
    ``i``-th token of the sentence (0 where ``mask`` is 0).
    """
    sel = attention_mask.bool() & (token_type_ids == segment)
    t = sel.shape[1]
    lengths = sel.sum(1)
    width = max(int(lengths.max()), 1)
    key = (~sel).long() * t + torch.arange(t, device=sel.device)
    index = key.argsort(dim=1)[:, :width]
    mask = (torch.arange(width, device=sel.device).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return index * mask, mask


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.gather(1, index.reshape(*index.shape, *([1] * (x.dim() - 2))).expand(*index.shape, *x.shape[2:]))


class _ElmoFeaturesMixin:
    """ELMo features for a head: the (frozen or fine-tuned) BiLM and a ScalarMix."""

    def _setup_features(self, config: SesameElmoConfig) -> None:
        self.elmo = SesameElmoModel(config)
        self.scalar_mix = ScalarMix(config.num_layers + 1, layer_norm=config.scalar_mix_layer_norm)
        self.feature_dropout = nn.Dropout(config.classifier_dropout)

    def _freeze(self) -> None:
        if self.config.freeze_backbone:
            self.elmo.requires_grad_(False)

    def _features(self, char_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(B, T, 50)``, ``(B, T)`` -> ScalarMix features ``(B, T, 2P)``, 0 at padding (dropout applied)."""
        if self.config.freeze_backbone:  # frozen: no gradient, no dropout inside the BiLM
            was_training = self.elmo.training
            self.elmo.eval()
            with torch.no_grad():
                layers = self.elmo(char_ids, attention_mask=mask).hidden_states
            self.elmo.train(was_training)
        else:
            layers = self.elmo(char_ids, attention_mask=mask).hidden_states
        return self.feature_dropout(self.scalar_mix(layers)) * mask.unsqueeze(-1).to(layers[0].dtype)

    def _segment_features(self, char_ids, mask, token_type_ids):
        """ELMo features of both sentences of a pair, each run through the BiLM alone (one batched call).

        Returns ``[(features (B, T_s, 2P), mask (B, T_s), index (B, T_s)) for s in (0, 1)]``."""
        parts = [split_pair(token_type_ids, mask, s) for s in (0, 1)]
        width = max(p[0].shape[1] for p in parts)
        chars, masks = [], []
        for index, m in parts:
            pad = width - index.shape[1]
            c = _gather_rows(char_ids, index) * m.unsqueeze(-1)
            chars.append(F.pad(c, (0, 0, 0, pad)))
            masks.append(F.pad(m, (0, pad)))
        feats = self._features(torch.cat(chars), torch.cat(masks))
        b = char_ids.shape[0]
        return [(feats[i * b : (i + 1) * b, : parts[i][0].shape[1]], parts[i][1], parts[i][0]) for i in (0, 1)]


def _classification_loss(config, logits: torch.Tensor, labels: torch.Tensor, num_labels: int) -> torch.Tensor:
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    logits = logits.float()  # losses in float32 under mixed precision
    if config.problem_type == "regression":
        return F.mse_loss(logits.squeeze(-1), labels.squeeze(-1).float()) if num_labels == 1 else F.mse_loss(logits, labels.float())
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits, labels.float())


class SesameElmoForSequenceClassification(_ElmoFeaturesMixin, SesameElmoPreTrainedModel):
    """Sentence / sentence-pair classification or regression on ELMo features.

    ScalarMix -> task BiLSTM -> pooling (``config.pooling``) -> MLP. For pairs (``token_type_ids`` with 1s,
    as the tokenizer makes them) each sentence is encoded alone (BiLM, BiLSTM, pooling shared) into ``u`` and
    ``v``, combined as ``[u; v; |u - v|; u * v]`` (as the GLUE baselines, Wang et al. 2018). Regression
    (MSE) when ``num_labels == 1``; ``problem_type`` as in transformers.

    Forward args: ``char_ids (B, T, 50)``, ``attention_mask (B, T)``, ``token_type_ids (B, T)`` optional,
    ``labels (B,)`` long (float for regression). ``input_ids`` is ignored. Returns ``SequenceClassifierOutput``
    with ``logits (B, num_labels)``.
    """

    def __init__(self, config: SesameElmoConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._setup_features(config)
        self.encoder = _TaskBiLSTM(config.hidden_size, config.task_hidden_size)
        self.pooler = _Pooler(config, self.encoder.output_size)
        d = self.pooler.output_size
        hid = config.classifier_hidden_size
        self.pair_classifier = self._mlp(4 * d, hid, config)
        self.classifier = self._mlp(d, hid, config)
        self.post_init()
        self._freeze()

    @staticmethod
    def _mlp(d_in: int, hid: int, config: SesameElmoConfig) -> nn.Module:
        if not hid:
            return nn.Sequential(nn.Dropout(config.classifier_dropout), nn.Linear(d_in, config.num_labels))
        return nn.Sequential(nn.Dropout(config.classifier_dropout), nn.Linear(d_in, hid), nn.ReLU(),
                             nn.Dropout(config.classifier_dropout), nn.Linear(hid, config.num_labels))

    def _encode(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.pooler(self.encoder(feats, mask), mask)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        char_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        if attention_mask is None:
            attention_mask = (char_ids != 0).any(dim=-1).long()
        if token_type_ids is not None and bool((token_type_ids * attention_mask).any()):
            (fa, ma, _), (fb, mb, _) = self._segment_features(char_ids, attention_mask, token_type_ids)
            u, v = self._encode(fa, ma), self._encode(fb, mb)
            logits = self.pair_classifier(torch.cat([u, v, (u - v).abs(), u * v], dim=-1))
            unused = self.classifier
        else:
            logits = self.classifier(self._encode(self._features(char_ids, attention_mask), attention_mask))
            unused = self.pair_classifier
        # + 0 * (the unused classifier's weights): every parameter takes part in the graph, as DistributedDataParallel
        # (find_unused_parameters=False) requires; the gradient it gets is 0.
        logits = logits + 0.0 * sum(p.sum() for p in unused.parameters())
        loss = _classification_loss(self.config, logits, labels, self.num_labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


class SesameElmoForTokenClassification(_ElmoFeaturesMixin, SesameElmoPreTrainedModel):
    """Per-token tagging (NER, POS, ...): ScalarMix -> task BiLSTM -> linear.

    Forward args: ``char_ids (B, T, 50)``, ``attention_mask (B, T)``, ``labels (B, T)`` long with -100
    ignored. Returns ``TokenClassifierOutput`` with ``logits (B, T, num_labels)``.
    """

    def __init__(self, config: SesameElmoConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._setup_features(config)
        self.encoder = _TaskBiLSTM(config.hidden_size, config.task_hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(self.encoder.output_size, config.num_labels)
        self.post_init()
        self._freeze()

    def forward(self, input_ids=None, char_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        if attention_mask is None:
            attention_mask = (char_ids != 0).any(dim=-1).long()
        h = self.encoder(self._features(char_ids, attention_mask), attention_mask)
        logits = self.classifier(self.dropout(h))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
        return TokenClassifierOutput(loss=loss, logits=logits)


class SesameElmoForQuestionAnswering(_ElmoFeaturesMixin, SesameElmoPreTrainedModel):
    """Extractive QA, a simplified BiDAF (Seo et al. 2017) on ELMo features, as in BiDAF + ELMo.

    Input is the tokenizer's pair ``<S> question </S> <S> context </S>`` (``token_type_ids`` 0 / 1).
    Question and context are encoded alone (BiLM -> ScalarMix -> shared BiLSTM), then attention flow:
    ``S_ij = w^T [c_i; q_j; c_i * q_j]``, context-to-query ``a_i = sum_j softmax_j(S_ij) q_j``,
    query-to-context ``b = sum_i softmax_i(max_j S_ij) c_i``, ``G = [c; a; c * a; c * b]``, a modelling
    BiLSTM, and linear start / end scores. Simplifications: one modelling layer, the end scores read the
    same modelling output as the start scores.

    Logits are over the positions of the whole pair ``(B, T)`` as transformers' QA heads: context tokens get
    their scores, position 0 gets a learned null score (SQuAD 2.0 "no answer", from the max-pooled
    modelling output), all other positions -10000.

    Forward args: ``char_ids``, ``attention_mask``, ``token_type_ids`` (required), ``start_positions`` /
    ``end_positions`` ``(B,)`` long (positions in the pair). Returns ``QuestionAnsweringModelOutput``.
    """

    def __init__(self, config: SesameElmoConfig):
        super().__init__(config)
        self._setup_features(config)
        self.encoder = _TaskBiLSTM(config.hidden_size, config.task_hidden_size)
        d = self.encoder.output_size
        self.similarity = nn.Linear(3 * d, 1)
        self.modeling = _TaskBiLSTM(4 * d, config.task_hidden_size or d // 2)
        m = self.modeling.output_size
        self.span = nn.Linear(m, 2)
        self.null = nn.Linear(m, 2)
        self.post_init()
        self._freeze()

    def forward(
        self,
        input_ids=None,
        char_ids=None,
        attention_mask=None,
        token_type_ids=None,
        start_positions=None,
        end_positions=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        if token_type_ids is None:
            raise ValueError("SesameElmoForQuestionAnswering needs token_type_ids (0 = question, 1 = context)")
        if attention_mask is None:
            attention_mask = (char_ids != 0).any(dim=-1).long()
        (fq, mq, _), (fc, mc, ic) = self._segment_features(char_ids, attention_mask, token_type_ids)
        q, c = self.encoder(fq, mq), self.encoder(fc, mc)  # (B, Tq, d), (B, Tc, d)
        tc = c.shape[1]
        w_c, w_q, w_cq = self.similarity.weight.squeeze(0).chunk(3)
        sim = (c @ w_c).unsqueeze(2) + (q @ w_q).unsqueeze(1) + (c * w_cq) @ q.transpose(1, 2) + self.similarity.bias
        qmask, cmask = _nonempty(mq).unsqueeze(1), _nonempty(mc)
        c2q = torch.softmax(sim.masked_fill(~qmask, float("-inf")), dim=-1) @ q
        best = sim.masked_fill(~qmask, float("-inf")).amax(-1).masked_fill(~cmask, float("-inf"))
        q2c = (torch.softmax(best, dim=-1).unsqueeze(1) @ c).expand(-1, tc, -1)
        g = torch.cat([c, c2q, c * c2q, c * q2c], dim=-1) * mc.unsqueeze(-1).to(c.dtype)
        modeled = self.modeling(g, mc)
        span = self.span(modeled).masked_fill(~cmask.unsqueeze(-1), -10000.0)  # (B, Tc, 2)
        null = self.null(modeled.masked_fill(~cmask.unsqueeze(-1), float("-inf")).amax(1))  # (B, 2)
        b, t = attention_mask.shape
        full = span.new_full((b, t, 2), -10000.0)
        full = full.scatter(1, ic.unsqueeze(-1).expand(-1, -1, 2), span)
        full[:, 0] = null  # ic is 0 at padding: position 0 is written last with the null score
        start_logits, end_logits = full[..., 0], full[..., 1]
        loss = None
        if start_positions is not None and end_positions is not None:
            sp, ep = start_positions.clamp(0, t), end_positions.clamp(0, t)
            loss = (F.cross_entropy(start_logits.float(), sp, ignore_index=t)
                    + F.cross_entropy(end_logits.float(), ep, ignore_index=t)) / 2
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)
