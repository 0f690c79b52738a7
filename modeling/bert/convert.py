"""Convert a Hugging Face checkpoint of one of the sources (:data:`sources.SOURCES`: BERT, ModernBERT, EuroBERT) and
its tokenizer into a SesameBert model directory, or a SesameBert directory back into one of their formats.

    python -m modeling.bert.convert --source HF_DIR|REPO [--revision R] --output_dir D [--overwrite_output_dir]
        [--seed 0] [--tokenizer_name T]
    python -m modeling.bert.convert --source SESAME_DIR|REPO --to bert|modernbert|eurobert --output_dir D

A hub repo id is downloaded first (:func:`sources.folders.resolve_source`), so every source and ``--to`` reads a local
folder. The source's ``config.json`` ``model_type`` names its module (``modeling/bert/sources/``), which maps it to the
SesameBert class with the same head (its ``CLASSES``); ``--to`` writes the transformers class with the SesameBert
folder's head, in transformers' format (``config.json``, ``model.safetensors``, the tokenizer). A BERT source may hold
a ``BertModel``, ``BertForMaskedLM`` or ``BertForPreTraining`` checkpoint: the heads it lacks (the MLM transform /
bias, the NSP classifier, the pooler) are initialised as BERT does (seeded by ``--seed``) and reported. The output is
``save_pretrained`` output (a SesameBert folder carries ``auto_map`` and the model code) plus the source's tokenizer,
written atomically.

Three checks stand between a source and a written model: transformers' loading report must show no missing (but
the heads above), unexpected or other-shaped tensor (``refuse_incomplete``: transformers fills gaps with random
values); every converted tensor must equal the tensor read from the source's files (``check_copied``); and the
two models must agree on a sample sentence pair (the largest differences are reported, ~1e-6 in fp32).

Errors: :class:`core.errors.InputError` (exit status 2 under the CLI) for a missing source or repo, a source without
a config or without readable weights (missing, truncated), weights that do not cover the config, a source without
tokenizer files and no ``--tokenizer_name``, a model type, class or config without a counterpart, a non-empty output
directory without ``--overwrite_output_dir``, or an output directory that is, holds or lies inside the source.
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

from .sources import SOURCES
from .sources.folders import (
    MODEL_FOLDER_FILES,
    check_copied,
    drop_tokenizer_auto_map,
    load_tokenizer,
    read_weights,
    refuse_incomplete,
    resolve_source,
)

SAMPLE = ("The quick brown fox jumps over the lazy dog.", "It was not amused.")
#: What ``--to`` writes: a source's transformers format.
TARGETS = tuple(SOURCES)
#: The sources' names for help and messages ("BERT, ModernBERT or EuroBERT").
TITLES = " or ".join(", ".join(m.SOURCE.title for m in SOURCES.values()).rsplit(", ", 1))


def convert(
    source: str,
    output_dir: str | os.PathLike,
    overwrite: bool = False,
    seed: int = 0,
    tokenizer_name: str | None = None,
    to: str | None = None,
    revision: str | None = None,
) -> dict:
    """Convert ``source`` (a directory or hub repo id at ``revision`` of a source, :data:`TARGETS`) into a SesameBert
    directory at ``output_dir``, with the source's tokenizer (or ``tokenizer_name``'s; a source folder without
    tokenizer files is refused without it); with ``to`` (``"bert"`` / ``"modernbert"`` / ``"eurobert"``), a SesameBert
    directory or repo into that format.

    Nothing is written unless the source's weights cover its config exactly (``refuse_incomplete``), every
    converted tensor equals the source file's (``check_copied``) and the two models agree on a sample pair.
    ``overwrite`` replaces the files a conversion writes in an existing ``output_dir`` and keeps every other file.

    Returns the report: ``architecture`` (what the source held), ``converted_to`` (the class written),
    ``initialized`` (heads newly initialised because the source lacks them), ``initialized_parameters`` (their
    parameter names), ``max_abs_diff`` (largest |difference| of last hidden state and each head's logits on a sample
    pair, fp32). Raises :class:`InputError` as
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
    report = _convert(folder, where, output_dir, family, to, tokenizer_name)
    return {"source": str(source), "revision": revision, "output_dir": str(output_dir), **report}


def _convert(folder: Path, where: str, output_dir: Path, family: str | None, to: str | None, tokenizer_name) -> dict:
    """A source ``folder`` of the ``model_type`` ``family`` -> SesameBert (``to`` ``None``), or a SesameBert ``folder``
    -> ``to``'s format: the source is refused unless its weights cover its config (:func:`refuse_incomplete`), the
    converted tensors are checked against the source's files (:func:`check_copied`) and the two models on the sample
    pair, then the model is written with the tokenizer (:func:`_save`)."""
    import transformers

    from .. import bert

    if (to is not None) != (family == "sesame-bert"):
        expected = "sesame-bert" if to is not None else f"one of {', '.join(SOURCES)}"
        raise InputError(f"{where}: model_type={family!r}; expected {expected}")
    if to is not None and to not in SOURCES:
        raise InputError(f"--to {to}: expected one of {', '.join(TARGETS)}")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError, StrictDataclassError) as err:  # the last: a field the config's validators refuse
        raise InputError(f"{where}: cannot read a config ({type(err).__name__}: {first_line(err)})") from err
    module = SOURCES.get(to or config.model_type)
    if module is None:
        raise InputError(f"{where}: model_type={config.model_type!r}; expected one of {', '.join(SOURCES)}")
    source = module.SOURCE
    architecture = (getattr(config, "architectures", None) or ["unknown"])[0]
    classes = set(source.classes.values()) if to is not None else source.classes
    if architecture not in classes and (to is not None or source.load_as is None):
        raise InputError(f"{where}: architectures={[architecture]}; expected one of {', '.join(sorted(classes))}")
    if to is None:  # refuse a config SesameBert cannot express before reading the weights
        source.sesame_config(config, f"{where}: config.json", pooled=architecture.endswith("SequenceClassification"))
    load = architecture if to is not None else source.load_as or architecture
    try:
        source_model, info = getattr(bert if to is not None else transformers, load).from_pretrained(
            folder, config=config, trust_remote_code=False, output_loading_info=True, ignore_mismatched_sizes=True
        )
    except Exception as err:  # noqa: BLE001  (missing, truncated or corrupt weights: OSError, SafetensorError, ...)
        raise InputError(
            f"{where}: no readable weights (model.safetensors / pytorch_model.bin): {type(err).__name__}: "
            f"{first_line(err)}; expected a complete {architecture} checkpoint"
        ) from err
    refuse_incomplete(info, where, f"a complete {architecture} checkpoint", () if to else source.may_lack)
    source_model.eval()
    files = read_weights(folder, where)
    tokenizer = load_tokenizer(
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
        model = module.from_sesame(source_model)
        keys = source.key_map(model.state_dict(), type(model).__name__)
        new = check_copied(model, [(k, None, None, files[t][a:b]) for k, (t, a, b) in keys.items() if t in files])
    else:
        model = module.to_sesame(source_model)
        ordered = source.file_state(files, source_model.state_dict())  # in the model's order: the fused blocks'
        pairs = [(t, a, b, ordered[k]) for k, (t, a, b) in source.key_map(ordered, load).items()]
        new = check_copied(model, pairs, allowed_new=tuple(source.new_heads))
    batch = tokenizer(*SAMPLE, return_tensors="pt", return_token_type_ids=True)
    diff = _check_and_save(source_model, model, {k: batch[k] for k in source.inputs}, output_dir, tokenizer)
    return {
        "architecture": architecture,
        "converted_to": type(model).__name__,
        "initialized": sorted({head for n in new for prefix, head in source.new_heads.items() if n.startswith(prefix)}),
        "initialized_parameters": new,
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


def _model_type(folder: Path) -> str | None:
    """``model_type`` of a source folder's ``config.json`` (``None`` for an unreadable file: :func:`_convert` then
    reports what is wrong)."""
    try:
        return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConvertArguments:
    """``python -m modeling.bert.convert``: the source, the target format and the output folder."""

    source: str = arg(help=f"{TITLES} directory or hub repo id (SesameBert with --to)")
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
        f"Convert a Hugging Face {TITLES} checkpoint and its tokenizer into a SesameBert directory, or a SesameBert "
        f"directory into {TITLES} (--to)."
    )
    (args,) = parse_arguments([ConvertArguments], argv, prog="python -m modeling.bert.convert", description=description)
    options = dataclasses.asdict(args)
    report = convert(overwrite=options.pop("overwrite_output_dir"), **options)
    if report["initialized"]:
        print(f"initialised (not in the source): {', '.join(report['initialized'])}", file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
