"""Loading what a user names (a folder or a hub repo id) with one error line, and checking that the tokenizer and
the sequence length fit the model: :func:`load_pretrained`, :func:`check_model_fits`, :func:`check_sequence_length`.
Used by the commands and their builders (``pretrain.build``, ``finetune``), which need not import the run driver for
them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.errors import InputError, check_local_path, first_line


def load_pretrained(
    loader: Callable[..., Any],
    source: str,
    arg_name: str,
    expected: str,
    *,
    revision: str | None = None,
    failure: str = "could not be loaded",
    trust_remote_code: bool = False,
    **kwargs: Any,
) -> Any:
    """``loader(source, revision=revision, trust_remote_code=trust_remote_code, **kwargs)`` (a ``from_pretrained``)
    with the one error wrapper. ``trust_remote_code`` is always passed (default False): a folder or repo whose
    ``auto_map`` names code of its own is refused unless allowed, never a question on stdin.

    Args:
        loader: e.g. ``AutoTokenizer.from_pretrained`` or ``AutoModelForMaskedLM.from_pretrained``.
        source: a local folder or a hub repo id.
        arg_name: the flag it came from (``--model_name_or_path``), named in the message.
        expected: what the flag should name (``"a tokenizer folder (save_pretrained) or a hub repo id"``).
        failure: what went wrong, in the message (``"cannot load the weights"``).

    Raises:
        InputError: ``"<arg> <source> (--revision R): <failure> (<Error>: <first line>); expected <expected>"``;
            a path-like ``source`` that does not exist: ``"<arg> <source>: no such folder; expected ..."``; code of
            its own (``auto_map``) without ``trust_remote_code``: a line naming ``--trust_remote_code``. An
            :class:`InputError` raised by the loader passes unchanged.
    """
    check_local_path(source, arg_name, expected)
    try:
        return loader(source, revision=revision, trust_remote_code=trust_remote_code, **kwargs)
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001  (any failure of a user's model or repo is refused input)
        rev = f" (--revision {revision})" if revision else ""
        if not trust_remote_code and "trust_remote_code" in str(err):
            raise InputError(
                f"{arg_name} {source}{rev}: its auto_map names Python code of its own, which is not run "
                "without --trust_remote_code; expected a folder or repo without code, or "
                "--trust_remote_code if you trust that code"
            ) from err
        raise InputError(
            f"{arg_name} {source}{rev}: {failure} ({type(err).__name__}: {first_line(err)}); expected {expected}"
        ) from err


def check_model_fits(config, tokenizer, max_seq_length: int | None, tokenizer_arg: str = "--tokenizer_name") -> None:
    """Refuse a tokenizer with more tokens than the model's embeddings, character ids beyond the model's character
    vocabulary (a tokenizer with a ``char_vocab_size``, e.g. ELMo's, and a config ``char_vocab_size`` smaller than it),
    or blocks longer than its positions.

    Raises:
        InputError: one line naming the argument (or the config field), the sizes found and the size expected.
    """
    vocab_size = getattr(config, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise InputError(
            f"{tokenizer_arg}: {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}; "
            f"expected the tokenizer the model was trained with (at most {vocab_size} tokens)"
        )
    chars, needed = getattr(config, "char_vocab_size", None), getattr(tokenizer, "char_vocab_size", None)
    if isinstance(chars, int) and isinstance(needed, int) and chars < needed:
        raise InputError(
            f"the model config's char_vocab_size {chars}: {tokenizer_arg} writes character ids 0..{needed - 1}; "
            f"expected char_vocab_size >= {needed} (the ELMo default is {needed})"
        )
    check_sequence_length(config, max_seq_length)


def check_sequence_length(config, max_seq_length: int | None) -> None:
    """Refuse sequences longer than the model's positions (``max_position_embeddings``; a config without it, e.g.
    ELMo's, takes any length). Needs only the config: commands call it before training a tokenizer.

    Raises:
        InputError: ``"--max_seq_length N: exceeds the model's max_position_embeddings M; expected at most M"``.
    """
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_seq_length is not None and max_pos is not None and max_seq_length > max_pos:
        raise InputError(
            f"--max_seq_length {max_seq_length}: exceeds the model's max_position_embeddings {max_pos}; "
            f"expected at most {max_pos}"
        )


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set (``1`` / ``true`` / ``yes`` / ``on``)."""
    import os

    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


__all__ = ["check_model_fits", "check_sequence_length", "hub_offline", "load_pretrained"]
