"""The tokenizer and the model of a pretraining run (shared by ``pretrain`` and ``pretrain.prepare``)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from core.errors import InputError, check_local_path, first_line
from pretrain.arguments import CorpusArguments, ModelArguments, PretrainArguments
from pretrain.objectives import FamilyPretraining
from tokenizer import train_tokenizer  # the family's trainer
from training.pretrained import check_model_fits, load_pretrained

logger = logging.getLogger("pretrain")

TOKENIZER_EXPECTED = "a tokenizer folder (save_pretrained) or a hub repo id"


def tokenizer_hash(tokenizer) -> str:
    """:func:`pretrain.data.tokenizer_hash` (imported on use: ``--help`` and refused input stay fast)."""
    from pretrain.data import tokenizer_hash as content_hash

    return content_hash(tokenizer)


def load_tokenizer(path: str, arg_name: str, revision: str | None = None, trust_remote_code: bool = False):
    """``AutoTokenizer.from_pretrained(path)`` (sesame tokenizers registered), refused with one line if it fails
    (also a folder whose ``auto_map`` names code of its own, unless ``trust_remote_code``).

    Raises:
        InputError: no such folder, or the tokenizer cannot be loaded.
    """
    from transformers import AutoTokenizer

    import modeling  # noqa: F401  (registers the tokenizers with AutoTokenizer)

    return load_pretrained(
        AutoTokenizer.from_pretrained,
        path,
        arg_name,
        TOKENIZER_EXPECTED,
        revision=revision,
        trust_remote_code=trust_remote_code,
    )


def _has_tokenizer(path: str) -> bool:
    p = Path(path)
    if p.is_dir():
        return (p / "tokenizer_config.json").is_file()
    return not p.exists()  # a hub repo id: try it


def _rev(model: ModelArguments) -> str:
    return f" (--revision {model.revision})" if model.revision else ""


def _no_tokenizer(model: ModelArguments) -> InputError:
    return InputError(
        f"--model_name_or_path {model.model_name_or_path}{_rev(model)}: no tokenizer saved with the "
        "model; expected --tokenizer_name with the tokenizer it was trained with (a new tokenizer would "
        "give the embeddings other ids)"
    )


def given_tokenizer(model: ModelArguments):
    """The tokenizer named by ``--tokenizer_name`` / ``--model_name_or_path`` (they must agree), or None.

    Raises:
        InputError: a tokenizer that cannot be loaded, one that differs from the model's, or a model without one.
    """
    trust = model.trust_remote_code
    given = (
        load_tokenizer(model.tokenizer_name, "--tokenizer_name", model.revision, trust)
        if model.tokenizer_name
        else None
    )
    if not model.model_name_or_path:
        return given
    if not _has_tokenizer(model.model_name_or_path):
        if given is None:
            raise _no_tokenizer(model)
        return given
    try:
        saved = load_tokenizer(model.model_name_or_path, "--model_name_or_path", model.revision, trust)
    except InputError:
        if given is None:
            raise _no_tokenizer(model) from None
        return given
    if given is not None and tokenizer_hash(given) != tokenizer_hash(saved):
        raise InputError(
            f"--tokenizer_name {model.tokenizer_name}: differs from the tokenizer saved with --model_name_or_path "
            f"{model.model_name_or_path} ({len(given)} vs {len(saved)} tokens, or other ids); expected the "
            "tokenizer the "
            "model was trained with (leave --tokenizer_name out to use it)"
        )
    return given if given is not None else saved


def check_tokenizer_family(tokenizer, family: FamilyPretraining, where: str) -> None:
    """Refuse a tokenizer the family cannot use (a WordPiece tokenizer for ELMo-style pretraining, ...).

    Raises:
        InputError: naming ``where`` (the flag and value), the tokenizer's class and what the family needs.
    """
    problem = family.tokenizer_problem(tokenizer)
    if problem is not None:
        raise InputError(
            f"{where}: a {type(tokenizer).__name__} ({len(tokenizer)} tokens); expected a tokenizer of "
            f"the model family: {problem}"
        )


def get_tokenizer(
    model: ModelArguments,
    family: FamilyPretraining,
    corpus: CorpusArguments,
    output_dir: str | Path,
    *,
    prepared: str | None = None,
    resuming: bool = False,
    is_main_process: bool = True,
    wait_for_everyone: Callable[[], None] = lambda: None,
):
    """The run's tokenizer, by these rules:

    1. ``--tokenizer_name``; with ``--model_name_or_path`` whose folder holds a tokenizer, the two must be equal.
    2. ``--model_name_or_path`` alone: the tokenizer saved with the model (continued pretraining keeps the ids the
       embeddings learnt); a model without one is refused.
    3. ``--prepared_dataset``: the tokenizer saved in it (``--tokenizer_name``, if given, must equal it).
    4. A resumed run reuses ``<output_dir>/tokenizer``.
    5. Otherwise the main process trains one on the training text into ``<output_dir>/tokenizer`` (the other
       processes wait for it).

    Raises:
        InputError: a tokenizer that cannot be loaded, or one that differs from the model's / the prepared dataset's.
    """
    given = given_tokenizer(model)
    if given is not None:
        check_tokenizer_family(
            given,
            family,
            f"--tokenizer_name {model.tokenizer_name}"
            if model.tokenizer_name
            else f"--model_name_or_path {model.model_name_or_path}",
        )
    if prepared:
        tok = load_tokenizer(str(Path(prepared) / "tokenizer"), "--prepared_dataset")
        if given is not None and tokenizer_hash(given) != tokenizer_hash(tok):
            raise InputError(
                f"--prepared_dataset {prepared}: prepared with another tokenizer than "
                f"{model.tokenizer_name or model.model_name_or_path}; expected the same tokenizer (prepare "
                "the data again with it, or leave --tokenizer_name out)"
            )
        check_tokenizer_family(tok, family, f"--prepared_dataset {prepared}")
        return tok
    if given is not None:
        return given
    tok_dir = Path(output_dir) / "tokenizer"
    if resuming and (tok_dir / "tokenizer_config.json").is_file():
        return load_tokenizer(str(tok_dir), "--output_dir")
    if corpus.streaming:
        raise InputError(
            "--streaming: no tokenizer given; expected --tokenizer_name (train one on a sample with "
            "`python -m tokenizer train`) or --model_name_or_path with its tokenizer"
        )
    if is_main_process:
        if tok_dir.exists():  # --overwrite_output_dir: the earlier run's tokenizer is not reused
            shutil.rmtree(tok_dir)
        train_run_tokenizer(family, corpus, model.vocab_size, tok_dir)
    wait_for_everyone()
    tok = load_tokenizer(str(tok_dir), "--output_dir")
    if is_main_process and len(tok) < model.vocab_size:
        logger.warning(
            "the tokenizer has %d tokens, fewer than the %d asked (--vocab_size): the training text has no more "
            "distinct pieces; the model's vocabulary is %d",
            len(tok),
            model.vocab_size,
            len(tok),
        )
    return tok


def train_run_tokenizer(family: FamilyPretraining, corpus: CorpusArguments, vocab_size: int, tok_dir: Path) -> None:
    """Train the family's tokenizer on the training text (the bundled corpus for the demo) into ``tok_dir``."""
    files = corpus.train_file
    tmp_corpus = None
    if corpus.dataset_name:  # a hub dataset: write its training text once for the tokenizer trainer
        from pretrain.data import load_corpus

        raw = load_corpus(corpus)  # (the files and sample_by do not apply to a hub dataset)
        tmp_corpus = tok_dir.parent / ".tokenizer_corpus.txt"
        tmp_corpus.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp_corpus, "w", encoding="utf-8") as f:
            for text in raw["train"]["text"]:
                f.write(text.rstrip("\n") + "\n")
        files = [str(tmp_corpus)]
    elif not files:
        from pretrain.data import DEFAULT_TRAIN_FILES

        files = DEFAULT_TRAIN_FILES
    logger.info("training a %s tokenizer (vocab %d) on %s", family.name, vocab_size, ", ".join(map(str, files)))
    try:
        train_tokenizer(family.spec, files, vocab_size, tok_dir, corpus.max_seq_length)
    finally:
        if tmp_corpus is not None:
            tmp_corpus.unlink(missing_ok=True)


def load_model_config(plan: PretrainArguments, **overrides):
    """The config of the model to pretrain: ``--model_name_or_path``'s, a preset's, or ``--config_name``'s (a path
    or a hub repo id), with ``overrides``; checked to belong to the objective's family.

    Raises:
        InputError: an unknown preset, a config that cannot be loaded or that belongs to another family.
    """
    from transformers import AutoConfig

    import modeling

    model = plan.model
    if model.model_name_or_path:
        return _from_model_path(AutoConfig.from_pretrained, model)
    presets = sorted(plan.family.spec.presets)
    if model.config_name in presets:
        config = modeling.get_preset_config(model.config_name, **overrides)
    else:
        expected = (
            f"--config_name {model.config_name}{_rev(model)}: expected a preset ({', '.join(presets)}), a "
            "config path or a hub repo id"
        )
        if not model.config_name:
            raise InputError(expected)
        check_local_path(model.config_name, "--config_name", "a preset, a config path or a hub repo id")
        try:  # a config.json file or folder, or a hub repo id (at --revision)
            config = AutoConfig.from_pretrained(
                model.config_name, revision=model.revision, trust_remote_code=model.trust_remote_code, **overrides
            )
        except Exception as err:  # noqa: BLE001
            raise InputError(f"{expected} (could not be loaded: {type(err).__name__}: {first_line(err)})") from err
    if not plan.family.accepts(config):
        raise InputError(
            f"--config_name {model.config_name}: a {config.model_type} config; expected one for "
            f"--model_type {plan.family.name}"
        )
    return config


def _from_model_path(load, model: ModelArguments, **kwargs):
    """``load`` (a ``from_pretrained``) of ``--model_name_or_path`` at ``--revision`` (:func:`load_pretrained`)."""
    return load_pretrained(
        load,
        model.model_name_or_path,
        "--model_name_or_path",
        "a model folder with config.json and model.safetensors (save_pretrained) or a hub repo id",
        revision=model.revision,
        trust_remote_code=model.trust_remote_code,
        **kwargs,
    )


def build_model(plan: PretrainArguments, tokenizer):
    """A fresh model from the preset/config (vocabulary and positions sized for the tokenizer and blocks), or
    ``--model_name_or_path`` weights; checked to fit the tokenizer and ``--max_seq_length``.

    Raises:
        InputError: weights or a config that cannot be loaded; a tokenizer or block length the model cannot take.
    """
    model_args, auto = plan.model, plan.objective.auto_model_class()
    wrap = plan.objective.model_config  # e.g. rtd: the discriminator's config -> generator + discriminator
    if model_args.model_name_or_path:
        kwargs = {} if wrap is None else {"config": wrap(load_model_config(plan))}
        model = _from_model_path(auto.from_pretrained, model_args, **kwargs)
    else:
        overrides = {"vocab_size": len(tokenizer)}
        if tokenizer.pad_token_id is not None:
            overrides["pad_token_id"] = tokenizer.pad_token_id
        config = load_model_config(plan, **overrides)
        try:
            model = auto.from_config(config if wrap is None else wrap(config))
        except (RuntimeError, MemoryError) as err:  # e.g. hidden_size 100000: "can't allocate memory"
            if not isinstance(err, MemoryError) and "allocate" not in str(err) and "out of memory" not in str(err):
                raise
            raise InputError(
                f"--config_name {model_args.config_name}: the model does not fit in memory (hidden_size "
                f"{getattr(config, 'hidden_size', '?')}, {getattr(config, 'num_hidden_layers', '?')} layers, "
                f"vocabulary {getattr(config, 'vocab_size', '?')}: {first_line(err)}); expected a smaller model"
            ) from None
    arg = (
        "--tokenizer_name" if model_args.tokenizer_name or not model_args.model_name_or_path else "--model_name_or_path"
    )
    check_model_fits(
        model.config, tokenizer, plan.corpus.max_seq_length, f"{arg} {getattr(model_args, arg[2:]) or ''}".rstrip()
    )
    return model


__all__ = [
    "build_model",
    "check_tokenizer_family",
    "get_tokenizer",
    "given_tokenizer",
    "load_model_config",
    "load_tokenizer",
    "tokenizer_hash",
    "train_run_tokenizer",
]
