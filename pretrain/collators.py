"""Batch collators: MLM masking (BERT-like, optionally whole-word and NSP) and BiLM batches (ELMo-style).

Masking (Devlin et al. 2019, sec. 3.1 and appendix A.1): each non-special token is selected for prediction
with probability ``mlm_probability`` (whole-word masking: each *word* is selected with that probability and
all its pieces go together, so the expected fraction of selected tokens is still ``mlm_probability``); a
selected token is replaced by ``[MASK]`` with probability ``mask_replace_prob``, by a random non-special token
with ``random_replace_prob`` and kept otherwise; ``labels`` hold the original id at selected positions and
-100 elsewhere. At least one token per sequence is selected.

Randomness: the random numbers of an example come from a ``torch.Generator`` seeded with
``(seed, epoch, example index)`` -- never from the global RNG. A batch is therefore masked identically
whatever the number of processes, the data-loader workers, the prefetching, or a resume in the middle of an
epoch (the loop sets the epoch with :meth:`MLMCollator.set_epoch`), while every epoch gets new masks (dynamic
masking, as RoBERTa).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pretrain.data import seed_for


def mask_tokens(
    input_ids: torch.Tensor,
    candidates: torch.Tensor,
    u_select: torch.Tensor,
    u_replace: torch.Tensor,
    random_tokens: torch.Tensor,
    mask_token_id: int,
    mlm_probability: float = 0.15,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    word_start: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply MLM masking given the random numbers (pure, vectorised).

    Args:
        input_ids: ``(B, T)`` long.
        candidates: ``(B, T)`` bool, tokens that may be selected (not special, not padding).
        u_select: ``(B, T)`` float in [0, 1): selection draws (per token; with ``word_start``, the draw of a
            word is the one at its first piece).
        u_replace: ``(B, T)`` float in [0, 1): replacement draws.
        random_tokens: ``(B, T)`` long, the random replacement ids.
        word_start: ``(B, T)`` 0/1, 1 where a token begins a word: whole-word masking.

    Returns:
        ``(masked_input_ids, labels)``, both ``(B, T)`` long; labels are -100 where not selected.
    """
    u_tok = token_draws(u_select, word_start)
    selected = candidates & (u_tok < mlm_probability)
    # at least one prediction per sequence: the candidate (word) with the smallest draw
    empty = ~selected.any(dim=1) & candidates.any(dim=1)
    if empty.any():
        best = torch.where(candidates, u_tok, torch.full_like(u_tok, 2.0)).min(dim=1, keepdim=True).values
        selected = selected | (empty[:, None] & candidates & (u_tok == best))
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    to_mask = selected & (u_replace < mask_replace_prob)
    to_random = selected & (u_replace >= mask_replace_prob) & (u_replace < mask_replace_prob + random_replace_prob)
    out = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    out = torch.where(to_random, random_tokens, out)
    return out, labels


def token_draws(u_select: torch.Tensor, word_start: torch.Tensor | None = None) -> torch.Tensor:
    """The selection draw of each token, ``(B, T)`` float: ``u_select`` itself, or with ``word_start`` ((B, T) 0/1,
    whole-word masking) the draw at the first piece of the token's word."""
    if word_start is None:
        return u_select
    word_index = torch.cumsum(word_start.long(), dim=1) - 1  # (B, T), the word each token belongs to
    word_index = word_index.clamp_min(0)
    start_pos = torch.zeros_like(u_select).scatter_reduce(
        1, word_index, u_select * word_start, reduce="sum", include_self=False
    )
    return start_pos.gather(1, word_index)


#: The batch key of the selection draws an :class:`MLMCollator` keeps for a masking-rate schedule.
SELECTION_DRAWS = "selection_draws"


def select_at_rate(batch: dict[str, torch.Tensor], rate: float) -> dict[str, torch.Tensor]:
    """The batch masked at ``rate`` from one masked at a higher rate with :data:`SELECTION_DRAWS` kept (popped).

    ``batch["selection_draws"]`` (B, T) float holds each token's selection draw (:func:`token_draws`; 2.0 where the
    token may not be selected). A token stays selected when its draw is below ``rate``, or, in a sequence where no
    draw is, when its draw is the sequence's smallest (:func:`mask_tokens`' one prediction per sequence); the other
    tokens selected at the higher rate get their original id back (from ``labels``) and the label -100. With the
    same draws this is exactly :func:`mask_tokens` at ``rate`` (the replacement draws are per token): a pure function
    of the batch, on its device, with no host read.

    Args:
        batch: ``input_ids`` and ``labels`` (B, T) long, ``selection_draws`` (B, T) float.
        rate: the masking rate, at most the rate the batch was masked at.

    Returns:
        a new dict: the batch without ``selection_draws``, ``input_ids`` and ``labels`` masked at ``rate``.
    """
    batch = dict(batch)
    draws = batch.pop(SELECTION_DRAWS)
    input_ids, labels = batch["input_ids"], batch["labels"]
    keep = draws < rate
    lowest = draws == draws.min(dim=1, keepdim=True).values
    keep = keep | (~keep.any(dim=1, keepdim=True) & lowest)
    drop = (labels != -100) & ~keep
    batch["input_ids"] = torch.where(drop, labels, input_ids)
    batch["labels"] = labels.masked_fill(drop, -100)
    return batch


class MaskingRateSchedule:
    """A masking rate that moves linearly from ``start`` (optimizer step 1) to ``end`` (the last step), as the
    phases of ModernBERT / Ettin / mmBERT lower it (30% -> 15% -> 5%); ``pretrain --mlm_probability P
    --mlm_probability_end Q``.

    The training collator masks at :attr:`ceiling` (the larger rate) and keeps its selection draws; the loop calls
    the schedule on each micro-batch of step ``s`` (:class:`training.loop.Trainer`'s ``batch_fn``), which masks it
    at :meth:`rate` (``s``) by :func:`select_at_rate`: a pure function of the batch and the step, so a resumed run
    masks as an uninterrupted one. The held-out evaluation keeps its own fixed rate.

    Args:
        start, end: the rates at the first and the last step, in (0, 1).
        max_train_steps: the run's optimizer steps (>= 1).
    """

    def __init__(self, start: float, end: float, max_train_steps: int):
        self.start, self.end, self.max_train_steps = start, end, max_train_steps
        self.ceiling = max(start, end)

    def rate(self, step: int) -> float:
        """The masking rate of optimizer step ``step`` (1-based): ``start + (end - start) * (step - 1) / (N - 1)``."""
        progress = min(max(step - 1, 0), self.max_train_steps - 1) / max(self.max_train_steps - 1, 1)
        return self.start + (self.end - self.start) * progress

    def __call__(self, batch: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
        return select_at_rate(batch, self.rate(step))

    def logged(self, step: int) -> dict[str, float]:
        """``{"mlm_probability": rate}`` of step ``step``, for the loop's log."""
        return {"mlm_probability": self.rate(step)}


def keep_selection_draws(collator) -> None:
    """Make the :class:`MLMCollator` inside ``collator`` (itself, or a wrapper's ``collator`` / ``mlm``) add
    :data:`SELECTION_DRAWS` to its batches.

    Raises:
        InputError: ``collator`` does not mask (e.g. the BiLM's).
    """
    from core.errors import InputError

    inner = collator
    while not isinstance(inner, MLMCollator):
        inner = getattr(inner, "collator", None) or getattr(inner, "mlm", None)
        if inner is None:
            raise InputError(
                f"--mlm_probability_end: the {type(collator).__name__} masks no token; expected a BERT-like "
                "objective (mlm, mlm+nsp, rtd)"
            )
    inner.keep_selection_draws = True


def _pad(rows: Sequence[Sequence[int]], value: int, dtype=torch.long) -> torch.Tensor:
    length = max(len(r) for r in rows)
    if all(len(r) == length for r in rows):  # through numpy: 3-4x faster than torch.tensor on nested lists
        return torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(dtype)
    out = torch.full((len(rows), length), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


class MLMCollator:
    """Pad packed blocks (or NSP pairs) and mask them for MLM.

    Examples are dicts with ``input_ids``, ``word_start`` and ``index`` (and, for NSP, ``token_type_ids`` and
    ``next_sentence_label``; for document-aware blocks, ``position_ids``). Output: ``input_ids`` (B, T) long,
    ``labels`` (B, T) long with -100 = not predicted, ``attention_mask`` (B, T) long only when the batch has
    padding (full packed blocks have none: the model then needs no mask and reads none back from the device), and
    ``token_type_ids`` / ``next_sentence_label`` / ``position_ids`` (B, T) long when present (``position_ids``
    padded with 0: every padding token is a document of its own, which the attention mask hides anyway).

    Args:
        tokenizer: gives ``mask_token_id``, ``pad_token_id``, the special ids and the vocabulary size.
        seed: base seed of the per-example generators.
        salt: mixed into the seed (e.g. 1 for validation, so its masks are fixed and differ from training's).
    """

    def __init__(
        self,
        tokenizer,
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        whole_word_mask: bool = False,
        seed: int = 42,
        salt: int = 0,
    ):
        from core.errors import InputError

        if not 0 < mlm_probability < 1:
            raise InputError(f"--mlm_probability {mlm_probability}: expected a number in (0, 1)")
        if mask_replace_prob < 0 or random_replace_prob < 0 or mask_replace_prob + random_replace_prob > 1:
            raise InputError(
                f"--mask_replace_prob {mask_replace_prob} / --random_replace_prob {random_replace_prob}: expected "
                "non-negative numbers with a sum <= 1"
            )
        if tokenizer.mask_token_id is None:
            raise InputError("--tokenizer_name: the tokenizer has no mask token; expected a BERT-style [MASK]")
        self.mask_token_id = tokenizer.mask_token_id
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
        vocab = torch.arange(len(tokenizer))
        self.random_ids = vocab[~torch.isin(vocab, self.special_ids)]
        self.mlm_probability, self.mask_replace_prob, self.random_replace_prob = (
            mlm_probability,
            mask_replace_prob,
            random_replace_prob,
        )
        self.whole_word_mask, self.seed, self.salt, self.epoch = whole_word_mask, seed, salt, 0
        #: add :data:`SELECTION_DRAWS` to the batches (a masking-rate schedule, :class:`MaskingRateSchedule`)
        self.keep_selection_draws = False

    def set_epoch(self, epoch: int) -> None:
        """New masks every epoch (the training loop calls this; also at resume)."""
        self.epoch = epoch

    def random_draws(self, indices: Sequence[int], length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(u_select, u_replace, random_tokens)``, each ``(B, length)``, from the per-example generators."""
        sel, rep, tok = [], [], []
        n = len(self.random_ids)
        for index in indices:
            g = torch.Generator().manual_seed(seed_for(self.seed, self.salt, self.epoch, index))
            u = torch.rand(2, length, generator=g)
            sel.append(u[0])
            rep.append(u[1])
            tok.append(torch.randint(n, (length,), generator=g))
        return torch.stack(sel), torch.stack(rep), self.random_ids[torch.stack(tok)]

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        input_ids = _pad([e["input_ids"] for e in examples], self.pad_token_id)
        attention_mask = _pad([[1] * len(e["input_ids"]) for e in examples], 0)
        word_start = _pad([e["word_start"] for e in examples], 1) if self.whole_word_mask else None
        candidates = attention_mask.bool() & ~torch.isin(input_ids, self.special_ids)
        u_sel, u_rep, rand_tok = self.random_draws([e["index"] for e in examples], input_ids.shape[1])
        masked, labels = mask_tokens(
            input_ids,
            candidates,
            u_sel,
            u_rep,
            rand_tok,
            self.mask_token_id,
            self.mlm_probability,
            self.mask_replace_prob,
            self.random_replace_prob,
            word_start,
        )
        batch = {"input_ids": masked, "labels": labels}
        if self.keep_selection_draws:
            batch[SELECTION_DRAWS] = torch.where(candidates, token_draws(u_sel, word_start), 2.0)
        if not bool(attention_mask.all()):  # a host tensor: no device synchronisation
            batch["attention_mask"] = attention_mask
        if "token_type_ids" in examples[0]:
            batch["token_type_ids"] = _pad([e["token_type_ids"] for e in examples], 0)
        if "position_ids" in examples[0]:  # document boundaries: attention within each document
            batch["position_ids"] = _pad([e["position_ids"] for e in examples], 0)
        if "next_sentence_label" in examples[0]:
            batch["next_sentence_label"] = torch.tensor([e["next_sentence_label"] for e in examples], dtype=torch.long)
        return batch


class ShortRows:
    """Mixing lengths within a phase: with probability ``probability`` a batch of blocks of ``T`` tokens is cut into
    rows of ``length`` tokens, ``(B, T)`` -> ``(B * T / length, length)`` in every per-token tensor (``input_ids``,
    ``labels``, ``position_ids``, ``attention_mask``, ...); the other batches keep their blocks. ``pretrain
    --short_seq_length L --short_seq_probability P``; e.g. a context-extension phase at 8,192 tokens that keeps
    training at 1,024 on some of its steps.

    The batch-level counterpart of BERT's ``short_seq_prob`` (``create_pretraining_data.py``: that share of the
    examples is made shorter than the maximum length): the tokens, their masks and labels are the wrapped collator's,
    only the rows change, so the loss (per predicted token) and the tokens per step stay the same. With document
    masking each row's first piece is the tail of the document it was cut from (its ``position_ids`` continue), and
    attention ends at the row. Rows of padding only are dropped, and ``attention_mask`` with them when no padding is
    left (:class:`MLMCollator`'s rule).

    Whether a batch is cut is drawn from a generator seeded with ``(seed, epoch, first example index,`` 2``)``, so a
    batch is cut alike whatever the processes, the workers or a resume (a pure function of the batch's examples).

    Args:
        collator: the wrapped collator (:class:`MLMCollator` or :class:`RTDCollator`): batches of (B, T) tensors.
        length: the short rows' length in tokens; must divide every batch's ``T``.
        probability: in [0, 1], the share of batches cut.
        seed: the run's seed.

    Raises:
        ValueError: a batch whose length ``length`` does not divide, or a batch with a per-sequence tensor such as
            NSP's ``next_sentence_label`` (the objective's arguments refuse this first, with an ``InputError``).
    """

    STREAM = 2

    def __init__(self, collator, length: int, probability: float, seed: int):
        self.collator, self.length, self.probability, self.seed, self.epoch = collator, length, probability, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """The wrapped collator's ``set_epoch``, and new draws every epoch (the training loop calls this)."""
        self.epoch = epoch
        if hasattr(self.collator, "set_epoch"):
            self.collator.set_epoch(epoch)

    def cut(self, examples: Sequence[dict]) -> bool:
        """Whether the batch of ``examples`` is cut into short rows."""
        g = torch.Generator().manual_seed(seed_for(self.seed, self.epoch, examples[0]["index"], self.STREAM))
        return bool(torch.rand((), generator=g) < self.probability)

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        batch = self.collator(examples)
        if not self.cut(examples):
            return batch
        rows, length = batch["input_ids"].shape
        if length % self.length:
            raise ValueError(f"short rows of {self.length} tokens: blocks of {length} tokens; expected a multiple")
        odd = [k for k, v in batch.items() if v.shape[:2] != (rows, length)]
        if odd:
            raise ValueError(f"short rows: {', '.join(odd)} is not per token; expected (B, T) tensors only")
        short = {k: v.reshape(-1, self.length, *v.shape[2:]) for k, v in batch.items()}
        if "attention_mask" in short:
            keep = short["attention_mask"].any(dim=1)
            short = {k: v[keep] for k, v in short.items()}
            if bool(short["attention_mask"].all()):
                del short["attention_mask"]
        return short


class PackedSequences:
    """A collator's batches with FlashAttention's varlen arguments of their packed documents, computed on the host
    (in the DataLoader workers, ahead of the step), as transformers' ``DataCollatorWithFlattening(
    return_flash_attn_kwargs=True)`` gives them: a batch with ``position_ids`` (document masking) also carries
    ``cu_seq_lens_q`` / ``cu_seq_lens_k`` ((S + 1,) int32: the start of every document and every run of padding in
    the flattened (B * T) tokens, then B * T) and ``max_length_q`` / ``max_length_k`` (int, the longest), from
    :func:`modeling.bert.attention_sesame_bert.flash_varlen_kwargs`. The model's varlen paths then read nothing back
    from the device. Batches without ``position_ids`` pass unchanged.

    For a map-style training loader only: a stream dispatched by accelerate is concatenated and sliced along the
    batch dimension, which the (S + 1,) offsets do not have.

    Args:
        collator: the wrapped collator (:class:`MLMCollator` or :class:`RTDCollator`).
    """

    def __init__(self, collator):
        self.collator = collator

    def set_epoch(self, epoch: int) -> None:
        """The wrapped collator's :meth:`MLMCollator.set_epoch` (the training loop calls this)."""
        if hasattr(self.collator, "set_epoch"):
            self.collator.set_epoch(epoch)

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        from modeling.bert.attention_sesame_bert import document_ids, flash_varlen_kwargs

        batch = self.collator(examples)
        if "position_ids" in batch:
            keep = batch["attention_mask"].bool() if "attention_mask" in batch else None
            batch.update(flash_varlen_kwargs(document_ids(batch["position_ids"]), keep))
        return batch


class RTDCollator:
    """MLM batches for replaced-token detection (ELECTRA): :class:`MLMCollator`'s batch (the generator's input and
    labels, masked by its rules) plus ``sampling_uniforms`` (B, T) float32 in [0, 1), the uniform numbers with which
    the model draws the generator's sample at each masked position (inverse-CDF sampling,
    ``modeling.bert.modeling_sesame_bert_rtd.sample_tokens``).

    The numbers of an example come from a generator seeded with ``(seed, salt, epoch, example index,`` 1``)`` of the
    wrapped collator (a stream apart from its masking draws), so that the samples, like the masks, do not depend on
    the number of processes, the workers or a resume, and the eval collator's are fixed.
    """

    SAMPLING_STREAM = 1

    def __init__(self, mlm: MLMCollator):
        self.mlm = mlm

    def set_epoch(self, epoch: int) -> None:
        """New masks and samples every epoch (the training loop calls this; also at resume)."""
        self.mlm.set_epoch(epoch)

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        batch = self.mlm(examples)
        length, m = batch["input_ids"].shape[1], self.mlm
        batch["sampling_uniforms"] = torch.stack(
            [
                torch.rand(
                    length,
                    generator=torch.Generator().manual_seed(
                        seed_for(m.seed, m.salt, m.epoch, e["index"], self.SAMPLING_STREAM)
                    ),
                )
                for e in examples
            ]
        )
        return batch


class BiLMCollator:
    """Pad packed word blocks for the ELMo-style BiLM.

    Examples are dicts with ``input_ids`` (word ids) and ``words`` (strings). Output: ``input_ids`` (B, T) long,
    ``char_ids`` (B, T, 50) long (ELMo's byte ids with begin/end-of-word markers, zeros at padding),
    ``attention_mask`` (B, T) long, ``labels`` (B, T) long = ``input_ids`` with -100 at padding. The model shifts
    the labels itself (forward LM at t predicts labels[t+1], backward LM labels[t-1]). No randomness.
    """

    def __init__(self, tokenizer):
        from modeling.elmo.tokenization_elmo import word_to_char_ids

        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._to_chars = word_to_char_ids
        self._cache: dict[str, list[int]] = {}

    def chars(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._cache[word] = self._to_chars(word)
        return ids

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        input_ids = _pad([e["input_ids"] for e in examples], self.pad_token_id)
        attention_mask = _pad([[1] * len(e["input_ids"]) for e in examples], 0)
        B, T = input_ids.shape
        width = len(self.chars("a"))
        char_ids = torch.zeros(B, T, width, dtype=torch.long)
        for i, e in enumerate(examples):
            char_ids[i, : len(e["words"])] = torch.tensor([self.chars(w) for w in e["words"]], dtype=torch.long)
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        return {"input_ids": input_ids, "char_ids": char_ids, "attention_mask": attention_mask, "labels": labels}
