"""The pretraining table: model families and objectives, one entry each. ``pretrain``, ``pretrain.prepare`` and the
model card read it instead of branching on ``--model_type`` / ``--nsp``; a new family or objective is one new entry
(:func:`register_objective`), nothing else in the commands changes.

=========  ===========  ==========================  =======================================================
objective  family       Auto class                  blocks / collator / evaluation
=========  ===========  ==========================  =======================================================
mlm        bert         AutoModelForMaskedLM        packed ``[CLS]`` blocks, MLM masking; perplexity
mlm+nsp    bert         AutoModelForPreTraining     ``[CLS] A [SEP] B [SEP]`` pairs; + NSP accuracy
bilm       elmo         AutoModelForPreTraining     packed word blocks, char ids; forward/backward perplexity
rtd        bert         AutoModelForPreTraining     the mlm blocks and masks; ELECTRA generator + discriminator
=========  ===========  ==========================  =======================================================

A :class:`FamilyPretraining` (``--model_type``) holds what pretraining adds to a model family's
:class:`modeling.spec.ModelSpec`: the settings of a run on the user's data and of the demo job, the learning-rate rule
with its source, the config types it accepts, and its tokenization. An :class:`Objective` (``--objective``; by
default chosen by ``--model_type`` and ``--nsp``) holds what one pretraining task adds: blocks, collators, the loss's
item count, evaluation sums and metrics.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from core.errors import InputError
from modeling.bert import MODERN_PRESETS, SesameBertConfig, SesameBertRTDConfig
from modeling.bert import SPEC as BERT_SPEC
from modeling.elmo import SPEC as ELMO_SPEC
from modeling.spec import ModelSpec
from pretrain.collators import BiLMCollator, MLMCollator, RTDCollator
from pretrain.data import make_nsp_pairs, pack_blocks, tokenize_bert, tokenize_elmo

if TYPE_CHECKING:
    from pretrain.arguments import CorpusArguments, MaskingArguments


@dataclasses.dataclass(frozen=True)
class DeviceDefaults:
    """What a run on the user's data takes on one device type where not given (:func:`pretrain.arguments.resolve`).

    Attributes:
        config_name: the preset without ``--config_name`` / ``--model_name_or_path``.
        why: the reason, said in the run plan's line when that preset was taken.
        modern: settings of a run of a modern (ModernBERT-class) preset (``modern_presets``), chosen or given, where
            not given.
        modern_why: their reason, said in the plan's line.
        modern_presets: the presets ``modern`` applies to.
    """

    config_name: str
    why: str
    modern: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    modern_why: str = ""
    modern_presets: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class FamilyPretraining:
    """What ``pretrain`` adds to a model family's spec to build and train it (see the module docstring)."""

    spec: ModelSpec
    """The family's spec: ``--model_type`` value (``name``), presets, tokenizer trainer, ..."""
    data_defaults: Mapping[str, Any]
    """Settings of a run on the user's data, where not given."""
    demo_defaults: Mapping[str, Any]
    """Settings of the embedded demo job (``pretrain`` with no data argument)."""
    learning_rate: Callable[[Any], tuple[float, str]]
    """``(model config) -> (peak learning rate, its source)`` for a run with data and no ``--learning_rate``."""
    learning_rate_help: str
    """The rule in words, for ``--help``."""
    tokenize: Callable[..., Any]
    """``(raw DatasetDict, tokenizer, num_proc, overwrite_cache) -> DatasetDict`` of tokenized documents."""
    tokenizer_problem: Callable[[Any], str | None] = lambda tokenizer: None
    """``(tokenizer) -> None`` when the family can use it, else what the family needs instead (one phrase)."""
    any_config: bool = False
    """Whether it trains any config the objective's Auto class builds (else only configs of the spec's model_type)."""
    device_defaults: Mapping[str, DeviceDefaults] = dataclasses.field(default_factory=dict)
    """Device type (``"cuda"``, ``"cpu"``) -> the defaults of a run on the user's data on it, over ``data_defaults``
    (:func:`pretrain.arguments.device_defaults`)."""
    packing_problem: str = "its blocks hold one sequence each (no packing)"
    """Why its objectives' blocks cannot keep packed documents apart (``--document_masking true`` refused)."""

    @property
    def name(self) -> str:
        """``--model_type`` value (``bert``, ``elmo``)."""
        return self.spec.name

    def accepts(self, config) -> bool:
        """Whether this family trains a model of ``config``: one of its model type, or with ``any_config`` any that
        is not another family's (an ELMo config is not a BERT-like model the Auto class could build)."""
        model_type = getattr(config, "model_type", None)
        if model_type == self.spec.model_type:
            return True
        return self.any_config and not any(f.spec.model_type == model_type for f in FAMILIES.values())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Objective:
    """One pretraining objective (see the module docstring)."""

    name: str
    """``--objective`` value; recorded in prepared-dataset manifests and model cards (``+`` separates tasks)."""
    family: FamilyPretraining
    auto_class: str
    """Name of the transformers Auto class that builds and loads the model."""
    card_task: str
    """Pipeline tag of the model card."""
    to_blocks: Callable[..., Any]
    """``(tokenized, tokenizer, corpus: CorpusArguments, seed) -> DatasetDict`` of training blocks."""
    collators: Callable[..., tuple]
    """``(tokenizer, masking: MaskingArguments, seed) -> (train collator, eval collator)``."""
    eval_keys: tuple[str, ...]
    """Sums :func:`lm_eval_step` returns for this objective."""
    metrics: Callable[[Mapping[str, float]], dict]
    """Evaluation sums -> metrics (``eval_loss``, ``perplexity``, ...)."""
    result_keys: tuple[str, ...] = ()
    """Extra ``all_results.json`` keys of this objective (besides every ``eval_*`` metric)."""
    weight_fn: Callable | None = None
    """Items the loss averages over per batch (``None``: the loop's default, labels != -100)."""
    nsp: bool = False
    """Whether it is the objective ``--nsp`` selects for its family."""
    eval_step: Callable[[torch.nn.Module, Mapping[str, Any]], dict[str, torch.Tensor]] | None = None
    """Evaluation sums of one batch (default :func:`lm_eval_step`)."""
    loss_fn: Callable | None = None
    """``(model, batch) -> loss`` for the loop (``None``: the model's ``loss``); a (K,) tensor of loss terms with a
    ``weight_fn`` that counts each term's items (see :mod:`training.loop`)."""
    model_config: Callable[[Any], Any] | None = None
    """``(the family's model config) -> the config the Auto class builds`` (``None``: the config as it is); ``rtd``
    makes the discriminator's config an RTD config that adds the generator."""
    write_outputs: Callable[[Any, Any], None] | None = None
    """``(temporary output folder, tokenizer) -> None``: files the objective adds beside the saved model."""
    data_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Settings of a run on the user's data that this objective sets over its family's ``data_defaults`` (the
    measured recipe of MLM: masking rate and schedule)."""
    document_masking: bool = False
    """Whether its blocks can keep packed documents apart (``position_ids`` restarting per document, attention within
    a document); ``--document_masking`` then defaults to true (``to_blocks`` reads ``corpus.document_masking``)."""
    unigram_plateau: bool = False
    """Whether its ``eval_loss`` is a masked-token loss that the training word frequencies bound (``pretrain`` then
    logs the unigram loss in the plan and warns when a run ends on that plateau: :mod:`training.unigram`)."""

    def auto_model_class(self):
        """The transformers Auto class (``modeling`` imported, so the sesame classes are registered)."""
        import transformers

        return getattr(transformers, self.auto_class)


# -- the pieces ------------------------------------------------------------------------------------------------
def _packing(corpus: CorpusArguments) -> tuple:
    """The packing arguments after the special-token ids: documents per map batch, processes, cache refresh."""
    return corpus.packing_batch_size, corpus.preprocessing_num_workers, corpus.overwrite_cache


def _pack_bert(tokenized, tokenizer, corpus: CorpusArguments, seed: int):
    ids = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    return pack_blocks(
        tokenized, corpus.max_seq_length, *ids, *_packing(corpus), document_positions=bool(corpus.document_masking)
    )


def _nsp_pairs(tokenized, tokenizer, corpus: CorpusArguments, seed: int):
    ids = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    return make_nsp_pairs(tokenized, corpus.max_seq_length, *ids, seed, *_packing(corpus))


def _pack_words(tokenized, tokenizer, corpus: CorpusArguments, seed: int):
    return pack_blocks(tokenized, corpus.max_seq_length, None, None, *_packing(corpus))


def _mlm_collators(tokenizer, masking: MaskingArguments, seed: int):
    opts = (
        masking.mlm_probability,
        masking.mask_replace_prob,
        masking.random_replace_prob,
        masking.whole_word_mask,
        seed,
    )
    return MLMCollator(tokenizer, *opts), MLMCollator(tokenizer, *opts, salt=1)


def _bilm_collators(tokenizer, masking: MaskingArguments, seed: int):
    collator = BiLMCollator(tokenizer)
    return collator, collator


def _rtd_collators(tokenizer, masking: MaskingArguments, seed: int):
    train, evaluation = _mlm_collators(tokenizer, masking, seed)
    return RTDCollator(train), RTDCollator(evaluation)


def rtd_weight(batch) -> torch.Tensor:
    """Items of the two RTD loss terms, a (2,) tensor on the batch's device (no host sync): ``[masked tokens
    (labels != -100: the generator's MLM loss), real tokens (attention_mask sum, or every token of a batch without
    padding: the discriminator's loss)]``."""
    labels = batch["labels"]
    masked = (labels != -100).sum()
    real = batch["attention_mask"].sum() if "attention_mask" in batch else torch.full_like(masked, labels.numel())
    return torch.stack([masked, real.to(masked.dtype)])


def rtd_loss(model, batch) -> torch.Tensor:
    """The RTD model's two loss terms, (2,) float32: ``[generator MLM loss, lambda x discriminator loss]``, each a
    mean over its own items (:func:`rtd_weight`)."""
    return model(**batch).losses


def _rtd_model_config(config):
    """The RTD config whose discriminator is ``config`` (a SesameBert config; an RTD config stays as it is).

    Raises:
        InputError: a config of another family.
    """
    if not isinstance(config, SesameBertConfig):
        raise InputError(
            f"--objective rtd: a {getattr(config, 'model_type', type(config).__name__)} config; expected "
            "a SesameBert (BERT-like) preset or config, whose shape the discriminator takes"
        )
    return SesameBertRTDConfig.from_discriminator(config)


def _rtd_outputs(folder, tokenizer) -> None:
    """The tokenizer beside the generator too (``generator/``), so that ``pipeline("fill-mask")`` loads it alone."""
    tokenizer.save_pretrained(Path(folder) / "generator")


def rtd_eval_step(model, batch) -> dict[str, torch.Tensor]:
    """Sums over one evaluation batch of the RTD model (0-d float64 tensors on the batch's device): the generator's
    ``nll_sum`` and ``count`` over the masked tokens (the eval collator's fixed masks), the discriminator's
    ``disc_nll_sum`` and ``weighted_disc_sum`` (x lambda) over the ``real`` tokens, and over the real tokens the
    discriminator's ``correct`` predictions, true positives ``tp`` (predicted and replaced), ``predicted`` (logit
    > 0) and ``replaced`` tokens."""
    out = model(**batch)
    labels = batch["labels"]
    masked = (labels != -100).sum().double()
    keep = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(labels, dtype=torch.bool)
    real = keep.sum().double()
    predicted, replaced = (out.logits > 0) & keep, out.replaced_labels.bool() & keep
    return {
        "nll_sum": out.generator_loss.double() * masked,
        "count": masked,
        "disc_nll_sum": out.discriminator_loss.double() * real,
        "weighted_disc_sum": out.losses[1].double() * real,
        "real": real,
        "correct": (((out.logits > 0) == out.replaced_labels.bool()) & keep).sum().double(),
        "tp": (predicted & replaced).sum().double(),
        "predicted": predicted.sum().double(),
        "replaced": replaced.sum().double(),
    }


def _rtd_metrics(sums):
    """``eval_loss`` = generator MLM loss + lambda x discriminator loss (each exact over the set);
    ``eval_generator_loss`` (nats) and ``perplexity`` (the generator's); ``eval_discriminator_loss``;
    ``eval_discriminator_accuracy`` over the real tokens; ``eval_replaced_precision`` / ``eval_replaced_recall`` of
    "replaced" (0 when nothing is predicted / replaced); ``eval_replaced_fraction`` = replaced / real tokens (an
    always-"original" discriminator scores 1 minus it); ``eval_tokens`` = masked tokens."""
    real = max(sums["real"], 1.0)
    generator = sums["nll_sum"] / max(sums["count"], 1.0)
    return {
        "eval_loss": generator + sums["weighted_disc_sum"] / real,
        "eval_generator_loss": generator,
        "perplexity": math.exp(min(generator, 700.0)),
        "eval_discriminator_loss": sums["disc_nll_sum"] / real,
        "eval_discriminator_accuracy": sums["correct"] / real,
        "eval_replaced_precision": sums["tp"] / sums["predicted"] if sums["predicted"] else 0.0,
        "eval_replaced_recall": sums["tp"] / sums["replaced"] if sums["replaced"] else 0.0,
        "eval_replaced_fraction": sums["replaced"] / real,
        "eval_tokens": sums["count"],
    }


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
    return {
        **_lm_metrics(sums),
        "forward_perplexity": _ppl(sums["fwd_nll_sum"], sums["fwd_count"]),
        "backward_perplexity": _ppl(sums["bwd_nll_sum"], sums["bwd_count"]),
    }


@functools.cache
def _takes_skip_logits(model_class: type) -> bool:
    return "skip_logits" in inspect.signature(model_class.forward).parameters


def mlm_outputs(model, batch):
    """``model(**batch)``, with ``skip_logits=True`` where the model's ``forward`` takes it (SesameBert's MLM heads:
    the loss without the (N, V) logits, decoder and cross-entropy fused); a wrapped model (DDP, FSDP, DeepSpeed,
    ``torch.compile``) is judged by the model inside (accelerate's ``extract_model_from_parallel``). Other models (any
    transformers MLM model that ``--model_name_or_path`` names) are called as they are."""
    from accelerate.utils import extract_model_from_parallel

    inner = extract_model_from_parallel(model, keep_torch_compile=False)
    return model(**batch, skip_logits=True) if _takes_skip_logits(type(inner)) else model(**batch)


def mlm_loss(model, batch) -> torch.Tensor:
    """The loop's loss of the MLM objectives: :func:`mlm_outputs`' ``loss`` (mean NLL of the predicted tokens, plus
    NSP's where labelled)."""
    return mlm_outputs(model, batch).loss


def lm_eval_step(model, batch) -> dict[str, torch.Tensor]:
    """Sums over one evaluation batch for exact perplexity, each a 0-d float64 tensor on the batch's device:
    ``nll_sum`` (nats) and ``count`` of predicted (masked) tokens; NSP adds ``nsp_correct``/``nsp_count`` (pairs).
    ``batch``: the collator's tensors, ``input_ids`` (B, T) long ..."""
    out = mlm_outputs(model, batch)
    count = (batch["labels"] != -100).sum().double()
    mlm = getattr(out, "mlm_loss", None)
    mlm = out.loss if mlm is None else mlm
    stats = {"nll_sum": mlm.double() * count, "count": count}  # the model's loss is 0 when nothing is predicted
    if "next_sentence_label" in batch:
        pred = out.seq_relationship_logits.argmax(-1)
        stats["nsp_correct"] = (pred == batch["next_sentence_label"]).sum().double()
        stats["nsp_count"] = torch.tensor(float(len(pred)), dtype=torch.float64, device=pred.device)
    return stats


def bilm_eval_step(model, batch) -> dict[str, torch.Tensor]:
    """:func:`lm_eval_step` of the BiLM (0-d float64 tensors): ``nll_sum`` and ``count`` over both directions, and
    ``fwd_*`` / ``bwd_*`` per direction."""
    out = model(**batch)
    nf, nb = out.forward_num_tokens.double(), out.backward_num_tokens.double()
    f_sum, b_sum = out.forward_loss.double() * nf, out.backward_loss.double() * nb
    return dict(nll_sum=f_sum + b_sum, count=nf + nb, fwd_nll_sum=f_sum, fwd_count=nf, bwd_nll_sum=b_sum, bwd_count=nb)


#: Peak learning rate of a post-LN BERT-like model of hidden size :data:`POST_LN_REFERENCE_WIDTH` (bert-tiny), chosen
#: on the time-to-quality benchmark (bench/bench_time_to_quality.py; docs/results.md): at 3M tokens,
#: batch 32 x 128, held-out MLM loss 6.92 (1e-4, BERT's rate), 6.50 (1e-3), 6.41 (2e-3); unigram plateau 6.89.
POST_LN_LEARNING_RATE = 2e-3
POST_LN_REFERENCE_WIDTH = 128
#: BERT's rate (Devlin et al. 2019, sec. A.2: Adam 1e-4 at batch 256), the floor of the width rule.
BERT_LEARNING_RATE = 1e-4


#: Cramming's peak rate for pre-LN encoders (Geiping & Goldstein 2023), the floor of the pre-LN width rule.
PRE_LN_LEARNING_RATE = 1e-3


def _bert_learning_rate(config) -> tuple[float, str]:
    """The peak learning rate of a BERT-like config: the measured bert-tiny rate scaled by 1/width (muP's Adam rule for
    hidden matrices, Yang et al. 2022), kept >= BERT's 1e-4 for post-LN and >= Cramming's 1e-3 for pre-LN.

    Pre-LN, measured on the time-to-quality bench (modernbert-tiny, 2.5M tokens, batch 32 x 128, 2 seeds; held-out MLM
    loss, docs/results.md): 1e-3 5.21 / 5.22, 2e-3 4.99 / 5.00, 4e-3 4.98 / 5.01, 8e-3 5.34 (seed 43); at
    modernbert-mini (1M tokens, one seed, pretrain's held-out loss): 1e-3 5.69, 2e-3 5.64, 4e-3 6.20 -- so the rule
    gives modernbert-tiny 2e-3 and leaves modernbert-mini and modernbert-base at 1e-3."""
    width = int(getattr(config, "hidden_size", POST_LN_REFERENCE_WIDTH))
    pre = getattr(config, "norm_position", "post") == "pre"
    floor, source = (
        (PRE_LN_LEARNING_RATE, "Cramming's 1e-3 (Geiping & Goldstein 2023)")
        if pre
        else (BERT_LEARNING_RATE, "BERT's 1e-4")
    )
    rate = max(floor, POST_LN_LEARNING_RATE * POST_LN_REFERENCE_WIDTH / width)
    return float(f"{rate:.2g}"), (
        f"{'pre' if pre else 'post'}-LN: {POST_LN_LEARNING_RATE:g} x {POST_LN_REFERENCE_WIDTH} / hidden size "
        f"{width} (measured at {'modernbert-tiny' if pre else 'bert-tiny'}, 1/width as muP), at least {source}"
    )


def _elmo_learning_rate(config) -> tuple[float, str]:
    return 2e-3, (
        "measured for the BiLM with Adam on the ELMo recipe benchmark (elmo-small, 10 CPU minutes; bilm-tf used "
        "Adagrad at 0.2, which does not transfer)"
    )


def _subword_tokenizer_problem(tokenizer) -> str | None:
    if getattr(tokenizer, "is_fast", False):
        return None
    return (
        "--model_type bert needs a fast subword tokenizer (word ids for whole-word masking), e.g. WordPiece from "
        "`python -m tokenizer train --model_type bert`"
    )


def _word_tokenizer_problem(tokenizer) -> str | None:
    if hasattr(tokenizer, "split_words") and tokenizer.bos_token is not None and tokenizer.eos_token is not None:
        return None
    return (
        "--model_type elmo needs the ELMo-style word tokenizer (words, <S> </S>; `python -m tokenizer train "
        "--model_type elmo`)"
    )


#: What each family's runs share, on the user's data and in the demo job; its ``FamilyPretraining`` adds the rest.
_BERT_RUN = dict(max_seq_length=128, per_device_train_batch_size=32, weight_decay=0.01, lr_scheduler_type="linear")
_ELMO_RUN = dict(config_name="elmo-small", max_seq_length=32, per_device_train_batch_size=16, weight_decay=0.0)

#: The BERT-like preset of a run on the user's data on a GPU: the ModernBERT-class layout won the time-to-quality
#: benchmark (issue 41; docs/results.md: modernbert-tiny against bert-tiny, 10 CPU minutes, 2 repeats: 0.29
#: nats lower held-out MLM loss at 0.95M tokens, at the same tokens per second relative to the paired reference), so
#: its ModernBERT-base sizes.
BERT_DATA_PRESET = "modernbert-base"
#: ... and on the CPU (issue 50): modernbert-base (129.6M parameters) on 3 MB of text took 9.9 GB and an estimated
#: 1h18m for one epoch, and its own plan warned it would learn nothing beyond word frequencies; modernbert-tiny on the
#: same data: 1m41s, 2 GB, 0.33 nats below the unigram plateau.
BERT_CPU_DATA_PRESET = "modernbert-tiny"
#: ModernBERT's training length (Warner et al. 2024: 1,024 tokens until the context extension) and about 32k tokens
#: per optimizer step: a modern preset's run on the user's data on CUDA, where not given.
MODERN_GPU_RUN = dict(max_seq_length=1024, per_device_train_batch_size=32)

BERT = FamilyPretraining(
    spec=BERT_SPEC,
    data_defaults=dict(
        _BERT_RUN, config_name=BERT_DATA_PRESET, vocab_size=30000, warmup_ratio=0.06, mlm_probability=0.15
    ),
    demo_defaults=dict(
        _BERT_RUN,
        config_name="bert-tiny",
        vocab_size=8000,
        mlm_probability=0.15,
        learning_rate=1e-3,
        num_warmup_steps=30,
        max_train_steps=300,
        eval_steps=100,
    ),
    learning_rate=_bert_learning_rate,
    learning_rate_help="BERT-like post-LN: 2e-3 x 128 / hidden size, at least 1e-4 (measured at bert-tiny; "
    "bert-base: 3.3e-4); pre-LN: the same, at least 1e-3 (Cramming): modernbert-tiny 2e-3, modernbert-mini and "
    "-base 1e-3",
    tokenize=tokenize_bert,
    tokenizer_problem=_subword_tokenizer_problem,
    any_config=True,
    device_defaults={
        "cuda": DeviceDefaults(
            BERT_DATA_PRESET,
            why="ModernBERT-base's sizes, the default for your data on a GPU",
            modern=MODERN_GPU_RUN,
            modern_why="ModernBERT's length and about 32k tokens per optimizer step on a GPU",
            modern_presets=tuple(MODERN_PRESETS),
        ),
        "cpu": DeviceDefaults(
            BERT_CPU_DATA_PRESET,
            why=f"the default for your data on the CPU, a size that learns within a CPU run ({BERT_DATA_PRESET}, "
            "the GPU default, would take hours and learn little beyond word frequencies here; --config_name to "
            "choose)",
        ),
    },
)
ELMO = FamilyPretraining(
    spec=ELMO_SPEC,
    data_defaults=dict(_ELMO_RUN, vocab_size=30000, warmup_ratio=0.06, lr_scheduler_type="warmup_stable_decay_1sqrt"),
    demo_defaults=dict(
        _ELMO_RUN,
        vocab_size=8000,
        lr_scheduler_type="linear",
        learning_rate=2e-3,
        num_warmup_steps=20,
        max_train_steps=200,
        eval_steps=50,
    ),
    learning_rate=_elmo_learning_rate,
    learning_rate_help="2e-3 for ELMo-style (measured)",
    tokenize=tokenize_elmo,
    tokenizer_problem=_word_tokenizer_problem,
    packing_problem="its LSTMs read each block as one sequence (document starts would need state resets)",
)
#: ``--model_type`` -> :class:`FamilyPretraining`.
FAMILIES: dict[str, FamilyPretraining] = {family.name: family for family in (BERT, ELMO)}
#: The family of a run without ``--model_type`` / ``--objective`` (and of the demo job).
DEFAULT_FAMILY = BERT.name

OBJECTIVES: dict[str, Objective] = {}


def register_objective(objective: Objective) -> Objective:
    """Add ``objective`` to the table (its ``family`` to :data:`FAMILIES` too); returns it.

    Raises:
        ValueError: the name is taken by another objective.
    """
    if OBJECTIVES.get(objective.name, objective) is not objective:
        raise ValueError(f"objective {objective.name!r} is registered already")
    OBJECTIVES[objective.name] = objective
    FAMILIES.setdefault(objective.family.name, objective.family)
    return objective


#: MLM's recipe on the user's data, chosen on the time-to-quality benchmark (docs/results.md): 30% masking
#: (Wettig et al. 2023, "Should You Mask 15% in Masked Language Modeling?") and warmup-stable-decay with a 1 - sqrt
#: decay over the last 20% (Hägele et al. 2024); each lowered bert-tiny's held-out loss at 3M tokens by ~0.05 nats.
MLM_DATA_DEFAULTS = dict(mlm_probability=0.3, lr_scheduler_type="warmup_stable_decay_1sqrt")

# One row per objective, in keyword arguments: a table, laid out by hand (the formatter would give a line per argument).
# fmt: off
register_objective(Objective(
    name="mlm", family=BERT, auto_class="AutoModelForMaskedLM", card_task="fill-mask", to_blocks=_pack_bert,
    collators=_mlm_collators, eval_keys=("nll_sum", "count"), metrics=_lm_metrics,
    data_defaults=MLM_DATA_DEFAULTS, document_masking=True, unigram_plateau=True, loss_fn=mlm_loss,
))
register_objective(Objective(
    name="mlm+nsp", family=BERT, auto_class="AutoModelForPreTraining", card_task="fill-mask", to_blocks=_nsp_pairs,
    collators=_mlm_collators, eval_keys=("nll_sum", "count", "nsp_correct", "nsp_count"), metrics=_nsp_metrics,
    result_keys=("eval_nsp_accuracy",), nsp=True, unigram_plateau=True, loss_fn=mlm_loss,
))
register_objective(Objective(
    name="bilm", family=ELMO, auto_class="AutoModelForPreTraining", card_task="feature-extraction",
    to_blocks=_pack_words, collators=_bilm_collators,
    eval_keys=("nll_sum", "count", "fwd_nll_sum", "fwd_count", "bwd_nll_sum", "bwd_count"), metrics=_bilm_metrics,
    result_keys=("forward_perplexity", "backward_perplexity"), weight_fn=bilm_weight, eval_step=bilm_eval_step,
))
register_objective(Objective(
    name="rtd", family=BERT, auto_class="AutoModelForPreTraining", card_task="feature-extraction",
    to_blocks=_pack_bert, collators=_rtd_collators, metrics=_rtd_metrics,
    eval_keys=("nll_sum", "count", "disc_nll_sum", "weighted_disc_sum", "real", "correct", "tp", "predicted",
               "replaced"), weight_fn=rtd_weight, eval_step=rtd_eval_step, loss_fn=rtd_loss,
    model_config=_rtd_model_config, write_outputs=_rtd_outputs, document_masking=True,
))
# fmt: on


def get_objective(model_type: str | None = None, nsp: bool = False, objective: str | None = None) -> Objective:
    """The entry for ``--objective`` (which must fit ``--model_type`` when that is given too), or else the one of
    ``--model_type`` (default ``bert``) that ``--nsp`` selects.

    Raises:
        InputError: an unknown objective or family, or ``--nsp`` / ``--objective`` that do not fit the family.
    """
    if objective is not None:
        if objective not in OBJECTIVES:
            raise InputError(f"--objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
        entry = OBJECTIVES[objective]
        if model_type is not None and model_type != entry.family.name:
            raise InputError(
                f"--objective {objective}: trains a {entry.family.name} model; expected --model_type "
                f"{entry.family.name} (got {model_type}), or no --model_type"
            )
        if nsp and not entry.nsp:
            raise InputError(
                f"--nsp: conflicts with --objective {objective}; expected --objective mlm+nsp, or no --nsp"
            )
        return entry
    model_type = model_type or DEFAULT_FAMILY
    if model_type not in FAMILIES:
        raise InputError(f"--model_type {model_type!r}: expected one of {', '.join(FAMILIES)}")
    candidates = [o for o in OBJECTIVES.values() if o.family.name == model_type and o.nsp == nsp]
    if not candidates:
        if nsp:
            raise InputError(
                f"--nsp: next-sentence prediction needs a BERT-like model; expected --model_type bert "
                f"(got {model_type})"
            )
        raise InputError(
            f"--model_type {model_type}: no objective in the table; expected one of "
            f"{', '.join(sorted({o.family.name for o in OBJECTIVES.values()}))}"
        )
    return candidates[0]


__all__ = [
    "BERT_CPU_DATA_PRESET",
    "BERT_DATA_PRESET",
    "DEFAULT_FAMILY",
    "DeviceDefaults",
    "FAMILIES",
    "OBJECTIVES",
    "FamilyPretraining",
    "Objective",
    "bilm_eval_step",
    "bilm_weight",
    "get_objective",
    "lm_eval_step",
    "mlm_loss",
    "mlm_outputs",
    "register_objective",
    "rtd_eval_step",
    "rtd_loss",
    "rtd_weight",
]
