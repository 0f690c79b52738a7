"""The pretraining objectives, one table entry each: what ``pretrain``, ``pretrain.prepare`` and the model card
read instead of branching on ``--model_type`` / ``--nsp``. A new model family is one new :class:`Objective`.

=========  ===========  ==========================  =======================================================
name       model_type   Auto class                  blocks / collator / evaluation
=========  ===========  ==========================  =======================================================
mlm        bert         AutoModelForMaskedLM        packed ``[CLS]`` blocks, MLM masking; perplexity
mlm+nsp    bert         AutoModelForPreTraining     ``[CLS] A [SEP] B [SEP]`` pairs; + NSP accuracy
bilm       elmo         AutoModelForPreTraining     packed word blocks, char ids; forward/backward perplexity
=========  ===========  ==========================  =======================================================
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Objective:
    """One pretraining objective (see the module table)."""

    name: str
    """``mlm``, ``mlm+nsp`` or ``bilm``; recorded in prepared-dataset manifests."""
    model_type: str
    """``--model_type`` it belongs to (``bert`` or ``elmo``)."""
    config_model_type: str
    """``model_type`` of the model config it trains (``sesame-bert``, ``sesame-elmo``)."""
    auto_class: str
    """Name of the transformers Auto class that builds and loads the model."""
    card_task: str
    """Pipeline tag of the model card."""
    train_tokenizer: Callable[..., Any]
    """``(files, vocab_size, output_dir, max_seq_length)``: train and save a tokenizer."""
    tokenize: Callable[..., Any]
    """``(raw DatasetDict, tokenizer, num_proc, overwrite_cache) -> DatasetDict`` of tokenized documents."""
    to_blocks: Callable[..., Any]
    """``(tokenized, tokenizer, args) -> DatasetDict`` of training blocks."""
    collators: Callable[..., tuple]
    """``(tokenizer, args) -> (train collator, eval collator)``."""
    eval_keys: tuple[str, ...]
    """Sums :func:`lm_eval_step` returns for this objective."""
    metrics: Callable[[Mapping[str, float]], dict]
    """Evaluation sums -> metrics (``eval_loss``, ``perplexity``, ...)."""
    demo_defaults: Mapping[str, Any]
    """Settings of the embedded demo job (``pretrain`` with no data argument)."""
    result_keys: tuple[str, ...] = ()
    """Extra ``all_results.json`` keys of this objective."""
    weight_fn: Callable | None = None
    """Items the loss averages over per batch (``None``: the loop's default, labels != -100)."""

    def auto_model_class(self):
        """The transformers Auto class (``modeling`` imported, so the sesame classes are registered)."""
        import transformers

        import modeling  # noqa: F401

        return getattr(transformers, self.auto_class)


# -- the pieces ------------------------------------------------------------------------------------------------
def _train_wordpiece(files, vocab_size, output_dir, max_seq_length):
    from tokenizer.wordpiece import train_wordpiece_tokenizer

    train_wordpiece_tokenizer(files, vocab_size, output_dir, model_max_length=max(max_seq_length, 512))


def _train_words(files, vocab_size, output_dir, max_seq_length):
    from tokenizer.elmo_training import train_elmo_tokenizer

    train_elmo_tokenizer(files, vocab_size, output_dir)


def _tokenize_bert(raw, tokenizer, num_proc=None, overwrite_cache=False):
    from pretrain.data import tokenize_bert

    return tokenize_bert(raw, tokenizer, num_proc, overwrite_cache)


def _tokenize_elmo(raw, tokenizer, num_proc=None, overwrite_cache=False):
    from pretrain.data import tokenize_elmo

    return tokenize_elmo(raw, tokenizer, num_proc, overwrite_cache)


def _pack_bert(tokenized, tokenizer, args):
    from pretrain.data import pack_blocks

    return pack_blocks(tokenized, args.max_seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id,
                       args.packing_batch_size, args.preprocessing_num_workers, args.overwrite_cache)


def _nsp_pairs(tokenized, tokenizer, args):
    from pretrain.data import make_nsp_pairs

    return make_nsp_pairs(tokenized, args.max_seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id, args.seed,
                          args.packing_batch_size, args.preprocessing_num_workers, args.overwrite_cache)


def _pack_words(tokenized, tokenizer, args):
    from pretrain.data import pack_blocks

    return pack_blocks(tokenized, args.max_seq_length, None, None, args.packing_batch_size,
                       args.preprocessing_num_workers, args.overwrite_cache)


def _mlm_collators(tokenizer, args):
    from pretrain.collators import MLMCollator

    opts = (args.mlm_probability, args.mask_replace_prob, args.random_replace_prob, args.whole_word_mask, args.seed)
    return MLMCollator(tokenizer, *opts), MLMCollator(tokenizer, *opts, salt=1)


def _bilm_collators(tokenizer, args):
    from pretrain.collators import BiLMCollator

    collator = BiLMCollator(tokenizer)
    return collator, collator


def bilm_weight(batch) -> torch.Tensor:
    """Items the BiLM loss averages over: (forward + backward predicted tokens) / 2 = real tokens - 1 per row
    (a 0-d tensor on the batch's device; no host sync)."""
    mask = batch["attention_mask"]
    return mask.sum() - (mask.sum(dim=1) > 0).sum()


def _ppl(nll_sum: float, count: float) -> float:
    return math.exp(min(nll_sum / max(count, 1.0), 700.0))


def _lm_metrics(sums):
    loss = sums["nll_sum"] / max(sums["count"], 1.0)
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 700.0)), "eval_tokens": sums["count"]}


def _nsp_metrics(sums):
    return {**_lm_metrics(sums), "eval_nsp_accuracy": sums["nsp_correct"] / max(sums["nsp_count"], 1.0)}


def _bilm_metrics(sums):
    return {**_lm_metrics(sums), "forward_perplexity": _ppl(sums["fwd_nll_sum"], sums["fwd_count"]),
            "backward_perplexity": _ppl(sums["bwd_nll_sum"], sums["bwd_count"])}


def lm_eval_step(model, batch) -> dict[str, torch.Tensor]:
    """Sums over one evaluation batch for exact perplexity, each a 0-d float64 tensor on the batch's device:
    ``nll_sum`` (nats) and ``count`` of predicted tokens; NSP adds ``nsp_correct``/``nsp_count`` (pairs), the BiLM
    ``fwd_*``/``bwd_*`` per direction. ``batch``: the collator's tensors, ``input_ids`` (B, T) long ..."""
    out = model(**batch)
    if "char_ids" in batch:  # BiLM: both directions
        nf, nb = out.forward_num_tokens.double(), out.backward_num_tokens.double()
        f_sum, b_sum = out.forward_loss.double() * nf, out.backward_loss.double() * nb
        return {"nll_sum": f_sum + b_sum, "count": nf + nb, "fwd_nll_sum": f_sum, "fwd_count": nf, "bwd_nll_sum": b_sum, "bwd_count": nb}
    count = (batch["labels"] != -100).sum().double()
    mlm = getattr(out, "mlm_loss", None)
    mlm = out.loss if mlm is None else mlm
    stats = {"nll_sum": mlm.double() * count, "count": count}  # the model's loss is 0 when nothing is predicted
    if "next_sentence_label" in batch:
        pred = out.seq_relationship_logits.argmax(-1)
        stats["nsp_correct"] = (pred == batch["next_sentence_label"]).sum().double()
        stats["nsp_count"] = torch.tensor(float(len(pred)), dtype=torch.float64, device=pred.device)
    return stats


_BERT_DEMO = dict(config_name="bert-tiny", vocab_size=8000, max_seq_length=128, per_device_train_batch_size=32,
                  learning_rate=1e-3, num_warmup_steps=30, max_train_steps=300, eval_steps=100, weight_decay=0.01)
_ELMO_DEMO = dict(config_name="elmo-small", vocab_size=8000, max_seq_length=32, per_device_train_batch_size=16,
                  learning_rate=2e-3, num_warmup_steps=20, max_train_steps=200, eval_steps=50, weight_decay=0.0)

OBJECTIVES: dict[str, Objective] = {
    "mlm": Objective("mlm", "bert", "sesame-bert", "AutoModelForMaskedLM", "fill-mask", _train_wordpiece,
                     _tokenize_bert, _pack_bert, _mlm_collators, ("nll_sum", "count"), _lm_metrics, _BERT_DEMO),
    "mlm+nsp": Objective("mlm+nsp", "bert", "sesame-bert", "AutoModelForPreTraining", "fill-mask", _train_wordpiece,
                         _tokenize_bert, _nsp_pairs, _mlm_collators, ("nll_sum", "count", "nsp_correct", "nsp_count"),
                         _nsp_metrics, _BERT_DEMO, result_keys=("eval_nsp_accuracy",)),
    "bilm": Objective("bilm", "elmo", "sesame-elmo", "AutoModelForPreTraining", "feature-extraction", _train_words,
                      _tokenize_elmo, _pack_words, _bilm_collators,
                      ("nll_sum", "count", "fwd_nll_sum", "fwd_count", "bwd_nll_sum", "bwd_count"), _bilm_metrics,
                      _ELMO_DEMO, result_keys=("forward_perplexity", "backward_perplexity"), weight_fn=bilm_weight),
}


def get_objective(args) -> Objective:
    """The entry for ``--model_type`` / ``--nsp``.

    Raises:
        InputError: ``--nsp`` with a model type other than ``bert``.
    """
    from training.errors import InputError

    nsp = getattr(args, "nsp", False)
    if args.model_type == "elmo":
        if nsp:
            raise InputError(f"--nsp: next-sentence prediction needs a BERT-like model; expected --model_type bert (got {args.model_type})")
        return OBJECTIVES["bilm"]
    return OBJECTIVES["mlm+nsp" if nsp else "mlm"]
