"""Convert a Hugging Face BERT, ModernBERT or EuroBERT checkpoint (and its tokenizer) into a SesameBert model
directory, or a SesameBert directory back into BERT / ModernBERT / EuroBERT.

    python -m modeling.bert.convert --source HF_BERT_DIR|REPO [--revision R] --output_dir D [--overwrite_output_dir]
        [--seed 0] [--tokenizer_name T]
    python -m modeling.bert.convert --source MODERNBERT_OR_EUROBERT_DIR|REPO --output_dir D
    python -m modeling.bert.convert --source SESAME_DIR|REPO --to bert|modernbert|eurobert --output_dir D

A hub repo id is downloaded first (:func:`resolve_source`), so every source family and ``--to`` reads a local folder.
A ``modernbert`` / ``eurobert`` source (``config.json``'s ``model_type``) becomes the SesameBert class with the same
head (``convert_modern.SESAME_CLASS_OF``); ``--to`` writes the transformers class with the SesameBert folder's head, in
transformers' format (``config.json``, ``model.safetensors``, the tokenizer).

The source may hold a ``BertModel``, ``BertForMaskedLM`` or ``BertForPreTraining`` checkpoint (safetensors or
PyTorch, sharded or not; with or without the ``bert.`` prefix), read through transformers'
``BertForPreTraining.from_pretrained``. Heads missing from the source (the MLM transform / bias, the NSP
classifier, the pooler) are initialised as BERT does (N(0, initializer_range), zero biases, seeded by ``--seed``)
and reported. The output is ``SesameBertForPreTraining.save_pretrained`` output (``config.json`` with ``auto_map``,
``model.safetensors``, the model code) plus the source's tokenizer, written atomically.

Three checks stand between a source and a written model: transformers' loading report must show no missing (but
the heads above), unexpected or other-shaped tensor (:func:`refuse_incomplete`: transformers fills gaps with random
values); every converted tensor must equal the tensor read from the source's files (:func:`check_copied`); and the
two models must agree on a sample sentence pair (the largest differences are reported, ~1e-6 in fp32).

Errors: :class:`core.errors.InputError` (exit status 2 under the CLI) for a missing source or repo, a source without
a config or without readable weights (missing, truncated), weights that do not cover the config, a source without
tokenizer files and no ``--tokenizer_name``, an unsupported BERT variant, a non-empty output directory without
``--overwrite_output_dir``, or an output directory that is, holds or lies inside the source.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError

from core.arguments import arg, parse_arguments
from core.errors import InputError, first_line, run_cli
from core.files import share_like_umask

from . import convert_modern
from .configuration_sesame_bert import HIDDEN_ACTS, LAYOUTS, SesameBertConfig
from .modeling_sesame_bert import SesameBertForPreTraining

#: BertConfig fields copied as they are (the SesameBert fields have the same names and meanings).
COPIED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "classifier_dropout",
    "tie_word_embeddings",
)
#: transformers BERT parameter name part -> SesameBert name part (Q, K, V are fused into ``attn.qkv``).
BERT_RENAMES = (
    ("embeddings.LayerNorm.", "embeddings.norm."),
    ("attention.output.dense.", "attn.out."),
    ("attention.output.LayerNorm.", "norm1."),
    ("intermediate.dense.", "ffn.fc1."),
    ("output.dense.", "ffn.fc2."),
    ("output.LayerNorm.", "norm2."),
    ("cls.predictions.transform.dense.", "cls.dense."),
    ("cls.predictions.transform.LayerNorm.", "cls.norm."),
    ("cls.predictions.decoder.", "cls.decoder."),
    ("cls.seq_relationship.", "nsp."),
)
#: missing-key prefix in a BertForPreTraining load -> the part it belongs to (for the report).
HEADS = {"cls.predictions.": "MLM head", "cls.seq_relationship.": "NSP head", "bert.pooler.": "pooler"}
SAMPLE = ("The quick brown fox jumps over the lazy dog.", "It was not amused.")


def sesame_config_from_bert(bert_config, where: str = "config.json") -> SesameBertConfig:
    """A :class:`SesameBertConfig` with the same architecture as a transformers ``BertConfig`` (post-LN, learned
    positions, cls pooling). Raises :class:`InputError` for BERT variants SesameBert does not implement."""
    if getattr(bert_config, "model_type", None) != "bert":
        raise InputError(
            f"{where}: model_type={getattr(bert_config, 'model_type', None)!r}; expected a BERT checkpoint "
            "(model_type 'bert')"
        )
    position = getattr(bert_config, "position_embedding_type", "absolute")
    if position not in (None, "absolute"):
        raise InputError(f"{where}: position_embedding_type={position!r}; only 'absolute' BERT can be converted")
    if getattr(bert_config, "is_decoder", False) or getattr(bert_config, "add_cross_attention", False):
        raise InputError(f"{where}: is_decoder / add_cross_attention is set; only BERT encoders can be converted")
    if bert_config.hidden_act not in HIDDEN_ACTS:
        raise InputError(f"{where}: hidden_act={bert_config.hidden_act!r}; expected one of {', '.join(HIDDEN_ACTS)}")
    fields = {name: getattr(bert_config, name) for name in COPIED_FIELDS if hasattr(bert_config, name)}
    return SesameBertConfig(**fields)


def convert_state_dict(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Map a transformers ``BertForPreTraining`` state dict to ``SesameBertForPreTraining`` names.

    Q, K and V (each (H, H) weight, (H,) bias) are concatenated in that order into ``attn.qkv`` ((3H, H), (3H,));
    ``cls.predictions.bias`` (the same tensor as the decoder bias) and buffers are dropped.
    """
    out = {}
    for key, value in state.items():
        if ".attention.self." in key or key in ("cls.predictions.bias",) or key.endswith("position_ids"):
            continue
        if key.endswith("token_type_ids"):
            continue
        for old, new in BERT_RENAMES:
            key = key.replace(old, new)
        out[key] = value
    for i in range(num_layers):
        prefix = f"bert.encoder.layer.{i}.attention.self."
        for kind in ("weight", "bias"):
            out[f"bert.encoder.layer.{i}.attn.qkv.{kind}"] = torch.cat(
                [state[f"{prefix}{name}.{kind}"] for name in ("query", "key", "value")]
            )
    return out


def _load_source(folder: Path, where: str, tokenizer_name: str | None = None):
    """(BertForPreTraining in eval mode, the loading info, tokenizer) from a local checkpoint folder
    (:func:`resolve_source`); the tokenizer from ``tokenizer_name`` when given. ``where`` names the source in errors.

    Raises:
        InputError: a config that is no BERT SesameBert implements; unreadable weights; weights that do not cover
            the encoder (:func:`refuse_incomplete`: only the heads :data:`HEADS` may be missing).
    """
    from transformers import AutoConfig, BertForPreTraining

    try:
        bert_config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise InputError(f"{where}: cannot read a config ({err.__class__.__name__}: {err})") from err
    # refuse unsupported BERT variants before reading the weights
    sesame_config_from_bert(bert_config, f"{where}: config.json")
    try:
        model, info = BertForPreTraining.from_pretrained(
            folder, config=bert_config, output_loading_info=True, ignore_mismatched_sizes=True, trust_remote_code=False
        )
    except Exception as err:  # noqa: BLE001  (missing, truncated or corrupt weights: OSError, SafetensorError, ...)
        raise InputError(
            f"{where}: no readable weights (model.safetensors / pytorch_model.bin): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}; expected a complete BERT checkpoint"
        ) from err
    # A checkpoint that matches no BERT parameter at all is not a BERT checkpoint.
    if any(k.startswith("bert.embeddings.word_embeddings") for k in info.get("missing_keys", [])):
        raise InputError(f"{where}: the weights hold no BERT encoder (embeddings missing)")
    refuse_incomplete(
        info, where, "a BERT encoder checkpoint (BertModel, BertForMaskedLM or BertForPreTraining)", HEADS
    )
    return (
        model.eval(),
        info,
        _load_tokenizer(
            tokenizer_name or str(folder),
            f"--tokenizer_name {tokenizer_name}" if tokenizer_name else where,
            bert_config.vocab_size,
        ),
    )


#: Buffers a checkpoint may hold or lack that no parameter depends on (transformers drops or rebuilds them).
BUFFERS = ("position_ids", "token_type_ids", "rotary_emb.inv_freq", "rotary_emb.original_inv_freq")


def refuse_incomplete(info: dict, where: str, expected: str, allowed_missing: dict | tuple = ()) -> None:
    """Refuse a checkpoint that does not hold the model it claims, from transformers' loading report
    (``from_pretrained(..., output_loading_info=True, ignore_mismatched_sizes=True)``): transformers fills what is
    missing, and reinitialises what has the wrong shape, with random values, which a conversion must never write.

    Args:
        info: the report (``missing_keys``, ``unexpected_keys``, ``mismatched_keys`` as (name, checkpoint shape,
            model shape), ``error_msgs``).
        where: names the source in the message (``"--source DIR"``).
        expected: what the source should hold, for the message.
        allowed_missing: name prefixes that may be missing by design (the heads a conversion initialises).

    Raises:
        InputError: one line with the count and the first names of each kind of fault.
    """
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(tuple(allowed_missing)))
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if not k.endswith(BUFFERS))
    missing = [k for k in missing if not k.endswith(BUFFERS)]
    mismatched = sorted(info.get("mismatched_keys", ()))
    faults = []
    shapes = [f"{name} {tuple(got)} for {tuple(want)}" for name, got, want in mismatched]
    faults = [
        f"{len(names)} {kind} ({', '.join(names[:shown])}{', ...' if len(names) > shown else ''})"
        for kind, names, shown in (
            ("missing tensors", missing, 4),
            ("unexpected tensors", unexpected, 4),
            ("tensors of another shape", shapes, 2),
            ("load errors", [first_line(RuntimeError(m)) for m in info.get("error_msgs", ())], 1),
        )
        if names
    ]
    if faults:
        raise InputError(
            f"{where}: the weights do not match its config: {'; '.join(faults)}; expected {expected}; nothing was "
            "written"
        )


#: Files one of which a tokenizer folder holds (``tokenizer.json``, or BERT's ``vocab.txt``).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


def _load_tokenizer(source: str, where: str, vocab_size: int):
    """The tokenizer of ``source`` (a folder or a hub repo id); ``where`` names it in errors (``"--source DIR"``).

    Raises:
        InputError: a local folder without tokenizer files (transformers would build an empty 5-token tokenizer
            that maps every word to [UNK]), a tokenizer that cannot be loaded, or one with far fewer tokens than the
            model's vocabulary; the message suggests ``--tokenizer_name``.
    """
    from transformers import AutoTokenizer

    hint = "pass --tokenizer_name with the tokenizer the model was trained with"
    path = Path(source)
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(
            f"{where}: no tokenizer files ({' / '.join(TOKENIZER_FILES)}); expected the model's tokenizer: {hint}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as err:
        raise InputError(f"{where}: no tokenizer files (vocab.txt / tokenizer.json): {err}; {hint}") from err
    if len(tokenizer) < vocab_size // 2:
        raise InputError(
            f"{where}: the tokenizer has {len(tokenizer)} tokens for a model vocabulary of "
            f"{vocab_size}; expected the model's tokenizer: {hint}"
        )
    return tokenizer


#: What a hub source brings down (``snapshot_download``'s ``allow_patterns``): the config, the weights (safetensors or
#: PyTorch, sharded or not) and the tokenizer files.
DOWNLOADED = ("*.json", "*.safetensors", "*.bin", "*.txt", "*.model", "*.jinja")
#: Entries a model folder written by this command may hold (``save_pretrained`` of a model and a tokenizer, SesameBert's
#: remote code): an earlier conversion's entries of these names that a new one does not write are removed from
#: ``--output_dir``; every other entry is kept (:func:`core.files.atomic_output_dir`).
MODEL_FOLDER_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model-*-of-*.bin",
    "pytorch_model.bin.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.model",
    "*sesame_bert*.py",
)


def resolve_source(source: str, revision: str | None = None, arg_name: str = "--source") -> Path:
    """The local folder of ``source``: the folder itself, or the snapshot of a hub repo id at ``revision`` (its
    config, weights and tokenizer files, :data:`DOWNLOADED`, through ``huggingface_hub.snapshot_download``; the cache
    serves it offline).

    Raises:
        InputError: a file, a path that does not exist, a folder without ``config.json``, ``--revision`` with a local
            folder, or a repo (or revision) the hub does not have or cannot serve.
    """
    path = Path(source).expanduser()
    rev = f" (--revision {revision})" if revision else ""
    if path.exists() and not path.is_dir():
        raise InputError(f"{arg_name} {source}: is a file; expected a model directory or a hub repo id")
    if path.is_dir():
        if revision:
            raise InputError(f"--revision {revision}: {arg_name} {source} is a local folder; expected a hub repo id")
        if not (path / "config.json").is_file():
            raise InputError(f"{arg_name} {source}: no config.json; expected a model directory (save_pretrained)")
        return path
    if source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise InputError(f"{arg_name} {source}: no such directory; expected a model directory or a hub repo id")
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(source, revision=revision, allow_patterns=list(DOWNLOADED)))
    except Exception as err:  # noqa: BLE001  (not found, no such revision, offline without a cached copy, HTTP)
        raise InputError(
            f"{arg_name} {source}{rev}: cannot be downloaded ({type(err).__name__}: {first_line(err)}); expected a "
            "local model directory or a hub repo id (and revision) the hub has"
        ) from err
    if not (folder / "config.json").is_file():
        raise InputError(f"{arg_name} {source}{rev}: the repo has no config.json; expected a model repo")
    return folder


def read_weights(folder: Path, where: str) -> dict[str, torch.Tensor]:
    """Every tensor of the weight files of a checkpoint folder, read from the files themselves (safetensors, else
    PyTorch ``.bin`` with ``weights_only``; one file or the shards an index names), in the files' dtypes: the ground
    truth a conversion is checked against (:func:`check_copied`), independent of what ``from_pretrained`` filled in.

    Raises:
        InputError: no weight file, or one that cannot be read.
    """
    from safetensors.torch import load_file

    for single, index, load in (
        ("model.safetensors", "model.safetensors.index.json", load_file),
        ("pytorch_model.bin", "pytorch_model.bin.index.json", lambda f: torch.load(f, weights_only=True)),
    ):
        if (folder / single).is_file():
            files = [single]
        elif (folder / index).is_file():
            files = sorted(set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values()))
        else:
            continue
        state: dict[str, torch.Tensor] = {}
        for name in files:
            try:
                state.update(load(str(folder / name)))
            except Exception as err:  # noqa: BLE001  (truncated or corrupt file)
                raise InputError(f"{where}: {name}: unreadable ({type(err).__name__}: {first_line(err)})") from err
        return state
    raise InputError(f"{where}: no weights (model.safetensors / pytorch_model.bin); expected a complete checkpoint")


def check_copied(converted, pairs, allowed_new: tuple[str, ...] = ()) -> list[str]:
    """Check a converted model against the source's files: every source tensor equals its place in ``converted``,
    and every parameter of ``converted`` comes from the source unless it is a head the conversion adds by design.

    Args:
        converted: the converted model (its ``state_dict``; tied parameters count once).
        pairs: ``(converted name, first row, end row, source tensor)`` for every tensor read from the source files
            (:func:`read_weights`), after the renaming, splitting or fusing of the conversion; the rows select a
            block of a fused tensor.
        allowed_new: name prefixes of ``converted`` that may be newly initialised (heads the source lacks).

    Returns:
        The names of ``converted``'s parameters that were newly initialised (sorted).

    Raises:
        RuntimeError: a tensor that differs from the source (a bug of the conversion), or a parameter that comes
            neither from the source nor from ``allowed_new``.
    """
    state = converted.state_dict()
    covered = set()
    for name, first, end, tensor in pairs:
        mine = state[name][first:end]
        if mine.shape != tensor.shape or not torch.equal(mine, tensor.to(mine.dtype)):
            block = "" if mine.shape == state[name].shape else f" rows {first}:{end}"
            raise RuntimeError(f"{name}{block}: differs from the source's tensor after conversion")
        covered.add(state[name].data_ptr())
    new = sorted(k for k, v in state.items() if v.data_ptr() not in covered and not k.endswith(BUFFERS))
    stray = [k for k in new if not k.startswith(allowed_new)]
    if stray:
        raise RuntimeError(f"parameters that do not come from the source: {stray[:6]}")
    return new


def _bert_file_pairs(model, file_state: dict[str, torch.Tensor], num_layers: int):
    """:func:`check_copied`'s pairs of a BERT source's files: the keys as ``BertForPreTraining`` names them (a
    ``BertModel``'s without the ``bert.`` prefix; TF-era ``gamma`` / ``beta``), then :func:`convert_state_dict`'s
    names; ``cls.predictions.bias`` is the decoder's bias."""
    names = {}
    for key, value in file_state.items():
        name = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        names["bert." + name if not name.startswith(("bert.", "cls.")) else name] = value
    if "cls.predictions.bias" in names:
        names.setdefault("cls.predictions.decoder.bias", names["cls.predictions.bias"])
    mapped = convert_state_dict(names, num_layers)
    state = model.state_dict()
    return [(k, None, None, v) for k, v in mapped.items() if k in state]


def convert(
    source: str,
    output_dir: str | os.PathLike,
    overwrite: bool = False,
    seed: int = 0,
    tokenizer_name: str | None = None,
    to: str | None = None,
    revision: str | None = None,
) -> dict:
    """Convert ``source`` (a BERT, ModernBERT or EuroBERT directory or hub repo id at ``revision``) into a SesameBert
    directory at ``output_dir``, with the source's tokenizer (or ``tokenizer_name``'s; a source folder without
    tokenizer files is refused without it); with ``to`` (``"bert"`` / ``"modernbert"`` / ``"eurobert"``), a SesameBert
    directory or repo into that format.

    Nothing is written unless the source's weights cover its config exactly (:func:`refuse_incomplete`), every
    converted tensor equals the source file's (:func:`check_copied`) and the two models agree on a sample pair.
    ``overwrite`` replaces the files a conversion writes in an existing ``output_dir`` and keeps every other file.

    Returns the report: ``architecture`` (what the source held), ``initialized`` (heads newly initialised because
    the source lacks them), ``initialized_parameters`` (their parameter names), ``max_abs_diff`` (largest
    |difference| of last hidden state and each head's logits on a sample pair, fp32). Raises :class:`InputError` as
    described in the module docstring, and for an ``output_dir`` that is, contains or lies inside the source.
    """
    from core.files import check_sources_outside

    output_dir = Path(output_dir)
    local = Path(str(source)).expanduser().exists()
    folder = resolve_source(str(source), revision) if local else None  # a hub repo is downloaded below
    check_sources_outside(output_dir, {"--source": str(source), "--tokenizer_name": tokenizer_name})
    if output_dir.exists() and not output_dir.is_dir():
        raise InputError(f"--output_dir {output_dir}: is a file; expected a directory")
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise InputError(f"--output_dir {output_dir}: exists and is not empty; pass --overwrite_output_dir")
    if folder is None:
        folder = resolve_source(str(source), revision)
        check_sources_outside(output_dir, {"--source": folder})  # the snapshot in the hub cache
    torch.manual_seed(seed)
    family = _model_type(folder)
    where = f"--source {source}" + (f" (--revision {revision})" if revision else "")
    if to is not None or family in convert_modern.SOURCES:
        report = _convert_modern(folder, where, output_dir, family, to, tokenizer_name)
    else:
        report = _convert_bert(folder, where, output_dir, tokenizer_name)
    return {"source": str(source), "revision": revision, "output_dir": str(output_dir), **report}


def _convert_bert(folder: Path, where: str, output_dir: Path, tokenizer_name: str | None) -> dict:
    """A transformers BERT checkpoint folder -> ``SesameBertForPreTraining`` (see :func:`convert`)."""
    hf_model, _, tokenizer = _load_source(folder, where, tokenizer_name)
    config = sesame_config_from_bert(hf_model.config)
    architectures = getattr(hf_model.config, "architectures", None) or ["unknown"]

    model = SesameBertForPreTraining(config).eval()
    state = convert_state_dict(hf_model.state_dict(), config.num_hidden_layers)
    model.load_state_dict(state, strict=True)
    if config.tie_word_embeddings and model.cls.decoder.weight is not model.bert.embeddings.word_embeddings.weight:
        raise RuntimeError("the MLM decoder lost its tie to the word embeddings")
    pairs = _bert_file_pairs(model, read_weights(folder, where), config.num_hidden_layers)
    new = check_copied(model, pairs, allowed_new=tuple(SESAME_HEADS))
    initialized = sorted({head for name in new for prefix, head in SESAME_HEADS.items() if name.startswith(prefix)})

    batch = tokenizer(*SAMPLE, return_tensors="pt", return_token_type_ids=True)
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    diff = _check_and_save(hf_model, model, batch, output_dir, tokenizer)
    return {
        "architecture": architectures[0],
        "initialized": initialized,
        "initialized_parameters": new,
        "max_abs_diff": diff,
    }


#: SesameBertForPreTraining name prefix -> the head it belongs to (what a BERT source may lack, :data:`HEADS`).
SESAME_HEADS = {"cls.": "MLM head", "nsp.": "NSP head", "bert.pooler.": "pooler"}


def _check_and_save(source_model, model, batch: dict, output_dir: Path, tokenizer) -> dict[str, float]:
    """Run both models on ``batch`` and save ``model`` with ``tokenizer`` (:func:`_save`) when they agree. Returns
    the largest absolute differences of the last hidden state and of every head output the source gives.

    Raises:
        RuntimeError: a difference above 1e-3.
    """
    with torch.no_grad():
        ref, new = source_model(**batch, output_hidden_states=True), model(**batch, output_hidden_states=True)
    diff = {"last_hidden_state": (ref.hidden_states[-1] - new.hidden_states[-1]).abs().max().item()}
    for name in ("logits", "start_logits", "end_logits", "prediction_logits", "seq_relationship_logits"):
        if getattr(ref, name, None) is not None:
            diff[name] = (getattr(ref, name) - getattr(new, name)).abs().max().item()
    if max(diff.values()) > 1e-3:
        raise RuntimeError(f"converted model disagrees with the source: {diff}")
    _save(output_dir, model, tokenizer)
    return diff


def _save(output_dir: Path, model, tokenizer) -> None:
    """Write ``model`` and ``tokenizer`` (``save_pretrained``) into ``output_dir`` atomically
    (:func:`core.files.atomic_output_dir`): in an existing folder the files written replace those of the same name,
    an earlier conversion's other model-folder files (:data:`MODEL_FOLDER_FILES`) are removed, every other file is
    kept."""
    from core.files import atomic_output_dir

    with atomic_output_dir(output_dir, stale=MODEL_FOLDER_FILES) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        drop_tokenizer_auto_map(tmp)
        share_like_umask(tmp)  # safetensors writes model.safetensors owner-only (0600)


#: What ``--to`` writes: transformers' BERT, ModernBERT or EuroBERT format.
TARGETS = ("bert", *convert_modern.SOURCES)
#: SesameBert class -> the transformers BERT class with the same head (``--to bert``).
BERT_CLASSES = {
    "SesameBertModel": "BertModel",
    "SesameBertForMaskedLM": "BertForMaskedLM",
    "SesameBertForPreTraining": "BertForPreTraining",
    "SesameBertForSequenceClassification": "BertForSequenceClassification",
    "SesameBertForQuestionAnswering": "BertForQuestionAnswering",
    "SesameBertForTokenClassification": "BertForTokenClassification",
}


def bert_config_from_sesame(config: SesameBertConfig):
    """The transformers ``BertConfig`` of a SesameBert config of the BERT layout (``LAYOUTS["bert"]``, learned
    positions, one of ``HIDDEN_ACTS``, segment embeddings); the inverse of :func:`sesame_config_from_bert`.

    Raises:
        InputError: a field whose value BERT cannot express (named).
    """
    from transformers import BertConfig

    wrong = {f: getattr(config, f) for f, v in LAYOUTS["bert"].fixed.items() if getattr(config, f) != v}
    if config.position_embedding_type not in ("learned", "absolute"):
        wrong["position_embedding_type"] = config.position_embedding_type
    if config.hidden_act not in HIDDEN_ACTS or config.type_vocab_size < 1:
        wrong.update(hidden_act=config.hidden_act, type_vocab_size=config.type_vocab_size)
    if wrong:
        field, value = next(iter(wrong.items()))
        raise InputError(f"a SesameBert config with {field}={value!r} has no BERT counterpart (--to bert)")
    labels = dict(num_labels=config.num_labels, id2label=config.id2label, label2id=config.label2id)
    return BertConfig(**{name: getattr(config, name) for name in COPIED_FIELDS}, **labels)


def bert_key_map(keys, hidden: int) -> dict[str, tuple[str, int | None, int | None]]:
    """Where each parameter of a transformers BERT model (its state-dict ``keys``) lives in SesameBert's:
    name -> ``(SesameBert name, first row, end row)``; query, key and value are the row blocks of ``attn.qkv`` (in that
    order, ``hidden`` rows each), every other parameter a whole tensor (rows ``None``), renamed by :data:`BERT_RENAMES`;
    ``cls.predictions.bias`` is the decoder's bias."""
    out = {}
    for key in keys:
        part = next((i for i, n in enumerate(("query", "key", "value")) if f".attention.self.{n}." in key), None)
        target = key.replace("cls.predictions.bias", "cls.predictions.decoder.bias")
        if part is not None:
            target = target.replace(f"attention.self.{('query', 'key', 'value')[part]}.", "attn.qkv.")
        for old, new in BERT_RENAMES:
            target = target.replace(old, new)
        out[key] = (target, None, None) if part is None else (target, part * hidden, (part + 1) * hidden)
    return out


def to_bert(model):
    """The transformers BERT model (:data:`BERT_CLASSES`, eval mode) with the same head and function as a SesameBert
    ``model`` of the BERT layout: ``attn.qkv`` is split into query, key and value (rows in that order), the other
    parameters renamed back (:data:`BERT_RENAMES`, :func:`bert_key_map`).

    Raises:
        InputError: a class or a config without a BERT counterpart.
    """
    import transformers

    name = BERT_CLASSES.get(type(model).__name__)
    if name is None:
        raise InputError(f"{type(model).__name__}: has no BERT counterpart; expected one of {', '.join(BERT_CLASSES)}")
    config = bert_config_from_sesame(model.config)
    if name == "BertForQuestionAnswering":
        config.num_labels = 2  # transformers' span head has num_labels outputs
    theirs = getattr(transformers, name)(config).eval()
    ours = model.state_dict()
    keys = bert_key_map(theirs.state_dict(), model.config.hidden_size)
    state = {key: ours[target][first:end] for key, (target, first, end) in keys.items() if target in ours}
    missing = [k for k in theirs.state_dict() if k not in state and not k.endswith(("position_ids", "token_type_ids"))]
    if missing:
        raise RuntimeError(f"{name}: parameters without a SesameBert counterpart: {missing}")
    theirs.load_state_dict(state, strict=False)
    return theirs


def _model_type(folder: Path) -> str | None:
    """``model_type`` of a source folder's ``config.json`` (``None`` for an unreadable file: the BERT path then reports
    what is wrong)."""
    try:
        return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _convert_modern(
    folder: Path, where: str, output_dir: Path, family: str | None, to: str | None, tokenizer_name: str | None
) -> dict:
    """ModernBERT / EuroBERT ``folder`` -> SesameBert (``to`` ``None``), or SesameBert ``folder`` -> ``to``: the source
    is refused unless its weights cover its config (:func:`refuse_incomplete`), the converted tensors are checked
    against the source's files (:func:`check_copied`) and the two models on the sample pair, then the model is written
    with the tokenizer (:func:`_save`)."""
    import transformers

    from .. import bert

    expected = "sesame-bert" if to is not None else "one of bert, " + ", ".join(convert_modern.SOURCES)
    if (to is not None) != (family == "sesame-bert"):
        raise InputError(f"{where}: model_type={family!r}; expected {expected}")
    if to is not None and to not in TARGETS:
        raise InputError(f"--to {to}: expected one of {', '.join(TARGETS)}")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError, StrictDataclassError) as err:  # the last: a field the config's validators refuse
        raise InputError(f"{where}: cannot read a config ({type(err).__name__}: {first_line(err)})") from err
    architecture = (getattr(config, "architectures", None) or ["?"])[0]
    classes = bert.__dict__ if to is not None else convert_modern.SESAME_CLASS_OF
    if architecture not in classes:
        names = sorted(
            set(convert_modern.SESAME_CLASS_OF.values()) if to is not None else convert_modern.SESAME_CLASS_OF
        )
        raise InputError(f"{where}: architectures={[architecture]}; expected one of {', '.join(names)}")
    load = getattr(bert if to is not None else transformers, architecture).from_pretrained
    try:
        source_model, info = load(
            folder, trust_remote_code=False, output_loading_info=True, ignore_mismatched_sizes=True
        )
    except Exception as err:  # noqa: BLE001  (missing, truncated or corrupt weights)
        raise InputError(f"{where}: no readable weights: {type(err).__name__}: {first_line(err)}") from err
    refuse_incomplete(info, where, f"a complete {architecture} checkpoint")
    source_model.eval()
    files = read_weights(folder, where)
    tokenizer = _load_tokenizer(
        tokenizer_name or str(folder),
        f"--tokenizer_name {tokenizer_name}" if tokenizer_name else where,
        config.vocab_size,
    )
    if to:  # the special tokens the target's config names, from the tokenizer where the SesameBert config has none
        special = dict(bos_token_id="cls_token_id", eos_token_id="sep_token_id", cls_token_id="cls_token_id")
        special.update(sep_token_id="sep_token_id", mask_token_id="mask_token_id")
        for field, attribute in special.items():
            if getattr(source_model.config, field, None) is None and getattr(tokenizer, attribute, None) is not None:
                setattr(source_model.config, field, getattr(tokenizer, attribute))
    if to:
        model = to_bert(source_model) if to == "bert" else convert_modern.from_sesame(source_model, to)
        theirs = model.state_dict()
        if to == "bert":
            keys = bert_key_map(theirs, source_model.config.hidden_size)
        else:
            keys = convert_modern.key_map(theirs, type(model).__name__)
        pairs = [(k, None, None, files[t][a:b]) for k, (t, a, b) in keys.items() if t in files]
        new = check_copied(model, pairs)
    else:
        model = convert_modern.to_sesame(source_model)
        ordered = {k: files[k] for k in source_model.state_dict() if k in files}  # the fused blocks' order
        pairs = [(t, a, b, ordered[k]) for k, (t, a, b) in convert_modern.key_map(ordered, architecture).items()]
        bare = architecture.endswith("BertModel")  # its pooler has no counterpart: initialised by design
        new = check_copied(model, pairs, allowed_new=("pooler.",) if bare else ())
    batch = tokenizer(*SAMPLE, return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    diff = _check_and_save(source_model, model, batch, output_dir, tokenizer)
    return {
        "architecture": architecture,
        "converted_to": type(model).__name__,
        "initialized": ["pooler"] if new else [],
        "initialized_parameters": new,
        "max_abs_diff": diff,
    }


def drop_tokenizer_auto_map(folder: Path) -> bool:
    """Remove the ``auto_map`` of ``folder/tokenizer_config.json``: the source's tokenizer was loaded as a standard
    transformers class (``trust_remote_code=False``), and the code files its ``auto_map`` names are not copied, so
    the entry would only point loaders at code that is not there. Returns whether one was removed."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return False
    config = json.loads(path.read_text(encoding="utf-8"))
    if "auto_map" not in config:
        return False
    del config["auto_map"]
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConvertArguments:
    """``python -m modeling.bert.convert``: the source, the target format and the output folder."""

    source: str = arg(help="BERT, ModernBERT or EuroBERT directory or hub repo id (SesameBert with --to)")
    revision: str | None = arg(None, "the hub revision (branch, tag or commit) of a --source repo id")
    to: str | None = arg(None, "write a SesameBert --source in this transformers format instead", choices=TARGETS)
    output_dir: str = arg(help="where to write the SesameBert directory")
    overwrite_output_dir: bool = arg(
        False, "write into a non-empty --output_dir: the files a conversion writes are replaced, all others kept"
    )
    seed: int = arg(0, "seed for the initialisation of missing heads")
    tokenizer_name: str | None = arg(
        None, "tokenizer folder or repo id (default: the source's; required when the source has no tokenizer files)"
    )


def main(argv=None) -> int:
    description = (
        "Convert a Hugging Face BERT, ModernBERT or EuroBERT checkpoint and its tokenizer into a SesameBert directory, "
        "or a SesameBert directory into BERT, ModernBERT or EuroBERT (--to)."
    )
    (args,) = parse_arguments([ConvertArguments], argv, prog="python -m modeling.bert.convert", description=description)
    report = convert(
        args.source,
        args.output_dir,
        overwrite=args.overwrite_output_dir,
        seed=args.seed,
        tokenizer_name=args.tokenizer_name,
        to=args.to,
        revision=args.revision,
    )
    if report["initialized"]:
        print(f"initialised (not in the source): {', '.join(report['initialized'])}", file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
