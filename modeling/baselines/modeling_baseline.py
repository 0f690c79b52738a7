"""The classic sentence encoders that the GLUE paper (Wang et al. 2018) used as baselines, as one model family: the
word vectors, the ELMo features and the models; the encoders are in ``encoders_baseline.py``.

Word vectors (:class:`WordVectors`): for ``"fasttext"`` (Joulin et al. 2017, "Bag of Tricks for Efficient Text
Classification") the subword vectors of Bojanowski et al. (2017): a word's vector is the mean of its word embedding
and the embeddings of its hashed character n-grams (``<word>``, lengths ``ngram_min_n..ngram_max_n``, FNV-1a hash
modulo ``ngram_buckets``, exactly fastText's / gensim's ``ft_ngram_hashes``; a word outside the vocabulary gets the
mean of its n-gram embeddings only).

Input is the ELMo-style word tokenizer's output (``input_ids`` word ids, ``char_ids`` UTF-8 bytes per word,
``attention_mask``, ``token_type_ids`` 0/1 for pairs ``<S> a </S> <S> b </S>``). The ``<S>``/``</S>``
markers and padding are dropped: a sentence is its words. Pairs are encoded sentence by sentence with
shared weights into ``u`` and ``v`` and classified from ``[u; v; |u - v|; u * v]`` (Conneau et al. 2017;
the GLUE baselines).

ELMo features (``config.elmo_config``; Peters et al. 2018, "Deep contextualized word representations", section 3.3):
a frozen pretrained BiLM (:class:`~modeling.elmo.SesameElmoModel`, run in eval mode without gradient, each sentence
alone with its ``<S>``/``</S>``) gives ``L + 1`` layers per word; a task-specific ScalarMix (``gamma * sum_j
softmax(s)_j h_j``, eq. 1, trained with the task model) mixes them, dropout follows, and the mixture is concatenated
to each word vector before the encoder (:class:`ElmoFeatures`).

Imports only torch, transformers and sibling files (remote code): the configuration, the encoders, and the ELMo family's
``configuration_elmo``, ``lstm_elmo`` and ``modeling_elmo`` (in the package, links to ``modeling/elmo``'s files, the
same modules; ``save_pretrained`` copies them into every baseline folder).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPooling, SequenceClassifierOutput, TokenClassifierOutput

from .configuration_baseline import SesameBaselineConfig
from .configuration_elmo import SesameElmoConfig
from .encoders_baseline import ENCODERS, TreeLSTMEncoder, masked_pool
from .modeling_elmo import (
    ScalarMix,
    SesameElmoModel,
    _classifier,
    _OutputFlags,
    _pair_logits,
    _sequence_loss,
)

# --------------------------------------------------------------------------------------------------------------
# fastText's character n-gram hashing


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a hash of ``data`` as fastText computes it (``Dictionary::hash``): each byte is read as a
    signed ``int8`` and sign-extended before the XOR, so bytes >= 0x80 XOR in ``0xFFFFFF00 | b``
    (gensim's ``ft_hash_bytes`` keeps this for compatibility). Returns an int in ``[0, 2**32)``."""
    h = 2166136261
    for b in data:
        h = ((h ^ (b | 0xFFFFFF00 if b >= 0x80 else b)) * 16777619) & 0xFFFFFFFF
    return h


def ngram_bucket_ids(word: str, min_n: int, max_n: int, num_buckets: int) -> list[int]:
    """Bucket ids of the character n-grams of ``<word>`` (Bojanowski et al. 2017): every substring of
    ``min_n..max_n`` characters (Unicode characters, hashed as UTF-8 bytes), the whole ``<word>`` included
    when short enough; ``fnv1a_32(ngram) % num_buckets``. The same multiset as gensim's ``ft_ngram_hashes``."""
    ext = f"<{word}>"
    return [
        fnv1a_32(ext[i : i + n].encode("utf-8")) % num_buckets
        for n in range(min_n, min(len(ext), max_n) + 1)
        for i in range(len(ext) - n + 1)
    ]


def chars_to_word(row: list[int]) -> str:
    """The word of one row of ELMo character ids (``[bow, byte + 1, ..., eow, pad, ...]``); bytes cut inside a
    multi-byte character (the tokenizer keeps 48 bytes) are dropped."""
    data = bytes(c - 1 for c in row[1:] if 1 <= c <= 256)
    return data.decode("utf-8", errors="ignore")


# --------------------------------------------------------------------------------------------------------------
# Sentences: the words of each sequence (or of each sentence of a pair), packed to the left


def pack_words(select: torch.Tensor, max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of the selected tokens of each row, in order, packed to the left.

    Args:
        select: ``(B, T)`` bool, the tokens that belong to the sentence.
        max_len: width ``W`` of the result (default ``T``; a longer sentence is cut). Index arithmetic only (cumulative
            sums, a scatter): static shapes, no host read.

    Returns:
        ``index (B, W)`` long (position in the row; 0 where unused) and ``mask (B, W)`` bool.
    """
    t = select.shape[1]
    width = t if max_len is None else max_len
    n = select.sum(1, keepdim=True)
    slot = torch.where(select, select.cumsum(1) - 1, n + (~select).cumsum(1) - 1)  # the words first, then the others
    positions = torch.arange(t, device=select.device).expand_as(slot)
    order = torch.empty_like(slot).scatter_(1, slot, positions)[:, :width]
    if order.shape[1] < width:
        order = F.pad(order, (0, width - order.shape[1]))
    mask = torch.arange(width, device=select.device).unsqueeze(0) < n
    return order * mask, mask


def sentence_width(select: torch.Tensor) -> int:
    """The width to pack the sentences ``select (B, T)`` bool to: ``T`` under ``torch.compile`` / ``torch.export``
    (static shapes); in eager mode the longest sentence (at least 1) -- one host read that spares the encoders the
    positions of ``<S>``, ``</S>``, padding and, for pairs, the other sentence."""
    if torch.compiler.is_compiling() or not select.numel():
        return max(select.shape[1], 1)
    return max(int(select.sum(1).max()), 1)


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b, i]]`` for ``x`` of shape ``(B, T, ...)``."""
    return x.gather(1, index.reshape(*index.shape, *([1] * (x.dim() - 2))).expand(*index.shape, *x.shape[2:]))


def unpack_words(rows: torch.Tensor, index: torch.Tensor, mask: torch.Tensor, length: int) -> torch.Tensor:
    """The inverse of packing (:func:`pack_words`): ``rows (B, W, D)`` put back at the positions ``index (B, W)`` of a
    ``(B, length, D)`` zero tensor; rows where ``mask (B, W)`` is False add nothing."""
    rows = rows * mask.unsqueeze(-1).to(rows.dtype)
    out = rows.new_zeros(rows.shape[0], length, rows.shape[-1])
    return out.scatter_add(1, index.unsqueeze(-1).expand_as(rows), rows)


# --------------------------------------------------------------------------------------------------------------
# Word vectors


class WordVectors(nn.Module):
    """Word vectors ``(B, T, embedding_dim)``: a word embedding (fine-tuned unless ``embedding_mode="static"``),
    for fastText averaged with the word's character n-gram embeddings, and for ``"multichannel"`` a second,
    frozen channel (returned as ``(2, B, T, E)``: the frozen then the fine-tuned vectors)."""

    def __init__(self, config: SesameBaselineConfig):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=config.pad_token_id)
        self.static_embeddings = (
            nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=config.pad_token_id)
            if config.embedding_mode == "multichannel"
            else None
        )
        self.ngram_embeddings = (
            nn.EmbeddingBag(config.ngram_buckets, config.embedding_dim, mode="sum")
            if config.encoder_type == "fasttext"
            else None
        )
        self.dropout = nn.Dropout(config.embedding_dropout)
        self._ngram_cache: dict[tuple[int, ...], list[int]] = {}

    def freeze(self) -> None:
        """Mark what ``embedding_mode`` keeps fixed (static: all; multichannel: the static channel) as not
        requiring gradients. The forward pass also reads those weights detached, so they stay fixed even where
        loading (``from_pretrained``) hands back parameters that require gradients (their ``grad`` stays None,
        which optimizers skip)."""
        if self.config.embedding_mode == "static":
            self.requires_grad_(False)
        if self.static_embeddings is not None:
            self.static_embeddings.requires_grad_(False)

    def _weight(self, module: nn.Module, frozen: bool) -> torch.Tensor:
        return module.weight.detach() if frozen else module.weight

    def _ngrams(self, row: tuple[int, ...]) -> list[int]:
        ids = self._ngram_cache.get(row)
        if ids is None:
            c = self.config
            ids = ngram_bucket_ids(chars_to_word(list(row)), c.ngram_min_n, c.ngram_max_n, c.ngram_buckets)
            if len(self._ngram_cache) < 1_000_000:
                self._ngram_cache[row] = ids
        return ids

    def fasttext_vectors(self, input_ids: torch.Tensor, char_ids: torch.Tensor) -> torch.Tensor:
        """fastText word vectors ``(N, E)`` of ``N`` words: ``(w + sum of n-gram vectors) / (1 + #n-grams)``
        for words in the vocabulary, ``sum / #n-grams`` for ``<UNK>`` (as gensim's ``FastTextKeyedVectors``).

        Args:
            input_ids: ``(N,)`` word ids. char_ids: ``(N, 50)`` ELMo character ids of the same words.
        """
        rows, inverse = torch.unique(char_ids, dim=0, return_inverse=True)
        buckets = [self._ngrams(tuple(r)) for r in rows.tolist()]
        flat = torch.tensor([b for bs in buckets for b in bs], dtype=torch.long, device=char_ids.device)
        offsets = torch.tensor([0] + [len(bs) for bs in buckets[:-1]], dtype=torch.long, device=char_ids.device).cumsum(
            0
        )
        counts = torch.tensor([len(bs) for bs in buckets], device=char_ids.device)[inverse]
        static = self.config.embedding_mode == "static"
        sums = F.embedding_bag(flat, self._weight(self.ngram_embeddings, static), offsets, mode="sum")[inverse]
        known = (input_ids != self.config.unk_token_id) | (counts == 0)
        word = F.embedding(input_ids, self._weight(self.word_embeddings, static)) * known.unsqueeze(-1)
        return (word + sums) / (counts + known.long()).clamp(min=1).unsqueeze(-1).to(sums.dtype)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        char_ids: torch.Tensor | None,
        mask: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``input_ids (B, T)`` (+ ``char_ids (B, T, 50)`` for fastText), ``mask (B, T)`` bool (the words) ->
        ``(B, T, E)`` float, 0 where ``mask`` is False (``(2, B, T, E)`` for multichannel: the frozen channel, then the
        fine-tuned one). ``inputs_embeds (B, T, E)`` replaces the embedding lookup (``input_ids`` is not read).

        Raises:
            ValueError: fastText without ``char_ids``; ``inputs_embeds`` for fastText (its vectors need the
                characters of each word) or multichannel embeddings (the frozen channel needs the word ids).
        """
        m = mask.unsqueeze(-1)
        if inputs_embeds is not None:
            if self.ngram_embeddings is not None or self.static_embeddings is not None:
                c = self.config
                raise ValueError(
                    f"inputs_embeds: not for encoder_type={c.encoder_type!r} with embedding_mode="
                    f"{c.embedding_mode!r} (fastText's vectors need the characters, a multichannel CNN's "
                    "frozen channel the word ids); pass input_ids (and char_ids)"
                )
            return self.dropout(inputs_embeds) * m
        if self.ngram_embeddings is not None:
            if char_ids is None:
                raise ValueError("encoder_type='fasttext' needs char_ids (the ELMo-style tokenizer's output)")
            sel = mask.reshape(-1)
            flat = torch.zeros(
                sel.shape[0],
                self.config.embedding_dim,
                device=input_ids.device,
                dtype=self.word_embeddings.weight.dtype,
            )
            if bool(sel.any()):
                flat = flat.index_put(
                    (sel.nonzero().squeeze(1),),
                    self.fasttext_vectors(input_ids.reshape(-1)[sel], char_ids.reshape(-1, char_ids.shape[-1])[sel]),
                )
            x = flat.reshape(*input_ids.shape, -1)
        else:
            x = F.embedding(input_ids, self._weight(self.word_embeddings, self.config.embedding_mode == "static"))
        x = self.dropout(x) * m
        if self.static_embeddings is not None:
            return torch.stack(
                [self.dropout(F.embedding(input_ids, self._weight(self.static_embeddings, True))) * m, x]
            )
        return x


# --------------------------------------------------------------------------------------------------------------
# ELMo features


class ElmoFeatures(nn.Module):
    """A frozen ELMo BiLM and the task-specific ScalarMix(es) over its layers (Peters et al. 2018, section 3.3).

    ``bilm``: a :class:`~modeling.elmo.SesameElmoModel` built from ``config.elmo_config``. It always runs in eval mode
    (no dropout inside it, whatever ``train()`` says) under ``torch.no_grad()``, and its parameters do not require
    gradients: training the task model never changes it (an optimizer sees no gradient for it, so it does not
    step it, weight decay included). ``input_mix`` (and ``output_mix`` with ``config.elmo_at_output``): a
    :class:`~modeling.elmo.ScalarMix` over the ``L + 1`` layers, ``gamma * sum_j softmax(s)_j h_j`` (eq. 1), trained
    with the task model; ``dropout`` (``config.elmo_dropout``) on each mixture.

    Cache (``config.elmo_cache_mb`` > 0, eager mode): the frozen BiLM gives a sentence the same layers every time, so
    they are kept per distinct sentence (its character ids) up to that many MiB of float32, and a fixed training set
    passes through the BiLM once instead of once per epoch. Kept as computed the first time (in the batch it came
    in, where matrix products may round the last bit differently than in another batch); when full, new sentences
    are computed and not kept.
    """

    def __init__(self, config: SesameBaselineConfig):
        super().__init__()
        bilm_config = SesameElmoConfig(**{k: v for k, v in config.elmo_config.items() if k != "auto_map"})
        self.bilm = SesameElmoModel(bilm_config)
        self.bilm.requires_grad_(False)
        layers = bilm_config.num_layers + 1
        self.input_mix = ScalarMix(layers)
        self.output_mix = ScalarMix(layers) if config.elmo_at_output else None
        self.dropout = nn.Dropout(config.elmo_dropout)
        self.l2_coef = config.elmo_l2_coef
        self.cache_bytes = int(config.elmo_cache_mb) * 2**20
        self._cache: dict[bytes, torch.Tensor] = {}
        self._cached_bytes = 0
        self.bilm.eval()

    def train(self, mode: bool = True) -> ElmoFeatures:
        """Set the mixes' mode; the BiLM stays in eval mode (frozen features: no dropout inside it)."""
        super().train(mode)
        self.bilm.eval()
        return self

    def layers(self, char_ids: torch.Tensor, sentences: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The BiLM's ``L + 1`` layers of each sentence, every sentence run alone.

        Args:
            char_ids: ``(B, T, 50)`` long, ELMo character ids of the rows (the ELMo-style tokenizer's ``char_ids``).
            sentences: ``(S, B, T)`` bool, the tokens of each of the ``S`` sentences of a row (a pair's two; with
                their ``<S>``/``</S>``, as the BiLM was trained). Sentences do not overlap.

        Returns:
            ``L + 1`` tensors ``(B, T, 2P)`` float: each token's representation computed from its own sentence
            alone, 0 where no sentence has a token. Computed without gradient; the packing of each sentence to the
            left (one host read for the width in eager mode) does not change the values.
        """
        s, b, t = sentences.shape
        flat = sentences.flatten(0, 1)
        index, keep = pack_words(flat, sentence_width(flat))
        rows = _take(char_ids.repeat(s, 1, 1), index) * keep.unsqueeze(-1).to(char_ids.dtype)
        if self.cache_bytes and not torch.compiler.is_compiling():
            hidden = self._cached_layers(rows, keep)
        else:
            with torch.no_grad():
                hidden = self.bilm(rows, keep.long(), return_dict=True).hidden_states
        return tuple(unpack_words(h.float(), index, keep, t).unflatten(0, (s, b)).sum(0) for h in hidden)

    def _cached_layers(self, rows: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The BiLM's layers of the packed sentences ``rows (N, W, 50)`` / ``keep (N, W)`` bool, from the cache where
        a sentence is in it; the others in one BiLM call (and kept while the cache has room)."""
        lengths = keep.sum(1).tolist()
        keys = [rows[i, :n].to(torch.int16).cpu().numpy().tobytes() for i, n in enumerate(lengths)]
        missing = [i for i, (k, n) in enumerate(zip(keys, lengths)) if n and k not in self._cache]
        found: dict[int, torch.Tensor] = {}
        if missing:
            sub, sub_keep = rows[missing], keep[missing]
            width = max(lengths[i] for i in missing)
            with torch.no_grad():
                layers = self.bilm(sub[:, :width], sub_keep[:, :width].long(), return_dict=True).hidden_states
            stacked = torch.stack([h.float() for h in layers], dim=1)  # (M, L + 1, width, 2P)
            for j, i in enumerate(missing):
                found[i] = value = stacked[j, :, : lengths[i]].clone()
                size = value.numel() * value.element_size()
                if self._cached_bytes + size <= self.cache_bytes and keys[i] not in self._cache:
                    self._cache[keys[i]] = value
                    self._cached_bytes += size
        n_layers = self.input_mix.num_layers
        out = rows.new_zeros(
            (rows.shape[0], n_layers, rows.shape[1], self.bilm.config.projection_dim * 2), dtype=torch.float32
        )
        for i, n in enumerate(lengths):
            if n:
                out[i, :, :n] = found[i] if i in found else self._cache[keys[i]]
        return tuple(out.unbind(1))

    def mix(self, layers: tuple[torch.Tensor, ...], mask: torch.Tensor, output: bool = False) -> torch.Tensor:
        """The ScalarMix (``output_mix`` when ``output``) of ``layers`` (``L + 1`` x ``(B, T, 2P)``), dropout applied,
        0 where ``mask (B, T)`` bool is False: ``(B, T, 2P)`` float."""
        mixer = self.output_mix if output else self.input_mix
        return self.dropout(mixer(layers)) * mask.unsqueeze(-1).to(layers[0].dtype)

    def l2_penalty(self) -> torch.Tensor:
        """``elmo_l2_coef * ||s||^2`` summed over the mixes (the paper's regulariser of the layer weights ``s``,
        before the softmax); a 0-dim float tensor."""
        mixes = [m for m in (self.input_mix, self.output_mix) if m is not None]
        return self.l2_coef * sum((m.scalar_parameters**2).sum() for m in mixes)


# --------------------------------------------------------------------------------------------------------------
# Models


class SesameBaselinePreTrainedModel(_OutputFlags, PreTrainedModel):
    """Weights initialisation and the config class of every SesameBaseline model."""

    config_class = SesameBaselineConfig
    base_model_prefix = "baseline"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """``PreTrainedModel.from_pretrained``, then the fixed parts marked again as not requiring gradients (loading
        hands back parameters that require them): static embeddings and the ELMo BiLM (see
        :meth:`SesameBaselineModel.freeze`)."""
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        getattr(model, model.base_model_prefix, model).freeze()
        return loaded

    def _head_output(self, output_class, loss, logits, hidden, output_hidden_states, return_dict):
        """A head's ``output_class`` (or its tuple, :meth:`_finish`): ``loss`` (``None`` without labels) plus the
        frozen BiLM's ScalarMix L2 penalty (:meth:`ElmoFeatures.l2_penalty`) when ``elmo_l2_coef`` is set,
        ``logits``, and the encoder's ``hidden`` states when asked (:meth:`_hidden_flag`)."""
        elmo = self.baseline.elmo
        if loss is not None and elmo is not None and elmo.l2_coef:
            loss = loss + elmo.l2_penalty()
        hidden = hidden if self._hidden_flag(output_hidden_states) else None
        return self._finish(output_class(loss=loss, logits=logits, hidden_states=hidden), return_dict)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
                fill = getattr(module, "bias_fill", None)  # (start, end, value): the Tree-LSTM's forget-gate biases
                if fill is not None and not getattr(module.bias, "_is_hf_initialized", False):
                    with torch.no_grad():
                        module.bias[fill[0] : fill[1]].fill_(fill[2])
        elif isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            init.normal_(module.weight, mean=0.0, std=0.1)  # a random-initialisation scale close to trained vectors'
            if getattr(module, "padding_idx", None) is not None and not getattr(
                module.weight, "_is_hf_initialized", False
            ):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, (nn.LSTM, nn.GRU)):
            for name, param in module.named_parameters():
                (init.xavier_uniform_ if "weight" in name else init.zeros_)(param)
            if isinstance(module, nn.LSTM) and not getattr(module.bias_ih_l0, "_is_hf_initialized", False):
                h = module.hidden_size
                with torch.no_grad():
                    for name, param in module.named_parameters():
                        if name.startswith("bias_ih"):
                            param[h : 2 * h].fill_(1.0)  # forget gate
        elif isinstance(module, TreeLSTMEncoder):
            init.normal_(module.query, mean=0.0, std=0.1)
        elif isinstance(module, ScalarMix):  # equal layer weights, gamma 1 (the BiLM's own weights are loaded)
            init.zeros_(module.scalar_parameters)
            init.ones_(module.gamma)


class SesameBaselineModel(SesameBaselinePreTrainedModel):
    """Sentence vectors from one of the classic encoders (``config.encoder_type``).

    Forward args: ``input_ids (B, T)`` long word ids, ``char_ids (B, T, 50)`` (fastText), ``attention_mask (B, T)``,
    ``token_type_ids (B, T)`` (with 1s: only sentence ``segment`` is encoded), ``tree_merges`` (Tree-LSTM over
    given trees, single sentences), ``inputs_embeds (B, T, E)`` instead of ``input_ids``: the word vectors
    (``get_input_embeddings()(input_ids)``; not for fastText, whose vectors need the characters, nor a multichannel
    CNN) -- every position of ``attention_mask`` is then a word (mask ``<S>``/``</S>`` out: without the word ids the
    model cannot see them), ``output_hidden_states`` and ``return_dict`` (defaults from the config).

    Returns ``BaseModelOutputWithPooling`` (or its tuple): ``pooler_output (B, D)`` float, the sentence vector (``D =
    output_size``); ``hidden_states`` (when asked), each ``(B, T, .)`` at the input positions, 0 elsewhere (``<S>``,
    ``</S>``, padding, the other sentence): the word vectors ``(B, T, E)`` (what the encoder reads; the fine-tuned
    channel of a multichannel CNN), then for "rnn" and "treelstm" the encoder's token states ``(B, T, H)`` (the
    RNN's top-layer states, the Tree-LSTM's leaves); every one in the graph of ``pooler_output``;
    ``last_hidden_state``: the last of them (the word vectors for cbow / fasttext / cnn).

    Static shapes: under ``torch.export`` / ``torch.compile`` nothing in ``forward`` reads tensor values back; eager
    mode reads some for speed, with the same result: the cut of the packed sentences to the longest one
    (:func:`sentence_width`; ``T`` in a graph), the RNN's packed sequences (lengths on the host; a ``scan`` loop under
    ``torch.export``) and the classifier's single-sentence path. fastText's n-gram hashing (Python over the characters)
    and the checks of given trees read values in any mode: neither exports. Gradient checkpointing recomputes the
    encoder in the backward pass.

    Raises:
        ValueError: none or both of ``input_ids`` and ``inputs_embeds``; see :meth:`WordVectors.forward`.
    """

    gradient_checkpointing = False  # set by gradient_checkpointing_enable(): recompute the encoder in backward

    def __init__(self, config: SesameBaselineConfig):
        super().__init__(config)
        self.embeddings = WordVectors(config)
        self.elmo = ElmoFeatures(config) if config.elmo_config else None
        self.encoder = ENCODERS[config.encoder_type](config)
        self.output_size = self.encoder.output_size + (config.elmo_dim if config.elmo_at_output else 0)
        self.post_init()
        self.freeze()

    def freeze(self) -> None:
        """Mark the fixed parts as not requiring gradients: the embeddings ``embedding_mode`` keeps fixed and the
        ELMo BiLM (its forward runs without gradient in any case)."""
        self.embeddings.freeze()
        if self.elmo is not None:
            self.elmo.bilm.requires_grad_(False)

    def elmo_layers(self, char_ids, attention_mask, token_type_ids=None, segments=(None,)):
        """The frozen BiLM's ``L + 1`` layers ``(B, T, 2P)`` for the sentences ``segments`` of each row (``None``: the
        whole row; 0 / 1: the tokens of that ``token_type_ids`` value), each sentence run alone; ``None`` without ELMo.

        Raises:
            ValueError: ELMo features without ``char_ids``.
        """
        if self.elmo is None:
            return None
        if char_ids is None:
            raise ValueError("ELMo features (config.elmo_config) need char_ids (the ELMo-style tokenizer's output)")
        keep = attention_mask.bool()
        sentences = torch.stack([keep if s is None else keep & (token_type_ids == s) for s in segments])
        return self.elmo.layers(char_ids, sentences)

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embeddings.word_embeddings = value

    def sentence_mask(self, input_ids, attention_mask, token_type_ids=None, segment: int | None = None) -> torch.Tensor:
        """``(B, T)`` bool: the words of the sentence (no ``<S>``/``</S>``, no padding; of ``segment`` if given).
        Without ``input_ids`` (``inputs_embeds``): the positions of ``attention_mask`` (required then)."""
        c = self.config
        if input_ids is not None:
            select = (input_ids != c.pad_token_id) & (input_ids != c.bos_token_id) & (input_ids != c.eos_token_id)
        else:
            select = torch.ones_like(attention_mask, dtype=torch.bool)
        if attention_mask is not None:
            select &= attention_mask.bool()
        if segment is not None:
            if token_type_ids is None:
                raise ValueError(f"segment={segment} needs token_type_ids (0 / 1 for the two sentences of a pair)")
            select &= token_type_ids == segment
        return select

    def encode(self, input_ids, char_ids, select, tree_merges=None, inputs_embeds=None, elmo_layers=None):
        """Encode the words ``select`` bool of each row: ``(B, T)``, one sentence per row, or ``(S, B, T)``, ``S``
        sentences per row (a pair's two), each encoded alone. With ELMo, ``elmo_layers`` (:meth:`elmo_layers`) are
        mixed and concatenated to the word vectors (a multichannel CNN's frozen channel gets zeros there: the
        features enter once), and with ``elmo_at_output`` the second mixture, pooled, to the sentence vector.

        Returns ``(hidden states, sentences (S * B, D))`` (sentence ``s`` of row ``b`` at ``s * B + b``), the hidden
        states as :class:`SesameBaselineModel` returns them, each ``(B, T, .)`` with every sentence's words at their
        input positions. Each sentence's words are packed to the left from the returned hidden states (a gather), so
        that those are in the graph of the sentence vectors.
        """
        if tree_merges is not None and not isinstance(self.encoder, TreeLSTMEncoder):
            raise ValueError(f"tree_merges is for encoder_type='treelstm', not {self.config.encoder_type!r}")
        selects = select if select.dim() == 3 else select.unsqueeze(0)
        t = selects.shape[-1]
        width = sentence_width(selects.flatten(0, 1))
        packed = [pack_words(sel, width) for sel in selects]
        index, mask = torch.cat([i for i, _ in packed]), torch.cat([m for _, m in packed])  # (S * B, W)
        keep = mask.unsqueeze(-1)

        def gather(full):  # (B, T, D) -> (S * B, W, D), 0 at unused slots
            return _take(full.repeat(len(packed), 1, 1), index) * keep.to(full.dtype)

        words = self.embeddings(input_ids, char_ids, selects.any(0), inputs_embeds)  # (B, T, E) or (2, B, T, E)
        if self.elmo is not None:
            feats = self.elmo.mix(elmo_layers, selects.any(0)).to(words.dtype)  # (B, T, 2P)
            if words.dim() == 4:
                words = torch.stack(
                    [torch.cat([words[0], torch.zeros_like(feats)], -1), torch.cat([words[1], feats], -1)]
                )
            else:
                words = torch.cat([words, feats], dim=-1)
        x = torch.stack([gather(w) for w in words]) if words.dim() == 4 else gather(words)
        hidden = (words[-1] if words.dim() == 4 else words,)
        checkpoint = None
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            checkpoint = self._gradient_checkpointing_func
        states = self.encoder.states(x, mask) if checkpoint is None else checkpoint(self.encoder.states, x, mask)
        if self.encoder.token_states:  # put back at the input positions, then read again from there
            per_sentence = states.unflatten(0, (len(packed), selects.shape[1])).unbind(0)  # not chunk: see the pairs
            hidden += (sum(unpack_words(st, i, m, t) for st, (i, m) in zip(per_sentence, packed)),)
            states = gather(hidden[-1])
        extra = (tree_merges,) if isinstance(self.encoder, TreeLSTMEncoder) else ()
        pool = self.encoder.pool
        sentence = pool(states, mask, x, *extra) if checkpoint is None else checkpoint(pool, states, mask, x, *extra)
        if self.elmo is not None and self.elmo.output_mix is not None:
            kind = (
                self.config.pooling
                if self.config.encoder_type == "rnn" and self.config.pooling != "attention"
                else "max"
            )
            out = gather(self.elmo.mix(elmo_layers, selects.any(0), output=True).to(sentence.dtype))
            sentence = torch.cat([sentence, masked_pool(out, mask, kind)], dim=-1)
        return hidden, sentence

    def _inputs(self, input_ids, inputs_embeds, attention_mask):
        """``attention_mask``, or by default: the positions that are not ``<pad>`` (all of ``inputs_embeds``).

        Raises:
            ValueError: none or both of ``input_ids`` and ``inputs_embeds``.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(
                f"{type(self).__name__} needs exactly one of input_ids (word ids of the ELMo-style "
                "tokenizer) or inputs_embeds (B, T, embedding_dim)"
            )
        if attention_mask is not None:
            return attention_mask
        if input_ids is not None:
            return input_ids != self.config.pad_token_id
        return torch.ones(inputs_embeds.shape[:2], dtype=torch.bool, device=inputs_embeds.device)

    def forward(
        self,
        input_ids=None,
        char_ids=None,
        attention_mask=None,
        token_type_ids=None,
        tree_merges=None,
        segment: int | None = None,
        inputs_embeds=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> BaseModelOutputWithPooling | tuple:
        attention_mask = self._inputs(input_ids, inputs_embeds, attention_mask)
        select = self.sentence_mask(input_ids, attention_mask, token_type_ids, segment)
        if segment is not None:
            segments = (segment,)
        elif token_type_ids is not None and (
            torch.compiler.is_compiling() or bool((token_type_ids.bool() & attention_mask.bool()).any())
        ):
            segments = (0, 1)  # a pair's sentences, each through the BiLM alone
        else:
            segments = (None,)
        layers = self.elmo_layers(char_ids, attention_mask, token_type_ids, segments)
        hidden, sentence = self.encode(input_ids, char_ids, select, tree_merges, inputs_embeds, layers)
        output = BaseModelOutputWithPooling(
            last_hidden_state=hidden[-1],
            pooler_output=sentence,
            hidden_states=hidden if self._hidden_flag(output_hidden_states) else None,
        )
        return self._finish(output, return_dict)


class SesameBaselineForSequenceClassification(SesameBaselinePreTrainedModel):
    """Sentence / sentence-pair classification or regression with a classic encoder.

    Single sentences: ``classifier(u)``. Pairs (rows whose ``token_type_ids`` have 1s, as the tokenizer makes them):
    each sentence is encoded alone with the same encoder into ``u`` and ``v``, classified by ELMo's ``_pair_logits``
    (Wang et al. 2018); in a batch that mixes both, each row is classified as what it is. A linear classifier
    (``classifier_hidden_size=0``) or one hidden layer. The loss: ELMo's ``_sequence_loss`` (MSE when
    ``num_labels == 1``).

    Forward args: ``input_ids (B, T)`` (or ``inputs_embeds (B, T, E)``, see :class:`SesameBaselineModel`),
    ``char_ids (B, T, 50)``, ``attention_mask (B, T)``, ``token_type_ids (B, T)`` optional, ``tree_merges`` optional
    (single sentences), ``labels (B,)`` long (float for regression), ``output_hidden_states``, ``return_dict``
    (defaults from the config). Returns ``SequenceClassifierOutput`` (or its tuple) with ``logits (B, num_labels)``,
    ``loss`` and, when asked, ``hidden_states`` as :class:`SesameBaselineModel`'s (for a pair, both sentences' in the
    pair's layout).

    Raises:
        ValueError: none or both of ``input_ids`` and ``inputs_embeds``; ``tree_merges`` with pairs.
    """

    def __init__(self, config: SesameBaselineConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.baseline = SesameBaselineModel(config)
        d = self.baseline.output_size
        self.classifier = _classifier(d, config)
        self.pair_classifier = _classifier(4 * d, config)
        self.post_init()
        self.baseline.freeze()

    def forward(
        self,
        input_ids=None,
        char_ids=None,
        attention_mask=None,
        token_type_ids=None,
        tree_merges=None,
        labels=None,
        inputs_embeds=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        model = self.baseline
        attention_mask = model._inputs(input_ids, inputs_embeds, attention_mask)
        pair = None if token_type_ids is None else (token_type_ids.bool() & attention_mask.bool()).any(dim=1)  # (B,)
        # Eager mode skips the second sentence when no row has one (one host read; the same result); a captured graph
        # (torch.export / torch.compile) always takes the general path, which decides row by row.
        if pair is not None and (torch.compiler.is_compiling() or bool(pair.any())):
            if tree_merges is not None:
                raise ValueError("tree_merges: given trees are supported for single sentences, not pairs")
            # both sentences in one batched call: rows 0..B-1 of the sentence vectors are the first sentences
            selects = torch.stack([model.sentence_mask(input_ids, attention_mask, token_type_ids, s) for s in (0, 1)])
            layers = model.elmo_layers(char_ids, attention_mask, token_type_ids, (0, 1))
            hidden, sent = model.encode(input_ids, char_ids, selects, inputs_embeds=inputs_embeds, elmo_layers=layers)
            # unflatten, not chunk(2): torch.export cannot prove that chunking 2B rows gives two pieces for every B
            u, v = sent.unflatten(0, (2, selects.shape[1])).unbind(0)
            logits = _pair_logits(self, u, v, pair)
        else:
            select = model.sentence_mask(input_ids, attention_mask)
            layers = model.elmo_layers(char_ids, attention_mask)
            hidden, u = model.encode(input_ids, char_ids, select, tree_merges, inputs_embeds, layers)
            # + 0 * (the pair classifier's weights): every parameter takes part in the graph, as DistributedDataParallel
            # (find_unused_parameters=False) requires; its gradient is 0.
            logits = self.classifier(u) + 0.0 * sum(p.sum() for p in self.pair_classifier.parameters())
        loss = _sequence_loss(self, logits, labels)
        return self._head_output(SequenceClassifierOutput, loss, logits, hidden, output_hidden_states, return_dict)


class SesameBaselineForTokenClassification(SesameBaselinePreTrainedModel):
    """Per-word tagging (NER) with a classic encoder that has token states (``encoder_type="rnn"``): the classic
    BiLSTM tagger (Huang et al. 2015 without the CRF; Lample et al. 2016's word-level part): word vectors -- with
    ``elmo_config`` the frozen BiLM's ScalarMix concatenated to them, as ELMo's taggers do (Peters et al. 2018,
    section 3.3) -- through the (Bi)LSTM, then dropout (``classifier_dropout``) and a linear layer on each word's state.

    Forward args: ``input_ids (B, T)`` word ids, ``char_ids (B, T, 50)``, ``attention_mask (B, T)``, ``labels (B, T)``
    long with -100 ignored (``<S>``, ``</S>``, padding), ``output_hidden_states``, ``return_dict``. Returns
    ``TokenClassifierOutput`` with ``logits (B, T, num_labels)`` (those of ``<S>`` / ``</S>`` / padding are the bias
    alone: their state is 0) and ``loss`` (mean cross-entropy over the labelled words, plus the ScalarMix's L2 penalty).

    Raises:
        ValueError: an encoder without token states (cbow, fasttext, cnn: their tokens are the word vectors alone;
            treelstm); none or both of ``input_ids`` and ``inputs_embeds``.
    """

    def __init__(self, config: SesameBaselineConfig):
        super().__init__(config)
        if config.encoder_type != "rnn":
            raise ValueError(
                f"SesameBaselineForTokenClassification: encoder_type {config.encoder_type!r}; expected 'rnn' (a tagger "
                "needs each word's state in context)"
            )
        self.num_labels = config.num_labels
        self.baseline = SesameBaselineModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(self.baseline.encoder.output_size, config.num_labels)
        self.post_init()
        self.baseline.freeze()

    def forward(
        self,
        input_ids=None,
        char_ids=None,
        attention_mask=None,
        token_type_ids=None,
        labels=None,
        inputs_embeds=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        model = self.baseline
        attention_mask = model._inputs(input_ids, inputs_embeds, attention_mask)
        select = model.sentence_mask(input_ids, attention_mask)
        layers = model.elmo_layers(char_ids, attention_mask)
        hidden, _ = model.encode(input_ids, char_ids, select, inputs_embeds=inputs_embeds, elmo_layers=layers)
        logits = self.classifier(self.dropout(hidden[-1]))  # hidden[-1]: the RNN's states at the input positions
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
        return self._head_output(TokenClassifierOutput, loss, logits, hidden, output_hidden_states, return_dict)
