"""Errors for bad user input, and the CLI wrapper that reports them as one clear line.

Every command of sesame-lm (``python -m tokenizer``, ``pretrain``, ``finetune.glue``, ...) raises
:class:`InputError` for input it refuses -- a missing or malformed file, a wrong column, a value out of
range -- with a message that names the file, field or value and says what was expected. :func:`run_cli`
turns it into ``error: <message>`` on stderr and exit status 2, without a traceback unless ``--debug``
is given (or ``SESAME_DEBUG=1`` is set). Bugs (any other exception) keep their traceback.

This module imports nothing heavy: the tokenizer, pretraining and fine-tuning entry points all use it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

#: Exit status for refused input (as argparse uses for usage errors).
EXIT_INPUT_ERROR = 2


class InputError(ValueError):
    """Bad user input: a file, field or value that is not what was expected.

    The message must name the offending file / field / value and say what was expected, e.g.
    ``"--train_file corpus.txt: file is empty; expected UTF-8 text"``.
    """


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm became NaN or infinite (more often than ``skip_nonfinite_steps``); the update
    of that step was not applied and training stopped."""


class TrainingStopped(RuntimeError):
    """Training stopped on request (:meth:`training.loop.Trainer.request_stop`, e.g. from a SIGTERM handler) after
    writing a checkpoint; the message says how to resume."""

    def __init__(self, message: str, checkpoint: str):
        super().__init__(message)
        self.checkpoint = checkpoint


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, for one-line error reports (the type name when the message is
    empty; long library messages often carry a stack of context lines after it). A first line that ends with a
    colon (an introduction, e.g. huggingface_hub's strict-dataclass validation errors) is joined with the next one,
    the reason."""
    text = str(err).strip()
    if not text:
        return type(err).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines[0].endswith(":") and len(lines) > 1:  # "... for validator 'validate_architecture':" + the reason
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def check_local_path(name: str, arg: str, expected: str) -> None:
    """Refuse a path-like ``name`` (absolute, ``./``, ``../`` or ``~``) that does not exist, before a hub client
    misreads it as a malformed repo id.

    Raises:
        InputError: ``"<arg> <name>: no such folder; expected <expected>"``.
    """
    if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().exists():
        raise InputError(f"{arg} {name}: no such folder; expected {expected}")


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--debug`` (show full tracebacks for refused input) to ``parser``."""
    parser.add_argument("--debug", action="store_true", help="show the full traceback for refused input")


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)`` and turn an :class:`InputError` into one ``error:`` line and exit status 2.

    Args:
        main: the command's entry point; it parses ``argv`` (``None`` = ``sys.argv[1:]``) and returns an
            exit status or ``None`` (success).
        argv: the arguments, or ``None`` for ``sys.argv[1:]``.

    Returns:
        The exit status: ``main``'s, 0 for ``None``, :data:`EXIT_INPUT_ERROR` for refused input.

    Raises:
        InputError: only when debugging (``--debug`` in ``argv`` or ``SESAME_DEBUG=1``), to show the traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("SESAME_DEBUG", "") not in ("", "0")
    try:
        status = main(args)
    except InputError as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    return 0 if status is None else int(status)
