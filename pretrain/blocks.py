"""The blocks a pretraining run trains and evaluates on (:func:`load_blocks`), checked for a token to predict
(:func:`check_predictable`) and fingerprinted for the resume check (:func:`data_fingerprint`)."""

from __future__ import annotations

from core.errors import InputError
from pretrain.arguments import PretrainArguments


def data_fingerprint(plan: PretrainArguments, tokenizer, train_blocks) -> list[dict]:
    """What the training blocks are made of, for the resume check (:func:`training.data.fingerprint_sources`): the
    training files by size and SHA-256 (a prepared dataset: its manifest's hashes of the sources and shards; a hub
    dataset: its name and ``datasets`` fingerprint), the tokenizer's hash and the settings that cut the blocks."""
    import hashlib
    import json

    from pretrain import data
    from pretrain.build import tokenizer_hash
    from training.data import fingerprint_sources

    corpus, train_data = plan.corpus, plan.data
    files, settings = [], {}
    if train_data.prepared_dataset:
        from pretrain.prepare import read_manifest

        manifest = read_manifest(train_data.prepared_dataset)
        train = {
            "sources": manifest["sources"]["train"],
            "shards": {k: v for k, v in (manifest.get("files") or {}).items() if k.startswith("train/")},
        }
        settings["prepared_train"] = hashlib.sha256(json.dumps(train, sort_keys=True).encode()).hexdigest()
    elif corpus.dataset_name:
        settings["dataset"] = f"{corpus.dataset_name}/{corpus.dataset_config_name}"
        settings["datasets_fingerprint"] = getattr(train_blocks, "_fingerprint", None)
    else:
        files = corpus.train_file or data.DEFAULT_TRAIN_FILES
    return fingerprint_sources(
        files,
        **settings,
        tokenizer=tokenizer_hash(tokenizer),
        objective=plan.objective.name,
        max_seq_length=corpus.max_seq_length,
        sample_by=corpus.sample_by,
        document_masking=corpus.document_masking,
        packing_batch_size=corpus.packing_batch_size,
        validation_split_percentage=None if corpus.validation_file else corpus.validation_split_percentage,
        max_train_samples=train_data.max_train_samples,
    )


def load_blocks(plan: PretrainArguments, tokenizer, accelerator):
    """The training and validation blocks: memory-mapped from ``--prepared_dataset``, a stream (``--streaming``),
    or raw text -> tokens -> packed blocks (or NSP pairs) on the main process first (the others then read its
    ``datasets`` cache, whose fingerprints are deterministic); cut to ``--max_*_samples``.

    Raises:
        InputError: no training or validation block; ``--streaming`` without ``--max_train_steps``.
    """
    from pretrain import data

    corpus, objective = plan.corpus, plan.objective
    if plan.data.prepared_dataset:
        from pretrain.prepare import load_prepared

        with accelerator.main_process_first():  # the main process hashes (once), the others find it verified
            splits = load_prepared(plan.data.prepared_dataset, verify=plan.data.verify_prepared)
        return _limit(plan, splits["train"], splits["validation"])
    if corpus.streaming:
        return stream_blocks(plan, tokenizer)
    with accelerator.main_process_first():
        raw = data.load_corpus(corpus)
        tokenized = objective.family.tokenize(raw, tokenizer, corpus.preprocessing_num_workers, corpus.overwrite_cache)
        blocks = objective.to_blocks(tokenized, tokenizer, corpus, plan.training.seed)
    return _limit(plan, blocks["train"], blocks["validation"])


def stream_blocks(plan: PretrainArguments, tokenizer):
    """``--streaming``: the training blocks as a ``datasets.IterableDataset`` (tokenized and packed while read), and
    the validation blocks read once into memory (``max_eval_samples`` at most).

    Raises:
        InputError: no ``--max_train_steps`` (a stream has no length), or the stream's validation part gives no block.
    """
    from datasets import Dataset

    from pretrain import data

    corpus, objective = plan.corpus, plan.objective
    if plan.training.max_train_steps is None and not plan.budget.given:
        raise InputError(
            "--streaming: a stream has no length to count epochs in; expected --max_train_steps (or "
            "--max_train_tokens / --time_budget)"
        )
    raw = data.load_corpus(corpus, streaming=True)
    blocks = objective.to_blocks(objective.family.tokenize(raw, tokenizer), tokenizer, corpus, plan.training.seed)
    validation = blocks["validation"]
    if plan.data.max_eval_samples is not None:
        validation = validation.take(plan.data.max_eval_samples)
    validation = Dataset.from_list(list(validation))
    if len(validation) == 0:
        raise InputError(
            "--streaming: no validation block; expected a validation split, --validation_file, or more text"
        )
    return blocks["train"], validation


def held_out_source(plan: PretrainArguments) -> str:
    """Where the validation blocks come from, as the user named it: ``--validation_file F``, ``--prepared_dataset
    P (its validation split)``, ``--dataset_name D (...)`` or ``--train_file F ... (the N% held out ...)``."""
    corpus = plan.corpus
    if plan.data.prepared_dataset:
        return f"--prepared_dataset {plan.data.prepared_dataset} (its validation split)"
    if corpus.validation_file:
        return f"--validation_file {corpus.validation_file}"
    if corpus.dataset_name:
        return f"--dataset_name {corpus.dataset_name} (its validation split or the part held out)"
    files = " ".join(corpus.train_file or ["(the bundled corpus)"])
    return f"--train_file {files} (the {corpus.validation_split_percentage}% held out for validation)"


def _has_predictable_token(blocks, tokenizer) -> bool:
    """Whether any block of ``blocks`` (a ``datasets.Dataset`` with ``input_ids``) holds a token the objectives can
    predict: one that is not a special token (masking and the BiLM's targets skip those). Stops at the first one."""
    import numpy as np

    special = np.asarray(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)
    for batch in blocks.iter(batch_size=1024):
        for ids in batch["input_ids"]:
            if (~np.isin(np.asarray(ids, dtype=np.int64), special)).any():
                return True
    return False


def check_predictable(plan: PretrainArguments, tokenizer, train_blocks, valid_blocks) -> None:
    """Refuse, before step 0, held-out or training text with nothing to predict (every token special, e.g. lines
    of ``[MASK] [SEP]``): it would report ``eval_loss`` 0 and perplexity 1 over ``eval_tokens=0`` (issue 43). A
    streamed training corpus is not read ahead; its held-out blocks are checked.

    Raises:
        InputError: naming the validation source (:func:`held_out_source`) or ``--train_file``.
    """
    expected = "expected text with words beyond the special tokens (" + " ".join(tokenizer.all_special_tokens) + ")"
    if not _has_predictable_token(valid_blocks, tokenizer):
        raise InputError(
            f"{held_out_source(plan)}: no token to predict in its {len(valid_blocks)} validation block(s): every "
            f"token is a special token, so the held-out loss would be over 0 tokens; {expected}"
        )
    if not plan.corpus.streaming and not _has_predictable_token(train_blocks, tokenizer):
        source = (
            f"--prepared_dataset {plan.data.prepared_dataset}"
            if plan.data.prepared_dataset
            else f"--train_file {' '.join(plan.corpus.train_file or ['(the bundled corpus)'])}"
            if not plan.corpus.dataset_name
            else f"--dataset_name {plan.corpus.dataset_name}"
        )
        raise InputError(
            f"{source}: no token to predict in its {len(train_blocks)} training block(s): every token is a special "
            f"token, so there is nothing to learn; {expected}"
        )


def _limit(plan: PretrainArguments, train, validation):
    train_data = plan.data
    if train_data.max_train_samples is not None:
        train = train.select(range(min(train_data.max_train_samples, len(train))))
    if train_data.max_eval_samples is not None:
        validation = validation.select(range(min(train_data.max_eval_samples, len(validation))))
    if len(train) == 0:
        raise InputError("--train_file: no training block after tokenisation; expected more text")
    if len(validation) == 0:
        raise InputError("--validation_file: no validation block after tokenisation; expected more text")
    return train, validation


__all__ = ["check_predictable", "data_fingerprint", "held_out_source", "load_blocks", "stream_blocks"]
