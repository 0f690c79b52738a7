"""``accelerate launch pretrain``: pretrain a BERT-like (MLM, optionally NSP) or ELMo-style (BiLM) model.

With no data argument: the embedded demo job -- a WordPiece tokenizer (8k) trained on the corpus bundled in
``pretrain/corpus/``, a bert-tiny-sized SesameBert (L2/H128), documents packed into 128-token blocks, MLM, 300 steps;
a few minutes on a laptop CPU; writes ``outputs/pretrain-bert``. The demo's settings apply to the demo only: with
``--train_file`` / ``--dataset_name`` / ``--prepared_dataset`` the run plan follows the data (:func:`apply_defaults`).

What differs between objectives (MLM, MLM+NSP, BiLM) is read from one table, :mod:`pretrain.objectives`.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

from training.errors import InputError, add_debug_argument, check_local_path, first_line

logger = logging.getLogger("pretrain")

#: Settings of a run on the user's data, where not given (the demo job has its own: ``Objective.demo_defaults``).
DATA_DEFAULTS = {
    "bert": dict(config_name="bert-base", vocab_size=30000, max_seq_length=128, per_device_train_batch_size=32,
                 weight_decay=0.01, warmup_ratio=0.06),
    "elmo": dict(config_name="elmo-small", vocab_size=30000, max_seq_length=32, per_device_train_batch_size=16,
                 weight_decay=0.0, warmup_ratio=0.06),
}
#: Peak learning rates of AdamW by family and norm position, with their sources.
LEARNING_RATES = {
    ("bert", "post"): (1e-4, "BERT (Devlin et al. 2019, sec. A.2): 1e-4 at batch 256, post-LN"),
    ("bert", "pre"): (1e-3, "Cramming (Geiping & Goldstein 2023): 1e-3 for pre-LN encoders"),
    ("elmo", None): (1e-3, "sesame-lm default for the BiLM with Adam (bilm-tf used Adagrad at 0.2, which does not transfer)"),
}


def build_parser() -> argparse.ArgumentParser:
    from training.hub import add_hub_arguments
    from training.loop import add_training_arguments
    from training.run import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="accelerate launch pretrain",
        description=(
            "Pretrain a BERT-like encoder (MLM, optionally NSP) or an ELMo-style BiLM. With no data argument: the demo job, "
            "a bert-tiny-sized model with an 8k WordPiece tokenizer trained on the bundled corpus, 128-token packed "
            "blocks, 300 optimizer steps of batch 32 (a few minutes on a CPU), written to outputs/pretrain-bert. With "
            "your data (--train_file, --dataset_name or --prepared_dataset) the run lasts --num_train_epochs (1) unless "
            "--max_train_steps is given, warms up for --warmup_ratio 0.06, and evaluates and checkpoints every 10% of it."
        ),
        formatter_class=HelpFormatter,
    )
    add_model_arguments(parser)
    add_data_arguments(parser)
    add_objective_arguments(parser)
    add_hub_arguments(parser)
    add_training_arguments(
        parser, output_dir=None, learning_rate=None, max_train_steps=None, num_train_epochs=None, num_warmup_steps=None, warmup_ratio=None,
        eval_steps=None, weight_decay=None, per_device_train_batch_size=None, per_device_eval_batch_size=32,
        project_name="sesame-lm-pretrain",
        learning_rate_help="peak learning rate (default: 1e-4 for post-LN BERT-like presets (BERT, batch 256), 1e-3 for "
                           "pre-LN ones (Cramming), 1e-3 for ELMo-style; the demo job: 1e-3 / 2e-3)",
    )
    for action in parser._actions:  # the defaults that depend on the data are given in the help
        if action.dest == "warmup_ratio":
            action.help = "warmup as a fraction of the run's optimizer steps, when --num_warmup_steps is not given (default: 0.06)"
        elif action.dest == "output_dir":
            action.help += " (default: outputs/pretrain-<model_type>)"
        elif action.dest == "num_train_epochs":
            action.help += " (default: 1; the demo job: 300 steps)"
        elif action.dest in ("eval_steps", "checkpointing_steps"):
            action.help += " (default: every 10%% of the run with your data)"
    add_debug_argument(parser)
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model_type``, ``--config_name``, ``--model_name_or_path``, ``--tokenizer_name``, ``--revision``,
    ``--vocab_size`` (shared with ``pretrain.prepare``)."""
    m = parser.add_argument_group("model")
    m.add_argument("--model_type", choices=["bert", "elmo"], default="bert", help="BERT-like (MLM) or ELMo-style (BiLM)")
    m.add_argument("--config_name", default=None, help="preset (bert-tiny, bert-mini, bert-small, bert-base, elmo-small, elmo-original), a config.json path or folder, or a hub repo id (default: bert-base / elmo-small; the demo job: bert-tiny)")
    m.add_argument("--model_name_or_path", default=None, help="continue pretraining these weights (and their tokenizer) instead of a fresh model")
    m.add_argument("--tokenizer_name", default=None, help="tokenizer path or repo (default: the one saved with --model_name_or_path or --prepared_dataset, else one trained on the training files)")
    m.add_argument("--revision", default=None, help="revision (branch, tag or commit id) of hub repos given by --model_name_or_path / --config_name / --tokenizer_name")
    m.add_argument("--vocab_size", type=int, default=None, help="vocabulary size of a trained tokenizer (default: 30000; the demo job: 8000)")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data arguments (shared with ``pretrain.prepare``)."""
    d = parser.add_argument_group("data")
    d.add_argument("--train_file", nargs="+", default=None, help=".txt/.txt.gz files, documents separated by blank lines (default: the bundled corpus)")
    d.add_argument("--validation_file", default=None, help="validation file (default: the bundled one, or the last --validation_split_percentage %% of the training documents)")
    d.add_argument("--dataset_name", default=None, help="a hub dataset instead of files")
    d.add_argument("--dataset_config_name", default=None, help="its configuration")
    d.add_argument("--text_column_name", default="text", help="text column of a hub dataset")
    d.add_argument("--validation_split_percentage", type=int, default=5, help="held-out share of the training documents when there is no validation split")
    d.add_argument("--sample_by", choices=["paragraph", "line"], default="paragraph", help="examples of a text file: documents (blank-line separated) or lines")
    d.add_argument("--max_seq_length", type=int, default=None, help="block length in tokens (default: 128 BERT-like, 32 ELMo-style)")
    d.add_argument("--preprocessing_num_workers", type=int, default=None, help="processes for datasets.map")
    d.add_argument("--overwrite_cache", action="store_true", help="recompute the cached datasets.map results")
    d.add_argument("--packing_batch_size", type=int, default=1000, help="documents per packing map batch (only its last block may be short)")
    d.add_argument("--max_train_samples", type=int, default=None, help="use only the first N training blocks")
    d.add_argument("--max_eval_samples", type=int, default=None, help="use only the first N validation blocks")
    d.add_argument("--dataloader_num_workers", type=int, default=0, help="DataLoader worker processes")
    d.add_argument("--prepared_dataset", default=None, help="a folder written by `python -m pretrain.prepare`: memory-mapped blocks, no tokenization")
    d.add_argument("--streaming", action="store_true", help="read the hub dataset (or the files) as a stream, tokenized and packed on the fly: no full download; needs --max_train_steps and --tokenizer_name (or --model_name_or_path)")


def add_objective_arguments(parser: argparse.ArgumentParser) -> None:
    """Masking and NSP arguments (shared with ``pretrain.prepare``, which records ``--nsp``)."""
    o = parser.add_argument_group("objective (BERT-like)")
    o.add_argument("--mlm_probability", type=float, default=0.15, help="fraction of tokens selected for prediction")
    o.add_argument("--mask_replace_prob", type=float, default=0.8, help="of the selected tokens: replaced by [MASK]")
    o.add_argument("--random_replace_prob", type=float, default=0.1, help="of the selected tokens: replaced by a random token (the rest are kept)")
    o.add_argument("--whole_word_mask", action="store_true", help="select whole words (all their WordPiece pieces)")
    o.add_argument("--nsp", action="store_true", help="sentence-pair blocks and next-sentence prediction (SesameBertForPreTraining)")


def is_demo(args: argparse.Namespace) -> bool:
    """The embedded demo job: no data argument (bundled corpus)."""
    return not (args.train_file or args.dataset_name or getattr(args, "prepared_dataset", None))


def apply_defaults(args: argparse.Namespace, objective) -> argparse.Namespace:
    """Fill the arguments not given: the demo job's settings (``objective.demo_defaults``) without a data argument;
    with data, :data:`DATA_DEFAULTS`, one epoch unless ``--max_train_steps``, and evaluation + checkpoints every
    10% of the run (the learning rate is set once the model config is known, :func:`default_learning_rate`).

    Raises:
        InputError: a size argument below 1.
    """
    demo = is_demo(args)
    defaults = dict(objective.demo_defaults) if demo else dict(DATA_DEFAULTS[objective.model_type])
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            if demo and key in ("max_train_steps", "eval_steps") and args.num_train_epochs is not None:
                continue  # an explicit epoch count wins over the demo's step count
            setattr(args, key, value)
    if args.num_train_epochs is None:
        args.num_train_epochs = 1.0
    if args.warmup_ratio is None:
        args.warmup_ratio = 0.0 if demo else 0.06
    if args.output_dir is None:
        args.output_dir = os.path.join("outputs", f"pretrain-{args.model_type}")
    for name in ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size", "vocab_size"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} {getattr(args, name)}: expected an integer >= 1")
    return args


def default_learning_rate(args, model_config) -> tuple[float, str]:
    """``(learning rate, source)`` for a run with data and no ``--learning_rate`` (:data:`LEARNING_RATES`)."""
    if args.model_type == "elmo":
        return LEARNING_RATES[("elmo", None)]
    return LEARNING_RATES[("bert", getattr(model_config, "norm_position", "post"))]


# -- pieces ---------------------------------------------------------------------------------------------------
def _rev(args) -> str:
    return f" (--revision {args.revision})" if getattr(args, "revision", None) else ""


def tokenizer_hash(tokenizer) -> str:
    """:func:`pretrain.data.tokenizer_hash` (imported on use: ``--help`` and refused input stay fast)."""
    from pretrain.data import tokenizer_hash as content_hash

    return content_hash(tokenizer)


def _load_tokenizer(path: str, arg: str, revision=None):
    from transformers import AutoTokenizer

    import modeling  # noqa: F401  (registers the tokenizers with AutoTokenizer)

    check_local_path(path, arg, "a tokenizer folder (save_pretrained) or a hub repo id")
    try:
        return AutoTokenizer.from_pretrained(path, revision=revision)
    except Exception as err:  # noqa: BLE001
        rev = f" (--revision {revision})" if revision else ""
        raise InputError(f"{arg} {path}{rev}: could not be loaded ({type(err).__name__}: {first_line(err)}); "
                         "expected a tokenizer folder (save_pretrained) or a hub repo id") from err


def _has_tokenizer(path: str) -> bool:
    p = Path(path)
    if p.is_dir():
        return (p / "tokenizer_config.json").is_file()
    return not p.exists()  # a hub repo id: try it


def get_tokenizer(args, objective, accelerator, prepared=None):
    """The run's tokenizer, by these rules:

    1. ``--tokenizer_name``; with ``--model_name_or_path`` whose folder holds a tokenizer, the two must be equal.
    2. ``--model_name_or_path`` alone: the tokenizer saved with the model (continued pretraining keeps the ids the
       embeddings learnt); a model without one is refused.
    3. ``--prepared_dataset``: the tokenizer saved in it (``--tokenizer_name``, if given, must equal it).
    4. A resumed run (``--resume_from_checkpoint``) reuses ``<output_dir>/tokenizer``.
    5. Otherwise the main process trains one on the training text into ``<output_dir>/tokenizer``.

    Raises:
        InputError: a tokenizer that cannot be loaded, or one that differs from the model's / the prepared dataset's.
    """
    given = _load_tokenizer(args.tokenizer_name, "--tokenizer_name", args.revision) if args.tokenizer_name else None
    if args.model_name_or_path:
        if _has_tokenizer(args.model_name_or_path):
            try:
                saved = _load_tokenizer(args.model_name_or_path, "--model_name_or_path", args.revision)
            except InputError:
                saved = None if given is not None else _raise_no_tokenizer(args)
            if given is not None and saved is not None and tokenizer_hash(given) != tokenizer_hash(saved):
                raise InputError(
                    f"--tokenizer_name {args.tokenizer_name}: differs from the tokenizer saved with --model_name_or_path "
                    f"{args.model_name_or_path} ({len(given)} vs {len(saved)} tokens, or other ids); expected the tokenizer the "
                    "model was trained with (leave --tokenizer_name out to use it)")
            if given is None:
                given = saved
        elif given is None:
            _raise_no_tokenizer(args)
    if prepared is not None:
        tok = _load_tokenizer(str(Path(args.prepared_dataset) / "tokenizer"), "--prepared_dataset")
        if given is not None and tokenizer_hash(given) != tokenizer_hash(tok):
            raise InputError(f"--prepared_dataset {args.prepared_dataset}: prepared with another tokenizer than "
                             f"{args.tokenizer_name or args.model_name_or_path}; expected the same tokenizer (prepare the "
                             "data again with it, or leave --tokenizer_name out)")
        return tok
    if given is not None:
        return given
    tok_dir = Path(args.output_dir) / "tokenizer"
    if args.resume_from_checkpoint and (tok_dir / "tokenizer_config.json").is_file():
        return _load_tokenizer(str(tok_dir), "--output_dir")
    if getattr(args, "streaming", False):
        raise InputError("--streaming: no tokenizer given; expected --tokenizer_name (train one on a sample with "
                         "`python -m tokenizer train`) or --model_name_or_path with its tokenizer")
    if accelerator.is_main_process:
        if tok_dir.exists():  # --overwrite_output_dir: the earlier run's tokenizer is not reused
            import shutil

            shutil.rmtree(tok_dir)
        train_tokenizer(args, objective, tok_dir)
    accelerator.wait_for_everyone()
    return _load_tokenizer(str(tok_dir), "--output_dir")


def _raise_no_tokenizer(args):
    raise InputError(f"--model_name_or_path {args.model_name_or_path}{_rev(args)}: no tokenizer saved with the model; "
                     "expected --tokenizer_name with the tokenizer it was trained with (a new tokenizer would give the "
                     "embeddings other ids)")


def train_tokenizer(args, objective, tok_dir: Path) -> None:
    """Train the objective's tokenizer on the training text (the bundled corpus for the demo) into ``tok_dir``."""
    files = args.train_file
    tmp_corpus = None
    if args.dataset_name or not files:
        if args.dataset_name:  # hub dataset: write its training text once for the tokenizer trainer
            from pretrain.data import load_raw_datasets

            raw = load_raw_datasets(None, None, args.dataset_name, args.dataset_config_name, args.text_column_name, args.validation_split_percentage)
            tmp_corpus = tok_dir.parent / ".tokenizer_corpus.txt"
            tmp_corpus.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp_corpus, "w", encoding="utf-8") as f:
                for text in raw["train"]["text"]:
                    f.write(text.rstrip("\n") + "\n")
            files = [str(tmp_corpus)]
        else:
            from pretrain.data import DEFAULT_TRAIN_FILES

            files = DEFAULT_TRAIN_FILES
    logger.info("training a %s tokenizer (vocab %d) on %s", args.model_type, args.vocab_size, ", ".join(map(str, files)))
    try:
        objective.train_tokenizer(files, args.vocab_size, tok_dir, args.max_seq_length)
    finally:
        if tmp_corpus is not None:
            tmp_corpus.unlink(missing_ok=True)


def build_model(args, objective, tokenizer):
    """A fresh model from the preset/config (vocabulary and positions sized for the tokenizer and blocks), or
    ``--model_name_or_path`` weights; checked to fit the tokenizer and ``--max_seq_length``."""
    from transformers import AutoConfig

    import modeling
    from training.run import check_model_fits

    auto = objective.auto_model_class()
    if args.model_name_or_path:
        check_local_path(args.model_name_or_path, "--model_name_or_path", "a model folder (save_pretrained) or a hub repo id")
        try:
            model = auto.from_pretrained(args.model_name_or_path, revision=args.revision)
        except Exception as err:  # noqa: BLE001
            raise InputError(f"--model_name_or_path {args.model_name_or_path}{_rev(args)}: could not be loaded ({type(err).__name__}: {first_line(err)}); "
                             "expected a model folder with config.json and model.safetensors (save_pretrained) or a hub repo id") from err
    else:
        overrides = {"vocab_size": len(tokenizer)}
        if tokenizer.pad_token_id is not None:
            overrides["pad_token_id"] = tokenizer.pad_token_id
        presets = sorted(name for name, (cls, _) in modeling.PRESETS.items() if cls.model_type == objective.config_model_type)
        if args.config_name in presets:
            config = modeling.get_preset_config(args.config_name, **overrides)
        else:
            expected = (f"--config_name {args.config_name}{_rev(args)}: expected a preset "
                        f"({', '.join(presets)}), a config path or a hub repo id")
            if not args.config_name:
                raise InputError(expected)
            check_local_path(args.config_name, "--config_name", "a preset, a config path or a hub repo id")
            try:  # a config.json file or folder, or a hub repo id (at --revision)
                config = AutoConfig.from_pretrained(args.config_name, revision=args.revision, **overrides)
            except Exception as err:  # noqa: BLE001
                raise InputError(f"{expected} (could not be loaded: {type(err).__name__}: {first_line(err)})") from err
        if getattr(config, "model_type", None) != objective.config_model_type and objective.model_type == "elmo":
            raise InputError(f"--config_name {args.config_name}: a {config.model_type} config; expected one for --model_type {args.model_type}")
        model = auto.from_config(config)
    arg = "--tokenizer_name" if args.tokenizer_name else "--model_name_or_path" if args.model_name_or_path else "--tokenizer_name"
    check_model_fits(model.config, tokenizer, args.max_seq_length, f"{arg} {getattr(args, arg[2:]) or ''}".rstrip())
    return model


def prepare_data(args, objective, tokenizer, accelerator):
    """Raw text → tokens → packed blocks (or NSP pairs) on the main process first (the others then read its
    ``datasets`` cache, whose fingerprints are deterministic); returns ``(train, validation)`` datasets."""
    from pretrain import data

    with accelerator.main_process_first():
        raw = data.load_raw_datasets(
            args.train_file, args.validation_file, args.dataset_name, args.dataset_config_name,
            args.text_column_name, args.validation_split_percentage, args.sample_by,
        )
        tokenized = objective.tokenize(raw, tokenizer, args.preprocessing_num_workers, args.overwrite_cache)
        blocks = objective.to_blocks(tokenized, tokenizer, args)
    return _limit(args, blocks["train"], blocks["validation"])


def stream_data(args, objective, tokenizer):
    """``--streaming``: the training blocks as a ``datasets.IterableDataset`` (tokenized and packed while read), and
    the validation blocks read once into memory (``max_eval_samples`` at most).

    Raises:
        InputError: no ``--max_train_steps`` (a stream has no length), or the stream's validation part gives no block.
    """
    from datasets import Dataset

    from pretrain import data

    if args.max_train_steps is None:
        raise InputError("--streaming: a stream has no length to count epochs in; expected --max_train_steps")
    raw = data.load_raw_datasets(args.train_file, args.validation_file, args.dataset_name, args.dataset_config_name,
                                 args.text_column_name, args.validation_split_percentage, args.sample_by, streaming=True)
    blocks = objective.to_blocks(objective.tokenize(raw, tokenizer), tokenizer, args)
    validation = blocks["validation"]
    if args.max_eval_samples is not None:
        validation = validation.take(args.max_eval_samples)
    validation = Dataset.from_list(list(validation))
    if len(validation) == 0:
        raise InputError("--streaming: no validation block; expected a validation split, --validation_file, or more text")
    return blocks["train"], validation


def _limit(args, train, validation):
    if args.max_train_samples is not None:
        train = train.select(range(min(args.max_train_samples, len(train))))
    if args.max_eval_samples is not None:
        validation = validation.select(range(min(args.max_eval_samples, len(validation))))
    if len(train) == 0:
        raise InputError("--train_file: no training block after tokenisation; expected more text")
    if len(validation) == 0:
        raise InputError("--validation_file: no validation block after tokenisation; expected more text")
    return train, validation


def _interval(steps: int | None) -> str:
    """``every N steps`` for a periodic action, ``at the end`` for one done only when training ends."""
    return f"every {steps} steps" if steps else "at the end"


def log_plan(args, trainer, train_blocks: int, valid_blocks: int, lr_source: str) -> dict:
    """Log the run plan once (main process) and return it: global batch in sequences and tokens, steps, epochs,
    warmup, total tokens, evaluation/checkpoint intervals and the learning rate with its source."""
    plan = trainer.plan()
    plan.update(tokens_per_step=plan["global_batch_size"] * args.max_seq_length, max_seq_length=args.max_seq_length,
                learning_rate=args.learning_rate, eval_steps=args.eval_steps, checkpointing_steps=args.checkpointing_steps)
    plan["total_tokens"] = plan["tokens_per_step"] * plan["max_train_steps"]
    data = (f"{plan['epochs']:.3g} epochs of {train_blocks} training blocks" if train_blocks is not None
            else "a stream of training blocks")
    logger.info(
        "run plan: %d optimizer steps = %s (%d validation); global batch %d sequences = "
        "%d tokens (%d processes x %d per device x %d accumulation), %.4g tokens in all; warmup %d steps; learning rate %g "
        "(%s); evaluation %s, checkpoints %s",
        plan["max_train_steps"], data, valid_blocks, plan["global_batch_size"], plan["tokens_per_step"],
        plan["num_processes"], plan["per_device_train_batch_size"], plan["gradient_accumulation_steps"], plan["total_tokens"],
        plan["num_warmup_steps"], args.learning_rate, lr_source, _interval(args.eval_steps), _interval(args.checkpointing_steps))
    return plan


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from accelerate.utils import set_seed

    from pretrain import data
    from pretrain.objectives import get_objective, lm_eval_step
    from training.hub import HubPusher, every_save_hook, validate_hub_args
    from training.loop import (Trainer, TrainingConfig, evaluate_sums, finish, make_accelerator, make_stream_dataloader,
                               make_train_dataloader)
    from training.run import check_output_dir_reuse, run_config, setup_logging

    objective = get_objective(args)
    prepared = None
    if args.prepared_dataset:
        from pretrain.prepare import load_prepared

        prepared = load_prepared(args, objective)  # checks the manifest against the run; fills --max_seq_length
    args = apply_defaults(args, objective)
    setup_logging()
    resuming = bool(args.resume_from_checkpoint)
    check_output_dir_reuse(args.output_dir, args.overwrite_output_dir, resuming)
    # with data: evaluate and checkpoint every 10% of the run unless told otherwise (set once the steps are known)
    auto_intervals = not is_demo(args)
    # the default learning rate depends on the model config (norm position), known once the model is built below:
    # a placeholder until then (the optimizer is created by the Trainer, after it is set)
    config = TrainingConfig.from_args(args, learning_rate=args.learning_rate or 1e-3)
    validate_hub_args(args)  # fail before training, not after it
    if args.train_file and not args.dataset_name:
        from tokenizer.corpus import check_text_files

        check_text_files(args.train_file, "--train_file")
        if args.validation_file:
            check_text_files([args.validation_file], "--validation_file")
    accelerator = make_accelerator(config, mixed_precision=args.mixed_precision)
    setup_logging(accelerator.is_main_process)
    tokenizer = get_tokenizer(args, objective, accelerator, prepared)
    if prepared is not None:
        train_ds, valid_ds = _limit(args, prepared["train"], prepared["validation"])
    elif args.streaming:
        train_ds, valid_ds = stream_data(args, objective, tokenizer)
    else:
        train_ds, valid_ds = prepare_data(args, objective, tokenizer, accelerator)
    set_seed(args.seed)
    model = build_model(args, objective, tokenizer)
    lr_source = "--learning_rate"
    if args.learning_rate is None:
        args.learning_rate, lr_source = default_learning_rate(args, model.config)
    train_collator, eval_collator = objective.collators(tokenizer, args)
    valid_data = data.IndexedDataset(valid_ds)
    if args.streaming:
        train_loader = make_stream_dataloader(data.StreamedBlocks(train_ds), args.per_device_train_batch_size,
                                              train_collator, num_workers=args.dataloader_num_workers)
    else:
        train_loader = make_train_dataloader(data.IndexedDataset(train_ds), args.per_device_train_batch_size,
                                             train_collator, args.seed, num_workers=args.dataloader_num_workers)

    def eval_fn(trainer):
        sums = evaluate_sums(accelerator, trainer.model, valid_data, eval_collator, args.per_device_eval_batch_size,
                             lm_eval_step, objective.eval_keys)
        return objective.metrics(sums)

    pusher = HubPusher.from_args(args)
    kwargs = {"weight_fn": objective.weight_fn} if objective.weight_fn else {}
    kwargs["on_save"] = every_save_hook(pusher, args, tokenizer, task=objective.card_task)
    config.learning_rate = args.learning_rate
    trainer = Trainer(accelerator, model, train_loader, config, eval_fn=eval_fn, run_config=run_config(args), **kwargs)
    del model
    if auto_intervals:
        every = max(1, math.ceil(trainer.max_train_steps / 10))
        if args.eval_steps is None:
            args.eval_steps = trainer.config.eval_steps = every
        if args.checkpointing_steps is None:
            args.checkpointing_steps = trainer.config.checkpointing_steps = args.eval_steps
    if accelerator.is_main_process:
        n_params = sum(p.numel() for p in trainer.unwrapped_model.parameters())
        logger.info("%s (%s): %d parameters", args.model_name_or_path or args.config_name, objective.name, n_params)
        log_plan(args, trainer, None if args.streaming else len(train_ds), len(valid_ds), lr_source)
    from training.signals import train_until_stopped

    result, status = train_until_stopped(trainer, lambda: finish(accelerator, trainer))  # SIGTERM/SIGINT: 143/130
    if result is None:
        return status
    state_dict = accelerator.get_state_dict(trainer.model)  # all processes (FSDP gathers the shards)
    if accelerator.is_main_process:
        save_outputs(args, trainer.unwrapped_model, tokenizer, result, state_dict, objective=objective)
        logger.info("wrote %s (perplexity %.2f)", args.output_dir, result.get("perplexity", float("nan")))
    del state_dict
    finish(accelerator, trainer)
    if args.push_to_hub and accelerator.is_main_process:  # after the process group is gone: no rank waits on it
        push(args)
    return 0


def save_outputs(args, model, tokenizer, result: dict, state_dict=None, objective=None) -> None:
    """Model + tokenizer (``save_pretrained``), ``all_results.json``, ``eval_history.json``, ``trainer_log.json``,
    ``curves.png`` and a model card (``README.md``) into ``output_dir``, moved there only once all are written."""
    from tokenizer.corpus import atomic_output_dir
    from training.run import write_run_files

    from pretrain.objectives import get_objective

    objective = objective or get_objective(args)
    keys = ["train_loss", "eval_loss", "perplexity", "train_runtime_s", "train_tokens_per_second", "train_samples_per_second",
            "global_step", "epoch", *objective.result_keys, "best_step", "best_metric", "stopped_early", "replica_max_abs_diff"]
    flat = {k: result[k] for k in keys if k in result}
    with atomic_output_dir(args.output_dir) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        write_run_files(tmp, result, flat, Path(args.output_dir).name)
        try:
            from training.model_card import card_for_run

            card = card_for_run(tmp, args, task=objective.card_task, objective=objective.name.split("+"))
            (tmp / "README.md").write_text(card, encoding="utf-8")
        except (ImportError, InputError) as err:  # the card is a courtesy; never lose the model over it
            logger.warning("no model card written: %s", err)


def push(args) -> None:
    """Push ``output_dir`` (model, tokenizer, results, model card; never checkpoints) to ``--hub_model_id``."""
    from training.hub import push_output_dir

    readme = Path(args.output_dir) / "README.md"
    url = push_output_dir(
        args.output_dir, args.hub_model_id, token=args.hub_token, private=args.hub_private_repo,
        revision=args.hub_revision, commit_message=f"pretrain: {args.model_type} {args.config_name}",
        model_card=readme.read_text(encoding="utf-8") if readme.exists() else None,
    )
    logger.info("pushed %s to %s", args.output_dir, url)
