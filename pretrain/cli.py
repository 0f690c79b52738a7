"""``accelerate launch pretrain``: pretrain a BERT-like (MLM, optionally NSP) or ELMo-style (BiLM) model.

With no arguments: the embedded default job -- a WordPiece tokenizer (8k) trained on the corpus bundled in
``pretrain/corpus/``, a bert-tiny-sized SesameBert (L2/H128), documents packed into 128-token blocks, MLM; a few minutes
on a laptop CPU; writes ``outputs/pretrain-bert``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

from training.errors import InputError, add_debug_argument, check_local_path, first_line

logger = logging.getLogger("pretrain")

#: The embedded default job (used for every argument not given).
DEFAULTS = {
    "bert": dict(config_name="bert-tiny", vocab_size=8000, max_seq_length=128, per_device_train_batch_size=32,
                 learning_rate=1e-3, num_warmup_steps=30, max_train_steps=300, eval_steps=100, weight_decay=0.01),
    "elmo": dict(config_name="elmo-small", vocab_size=8000, max_seq_length=32, per_device_train_batch_size=16,
                 learning_rate=2e-3, num_warmup_steps=20, max_train_steps=200, eval_steps=50, weight_decay=0.0),
}


def build_parser() -> argparse.ArgumentParser:
    from training.loop import add_training_arguments

    parser = argparse.ArgumentParser(
        prog="accelerate launch pretrain",
        description=(
            "Pretrain a BERT-like encoder (MLM, optionally NSP) or an ELMo-style BiLM. With no arguments: a "
            "bert-tiny-sized model with an 8k WordPiece tokenizer trained on the bundled corpus, 128-token packed "
            "blocks, 300 optimizer steps of batch 32 (a few minutes on a CPU), written to outputs/pretrain-bert."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    m = parser.add_argument_group("model")
    m.add_argument("--model_type", choices=["bert", "elmo"], default="bert", help="BERT-like (MLM) or ELMo-style (BiLM)")
    m.add_argument("--config_name", default=None, help="preset (bert-tiny, bert-mini, bert-small, bert-base, elmo-small, elmo-original), a config.json path or folder, or a hub repo id; default bert-tiny / elmo-small")
    m.add_argument("--model_name_or_path", default=None, help="continue pretraining these weights instead of a fresh model")
    m.add_argument("--tokenizer_name", default=None, help="tokenizer path or repo; default: train one on the training files (saved with the model)")
    m.add_argument("--revision", default=None, help="revision (branch, tag or commit id) of hub repos given by --model_name_or_path / --config_name / --tokenizer_name")
    m.add_argument("--vocab_size", type=int, default=None, help="vocabulary size of a trained tokenizer (default 8000)")
    d = parser.add_argument_group("data")
    d.add_argument("--train_file", nargs="+", default=None, help=".txt/.txt.gz files, documents separated by blank lines; default: the bundled corpus")
    d.add_argument("--validation_file", default=None, help="validation file; default: the bundled one, or the last --validation_split_percentage %% of the training documents")
    d.add_argument("--dataset_name", default=None, help="a hub dataset instead of files")
    d.add_argument("--dataset_config_name", default=None)
    d.add_argument("--text_column_name", default="text", help="text column of a hub dataset")
    d.add_argument("--validation_split_percentage", type=int, default=5)
    d.add_argument("--sample_by", choices=["paragraph", "line"], default="paragraph", help="examples of a text file: documents (blank-line separated) or lines")
    d.add_argument("--max_seq_length", type=int, default=None, help="block length in tokens (default 128 BERT, 32 ELMo)")
    d.add_argument("--preprocessing_num_workers", type=int, default=None, help="processes for datasets.map")
    d.add_argument("--overwrite_cache", action="store_true", help="recompute the cached datasets.map results")
    d.add_argument("--packing_batch_size", type=int, default=1000, help="documents per packing map batch (only its last block may be short)")
    d.add_argument("--max_train_samples", type=int, default=None, help="use only the first N training blocks")
    d.add_argument("--max_eval_samples", type=int, default=None, help="use only the first N validation blocks")
    d.add_argument("--dataloader_num_workers", type=int, default=0)
    o = parser.add_argument_group("objective (BERT-like)")
    o.add_argument("--mlm_probability", type=float, default=0.15, help="fraction of tokens selected for prediction")
    o.add_argument("--mask_replace_prob", type=float, default=0.8, help="of the selected tokens: replaced by [MASK]")
    o.add_argument("--random_replace_prob", type=float, default=0.1, help="of the selected tokens: replaced by a random token (the rest are kept)")
    o.add_argument("--whole_word_mask", action="store_true", help="select whole words (all their WordPiece pieces)")
    o.add_argument("--nsp", action="store_true", help="sentence-pair blocks and next-sentence prediction (SesameBertForPreTraining)")
    from training.hub import add_hub_arguments

    add_hub_arguments(parser)
    add_training_arguments(parser, output_dir=None, learning_rate=None, max_train_steps=None, num_warmup_steps=None,
                           eval_steps=None, weight_decay=None, per_device_train_batch_size=None, per_device_eval_batch_size=32,
                           project_name="sesame-lm-pretrain")
    add_debug_argument(parser)
    return parser


def _apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    defaults = DEFAULTS[args.model_type]
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            if key in ("max_train_steps", "eval_steps") and args.num_train_epochs != 1.0:
                continue  # an explicit epoch count wins over the default step count
            setattr(args, key, value)
    if args.output_dir is None:
        args.output_dir = os.path.join("outputs", f"pretrain-{args.model_type}")
    if args.nsp and args.model_type != "bert":
        raise InputError(f"--nsp: next-sentence prediction needs a BERT-like model; expected --model_type bert (got {args.model_type})")
    for name in ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size", "vocab_size"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} {getattr(args, name)}: expected an integer >= 1")
    return args


# -- pieces ---------------------------------------------------------------------------------------------------
def _rev(args) -> str:
    return f" (--revision {args.revision})" if getattr(args, "revision", None) else ""


def get_tokenizer(args, accelerator):
    """Load ``--tokenizer_name``, reuse ``<output_dir>/tokenizer`` (a resumed run) or train one on the main process."""
    from transformers import AutoTokenizer

    import modeling  # noqa: F401  (registers the tokenizers with AutoTokenizer)

    if args.tokenizer_name:
        check_local_path(args.tokenizer_name, "--tokenizer_name", "a tokenizer folder (save_pretrained) or a hub repo id")
        try:
            return AutoTokenizer.from_pretrained(args.tokenizer_name, revision=args.revision)
        except Exception as err:  # noqa: BLE001
            raise InputError(f"--tokenizer_name {args.tokenizer_name}{_rev(args)}: could not be loaded ({type(err).__name__}: {first_line(err)}); "
                             "expected a tokenizer folder (save_pretrained) or a hub repo id") from err
    tok_dir = Path(args.output_dir) / "tokenizer"
    if accelerator.is_main_process and not (tok_dir / "tokenizer_config.json").is_file():
        files = args.train_file
        tmp_corpus = None
        if args.dataset_name or not files:
            if args.dataset_name:  # hub dataset: write its training text once for the tokenizer trainer
                from pretrain.data import load_raw_datasets

                raw = load_raw_datasets(None, None, args.dataset_name, args.dataset_config_name, args.text_column_name, args.validation_split_percentage)
                tmp_corpus = Path(args.output_dir) / ".tokenizer_corpus.txt"
                tmp_corpus.parent.mkdir(parents=True, exist_ok=True)
                with open(tmp_corpus, "w", encoding="utf-8") as f:
                    for text in raw["train"]["text"]:
                        f.write(text.rstrip("\n") + "\n")
                files = [str(tmp_corpus)]
            else:
                from pretrain.data import DEFAULT_TRAIN_FILES

                files = DEFAULT_TRAIN_FILES
        logger.info("training a %s tokenizer (vocab %d) on %s", args.model_type, args.vocab_size, ", ".join(map(str, files)))
        if args.model_type == "bert":
            from tokenizer.wordpiece import train_wordpiece_tokenizer

            train_wordpiece_tokenizer(files, args.vocab_size, tok_dir, model_max_length=args.max_seq_length)
        else:
            from tokenizer.elmo_training import train_elmo_tokenizer

            train_elmo_tokenizer(files, args.vocab_size, tok_dir)
        if tmp_corpus is not None:
            tmp_corpus.unlink(missing_ok=True)
    accelerator.wait_for_everyone()
    return AutoTokenizer.from_pretrained(str(tok_dir))


def build_model(args, tokenizer):
    """A fresh model from the preset/config (vocabulary and positions sized for the tokenizer and blocks), or
    ``--model_name_or_path`` weights."""
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForPreTraining

    import modeling

    auto = AutoModelForPreTraining if (args.nsp or args.model_type == "elmo") else AutoModelForMaskedLM
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
        if args.config_name in modeling.PRESETS:
            config = modeling.get_preset_config(args.config_name, **overrides)
        else:
            expected = (f"--config_name {args.config_name}{_rev(args)}: expected a preset "
                        f"({', '.join(sorted(modeling.PRESETS))}), a config path or a hub repo id")
            if not args.config_name:
                raise InputError(expected)
            check_local_path(args.config_name, "--config_name", "a preset, a config path or a hub repo id")
            try:  # a config.json file or folder, or a hub repo id (at --revision)
                config = AutoConfig.from_pretrained(args.config_name, revision=args.revision, **overrides)
            except Exception as err:  # noqa: BLE001
                raise InputError(f"{expected} (could not be loaded: {type(err).__name__}: {first_line(err)})") from err
        expected = "sesame-bert" if args.model_type == "bert" else "sesame-elmo"
        if getattr(config, "model_type", None) != expected and args.model_type == "elmo":
            raise InputError(f"--config_name {args.config_name}: a {config.model_type} config; expected one for --model_type {args.model_type}")
        model = auto.from_config(config)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and args.max_seq_length > max_pos:
        raise InputError(f"--max_seq_length {args.max_seq_length}: exceeds the model's max_position_embeddings {max_pos}; "
                         f"expected at most {max_pos}")
    if model.config.vocab_size < len(tokenizer):
        raise InputError(f"--tokenizer_name {args.tokenizer_name}: {len(tokenizer)} tokens but the model's vocab_size is "
                         f"{model.config.vocab_size}; expected the tokenizer the model was trained with (at most "
                         f"{model.config.vocab_size} tokens)")
    return model


def prepare_data(args, tokenizer, accelerator):
    """Raw text → tokens → packed blocks (or NSP pairs); returns ``(train, validation)`` datasets."""
    from pretrain import data

    with accelerator.main_process_first():
        raw = data.load_raw_datasets(
            args.train_file, args.validation_file, args.dataset_name, args.dataset_config_name,
            args.text_column_name, args.validation_split_percentage, args.sample_by,
        )
        if args.model_type == "bert":
            tokenized = data.tokenize_bert(raw, tokenizer, args.preprocessing_num_workers, args.overwrite_cache)
            if args.nsp:
                blocks = data.make_nsp_pairs(tokenized, args.max_seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id,
                                             args.seed, args.packing_batch_size, args.preprocessing_num_workers, args.overwrite_cache)
            else:
                blocks = data.pack_blocks(tokenized, args.max_seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id,
                                          args.packing_batch_size, args.preprocessing_num_workers, args.overwrite_cache)
        else:
            tokenized = data.tokenize_elmo(raw, tokenizer, args.preprocessing_num_workers, args.overwrite_cache)
            blocks = data.pack_blocks(tokenized, args.max_seq_length, None, None, args.packing_batch_size,
                                      args.preprocessing_num_workers, args.overwrite_cache)
    train, validation = blocks["train"], blocks["validation"]
    if args.max_train_samples is not None:
        train = train.select(range(min(args.max_train_samples, len(train))))
    if args.max_eval_samples is not None:
        validation = validation.select(range(min(args.max_eval_samples, len(validation))))
    if len(train) == 0:
        raise InputError("--train_file: no training block after tokenisation; expected more text")
    if len(validation) == 0:
        raise InputError("--validation_file: no validation block after tokenisation; expected more text")
    return train, validation


def lm_eval_step(model, batch):
    """Sums for perplexity: ``nll_sum`` (nats) and ``count`` of predicted tokens (+ NSP/BiLM extras)."""
    import torch

    out = model(**batch)
    if "char_ids" in batch:  # BiLM: both directions
        nf, nb = out.forward_num_tokens.double(), out.backward_num_tokens.double()
        f_sum, b_sum = out.forward_loss.double() * nf, out.backward_loss.double() * nb
        return {"nll_sum": f_sum + b_sum, "count": nf + nb, "fwd_nll_sum": f_sum, "fwd_count": nf, "bwd_nll_sum": b_sum, "bwd_count": nb}
    count = (batch["labels"] != -100).sum().double()
    mlm = getattr(out, "mlm_loss", None)
    mlm = out.loss if mlm is None else mlm
    stats = {"nll_sum": mlm.double() * count, "count": count}
    if "next_sentence_label" in batch:
        pred = out.seq_relationship_logits.argmax(-1)
        stats["nsp_correct"] = (pred == batch["next_sentence_label"]).sum().double()
        stats["nsp_count"] = torch.tensor(float(len(pred)), dtype=torch.float64)
    return stats


def bilm_weight(batch) -> int:
    """Items the BiLM loss averages over: (forward + backward predicted tokens) / 2 = real tokens - 1 per row."""
    mask = batch["attention_mask"]
    return int(mask.sum() - (mask.sum(dim=1) > 0).sum())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _apply_defaults(parser.parse_args(argv))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    for noisy in ("datasets", "transformers", "accelerate.checkpointing", "accelerate.accelerator"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)  # "Removed shared tensor" of tied weights

    from accelerate.utils import set_seed

    from pretrain import data
    from pretrain.collators import BiLMCollator, MLMCollator
    from training.loop import Trainer, TrainingConfig, evaluate_sums, finish, make_accelerator, make_train_dataloader

    config = TrainingConfig.from_args(args)
    from training.hub import validate_hub_args

    validate_hub_args(args)  # fail before training, not after it
    if args.train_file and not args.dataset_name:
        from tokenizer.corpus import check_text_files

        check_text_files(args.train_file, "--train_file")
        if args.validation_file:
            check_text_files([args.validation_file], "--validation_file")
    accelerator = make_accelerator(config, mixed_precision=args.mixed_precision)
    if not accelerator.is_main_process:
        logging.getLogger().setLevel(logging.WARNING)
    tokenizer = get_tokenizer(args, accelerator)
    train_ds, valid_ds = prepare_data(args, tokenizer, accelerator)
    set_seed(args.seed)
    model = build_model(args, tokenizer)
    if args.model_type == "bert":
        train_collator = MLMCollator(tokenizer, args.mlm_probability, args.mask_replace_prob, args.random_replace_prob, args.whole_word_mask, args.seed)
        eval_collator = MLMCollator(tokenizer, args.mlm_probability, args.mask_replace_prob, args.random_replace_prob, args.whole_word_mask, args.seed, salt=1)
        weight_fn = None
    else:
        train_collator = eval_collator = BiLMCollator(tokenizer)
        weight_fn = bilm_weight
    train_data, valid_data = data.IndexedDataset(train_ds), data.IndexedDataset(valid_ds)
    train_loader = make_train_dataloader(train_data, args.per_device_train_batch_size, train_collator, args.seed,
                                         num_workers=args.dataloader_num_workers)
    keys = ["nll_sum", "count"] + (["nsp_correct", "nsp_count"] if args.nsp else []) + (
        ["fwd_nll_sum", "fwd_count", "bwd_nll_sum", "bwd_count"] if args.model_type == "elmo" else [])

    def eval_fn(trainer):
        sums = evaluate_sums(accelerator, trainer.model, valid_data, eval_collator, args.per_device_eval_batch_size, lm_eval_step, keys)
        loss = sums["nll_sum"] / max(sums["count"], 1.0)
        metrics = {"eval_loss": loss, "perplexity": math.exp(min(loss, 700.0)), "eval_tokens": sums["count"]}
        if args.nsp:
            metrics["eval_nsp_accuracy"] = sums["nsp_correct"] / max(sums["nsp_count"], 1.0)
        if args.model_type == "elmo":
            metrics["forward_perplexity"] = math.exp(min(sums["fwd_nll_sum"] / max(sums["fwd_count"], 1.0), 700.0))
            metrics["backward_perplexity"] = math.exp(min(sums["bwd_nll_sum"] / max(sums["bwd_count"], 1.0), 700.0))
        return metrics

    kwargs = {"weight_fn": weight_fn} if weight_fn else {}
    run_config = {k: v for k, v in vars(args).items() if k not in ("hub_token",)}
    from training.hub import HubPusher, every_save_hook

    pusher = HubPusher.from_args(args)
    kwargs["on_save"] = every_save_hook(pusher, args, tokenizer,
                                        task="fill-mask" if args.model_type == "bert" else "feature-extraction")
    trainer = Trainer(accelerator, model, train_loader, config, eval_fn=eval_fn, run_config=run_config, **kwargs)
    del model
    if accelerator.is_main_process:
        n_params = sum(p.numel() for p in trainer.unwrapped_model.parameters())
        logger.info(
            "%s: %d parameters; %d training blocks, %d validation blocks of <= %d tokens; %d optimizer steps of %d "
            "blocks (%d processes x %d x %d accumulation)", args.config_name, n_params, len(train_ds), len(valid_ds),
            args.max_seq_length, trainer.max_train_steps, args.per_device_train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps,
            accelerator.num_processes, args.per_device_train_batch_size, args.gradient_accumulation_steps,
        )
    from training.signals import train_until_stopped

    result, status = train_until_stopped(trainer, lambda: finish(accelerator, trainer))  # SIGTERM/SIGINT: 143/130
    if result is None:
        return status
    state_dict = accelerator.get_state_dict(trainer.model)  # all processes (FSDP gathers the shards)
    if accelerator.is_main_process:
        save_outputs(args, trainer.unwrapped_model, tokenizer, result, state_dict)
        logger.info("wrote %s (perplexity %.2f)", args.output_dir, result.get("perplexity", float("nan")))
    del state_dict
    finish(accelerator, trainer)
    if args.push_to_hub and accelerator.is_main_process:  # after the process group is gone: no rank waits on it
        push(args)
    return 0


def save_outputs(args, model, tokenizer, result: dict, state_dict=None) -> None:
    """Model + tokenizer (``save_pretrained``), ``all_results.json``, ``eval_history.json``, ``trainer_log.json``,
    ``curves.png`` and a model card (``README.md``) into ``output_dir``, moved there only once all are written."""
    from tokenizer.corpus import atomic_output_dir
    from training.plot import write_curves

    keys = ["train_loss", "eval_loss", "perplexity", "train_runtime_s", "train_tokens_per_second", "train_samples_per_second",
            "global_step", "epoch", "eval_nsp_accuracy", "forward_perplexity", "backward_perplexity", "replica_max_abs_diff"]
    flat = {k: result[k] for k in keys if k in result}
    with atomic_output_dir(args.output_dir) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        (tmp / "all_results.json").write_text(json.dumps(flat, indent=2) + "\n", encoding="utf-8")
        (tmp / "eval_history.json").write_text(json.dumps(result.get("eval_history", []), indent=2) + "\n", encoding="utf-8")
        (tmp / "trainer_log.json").write_text(json.dumps(result.get("log_history", []), indent=2) + "\n", encoding="utf-8")
        write_curves(dict(result, name=Path(args.output_dir).name), tmp / "curves.png")
        try:
            from training.model_card import card_for_run

            task = "fill-mask" if args.model_type == "bert" else "feature-extraction"
            (tmp / "README.md").write_text(card_for_run(tmp, args, task=task), encoding="utf-8")
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
