"""Convert a Hugging Face BERT, ModernBERT or EuroBERT checkpoint (and its tokenizer) into a SesameBert model
directory, or a SesameBert directory back into BERT / ModernBERT / EuroBERT.

    python -m modeling.bert.convert --source HF_BERT_DIR|REPO --output_dir D [--overwrite_output_dir] [--seed 0]
        [--tokenizer_name T]
    python -m modeling.bert.convert --source MODERNBERT_OR_EUROBERT_DIR --output_dir D
    python -m modeling.bert.convert --source SESAME_DIR --to bert|modernbert|eurobert --output_dir D

A ``modernbert`` / ``eurobert`` source (``config.json``'s ``model_type``) becomes the SesameBert class with the same
head (``convert_modern.CLASSES``); ``--to`` writes the transformers class with the SesameBert folder's head, in
transformers' format (``config.json``, ``model.safetensors``, the tokenizer). Both check the two models on a sample
pair.

The source may hold a ``BertModel``, ``BertForMaskedLM`` or ``BertForPreTraining`` checkpoint (safetensors or
PyTorch, sharded or not; with or without the ``bert.`` prefix), read through transformers'
``BertForPreTraining.from_pretrained``. Heads missing from the source (the MLM transform / bias, the NSP
classifier, the pooler) are initialised as BERT does (N(0, initializer_range), zero biases, seeded by ``--seed``)
and reported. The output is ``SesameBertForPreTraining.save_pretrained`` output (``config.json`` with ``auto_map``,
``model.safetensors``, the model code) plus the source's tokenizer, written atomically. After conversion both
models run on a sample sentence pair and the largest differences are reported (they are ~1e-6 in fp32).

Errors: :class:`core.errors.InputError` (exit status 2 under the CLI) for a missing source, a source without a
BERT config or without readable weights (missing, truncated), without tokenizer files and no ``--tokenizer_name``,
an unsupported BERT variant, or a non-empty output directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError

from core.arguments import arg, parse_arguments
from core.errors import InputError, first_line, run_cli
from core.files import share_like_umask

from . import convert_modern
from .configuration_sesame_bert import HIDDEN_ACTS, SesameBertConfig
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
RENAMES = (
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
        for old, new in RENAMES:
            key = key.replace(old, new)
        out[key] = value
    for i in range(num_layers):
        prefix = f"bert.encoder.layer.{i}.attention.self."
        for kind in ("weight", "bias"):
            out[f"bert.encoder.layer.{i}.attn.qkv.{kind}"] = torch.cat(
                [state[f"{prefix}{name}.{kind}"] for name in ("query", "key", "value")]
            )
    return out


def _load_source(source: str, tokenizer_name: str | None = None):
    """(BertForPreTraining in eval mode, missing keys, tokenizer) from a local directory or a hub repo id; the
    tokenizer from ``tokenizer_name`` when given."""
    from transformers import AutoConfig, BertForPreTraining

    path = Path(source)
    if path.exists() and not path.is_dir():
        raise InputError(f"--source {source}: is a file; expected a model directory or a hub repo id")
    if path.is_dir() and not (path / "config.json").is_file():
        raise InputError(f"--source {source}: no config.json; expected a Hugging Face BERT model directory")
    if not path.is_dir() and (source.startswith((".", "/", "~")) or source.count("/") > 1):
        raise InputError(f"--source {source}: no such directory")
    try:
        bert_config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise InputError(f"--source {source}: cannot read a config ({err.__class__.__name__}: {err})") from err
    # refuse unsupported BERT variants before reading the weights
    sesame_config_from_bert(bert_config, f"--source {source}: config.json")
    try:
        model, info = BertForPreTraining.from_pretrained(
            source, config=bert_config, output_loading_info=True, trust_remote_code=False
        )
    except Exception as err:  # noqa: BLE001  (missing, truncated or corrupt weights: OSError, SafetensorError, ...)
        raise InputError(
            f"--source {source}: no readable weights (model.safetensors / pytorch_model.bin): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}; expected a complete BERT checkpoint"
        ) from err
    missing = list(info.get("missing_keys", []))
    # A checkpoint that matches no BERT parameter at all is not a BERT checkpoint.
    if any(k.startswith("bert.embeddings.word_embeddings") for k in missing):
        raise InputError(f"--source {source}: the weights hold no BERT encoder (embeddings missing)")
    return (
        model.eval(),
        missing,
        _load_tokenizer(
            tokenizer_name or source, "--tokenizer_name" if tokenizer_name else "--source", bert_config.vocab_size
        ),
    )


#: Files one of which a tokenizer folder holds (``tokenizer.json``, or BERT's ``vocab.txt``).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


def _load_tokenizer(source: str, arg_name: str, vocab_size: int):
    """The tokenizer of ``source`` (a folder or a hub repo id).

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
            f"{arg_name} {source}: no tokenizer files ({' / '.join(TOKENIZER_FILES)}); expected the "
            f"model's tokenizer: {hint}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as err:
        raise InputError(
            f"{arg_name} {source}: no tokenizer files (vocab.txt / tokenizer.json): {err}; {hint}"
        ) from err
    if len(tokenizer) < vocab_size // 2:
        raise InputError(
            f"{arg_name} {source}: the tokenizer has {len(tokenizer)} tokens for a model vocabulary of "
            f"{vocab_size}; expected the model's tokenizer: {hint}"
        )
    return tokenizer


def convert(
    source: str,
    output_dir: str | os.PathLike,
    overwrite: bool = False,
    seed: int = 0,
    tokenizer_name: str | None = None,
    to: str | None = None,
) -> dict:
    """Convert ``source`` (a BERT, ModernBERT or EuroBERT directory or hub repo id) into a SesameBert directory at
    ``output_dir``, with the source's tokenizer (or ``tokenizer_name``'s; a source folder without tokenizer files is
    refused without it); with ``to`` (``"modernbert"`` / ``"eurobert"``), a SesameBert directory into that format.

    Returns the report: ``architecture`` (what the source held), ``initialized`` (heads that were missing and
    are newly initialised), ``max_abs_diff`` (largest |difference| of last hidden state, MLM logits and NSP
    logits on a sample pair, fp32). Raises :class:`InputError` as described in the module docstring.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise InputError(f"--output_dir {output_dir}: is a file; expected a directory")
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise InputError(f"--output_dir {output_dir}: exists and is not empty; pass --overwrite_output_dir")
    torch.manual_seed(seed)
    family = _model_type(source)
    if to is not None or family in convert_modern.FAMILIES:
        return _convert_modern(source, output_dir, family, to, tokenizer_name)
    hf_model, missing, tokenizer = _load_source(source, tokenizer_name)
    config = sesame_config_from_bert(hf_model.config)
    initialized = sorted({name for key in missing for prefix, name in HEADS.items() if key.startswith(prefix)})
    architectures = getattr(hf_model.config, "architectures", None) or ["unknown"]

    model = SesameBertForPreTraining(config).eval()
    state = convert_state_dict(hf_model.state_dict(), config.num_hidden_layers)
    model.load_state_dict(state, strict=True)
    if config.tie_word_embeddings and model.cls.decoder.weight is not model.bert.embeddings.word_embeddings.weight:
        raise RuntimeError("the MLM decoder lost its tie to the word embeddings")

    batch = tokenizer(*SAMPLE, return_tensors="pt", return_token_type_ids=True)
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    diff = _check_and_save(hf_model, model, batch, output_dir, tokenizer)
    return {
        "source": str(source),
        "output_dir": str(output_dir),
        "architecture": architectures[0],
        "initialized": initialized,
        "max_abs_diff": diff,
    }


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
    """Write ``model`` and ``tokenizer`` (``save_pretrained``) to ``output_dir`` atomically (a temporary sibling folder
    renamed into place; an existing folder is replaced)."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        drop_tokenizer_auto_map(tmp)
        share_like_umask(tmp)  # safetensors writes model.safetensors owner-only (0600)
        if output_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.old.", dir=output_dir.parent))
            os.replace(output_dir, old / "dir")
            os.replace(tmp, output_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: What ``--to`` writes: transformers' BERT, ModernBERT or EuroBERT format.
TARGETS = ("bert", *convert_modern.FAMILIES)
#: SesameBert class -> the transformers BERT class with the same head (``--to bert``).
BERT_CLASSES = {
    "SesameBertModel": "BertModel",
    "SesameBertForMaskedLM": "BertForMaskedLM",
    "SesameBertForPreTraining": "BertForPreTraining",
    "SesameBertForSequenceClassification": "BertForSequenceClassification",
    "SesameBertForQuestionAnswering": "BertForQuestionAnswering",
    "SesameBertForTokenClassification": "BertForTokenClassification",
}
#: The SesameBert fields (and their values) of the BERT layout: a config with another value has no BERT counterpart.
BERT_LAYOUT = dict(
    norm_position="post",
    norm_type="layernorm",
    classifier_pooling="cls",
    embedding_size=None,
    num_key_value_heads=None,
    head_dim=None,
    attention_bias=True,
    mlp_bias=True,
    norm_bias=True,
    decoder_bias=True,
    classifier_bias=True,
    embedding_norm=True,
    head_layout="bert",
    layer_types=None,
    global_attn_every_n_layers=None,
)


def bert_config_from_sesame(config: SesameBertConfig):
    """The transformers ``BertConfig`` of a SesameBert config of the BERT layout (:data:`BERT_LAYOUT`, learned
    positions, one of ``HIDDEN_ACTS``, segment embeddings); the inverse of :func:`sesame_config_from_bert`.

    Raises:
        InputError: a field whose value BERT cannot express (named).
    """
    from transformers import BertConfig

    wrong = {f: getattr(config, f) for f, v in BERT_LAYOUT.items() if getattr(config, f) != v}
    if config.position_embedding_type not in ("learned", "absolute"):
        wrong["position_embedding_type"] = config.position_embedding_type
    if config.hidden_act not in HIDDEN_ACTS or config.type_vocab_size < 1:
        wrong.update(hidden_act=config.hidden_act, type_vocab_size=config.type_vocab_size)
    if wrong:
        field, value = next(iter(wrong.items()))
        raise InputError(f"a SesameBert config with {field}={value!r} has no BERT counterpart (--to bert)")
    labels = dict(num_labels=config.num_labels, id2label=config.id2label, label2id=config.label2id)
    return BertConfig(**{name: getattr(config, name) for name in COPIED_FIELDS}, **labels)


def to_bert(model):
    """The transformers BERT model (:data:`BERT_CLASSES`, eval mode) with the same head and function as a SesameBert
    ``model`` of the BERT layout: ``attn.qkv`` is split into query, key and value (rows in that order), the other
    parameters renamed back (:data:`RENAMES`).

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
    ours, hidden, state = model.state_dict(), model.config.hidden_size, {}
    for key in theirs.state_dict():
        part = next((i for i, n in enumerate(("query", "key", "value")) if f".attention.self.{n}." in key), None)
        target = key.replace("cls.predictions.bias", "cls.predictions.decoder.bias")
        if part is not None:
            target = target.replace(f"attention.self.{('query', 'key', 'value')[part]}.", "attn.qkv.")
        for old, new in RENAMES:
            target = target.replace(old, new)
        if target in ours:
            state[key] = ours[target] if part is None else ours[target][part * hidden : (part + 1) * hidden]
    missing = [k for k in theirs.state_dict() if k not in state and not k.endswith(("position_ids", "token_type_ids"))]
    if missing:
        raise RuntimeError(f"{name}: parameters without a SesameBert counterpart: {missing}")
    theirs.load_state_dict(state, strict=False)
    return theirs


def _model_type(source: str) -> str | None:
    """``model_type`` of a local source folder's ``config.json`` (``None`` for a hub repo id or an unreadable file:
    the BERT path then reports what is wrong)."""
    path = Path(source) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _convert_modern(source: str, output_dir: Path, family: str | None, to: str | None, tokenizer_name: str | None):
    """ModernBERT / EuroBERT ``source`` -> SesameBert (``to`` ``None``), or SesameBert ``source`` -> ``to``; the
    converted model is checked on the sample pair and written with the tokenizer (:func:`_save`)."""
    import transformers

    from .. import bert

    expected = "sesame-bert" if to is not None else "one of bert, " + ", ".join(convert_modern.FAMILIES)
    if (to is not None) != (family == "sesame-bert"):
        raise InputError(f"--source {source}: model_type={family!r}; expected {expected}")
    if to is not None and to not in TARGETS:
        raise InputError(f"--to {to}: expected one of {', '.join(TARGETS)}")
    try:
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError, StrictDataclassError) as err:  # the last: a field the config's validators refuse
        raise InputError(f"--source {source}: cannot read a config ({type(err).__name__}: {first_line(err)})") from err
    architecture = (getattr(config, "architectures", None) or ["?"])[0]
    classes = bert.__dict__ if to is not None else convert_modern.CLASSES
    if architecture not in classes:
        names = sorted(set(convert_modern.CLASSES.values()) if to is not None else convert_modern.CLASSES)
        raise InputError(f"--source {source}: architectures={[architecture]}; expected one of {', '.join(names)}")
    load = getattr(bert if to is not None else transformers, architecture).from_pretrained
    try:
        source_model = load(source, trust_remote_code=False).eval()
    except Exception as err:  # noqa: BLE001  (missing, truncated or corrupt weights)
        raise InputError(f"--source {source}: no readable weights: {type(err).__name__}: {first_line(err)}") from err
    arg_name = "--tokenizer_name" if tokenizer_name else "--source"
    tokenizer = _load_tokenizer(tokenizer_name or source, arg_name, config.vocab_size)
    if to:  # the special tokens the target's config names, from the tokenizer where the SesameBert config has none
        special = dict(bos_token_id="cls_token_id", eos_token_id="sep_token_id", cls_token_id="cls_token_id")
        special.update(sep_token_id="sep_token_id", mask_token_id="mask_token_id")
        for field, attribute in special.items():
            if getattr(source_model.config, field, None) is None and getattr(tokenizer, attribute, None) is not None:
                setattr(source_model.config, field, getattr(tokenizer, attribute))
    if to == "bert":
        model = to_bert(source_model)
    else:
        model = convert_modern.from_sesame(source_model, to) if to else convert_modern.to_sesame(source_model)
    batch = tokenizer(*SAMPLE, return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    diff = _check_and_save(source_model, model, batch, output_dir, tokenizer)
    return {
        "source": str(source),
        "output_dir": str(output_dir),
        "architecture": architecture,
        "converted_to": type(model).__name__,
        "initialized": ["pooler"] if architecture.endswith("BertModel") and to is None else [],
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
    to: str | None = arg(None, "write a SesameBert --source in this transformers format instead", choices=TARGETS)
    output_dir: str = arg(help="where to write the SesameBert directory")
    overwrite_output_dir: bool = arg(False, "replace a non-empty --output_dir")
    seed: int = arg(0, "seed for the initialisation of missing heads")
    tokenizer_name: str | None = arg(
        None, "tokenizer folder or repo id (default: the source's; required when the source has no tokenizer files)"
    )


def main(argv=None) -> int:
    description = "Convert a Hugging Face BERT checkpoint and its tokenizer into a SesameBert directory."
    (args,) = parse_arguments([ConvertArguments], argv, prog="python -m modeling.bert.convert", description=description)
    report = convert(
        args.source,
        args.output_dir,
        overwrite=args.overwrite_output_dir,
        seed=args.seed,
        tokenizer_name=args.tokenizer_name,
        to=args.to,
    )
    if report["initialized"]:
        print(f"initialised (not in the source): {', '.join(report['initialized'])}", file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
