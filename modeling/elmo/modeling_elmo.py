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
  ``lstm_elmo.BiLSTMProjectionFunction``, or with ``fused_cpu_lstm=False`` PyTorch's native LSTM kernel --
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

Speed: in eager mode layer 0 is computed once per distinct token of a batch (``torch.unique`` over the character
rows), 5x less work on running text at B=32, T=128; the result is the same as per token.

Static shapes (``torch.export``, ``torch.onnx.export``, ``torch.compile``): nothing in ``forward`` branches on tensor
values or reads them back, except shortcuts of eager mode that give the same result and are skipped while
``torch.compiler.is_compiling()`` (``is_exporting()`` for the last): the ``torch.unique`` above, the pair heads' cut
of both sentences to the longest one of the batch (:func:`_pair_width`), the classifier's single-sentence path when no
row of a batch with ``token_type_ids`` is a pair, and the task BiLSTM's packed sequences (lengths on the host). The
attention mask may have any layout (right or left padding, holes): the kept tokens
of each row are packed to the left with index arithmetic (``lstm_elmo.token_slots``) instead of checking the layout.
Under ``torch.export`` the LSTMs run as ``scan`` loops (``lstm_elmo.recurrence``; ``nn.LSTM`` would fix the sequence
length, and ONNX's LSTM has no projection), with the same parameters.

Files: the recurrent kernels in ``lstm_elmo.py``, the configuration in ``configuration_elmo.py``, the tokenizer in
``tokenization_elmo.py``; imports only torch, transformers and those siblings, relatively (remote code).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput

from .configuration_elmo import SesameElmoConfig
from .lstm_elmo import (
    BiLMPositions,
    DirectionalStack,
    bilm_positions,
    full_precision,
    inverse_permutation,
    permute_rows,
    recurrence,
    run_bilm_layer,
    token_slots,
)

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}


# --------------------------------------------------------------------------------------------- outputs
@dataclass
class SesameElmoModelOutput(ModelOutput):
    """Output of :class:`SesameElmoModel`.

    Args:
        last_hidden_state: ``(B, T, 2P)`` float, the top layer ``[forward h; backward h]`` (0 at padding).
        hidden_states: ``num_layers + 1`` tensors ``(B, T, 2P)``: layer 0 (``[x; x]``, the tensor both LSTM stacks
            read) then each LSTM layer.
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
        if torch.compiler.is_compiling():  # torch.compile / torch.export: static shapes, every token
            return self.encode_words(char_ids.reshape(b * t, c)).reshape(b, t, -1)
        # Layer 0 is context-free: compute it once per distinct token of the batch (a batch of running text
        # holds far fewer distinct words than tokens), then scatter back; gradients add up through the index.
        # (A data-dependent shape: eager mode only; the result is the same.)
        unique, inverse = torch.unique(char_ids.reshape(b * t, c), dim=0, return_inverse=True)
        return self.encode_words(unique)[inverse].reshape(b, t, -1)


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
class _OutputFlags:
    """``return_dict`` / ``output_hidden_states`` with the config's defaults, for the SesameElmo and SesameBaseline
    models (which return their outputs themselves)."""

    def _finish(self, output: ModelOutput, return_dict: bool | None):
        """``output`` as is, or as a tuple (its non-``None`` fields in order) when ``return_dict`` (default
        ``config.return_dict``) is False."""
        return output if (self.config.return_dict if return_dict is None else return_dict) else output.to_tuple()

    def _hidden_flag(self, output_hidden_states: bool | None) -> bool:
        """``output_hidden_states``, defaulting to the config's."""
        return self.config.output_hidden_states if output_hidden_states is None else output_hidden_states


class SesameElmoPreTrainedModel(_OutputFlags, PreTrainedModel):
    """Weights initialisation (bilm-tf spirit) and the config class for every SesameElmo model."""

    config_class = SesameElmoConfig
    base_model_prefix = "elmo"
    main_input_name = "char_ids"
    supports_gradient_checkpointing = True

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


class SesameElmoBiLMLayer(GradientCheckpointingLayer):
    """Layer ``index`` of the BiLM, both directions (:func:`~.lstm_elmo.run_bilm_layer`), as transformers'
    ``GradientCheckpointingLayer``: ``model.gradient_checkpointing_enable()`` / ``activation_checkpointing_enable()``
    set its ``gradient_checkpointing`` flag and its ``_gradient_checkpointing_func`` (``torch.utils.checkpoint``,
    reentrant or not as ``gradient_checkpointing_kwargs`` say), and in training mode with gradients on the layer is then
    recomputed in the backward pass instead of keeping its activations (the two LSTMs, dropout masks replayed).

    It has no parameters of its own: the weights are the ``index``-th :class:`~.lstm_elmo.RecurrentLayer` of each
    :class:`~.lstm_elmo.DirectionalStack`, passed at each call, so the state dict keeps its keys
    (``forward_stack.layers.{index}.rnn.*``, ``backward_stack.layers.{index}.rnn.*``).

    Forward: ``hidden_states (B, T, 2P)`` float, the layer below (positional: the tensor the checkpoint recomputes
    from); keywords ``attention_mask (B, T)`` 0/1, ``positions`` (:func:`~.lstm_elmo.bilm_positions` of it),
    ``forward_stack`` / ``backward_stack`` -> ``(B, T, 2P)`` in the parameters' dtype, ``[forward h; backward h]``, 0
    at masked positions.

    Source: the layer convention of transformers' ``modeling_layers.GradientCheckpointingLayer`` (the flag and function
    that ``PreTrainedModel._set_gradient_checkpointing`` sets on every such module; the layer's positional arguments
    go through the checkpoint, its keywords are bound to the recomputed call).
    """

    def __init__(self, config: SesameElmoConfig, index: int):
        super().__init__()
        self.config = config
        self.index = index

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        attention_mask: torch.Tensor,
        positions: BiLMPositions,
        forward_stack: DirectionalStack,
        backward_stack: DirectionalStack,
    ) -> torch.Tensor:
        return run_bilm_layer(
            self.config, forward_stack, backward_stack, self.index, hidden_states, attention_mask, positions
        )


def _input_mask(
    char_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """``attention_mask``, or by default ``(B, T)`` long: the tokens whose character ids are not all 0 (every
    position of ``inputs_embeds``).

    Raises:
        ValueError: none or both of ``char_ids`` and ``inputs_embeds`` given.
    """
    if (char_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of char_ids (B, T, 50) or inputs_embeds (B, T, projection_dim)")
    if attention_mask is not None:
        return attention_mask
    if char_ids is not None:
        return (char_ids != 0).any(dim=-1).long()
    return torch.ones(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)


class SesameElmoModel(SesameElmoPreTrainedModel):
    """The ELMo BiLM encoder: char-CNN layer 0 + separate forward / backward LSTM stacks.

    Forward args:
        char_ids: ``(B, T, 50)`` long, ELMo character ids (see ``tokenization_elmo.py``); the main input.
        attention_mask: ``(B, T)`` 0/1, the tokens, in any layout (right or left padding, masked positions inside a
            row): the kept tokens of a row are read as one sentence, in order, as if the others were absent; default:
            tokens whose char ids are not all 0 (with ``inputs_embeds``: every position).
        inputs_embeds: ``(B, T, P)`` float instead of ``char_ids``: layer 0, the token representations that
            :meth:`get_input_embeddings` (the character CNN + highway + projection) computes from ``char_ids``.
        return_dict: a :class:`SesameElmoModelOutput` (default ``config.return_dict``) or its tuple.
        input_ids, token_type_ids: accepted and ignored (the encoder reads characters only).

    Returns:
        :class:`SesameElmoModelOutput` with ``hidden_states`` = ``num_layers + 1`` tensors ``(B, T, 2P)``
        (zeros at padding; always returned, ELMo's output is all its layers) and ``last_hidden_state`` = the top
        one. ``hidden_states[0]`` is ``[x; x]`` (x = layer 0, masked), the tensor whose halves the forward and the
        backward LSTM stacks read, and each LSTM layer reads the one below as returned: every hidden state is in the
        graph of those above it.

    Gradient checkpointing (transformers' ``model.gradient_checkpointing_enable()`` /
    ``activation_checkpointing_enable()`` and their ``_disable()``): each LSTM layer (both directions) is a
    :class:`SesameElmoBiLMLayer`, transformers' ``GradientCheckpointingLayer``, recomputed in the backward pass instead
    of keeping its activations; the gradients are the same (dropout masks replayed). Off (the default), the layers run
    as plain calls.

    Raises:
        ValueError: none or both of ``char_ids`` and ``inputs_embeds``.
    """

    def __init__(self, config: SesameElmoConfig):
        super().__init__(config)
        self.char_encoder = CharCNNEncoder(config)
        self.forward_stack = DirectionalStack(config)
        self.backward_stack = DirectionalStack(config)
        # the units of gradient checkpointing (no parameters: the weights stay in the stacks)
        self.layers = nn.ModuleList(SesameElmoBiLMLayer(config, j) for j in range(config.num_layers))
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The module that computes layer 0 from the main input: :class:`CharCNNEncoder`, ``char_ids (B, T, 50)``
        long -> ``(B, T, projection_dim)`` float, what ``inputs_embeds`` replaces."""
        return self.char_encoder

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.char_encoder = value

    def forward(
        self,
        char_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SesameElmoModelOutput | tuple:
        attention_mask = _input_mask(char_ids, inputs_embeds, attention_mask)
        x = self.char_encoder(char_ids) if inputs_embeds is None else inputs_embeds
        x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        layer0 = torch.cat([x, x], dim=-1)  # the stacks read its halves: layer 0 as returned is in the graph
        positions = bilm_positions(attention_mask)
        hidden = [layer0]
        for layer in self.layers:  # each reads the one below as returned: every layer is in the graph of those above
            hidden.append(
                layer(
                    hidden[-1],
                    attention_mask=attention_mask,
                    positions=positions,
                    forward_stack=self.forward_stack,
                    backward_stack=self.backward_stack,
                )
            )
        out = SesameElmoModelOutput(last_hidden_state=hidden[-1], hidden_states=tuple(hidden), mask=attention_mask)
        return self._finish(out, return_dict)


# --------------------------------------------------------------------------------------------- BiLM
def log_uniform_log_prob(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log P(k) of the log-uniform (Zipfian) sampler of TensorFlow's sampled softmax:
    ``P(k) = (log(k + 2) - log(k + 1)) / log(V + 1)``, for ids sorted by decreasing frequency."""
    k = ids.to(torch.float64)
    return (torch.log((k + 2) / (k + 1)) / math.log(vocab_size + 1)).log().to(torch.float32)


class SesameElmoForBidirectionalLM(SesameElmoPreTrainedModel):
    """The BiLM with its shared softmax, for pretraining (``AutoModelForPreTraining``).

    Forward args:
        char_ids: ``(B, T, 50)`` long character ids (the main input), or ``inputs_embeds`` ``(B, T, P)``: layer 0
            (see :class:`SesameElmoModel`).
        attention_mask: ``(B, T)`` 0/1 (default: tokens whose char ids are not all 0; every position with
            ``inputs_embeds``).
        input_ids: ``(B, T)`` long word ids (``<S> w_1 ... w_n </S>``, padded as ``attention_mask``): the words to
            predict.
        labels: ``(B, T)`` long word ids to predict, -100 = ignored; default ``input_ids`` with padding
            set to -100. The forward LM at a token predicts the label of the next kept token; the backward LM
            that of the previous one (so ``<S>`` is predicted only backward, ``</S>`` only forward); for a
            right-padded mask: at ``t``, ``labels[t + 1]`` and ``labels[t - 1]``.
        output_hidden_states: also return the layer representations (default ``config.output_hidden_states``).
        return_dict: the output dataclass (default ``config.return_dict``) or its tuple.

    Raises:
        ValueError: none or both of ``char_ids`` and ``inputs_embeds``; neither ``input_ids`` nor ``labels``.

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
                config.projection_dim,
                config.vocab_size,
                config.resolved_adaptive_cutoffs(),
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
        """Sum of NLL of ``targets (N,)`` given states ``h (N, P)`` (0, in the graph, for ``N = 0``: no branch on ``N``,
        a data-dependent size)."""
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
        char_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SesameElmoBiLMOutput | tuple:
        out = self.elmo(char_ids, attention_mask, inputs_embeds=inputs_embeds, return_dict=True)
        attention_mask = out.mask
        if labels is None:
            if input_ids is None:
                raise ValueError("SesameElmoForBidirectionalLM needs input_ids or labels (the words to predict)")
            labels = input_ids.masked_fill(attention_mask == 0, -100)
        # neighbours are neighbours among the kept tokens: pack them to the left (the identity for right padding)
        order = inverse_permutation(token_slots(attention_mask)[0])
        top = permute_rows(self.dropout(out.last_hidden_state), order)
        (hf, tf), (hb, tb) = self._directions(top, labels.gather(1, order), attention_mask.gather(1, order))
        samples = None
        if self.training and self.config.softmax == "sampled":
            samples = self._draw_samples(top.device)
        nf, nb = torch.tensor(tf.numel(), device=top.device), torch.tensor(tb.numel(), device=top.device)
        forward_loss = self._nll_sum(hf, tf, samples) / nf.clamp(min=1)
        backward_loss = self._nll_sum(hb, tb, samples) / nb.clamp(min=1)
        output = SesameElmoBiLMOutput(
            loss=(forward_loss + backward_loss) / 2,
            forward_loss=forward_loss,
            backward_loss=backward_loss,
            forward_num_tokens=nf,
            backward_num_tokens=nb,
            hidden_states=out.hidden_states if self._hidden_flag(output_hidden_states) else None,
        )
        return self._finish(output, return_dict)

    @torch.no_grad()
    def log_probs(self, char_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """Exact next-word and previous-word distributions (dropout as the current mode).

        Returns:
            ``(forward_log_probs, backward_log_probs)``, each ``(B, T, V)`` float32: at position ``t`` the
            forward LM's log P(w_{t+1} | w_1..w_t) and the backward LM's log P(w_{t-1} | w_t..w_n).
        """
        top = self.elmo(char_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state
        p = self.config.projection_dim
        return self._exact_log_probs(top[..., :p]), self._exact_log_probs(top[..., p:])


# --------------------------------------------------------------------------------------------- heads
class _TaskBiLSTM(nn.Module):
    """One-layer bidirectional LSTM over the tokens of ``mask`` (any layout: they are packed to the left first), padding
    never entering a state, or identity if size 0. ``(B, T, D)``, ``(B, T)`` -> ``(B, T, 2H)``, 0 at masked positions.

    Eager mode runs packed sequences (``pack_padded_sequence``); under ``torch.export`` each direction runs
    :func:`~.lstm_elmo.recurrence` (the same function with the same parameters, static shapes)."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True, bidirectional=True) if hidden_size else None
        self.output_size = 2 * hidden_size if hidden_size else input_size

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.lstm is None:
            return x
        slot_f, slot_b = token_slots(mask)
        x, no_autocast = full_precision(x, self.lstm)
        with no_autocast:  # float32 under autocast, as the BiLM's LSTMs
            if torch.compiler.is_exporting():
                out_f = recurrence(self.lstm, permute_rows(x, inverse_permutation(slot_f)))
                out_b = recurrence(self.lstm, permute_rows(x, inverse_permutation(slot_b)), reverse=True)
                out = torch.cat([permute_rows(out_f, slot_f), permute_rows(out_b, slot_b)], dim=-1)
            else:
                lengths = mask.sum(1).clamp(min=1).cpu()
                packed = nn.utils.rnn.pack_padded_sequence(
                    permute_rows(x, inverse_permutation(slot_f)), lengths, batch_first=True, enforce_sorted=False
                )
                out, _ = self.lstm(packed)
                out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
                out = permute_rows(out, slot_f)
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


def split_pair(token_type_ids: torch.Tensor, attention_mask: torch.Tensor, segment: int, width: int | None = None):
    """Positions of sentence ``segment`` (0 or 1) of each row, packed to the left.

    Args:
        token_type_ids, attention_mask: ``(B, T)``; a token of the sentence has type ``segment`` and mask 1.
        segment: 0 or 1.
        width: the number of slots ``T_s`` (``<= T``; a sentence longer than that is cut). Default ``T``.

    Returns ``(index (B, T_s) long, mask (B, T_s) long)``: ``index[b, i]`` is the position in the pair of the
    ``i``-th token of the sentence (0 where ``mask`` is 0). Static shapes (no host read) for a static ``width``.
    """
    sel = attention_mask.bool() & (token_type_ids == segment)
    t = sel.shape[1]
    width = t if width is None else width
    index = inverse_permutation(token_slots(sel)[0])[:, :width]  # the sentence's positions in order, then the others
    mask = (torch.arange(width, device=sel.device).unsqueeze(0) < sel.sum(1, keepdim=True)).long()
    return index * mask, mask


def _pair_width(token_type_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """The width of both sentences of a pair batch once split (:func:`split_pair`): ``T`` under ``torch.compile`` /
    ``torch.export`` (static shapes), in eager mode the longest sentence of the batch (at least 1) -- one host read
    that spares the LSTMs the steps over padding (a pair's sentences are each about half of ``T``)."""
    if torch.compiler.is_compiling():
        return token_type_ids.shape[1]
    keep = attention_mask.bool()
    return max(int(torch.stack([(keep & (token_type_ids == s)).sum(1) for s in (0, 1)]).max()), 1)


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.gather(1, index.reshape(*index.shape, *([1] * (x.dim() - 2))).expand(*index.shape, *x.shape[2:]))


def _scatter_rows(rows: torch.Tensor, index: torch.Tensor, mask: torch.Tensor, length: int) -> torch.Tensor:
    """``rows (B, W, D)`` put at the positions ``index (B, W)`` of a ``(B, length, D)`` zero tensor (the inverse of
    :func:`_gather_rows` for one sentence of a pair); rows where ``mask (B, W)`` is 0 add nothing."""
    rows = rows * mask.unsqueeze(-1).to(rows.dtype)
    out = rows.new_zeros(rows.shape[0], length, rows.shape[-1])
    return out.scatter_add(1, index.unsqueeze(-1).expand_as(rows), rows)


def _classifier(d_in: int, config) -> nn.Module:
    """The sentence classifier of the ELMo and baseline heads: dropout + linear ``d_in -> config.num_labels``, or with
    ``config.classifier_hidden_size`` one ReLU hidden layer (dropout before each linear)."""
    hid = config.classifier_hidden_size
    if not hid:
        return nn.Sequential(nn.Dropout(config.classifier_dropout), nn.Linear(d_in, config.num_labels))
    return nn.Sequential(
        nn.Dropout(config.classifier_dropout),
        nn.Linear(d_in, hid),
        nn.ReLU(),
        nn.Dropout(config.classifier_dropout),
        nn.Linear(hid, config.num_labels),
    )


def _pair_logits(model, u: torch.Tensor, v: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
    """Logits (B, num_labels): ``model.pair_classifier([u; v; |u - v|; u * v])`` where ``pair (B,)`` bool, else
    ``model.classifier(u)`` (a single sentence); ``u``, ``v`` (B, D) sentence vectors (Wang et al. 2018)."""
    pair_logits = model.pair_classifier(torch.cat([u, v, (u - v).abs(), u * v], dim=-1))
    return torch.where(pair.unsqueeze(-1), pair_logits, model.classifier(u))


def _sequence_loss(model, logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """transformers' problem-type loss (``model.loss_function``) on float32 ``logits`` (B, num_labels); ``labels``
    are cast to float32 unless they are long/int32 class ids of a problem that is not multi-label. ``None`` without
    labels."""
    if labels is None:
        return None
    ids = labels.dtype in (torch.long, torch.int) and model.config.problem_type != "multi_label_classification"
    return model.loss_function(
        labels=labels if ids else labels.float(), pooled_logits=logits.float(), config=model.config
    )


class _ElmoFeaturesMixin:
    """ELMo features for a head: the (frozen or fine-tuned) BiLM and a ScalarMix."""

    def forward(
        self,
        char_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ModelOutput | tuple:
        """The sequence and token classifiers' forward: ``char_ids (B, T, 50)`` (or ``inputs_embeds (B, T, P)``,
        layer 0 as :meth:`SesameElmoModel.get_input_embeddings` computes it), ``attention_mask (B, T)``, the head's
        ``labels``, ``output_hidden_states`` / ``return_dict`` (default: the config's); ``input_ids`` is ignored.
        ``self._head(char_ids, attention_mask, token_type_ids, inputs_embeds, labels) -> (loss, logits, layers)``
        gives ``self.output_class``, with the BiLM's ``num_layers + 1`` layers ``(B, T, 2P)`` as ``hidden_states``
        when asked.

        Raises:
            ValueError: none or both of ``char_ids`` and ``inputs_embeds``.
        """
        attention_mask = _input_mask(char_ids, inputs_embeds, attention_mask)
        loss, logits, layers = self._head(char_ids, attention_mask, token_type_ids, inputs_embeds, labels)
        hidden = layers if self._hidden_flag(output_hidden_states) else None
        return self._finish(self.output_class(loss=loss, logits=logits, hidden_states=hidden), return_dict)

    def _setup_features(self, config: SesameElmoConfig) -> None:
        self.elmo = SesameElmoModel(config)
        self.scalar_mix = ScalarMix(config.num_layers + 1, layer_norm=config.scalar_mix_layer_norm)
        self.feature_dropout = nn.Dropout(config.classifier_dropout)

    def _freeze(self) -> None:
        if self.config.freeze_backbone:
            self.elmo.requires_grad_(False)

    def _layers(self, char_ids: torch.Tensor | None, mask: torch.Tensor, inputs_embeds: torch.Tensor | None = None):
        """The BiLM's ``num_layers + 1`` layers ``(B, T, 2P)`` of ``char_ids (B, T, 50)`` (or of layer 0,
        ``inputs_embeds (B, T, P)``) under ``mask (B, T)``; a frozen BiLM runs without gradient and without dropout."""
        if self.config.freeze_backbone:  # frozen: no gradient, no dropout inside the BiLM
            was_training = self.elmo.training
            self.elmo.eval()
            with torch.no_grad():
                layers = self.elmo(char_ids, mask, inputs_embeds=inputs_embeds, return_dict=True).hidden_states
            self.elmo.train(was_training)
            return layers
        return self.elmo(char_ids, mask, inputs_embeds=inputs_embeds, return_dict=True).hidden_states

    def _mix(self, layers, mask: torch.Tensor) -> torch.Tensor:
        """The ScalarMix features ``(B, T, 2P)`` of ``layers`` (``num_layers + 1`` x ``(B, T, 2P)``), dropout applied,
        0 where ``mask (B, T)`` is 0."""
        return self.feature_dropout(self.scalar_mix(layers)) * mask.unsqueeze(-1).to(layers[0].dtype)

    def _features(self, char_ids: torch.Tensor | None, mask: torch.Tensor, inputs_embeds: torch.Tensor | None = None):
        """``char_ids (B, T, 50)`` (or layer 0, ``inputs_embeds (B, T, P)``), ``mask (B, T)`` -> ``(features, layers)``:
        the ScalarMix features ``(B, T, 2P)``, 0 at padding (dropout applied), and the BiLM's ``num_layers + 1``
        layers ``(B, T, 2P)``."""
        layers = self._layers(char_ids, mask, inputs_embeds)
        return self._mix(layers, mask), layers

    def _segment_features(self, char_ids, inputs_embeds, mask, token_type_ids):
        """ELMo features of both sentences of a pair, each run through the BiLM alone (one batched call): each
        sentence's tokens are taken from ``char_ids (B, T, 50)``, or from ``inputs_embeds (B, T, P)`` when given.

        Returns ``(segments, layers)``: ``segments = [(features (B, T_s, 2P), mask (B, T_s), index (B, T_s)) for s in
        (0, 1)]`` (``index``: each token's position in the pair; ``T_s``: :func:`_pair_width`) and the BiLM's
        ``num_layers + 1`` layers in the pair's layout, ``(B, T, 2P)``: each token's representation computed with its
        own sentence alone, 0 at padding. The features are mixed from those layers (ScalarMix works token by token),
        so the returned layers are in the graph of the features."""
        width = _pair_width(token_type_ids, mask)
        parts = [split_pair(token_type_ids, mask, s, width) for s in (0, 1)]
        source = char_ids if inputs_embeds is None else inputs_embeds
        rows = torch.cat([_gather_rows(source, index) * m.unsqueeze(-1).to(source.dtype) for index, m in parts])
        masks = torch.cat([m for _, m in parts])
        segment_layers = self._layers(rows, masks) if inputs_embeds is None else self._layers(None, masks, rows)
        b, t = mask.shape
        layers = tuple(
            sum(_scatter_rows(h[i * b : (i + 1) * b], index, m, t) for i, (index, m) in enumerate(parts))
            for h in segment_layers
        )
        feats = self._mix(layers, mask)
        segments = [(_gather_rows(feats, index) * m.unsqueeze(-1).to(feats.dtype), m, index) for index, m in parts]
        return segments, layers


class SesameElmoForSequenceClassification(_ElmoFeaturesMixin, SesameElmoPreTrainedModel):
    """Sentence / sentence-pair classification or regression on ELMo features.

    ScalarMix -> task BiLSTM -> pooling (``config.pooling``) -> MLP. For pairs (``token_type_ids`` with 1s, as the
    tokenizer makes them) each sentence is encoded alone (BiLM, BiLSTM, pooling shared) into ``u`` and ``v``,
    classified by :func:`_pair_logits`; in a batch that mixes pairs and single sentences each row is classified as
    what it is. The loss: :func:`_sequence_loss` (MSE when ``num_labels == 1``).

    Forward (:meth:`_ElmoFeaturesMixin.forward`): ``token_type_ids (B, T)`` optional (a pair's ``inputs_embeds`` laid
    out as ``char_ids``), ``labels (B,)`` long (float for regression) -> ``SequenceClassifierOutput``, ``logits (B,
    num_labels)``; a pair's ``hidden_states`` are each token's from its own sentence alone.
    """

    output_class = SequenceClassifierOutput

    def __init__(self, config: SesameElmoConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._setup_features(config)
        self.encoder = _TaskBiLSTM(config.hidden_size, config.task_hidden_size)
        self.pooler = _Pooler(config, self.encoder.output_size)
        d = self.pooler.output_size
        self.pair_classifier = _classifier(4 * d, config)
        self.classifier = _classifier(d, config)
        self.post_init()
        self._freeze()

    def _encode(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.pooler(self.encoder(feats, mask), mask)

    def _head(self, char_ids, attention_mask, token_type_ids, inputs_embeds, labels):
        pair = None if token_type_ids is None else (token_type_ids.bool() & attention_mask.bool()).any(dim=1)  # (B,)
        # Eager mode skips the split when no row is a pair (one host read; the result is the same); a captured graph
        # (torch.export / torch.compile) always takes the general path, which decides row by row.
        if pair is not None and (torch.compiler.is_compiling() or bool(pair.any())):
            segments, layers = self._segment_features(char_ids, inputs_embeds, attention_mask, token_type_ids)
            (fa, ma, _), (fb, mb, _) = segments
            u, v = self._encode(fa, ma), self._encode(fb, mb)
            logits = _pair_logits(self, u, v, pair)
        else:
            feats, layers = self._features(char_ids, attention_mask, inputs_embeds)
            logits = self.classifier(self._encode(feats, attention_mask))
            # + 0 * (the pair classifier's weights): every parameter takes part in the graph, as DistributedDataParallel
            # (find_unused_parameters=False) requires; the gradient it gets is 0.
            logits = logits + 0.0 * sum(p.sum() for p in self.pair_classifier.parameters())
        return _sequence_loss(self, logits, labels), logits, layers


class SesameElmoForTokenClassification(_ElmoFeaturesMixin, SesameElmoPreTrainedModel):
    """Per-token tagging (NER, POS, ...): ScalarMix -> task BiLSTM -> linear.

    Forward (:meth:`_ElmoFeaturesMixin.forward`): ``labels (B, T)`` long with -100 ignored ->
    ``TokenClassifierOutput``, ``logits (B, T, num_labels)``.
    """

    output_class = TokenClassifierOutput

    def __init__(self, config: SesameElmoConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._setup_features(config)
        self.encoder = _TaskBiLSTM(config.hidden_size, config.task_hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(self.encoder.output_size, config.num_labels)
        self.post_init()
        self._freeze()

    def _head(self, char_ids, attention_mask, token_type_ids, inputs_embeds, labels):
        feats, layers = self._features(char_ids, attention_mask, inputs_embeds)
        logits = self.classifier(self.dropout(self.encoder(feats, attention_mask)))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
        return loss, logits, layers


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

    Forward args: ``char_ids`` (or ``inputs_embeds (B, T, P)``, layer 0, laid out as ``char_ids``),
    ``attention_mask``, ``token_type_ids`` (required), ``start_positions`` / ``end_positions`` ``(B,)`` long
    (positions in the pair), ``output_hidden_states``, ``return_dict`` (defaults from the config). Returns
    ``QuestionAnsweringModelOutput``; ``hidden_states`` when asked: the BiLM's ``num_layers + 1`` layers ``(B, T,
    2P)``, each token's from its own sentence alone.

    Raises:
        ValueError: no ``token_type_ids``; none or both of ``char_ids`` and ``inputs_embeds``.
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
        char_ids=None,
        attention_mask=None,
        token_type_ids=None,
        input_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        if token_type_ids is None:
            raise ValueError("SesameElmoForQuestionAnswering needs token_type_ids (0 = question, 1 = context)")
        attention_mask = _input_mask(char_ids, inputs_embeds, attention_mask)
        segments, layers = self._segment_features(char_ids, inputs_embeds, attention_mask, token_type_ids)
        (fq, mq, _), (fc, mc, ic) = segments
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
            loss = (
                F.cross_entropy(start_logits.float(), sp, ignore_index=t)
                + F.cross_entropy(end_logits.float(), ep, ignore_index=t)
            ) / 2
        hidden = layers if self._hidden_flag(output_hidden_states) else None
        output = QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=hidden
        )
        return self._finish(output, return_dict)
