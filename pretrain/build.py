"""The tokenizer and the model of a pretraining run (shared by ``pretrain`` and ``pretrain.prepare``)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from core.errors import InputError, check_local_path, first_line
from pretrain.arguments import CorpusArguments, ModelArguments, PretrainArguments
from pretrain.objectives import FAMILIES, FamilyPretraining
from tokenizer import train_tokenizer  # the family's trainer
from training.pretrained import check_model_fits, hub_offline, load_pretrained

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
    or a hub repo id), with ``overrides``; checked to belong to the objective's family. A config file of the user's
    gets one warning per field the config class does not know (:func:`warn_unknown_fields`).

    Raises:
        InputError: an unknown preset, a config that cannot be loaded or is refused by its validators (the line leads
            with the reason), or one that belongs to another family.
    """
    from transformers import AutoConfig

    import modeling

    model = plan.model
    overrides = {**overrides, **model.config_overrides}
    if model.model_name_or_path:
        return _checked_overrides(_from_model_path(AutoConfig.from_pretrained, model, **overrides), model)
    presets = sorted(plan.family.spec.presets)
    expected = f"expected a preset ({', '.join(presets)}), a config path or a hub repo id"
    name = model.config_name
    if name in presets:
        config = modeling.get_preset_config(name, **overrides)
    else:
        if not name:
            raise InputError(f"--config_name: not given; {expected}")
        check_local_path(name, "--config_name", "a preset, a config path or a hub repo id")
        local = Path(name).expanduser().exists()
        try:  # a config.json file or folder, or a hub repo id (at --revision)
            config = AutoConfig.from_pretrained(
                name, revision=model.revision, trust_remote_code=model.trust_remote_code, **overrides
            )
        except Exception as err:  # noqa: BLE001
            reason = config_problem(err)
            if local:
                tail = "" if "expected" in reason else "; expected a model config.json (file or folder)"
                raise InputError(f"--config_name {name}: {reason}{tail}") from err
            if hub_offline():
                reason = "HF_HUB_OFFLINE is set"
            raise InputError(
                f"--config_name {name}{_rev(model)}: not a preset, a config file or a loadable hub repo ({reason}); "
                f"{expected}"
            ) from err
        if local and not overrides:  # (build_model loads it again with the tokenizer's sizes: warned once)
            warn_unknown_fields(name, config)
    _checked_overrides(config, model)
    if not plan.family.accepts(config):
        owner = next((f.name for f in FAMILIES.values() if f.accepts(config)), None)
        hint = f" (or --model_type {owner})" if owner else ""
        raise InputError(
            f"--config_name {name}: a {config.model_type} config; expected one for --model_type "
            f"{plan.family.name}{hint}"
        )
    return config


def _checked_overrides(config, model: ModelArguments):
    """``config`` with ``--rope_theta`` as the base of its ``"full_attention"`` layers (``rope_parameters``; the
    others keep theirs), refused when it is given for a model without rotary positions (it would be ignored).

    Raises:
        InputError: ``--rope_theta`` and a config whose ``position_embedding_type`` is not ``"rope"``.
    """
    kind, theta = getattr(config, "position_embedding_type", None), getattr(model, "rope_theta", None)
    if theta is not None and kind != "rope":
        raise InputError(
            f"--rope_theta {theta:g}: the model has {kind or 'no'} position embeddings, no rotary base; "
            "expected a rotary model (position_embedding_type rope, e.g. --config_name modernbert-base)"
        )
    if theta is not None:
        config.rope_parameters = {
            **config.rope_parameters,
            "full_attention": {"rope_type": "default", "rope_theta": theta},
        }
    return config


#: Longest reason (characters) quoted from a library's error in a config refusal line.
REASON_CHARS = 120


def config_problem(err: BaseException) -> str:
    """The reason a config could not be loaded, short: the first sentence of the innermost cause's first line (a
    ``@strict`` validator's ``ValueError`` / ``TypeError`` as it is, rather than huggingface_hub's wrapper around it;
    other errors with their type's name), cut to :data:`REASON_CHARS` characters."""
    while err.__cause__ is not None and err.__cause__ is not err:
        err = err.__cause__
    text = first_line(err).split(". ")[0].rstrip(".")
    if type(err) not in (ValueError, TypeError):
        text = f"{type(err).__name__}: {text}"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def _config_file(path: str) -> Path:
    p = Path(path).expanduser()
    return p / "config.json" if p.is_dir() else p


def warn_unknown_fields(path: str, config) -> list[str]:
    """Warn once per field of the user's config file ``path`` (a config.json or its folder) that ``config``'s class
    does not know (transformers would keep it as a plain attribute and the model would ignore it: a typo such as
    ``local_attenton`` would silently train the default), naming the closest known field. A warning rather than a
    refusal: config files written by other tools and versions carry bookkeeping fields that are harmless. Only the
    first process warns. Returns the unknown fields, in file order.
    """
    import difflib
    import json
    import os

    try:
        saved = json.loads(_config_file(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(saved, dict):
        return []
    cls = type(config)
    known = {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}
    try:
        known |= set(cls().to_dict())  # the fields a fresh config writes (a class that needs arguments: skipped)
    except Exception:  # noqa: BLE001
        pass
    known |= set(getattr(cls, "attribute_map", {})) | GENERIC_CONFIG_FIELDS
    known |= set(modeling_fields().get(getattr(cls, "model_type", ""), ()))
    unknown = [k for k in saved if k not in known and not k.startswith("_")]
    if os.environ.get("RANK", "0") == "0":
        for field in unknown:
            close = difflib.get_close_matches(field, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            logger.warning(
                "--config_name %s: unknown field %s = %s is not a %s setting and is ignored%s",
                path,
                field,
                json.dumps(saved[field])[:40],
                cls.model_type,
                hint,
            )
    return unknown


#: Fields of ``PretrainedConfig`` kept as plain attributes (token ids, bookkeeping of other tools and versions).
GENERIC_CONFIG_FIELDS = frozenset(
    {
        "auto_map",
        "torch_dtype",
        "num_labels",
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "cls_token_id",
        "mask_token_id",
        "unk_token_id",
        "decoder_start_token_id",
        "tokenizer_class",
        "use_cache",
        "is_decoder",
        "add_cross_attention",
        "tie_encoder_decoder",
        "finetuning_task",
        "task_specific_params",
        "prefix",
        "pruned_heads",
        "torchscript",
        "output_attentions",
    }
)


def modeling_fields() -> dict[str, tuple[str, ...]]:
    """Fields a model type records beyond its config class's (a discriminator saved by RTD pretraining records how
    the pair was trained: :data:`modeling.bert.configuration_sesame_bert.RTD_FIELDS`)."""
    from modeling.bert.configuration_sesame_bert import RTD_FIELDS

    return {"sesame-bert": RTD_FIELDS}


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
        kwargs = {}
        if wrap is not None or model_args.config_overrides or getattr(model_args, "rope_theta", None) is not None:
            config = load_model_config(plan)
            kwargs["config"] = config if wrap is None else wrap(config)
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
