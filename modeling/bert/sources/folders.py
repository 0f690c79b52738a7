"""A conversion's source and output folders (``python -m modeling.bert.convert``): where a source is
(:func:`resolve_source`: a folder or a hub snapshot), its tensors as its files hold them (:func:`read_weights`), its
tokenizer (:func:`load_tokenizer`), the two checks between a source and a written model (:func:`refuse_incomplete`
on transformers' loading report, :func:`check_copied` against the files) and the names of a written model folder
(:data:`MODEL_FOLDER_FILES`, :func:`drop_tokenizer_auto_map`).

Errors: :class:`core.errors.InputError` (one line naming the folder, file or tensors, and what was expected).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from core.errors import InputError, first_line

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


def load_tokenizer(source: str, where: str, vocab_size: int):
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


__all__ = [
    "BUFFERS",
    "MODEL_FOLDER_FILES",
    "check_copied",
    "drop_tokenizer_auto_map",
    "load_tokenizer",
    "read_weights",
    "refuse_incomplete",
    "resolve_source",
]
