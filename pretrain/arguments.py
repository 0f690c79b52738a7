"""The typed arguments of ``pretrain`` and ``pretrain.prepare``, and their resolution into one
:class:`PretrainArguments` (the step counts are :class:`training.plan.RunPlan`'s, made later).

One frozen dataclass per concern (model, objective, masking, corpus, training data, output of ``prepare``; the loop's
:class:`training.config.TrainingConfig` and :class:`training.hub.HubArguments`), parsed once. The defaults that
depend on the data are then filled by :func:`resolve`, a pure function from the parsed values (and a prepared
dataset's manifest) to a :class:`PretrainArguments` of new frozen values:

* the demo job (no ``--train_file`` / ``--dataset_name`` / ``--prepared_dataset``) takes the family's
  ``demo_defaults`` (bert-tiny, 300 steps, ...);
* a run on the user's data takes the family's ``data_defaults``, one epoch unless ``--max_train_steps``, warmup
  6%, and evaluation + checkpoints every 10% of the run (``eval_steps = 0.1``, a fraction the run plan resolves:
  :func:`training.plan.make_plan`); over them, its ``device_defaults`` for the device the run will train on
  (:func:`device_choices`; BERT-like: modernbert-tiny on the CPU, modernbert-base on a GPU, where a modern preset
  takes ModernBERT's length 1,024 and 32 rows per device), said with their reason in the run plan's line;
* the learning rate follows the family's rule for the model config (:meth:`PretrainArguments.with_model_config`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from core.arguments import arg, run_config, with_defaults
from core.errors import InputError
from pretrain.objectives import DEFAULT_FAMILY, FAMILIES, OBJECTIVES, Objective, get_objective
from training.config import TrainingConfig
from training.hub import HubArguments

#: Fraction of a run with data between two evaluations / checkpoints, when not given.
DATA_INTERVAL = 0.1
#: The manifest key of a prepared dataset whose blocks carry ``position_ids`` (document boundaries).
DOCUMENT_BOUNDARIES_KEY = "document_boundaries"


def _default_configs(family) -> str:
    """The family's preset for the user's data, per device type where they differ (for ``--help``)."""
    if not family.device_defaults:
        return family.data_defaults["config_name"]
    where = {"cuda": "a GPU", "cpu": "the CPU"}
    return " / ".join(f"{d.config_name} on {where.get(k, k)}" for k, d in family.device_defaults.items())


def default_device_type() -> str:
    """The device type a run will train on: ``"cuda"`` when a CUDA device is available and accelerate is not told to
    use the CPU (``ACCELERATE_USE_CPU``, e.g. ``accelerate launch --cpu``), else ``"cpu"`` (other accelerators have no
    device defaults of their own)."""
    import torch

    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_choices(
    objective: Objective, given: Mapping[str, Any], demo: bool, device_type: str
) -> tuple[dict[str, Any], str | None]:
    """The defaults of a run on the user's data on ``device_type`` over the family's ``data_defaults`` (the family's
    :class:`pretrain.objectives.DeviceDefaults`), and the phrase that says which were taken and why.

    Args:
        objective: the run's objective (its family's ``device_defaults``).
        given: the user's values (``None`` or absent: not given) of ``config_name``, ``model_name_or_path``,
            ``max_seq_length`` (a prepared dataset's counts as given) and ``per_device_train_batch_size``.
        demo: the demo job (no device defaults).
        device_type: ``"cuda"``, ``"cpu"``, ...

    Returns:
        ``(defaults, why)``: the device's preset where neither ``--config_name`` nor ``--model_name_or_path`` is
        given; the device's settings of a modern preset (chosen or given) where not given; ``why`` is ``None`` when
        nothing was taken.
    """
    chosen = objective.family.device_defaults.get(device_type)
    if demo or chosen is None:
        return {}, None
    defaults: dict[str, Any] = {}
    why = []
    config_name = given.get("config_name")
    if config_name is None and given.get("model_name_or_path") is None:
        config_name = defaults["config_name"] = chosen.config_name
        why.append(f"{config_name}, {chosen.why}")
    if config_name in chosen.modern_presets:
        taken = {k: v for k, v in chosen.modern.items() if given.get(k) is None}
        defaults.update(taken)
        if taken:
            why.append(f"{', '.join(f'--{k} {v}' for k, v in taken.items())}: {chosen.modern_why}")
    return defaults, "; ".join(why) or None


@dataclasses.dataclass(frozen=True)
class ModelArguments:
    """Which model to pretrain and with which tokenizer."""

    _argument_group_name: ClassVar[str] = "model"

    model_type: str | None = arg(
        None,
        "BERT-like (MLM) or ELMo-style (BiLM) (default: bert, or the family of --objective)",
        choices=list(FAMILIES),
    )
    config_name: str | None = arg(
        None,
        f"preset ({', '.join(p for f in FAMILIES.values() for p in f.spec.presets)}), a config.json path or folder, "
        f"or a hub repo id (default: {' / '.join(_default_configs(f) for f in FAMILIES.values())}; the "
        f"demo job: {FAMILIES[DEFAULT_FAMILY].demo_defaults['config_name']})",
    )
    model_name_or_path: str | None = arg(
        None, "continue pretraining these weights (and their tokenizer) instead of a fresh model"
    )
    tokenizer_name: str | None = arg(
        None,
        "tokenizer path or repo (default: the one saved with --model_name_or_path "
        "or --prepared_dataset, else one trained on the training files)",
    )
    revision: str | None = arg(
        None,
        "revision (branch, tag or commit id) of hub repos given by --model_name_or_path "
        "/ --config_name / --tokenizer_name",
    )
    vocab_size: int | None = arg(None, "vocabulary size of a trained tokenizer (default: 30000; the demo job: 8000)")
    trust_remote_code: bool = arg(
        False,
        "allow Python code from the folders or repos of --model_name_or_path / "
        "--tokenizer_name / --config_name (auto_map); without it such code is refused",
    )
    output_bias_init: str = arg(
        "unigram",
        "output bias of a fresh model's MLM head: unigram (the log frequencies of the training tokens: the model "
        "starts on the unigram plateau, Lin et al. 2017) or zeros (BERT's)",
        choices=["unigram", "zeros"],
    )

    @property
    def config_overrides(self) -> dict[str, Any]:
        """The model config fields given on the command line (:class:`PretrainModelArguments`; here none)."""
        return {}


@dataclasses.dataclass(frozen=True)
class PretrainModelArguments(ModelArguments):
    """:class:`ModelArguments` with the config fields ``pretrain`` may set (a context-extension phase changes them)."""

    rope_theta: float | None = arg(
        None,
        "rotary base of a rotary model's global layers (rope_parameters['full_attention']['rope_theta']), over its "
        "config's; local layers keep theirs (rope_parameters['sliding_attention']). "
        "A context-extension phase raises it: ModernBERT trains at 1,024 tokens with 10,000, then extends to 8,192 "
        "with 160,000 (--continue_from_checkpoint with a longer --max_seq_length)",
    )
    max_position_embeddings: int | None = arg(
        None,
        "longest sequence the model takes, over its config's (a rotary model: no weights depend on it, so a "
        "context-extension phase may raise it)",
    )

    def __post_init__(self) -> None:
        theta, positions = self.rope_theta, self.max_position_embeddings
        if theta is not None and not (theta > 1 and math.isfinite(theta)):
            raise InputError(f"--rope_theta {theta}: expected a finite rotary base > 1")
        if positions is not None and positions < 1:
            raise InputError(f"--max_position_embeddings {positions}: expected an integer >= 1")

    @property
    def config_overrides(self) -> dict[str, Any]:
        """The model config fields given, set as they are: ``max_position_embeddings``. (``--rope_theta`` is one entry
        of the config's ``rope_parameters``: ``pretrain.build`` writes it into the loaded config.)"""
        return {} if self.max_position_embeddings is None else {"max_position_embeddings": self.max_position_embeddings}


@dataclasses.dataclass(frozen=True)
class RecipeArguments:
    """Pretraining in phases from a recipe file (:mod:`pretrain.recipe`)."""

    _argument_group_name: ClassVar[str] = "phases"

    recipe: str | None = arg(
        None,
        "run the phases of this YAML recipe in turn (e.g. recipes/modernbert.yaml: stable, context extension, decay), "
        "each a pretrain run with these flags and the phase's over them, in <output_dir>/<phase>, continuing the "
        "previous phase's last checkpoint; run again after an interruption: finished phases are skipped, the "
        "interrupted one resumes; with --push_to_hub each phase is a hub branch named after it",
    )


@dataclasses.dataclass(frozen=True)
class ObjectiveArguments:
    """Which pretraining objective (a row of :mod:`pretrain.objectives`)."""

    _argument_group_name: ClassVar[str] = "objective"

    objective: str | None = arg(
        None,
        f"pretraining objective: {', '.join(OBJECTIVES)} (default: mlm for --model_type "
        "bert, mlm+nsp with --nsp, bilm for --model_type elmo)",
    )
    nsp: bool = arg(
        False, "sentence-pair blocks and next-sentence prediction (SesameBertForPreTraining; = --objective mlm+nsp)"
    )


@dataclasses.dataclass(frozen=True)
class MaskingArguments:
    """MLM masking (BERT-like objectives)."""

    _argument_group_name: ClassVar[str] = "masking (BERT-like)"

    mlm_probability: float | None = arg(
        None,
        "fraction of tokens selected for prediction (default: 0.3 for mlm on "
        "your data, as measured; 0.15 (BERT) for mlm+nsp and the demo job)",
    )
    mask_replace_prob: float = arg(0.8, "of the selected tokens: replaced by [MASK]")
    random_replace_prob: float = arg(0.1, "of the selected tokens: replaced by a random token (the rest are kept)")
    whole_word_mask: bool = arg(False, "select whole words (all their WordPiece pieces)")
    mlm_probability_end: float | None = arg(
        None,
        "masking-rate schedule: the rate moves linearly from --mlm_probability at the first optimizer step to this "
        "at the last (e.g. 0.3 -> 0.15, as ModernBERT / Ettin phases lower it); the held-out evaluation keeps "
        "--mlm_probability, so its curves compare (unset: one fixed rate)",
    )

    def __post_init__(self) -> None:
        end = self.mlm_probability_end
        if end is not None and not 0 < end < 1:
            raise InputError(f"--mlm_probability_end {end}: expected a number in (0, 1)")


@dataclasses.dataclass(frozen=True)
class CorpusArguments:
    """The text and how it becomes blocks (shared by ``pretrain`` and ``pretrain.prepare``)."""

    _argument_group_name: ClassVar[str] = "data"

    train_file: list[str] | None = arg(
        None, ".txt/.txt.gz files, documents separated by blank lines (default: the bundled corpus)", nargs="+"
    )
    validation_file: str | None = arg(
        None,
        "validation file (default: the bundled one, or the last "
        "--validation_split_percentage %% of the training documents)",
    )
    dataset_name: str | None = arg(None, "a hub dataset instead of files")
    dataset_config_name: str | None = arg(None, "its configuration")
    text_column_name: str = arg("text", "text column of a hub dataset")
    validation_split_percentage: int = arg(
        5, "held-out share of the training documents when there is no validation split"
    )
    sample_by: Literal["paragraph", "line"] = arg(
        "paragraph", "examples of a text file: documents (blank-line separated) or lines"
    )
    max_seq_length: int | None = arg(None, "block length in tokens (default: 128 BERT-like, 32 ELMo-style)")
    preprocessing_num_workers: int | None = arg(None, "processes for datasets.map")
    overwrite_cache: bool = arg(False, "recompute the cached datasets.map results")
    packing_batch_size: int = arg(1000, "documents per packing map batch (only its last block may be short)")
    document_masking: bool | None = arg(
        None,
        "packed blocks keep their documents apart: each document piece starts "
        "with [CLS] at position 0, position ids restart per document and attention "
        "stays within a document (default: true for mlm; a --prepared_dataset: as "
        "it was prepared; false: documents joined by [SEP], one [CLS] per block, "
        "attention across the block)",
    )
    streaming: bool = arg(
        False,
        "read the hub dataset (or the files) as a stream, tokenized and packed on the fly: no "
        "full download; needs --max_train_steps and --tokenizer_name (or --model_name_or_path)",
    )

    @property
    def demo(self) -> bool:
        """The embedded demo job: no data argument (the bundled corpus)."""
        return not (self.train_file or self.dataset_name)


@dataclasses.dataclass(frozen=True)
class TrainDataArguments:
    """Training-run data options: a prepared dataset, sample caps, loader workers."""

    _argument_group_name: ClassVar[str] = "training data"

    prepared_dataset: str | None = arg(
        None, "a folder written by `python -m pretrain.prepare`: memory-mapped blocks, no tokenization"
    )
    verify_prepared: bool = arg(
        False,
        "check the SHA-256 of every file of --prepared_dataset against its manifest "
        "(default: sizes always, contents on first use and when changed)",
    )
    max_train_samples: int | None = arg(None, "use only the first N training blocks")
    max_eval_samples: int | None = arg(None, "use only the first N validation blocks")
    dataloader_num_workers: str = arg(
        "auto",
        "DataLoader worker processes that collate and mask ahead of the step: a number, or auto = "
        "min(4, CPU cores per local process) on CUDA (0 on the CPU and for --streaming)",
    )
    short_seq_length: int | None = arg(
        None,
        "mixing lengths: cut a training batch's blocks into rows of this many tokens (a divisor of "
        "--max_seq_length) with probability --short_seq_probability, e.g. 1024 in a context extension at 8192",
    )
    short_seq_probability: float | None = arg(
        None, "the share of training batches cut into rows of --short_seq_length (BERT's short_seq_prob, per batch)"
    )

    def __post_init__(self) -> None:
        from training.data import resolve_num_workers

        resolve_num_workers(self.dataloader_num_workers, "cpu")  # validates (InputError)
        length, probability = self.short_seq_length, self.short_seq_probability
        if (length is None) != (probability is None):
            raise InputError(
                "--short_seq_length and --short_seq_probability: expected both (mixing lengths) or neither"
            )
        if length is not None and length < 1:
            raise InputError(f"--short_seq_length {length}: expected a number of tokens >= 1")
        if probability is not None and not 0 <= probability <= 1:
            raise InputError(f"--short_seq_probability {probability}: expected a number in [0, 1]")


@dataclasses.dataclass(frozen=True)
class BudgetArguments:
    """A compute budget, converted once into ``--max_train_steps`` (the run logs the flag that repeats it exactly)."""

    _argument_group_name: ClassVar[str] = "compute budget (instead of --max_train_steps / --num_train_epochs)"

    max_train_tokens: int | None = arg(
        None, "train on this many tokens: --max_train_steps = ceil(N / (global batch x --max_seq_length))"
    )
    time_budget: float | None = arg(
        None,
        "train for about this many minutes of optimizer steps (evaluation, "
        "checkpoints and start-up not counted): the first steps are timed on a copy of "
        "the model and the budget becomes --max_train_steps (logged, and recorded in "
        "run_config.json and checkpoints: a resumed run keeps it)",
    )

    @property
    def given(self) -> str | None:
        """The budget flag given (``--max_train_tokens`` / ``--time_budget``), or None."""
        if self.max_train_tokens is not None:
            return "--max_train_tokens"
        return "--time_budget" if self.time_budget is not None else None


def _learning_rate_help() -> str:
    rules = ", ".join(f.learning_rate_help for f in FAMILIES.values())
    demo = " / ".join(f"{f.demo_defaults['learning_rate']:.0e}".replace("e-0", "e-") for f in FAMILIES.values())
    return f"peak learning rate (default: {rules}; the demo job: {demo})"


#: The loop's flags with pretraining's defaults: ``None`` = resolved by :func:`resolve` from the data and family.
PretrainTrainingArguments = with_defaults(
    TrainingConfig,
    dict(
        output_dir=None,
        learning_rate=None,
        num_train_epochs=None,
        warmup_ratio=None,
        eval_steps=None,
        checkpointing_steps=None,
        weight_decay=None,
        per_device_train_batch_size=None,
        per_device_eval_batch_size=32,
        lr_scheduler_type=None,
    ),
    help=dict(
        learning_rate=_learning_rate_help(),
        output_dir="run folder (model, checkpoints/, runs/, wandb/, all_results.json) (default: "
        "outputs/pretrain-<model_type>)",
        warmup_ratio="warmup as a fraction of the run's optimizer steps, when --num_warmup_steps is not given "
        "(default: 0.06)",
        num_train_epochs="passes over the training data, unless --max_train_steps is given (default: 1; the demo "
        "job: 300 steps)",
        eval_steps="evaluate every N optimizer steps, or every fraction of the run when below 1 (and at the end) "
        "(default: every 10%% of the run with your data)",
        checkpointing_steps="checkpoint every N optimizer steps, or every fraction of the run when below 1 (always "
        "one at the end) (default: every 10%% of the run with your data)",
        weight_decay="AdamW weight decay, not on biases/norms (default: 0.01 BERT-like, 0 ELMo-style)",
        per_device_train_batch_size="micro-batch size per process (default: 32 BERT-like, 16 ELMo-style)",
        lr_scheduler_type="learning-rate schedule (default: warmup_stable_decay_1sqrt for mlm and bilm on your data, "
        "as measured; linear for the other objectives and the demo job)",
    ),
    name="PretrainTrainingArguments",
)


@dataclasses.dataclass(frozen=True)
class PretrainArguments:
    """The resolved arguments of a pretraining run: every data-dependent default filled (see the module docstring)."""

    model: ModelArguments
    objective: Objective
    objective_args: ObjectiveArguments
    masking: MaskingArguments
    corpus: CorpusArguments
    data: TrainDataArguments
    training: TrainingConfig
    hub: HubArguments
    learning_rate_source: str = "--learning_rate"
    budget: BudgetArguments = BudgetArguments()
    device_choice: str | None = None
    """Which of the device's defaults were taken and why (:func:`device_choices`), for the run plan's line."""

    @property
    def demo(self) -> bool:
        return self.corpus.demo and not self.data.prepared_dataset

    @property
    def family(self):
        return self.objective.family

    def with_model_config(self, config) -> PretrainArguments:
        """The plan with the family's learning rate for ``config`` where ``--learning_rate`` was not given."""
        if self.training.learning_rate is not None:
            training, source = self.training.resolved(), "--learning_rate"
        else:
            rate, source = self.family.learning_rate(config)
            training = self.training.resolved(learning_rate=rate)
        return dataclasses.replace(self, training=training, learning_rate_source=source)

    def settings(self) -> dict[str, Any]:
        """The run's flat settings (secrets removed), for trackers, the model card and run files."""
        return {
            **run_config(
                self.model,
                self.objective_args,
                self.masking,
                self.corpus,
                self.data,
                self.budget,
                self.training,
                self.hub,
            ),
            "model_type": self.family.name,
            "objective": self.objective.name,
        }


def _fill(instance, defaults: Mapping[str, Any]):
    """``instance`` with its ``None`` fields that ``defaults`` names filled in."""
    names = {f.name for f in dataclasses.fields(instance)}
    values = {k: v for k, v in defaults.items() if k in names and getattr(instance, k) is None}
    return dataclasses.replace(instance, **values) if values else instance


def family_defaults(
    objective: Objective, demo: bool, epochs_given: bool = False, budget_given: bool = False
) -> dict[str, Any]:
    """The settings a run fills in where not given: the family's demo settings (without their step counts when an
    epoch count or a budget is given), or its data settings with one epoch, 6% warmup and evaluation + checkpoints
    every :data:`DATA_INTERVAL` of the run; the output folder ``outputs/pretrain-<family>``."""
    family = objective.family
    defaults = dict(family.demo_defaults) if demo else {**family.data_defaults, **objective.data_defaults}
    if demo and epochs_given:  # an explicit epoch count wins over the demo's step count
        defaults.pop("max_train_steps", None)
        defaults.pop("eval_steps", None)
    if demo and budget_given:  # so does a budget (the demo's evaluation steps stay)
        defaults.pop("max_train_steps", None)
    defaults.update(
        num_train_epochs=1.0,
        warmup_ratio=0.0 if demo else 0.06,
        output_dir=os.path.join("outputs", f"pretrain-{family.name}"),
    )
    return defaults


def _given(model: ModelArguments, corpus: CorpusArguments, batch_size: int | None) -> dict[str, Any]:
    """The user's values that :func:`device_choices` reads."""
    return dict(
        config_name=model.config_name,
        model_name_or_path=model.model_name_or_path,
        max_seq_length=corpus.max_seq_length,
        per_device_train_batch_size=batch_size,
    )


def resolve_inputs(
    model: ModelArguments,
    objective_args: ObjectiveArguments,
    corpus: CorpusArguments,
    demo: bool,
    manifest: Mapping[str, Any] | None = None,
    device_type: str | None = None,
    batch_size: int | None = None,
) -> tuple[Objective, ModelArguments, CorpusArguments]:
    """The objective, and the model and corpus arguments with the family's defaults and the device's (``pretrain``
    and ``pretrain.prepare``; :func:`device_choices` for ``device_type``, ``None``: :func:`default_device_type`, with
    ``batch_size`` the given ``--per_device_train_batch_size``); a prepared dataset's ``manifest`` gives the block
    length.

    Raises:
        InputError: an objective that does not fit ``--model_type`` / ``--nsp``, or a size argument below 1.
    """
    objective = get_objective(model.model_type, objective_args.nsp, objective_args.objective)
    if manifest is not None and corpus.max_seq_length is None:
        corpus = dataclasses.replace(corpus, max_seq_length=manifest["max_seq_length"])
    corpus = dataclasses.replace(corpus, document_masking=resolve_document_masking(objective, corpus, manifest))
    defaults = family_defaults(objective, demo)
    given = _given(model, corpus, batch_size)
    defaults.update(device_choices(objective, given, demo, device_type or default_device_type())[0])
    model, corpus = _fill(model, defaults), _fill(corpus, defaults)
    for name, value in (("max_seq_length", corpus.max_seq_length), ("vocab_size", model.vocab_size)):
        if value is not None and value < 1:
            raise InputError(f"--{name} {value}: expected an integer >= 1")
    return objective, model, corpus


def resolve_document_masking(
    objective: Objective, corpus: CorpusArguments, manifest: Mapping[str, Any] | None = None
) -> bool:
    """``--document_masking`` resolved: as given; else true for an objective whose blocks can keep documents apart
    (:attr:`pretrain.objectives.Objective.document_masking`), or, for a prepared dataset, what its ``manifest`` says
    (a manifest written before the key existed: false). A mismatch with the manifest is refused later, by
    :func:`pretrain.prepare.check_manifest`.

    Raises:
        InputError: ``--document_masking true`` for an objective without it (NSP pairs are one sequence per row; the
            BiLM's LSTMs read a block as one sequence).
    """
    given = corpus.document_masking
    if given and not objective.document_masking:
        raise InputError(
            f"--document_masking true: not available for the {objective.name} objective, "
            f"{objective.family.packing_problem}; "
            "expected false or no --document_masking"
        )
    if given is not None:
        return given
    if manifest is not None:
        return bool(manifest.get(DOCUMENT_BOUNDARIES_KEY, False))
    return objective.document_masking


def check_budget(budget: BudgetArguments, training: TrainingConfig) -> None:
    """Refuse a budget given with another budget or run length, or out of range.

    Raises:
        InputError: one line naming the conflicting flags, or the value and what is expected.
    """
    given = [
        name
        for name, value in (
            ("--max_train_tokens", budget.max_train_tokens),
            ("--time_budget", budget.time_budget),
            ("--max_train_steps", training.max_train_steps),
            ("--num_train_epochs", training.num_train_epochs),
        )
        if value is not None
    ]
    if budget.given and len(given) > 1:
        raise InputError(
            f"{given[0]}: conflicts with {', '.join(given[1:])}; expected one way to set the length of "
            "the run (--max_train_steps, --num_train_epochs, --max_train_tokens or --time_budget)"
        )
    if budget.max_train_tokens is not None and budget.max_train_tokens < 1:
        raise InputError(f"--max_train_tokens {budget.max_train_tokens}: expected an integer >= 1")
    if budget.time_budget is not None and not (budget.time_budget > 0 and math.isfinite(budget.time_budget)):
        raise InputError(f"--time_budget {budget.time_budget}: expected a positive number of minutes")


def resolve(
    model: ModelArguments,
    objective_args: ObjectiveArguments,
    masking: MaskingArguments,
    corpus: CorpusArguments,
    data: TrainDataArguments,
    training: TrainingConfig,
    hub: HubArguments,
    manifest: Mapping[str, Any] | None = None,
    budget: BudgetArguments | None = None,
    device_type: str | None = None,
) -> PretrainArguments:
    """The resolved arguments of the parsed ones (a pure function; the learning rate is resolved later, once the model
    config is known: :meth:`PretrainArguments.with_model_config`; a budget once the accelerator and the data are:
    :func:`pretrain.run_plan.make_run_plan`).

    Args:
        manifest: the ``--prepared_dataset``'s manifest (its block length fills ``--max_seq_length``).
        budget: ``--max_train_tokens`` / ``--time_budget`` (then no run length is filled in).
        device_type: the device the run trains on, for its defaults (:func:`device_choices`); ``None``:
            :func:`default_device_type`.

    Raises:
        InputError: an objective that does not fit ``--model_type`` / ``--nsp``, a size argument below 1, or a budget
            that conflicts with another run length (:func:`check_budget`).
    """
    budget = budget or BudgetArguments()
    check_budget(budget, training)
    demo = corpus.demo and not data.prepared_dataset
    device_type = device_type or default_device_type()
    batch = training.per_device_train_batch_size
    given = _given(model, corpus, batch)
    if manifest is not None and given["max_seq_length"] is None:  # the prepared blocks' length counts as given
        given["max_seq_length"] = manifest["max_seq_length"]
    objective, model, corpus = resolve_inputs(model, objective_args, corpus, demo, manifest, device_type, batch)
    device, device_choice = device_choices(objective, given, demo, device_type)
    defaults = family_defaults(
        objective, demo, epochs_given=training.num_train_epochs is not None, budget_given=budget.given is not None
    )
    defaults.update(device)
    if not demo:
        defaults.update(eval_steps=training.eval_steps or DATA_INTERVAL)
        defaults.update(checkpointing_steps=training.checkpointing_steps or defaults["eval_steps"])
    training = _fill(training, defaults)  # its construction checks the values
    masking = _fill(masking, defaults)
    if masking.mlm_probability_end is not None and objective.family.name != DEFAULT_FAMILY:
        raise InputError(
            f"--mlm_probability_end {masking.mlm_probability_end}: a masking-rate schedule, and the {objective.name} "
            "objective masks no token; expected a BERT-like objective (mlm, mlm+nsp, rtd)"
        )
    check_short_rows(data, objective, corpus.max_seq_length)
    parts = (model, objective, objective_args, masking, corpus, data, training, hub)
    return PretrainArguments(*parts, budget=budget, device_choice=device_choice)


def check_short_rows(data: TrainDataArguments, objective, max_seq_length: int | None) -> None:
    """Refuse ``--short_seq_length`` (mixing lengths, :class:`pretrain.collators.ShortRows`) where it cannot apply:
    an objective other than MLM / RTD (NSP pairs and BiLM sentences are not cut), or a length that is not a divisor
    of ``--max_seq_length`` below it.

    Raises:
        InputError: naming the flag, the value and what was expected.
    """
    length = data.short_seq_length
    if length is None:
        return
    if objective.family.name != DEFAULT_FAMILY or objective.nsp:
        raise InputError(
            f"--short_seq_length {length}: the {objective.name} objective's examples are not cut into rows; "
            "expected mlm or rtd"
        )
    if max_seq_length is None or length >= max_seq_length or max_seq_length % length:
        raise InputError(
            f"--short_seq_length {length}: blocks of {max_seq_length} tokens (--max_seq_length); expected a "
            "divisor below it (e.g. 1024 at 8192)"
        )


__all__ = [
    "DOCUMENT_BOUNDARIES_KEY",
    "BudgetArguments",
    "CorpusArguments",
    "MaskingArguments",
    "ModelArguments",
    "ObjectiveArguments",
    "PretrainArguments",
    "PretrainModelArguments",
    "PretrainTrainingArguments",
    "RecipeArguments",
    "TrainDataArguments",
    "check_budget",
    "check_short_rows",
    "default_device_type",
    "device_choices",
    "family_defaults",
    "resolve",
    "resolve_document_masking",
    "resolve_inputs",
]
