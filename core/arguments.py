"""Typed command-line arguments: one frozen dataclass per concern, parsed once with transformers' ``HfArgumentParser``.

Every command of sesame-lm declares its flags as dataclass fields (the help text in the field's metadata, one
default each) and parses them with :func:`parse_arguments`; nothing writes to the parsed values afterwards.
Defaults that depend on the data or the model (a run plan, a learning rate by model family) are *resolved* by
pure functions into new frozen values (``dataclasses.replace``) before anything is built.

Usage::

    @dataclasses.dataclass(frozen=True)
    class DataArguments:
        _argument_group_name: ClassVar[str] = "data"
        train_file: list[str] | None = arg(None, "text files", nargs="+")

    data, training = parse_arguments([DataArguments, TrainingConfig], argv, prog="python -m x", description="...")

A command that needs other defaults for a shared dataclass (e.g. fine-tuning's learning rate) derives a subclass
with :func:`with_defaults`, which keeps every field's help text.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterable, Sequence
from typing import Any

#: Flags whose values are secrets: never written to a file, a log, a tracker or a child's command line.
SECRET_FLAGS = ("hub_token",)

#: Metadata keys of :func:`arg` that ``HfArgumentParser`` passes on to ``add_argument`` (``positional``: no ``--flag``).
_ARGPARSE_KEYS = ("help", "choices", "metavar", "nargs", "aliases", "action", "positional")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with one default per flag: argparse's ``(default: X)`` is appended once, and left out where the
    default is ``None`` or ``False`` (the help text then says what applies) or the help already names it.

    Flags are shown in their Hugging Face form only (``--output_dir``; ``HfArgumentParser`` also accepts
    ``--output-dir``), and a boolean flag without its optional value (``--do_train``; ``--do_train false`` also
    works). The ``--no_X`` flag of a field that defaults to True says what it stands for instead of repeating ``X``'s
    help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if _is_negation(action):  # HfArgumentParser's --no_X for a field X that defaults to True
            return f"the same as --{action.dest} false"
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return super()._get_help_string(action)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        first = action.option_strings[0]
        shown = ", ".join(
            [
                first,
                *(
                    s
                    for s in action.option_strings[1:]
                    if s.replace("-", "_").lstrip("_") != first.replace("-", "_").lstrip("_")
                ),
            ]
        )
        if action.nargs == 0 or _is_bool_flag(action):
            return shown
        return f"{shown} {self._format_args(action, self._get_default_metavar_for_optional(action))}"

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if _is_bool_flag(action):
            return ""
        return super()._format_args(action, default_metavar)


def _is_negation(action: argparse.Action) -> bool:
    """The ``--no_X`` flag ``HfArgumentParser`` adds for a boolean field ``X`` whose default is True (it stores False
    into ``X``, and would repeat ``X``'s help)."""
    return action.nargs == 0 and action.const is False and f"--no_{action.dest}" in action.option_strings


def _is_bool_flag(action: argparse.Action) -> bool:
    """A boolean field of ``HfArgumentParser``: an optional value, ``True`` when the flag is given alone."""
    return action.nargs == "?" and action.const is True


def arg(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    default_factory: Any = dataclasses.MISSING,
    **argparse_kwargs: Any,
) -> Any:
    """A dataclass field that is a command-line flag: ``default`` and the ``--help`` text (plus ``choices``,
    ``metavar``, ``nargs``, ``aliases``, ``action`` passed to ``add_argument``; ``action="extend"`` on a list field
    takes the values of repeated flags; ``positional=True``: an argument without a flag); a help of
    ``argparse.SUPPRESS`` hides it.

    Raises:
        TypeError: an ``argparse_kwargs`` key that is not one of :data:`_ARGPARSE_KEYS`.
    """
    unknown = set(argparse_kwargs) - set(_ARGPARSE_KEYS)
    if unknown:
        raise TypeError(f"arg(): unknown keys {sorted(unknown)}; expected some of {_ARGPARSE_KEYS}")
    metadata = {"help": help, **argparse_kwargs}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def with_defaults(
    cls: type, defaults: dict[str, Any] | None = None, *, help: dict[str, str] | None = None, name: str | None = None
) -> type:
    """A frozen dataclass subclass of ``cls`` whose fields in ``defaults`` have other defaults and whose fields in
    ``help`` other help texts (the other fields keep theirs).

    A field whose type does not admit ``None`` becomes ``Optional`` when its new default is ``None`` (e.g. a
    learning rate resolved later from the model family). ``cls`` may declare
    ``_resolved_later: ClassVar[frozenset[str]]``, the fields whose ``None`` means "resolved later" (its
    ``__post_init__`` then skips their checks); the new class adds every field given a ``None`` default here.

    Raises:
        TypeError: a name in ``defaults`` or ``help`` that is not a field of ``cls``.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults, help = defaults or {}, help or {}
    unknown = (set(defaults) | set(help)) - set(fields)
    if unknown:
        raise TypeError(f"with_defaults({cls.__name__}): not fields: {sorted(unknown)}")
    hints = _type_hints(cls)
    new_fields = []
    for key in [f for f in fields if f in defaults or f in help]:
        old = fields[key]
        kind = hints[key]
        metadata = {**old.metadata, "help": help[key]} if key in help else old.metadata
        if key in defaults:
            value = defaults[key]
            if value is None and not _admits_none(kind):
                kind = kind | None
            field = dataclasses.field(default=value, metadata=metadata)
        elif old.default_factory is not dataclasses.MISSING:
            field = dataclasses.field(default_factory=old.default_factory, metadata=metadata)
        else:
            field = dataclasses.field(default=old.default, metadata=metadata)
        new_fields.append((key, kind, field))
    later = frozenset(getattr(cls, "_resolved_later", frozenset())) | {k for k, v in defaults.items() if v is None}
    namespace = {"_resolved_later": later, "__module__": cls.__module__}
    derived = dataclasses.make_dataclass(
        name or cls.__name__, new_fields, bases=(cls,), frozen=True, namespace=namespace
    )
    derived.__doc__ = cls.__doc__
    return derived


def _type_hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


def _admits_none(kind: Any) -> bool:
    import types
    import typing

    return kind is Any or (typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in kind.__args__)


def parser_class() -> type:
    """transformers' ``HfArgumentParser``; a field of :func:`arg` with ``positional=True`` is a positional argument."""
    from transformers import HfArgumentParser

    class ArgumentParser(HfArgumentParser):
        @staticmethod
        def _parse_dataclass_field(parser, field: dataclasses.Field) -> None:
            if not field.metadata.get("positional"):
                return HfArgumentParser._parse_dataclass_field(parser, field)
            parser.add_argument(field.name, **{k: v for k, v in field.metadata.items() if k != "positional"})

    return ArgumentParser


def build_parser(types: Iterable[type], *, prog: str, description: str):
    """The command's parser: :func:`parser_class` over ``types`` (one argument group per dataclass that names
    ``_argument_group_name``) with :class:`HelpFormatter`, plus ``--debug`` (full tracebacks for refused input, read
    by :func:`core.errors.run_cli`)."""
    parser = parser_class()(list(types), prog=prog, description=description, formatter_class=HelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the full traceback for refused input")
    return parser


def parse_arguments(types: Sequence[type], argv: Sequence[str] | None, *, prog: str, description: str) -> tuple:
    """Parse ``argv`` into one instance of each dataclass in ``types`` (in that order).

    Unknown flags stop the command as argparse does (usage, ``error: unrecognized arguments``, exit status 2).
    The values of secret flags (:data:`SECRET_FLAGS`) are then removed from ``sys.argv`` (trackers such as wandb
    record it) and from error messages.

    Raises:
        SystemExit: ``--help`` (status 0) or a usage error (status 2).
        core.errors.InputError: a value refused by a dataclass's ``__post_init__``.
    """
    parser = build_parser(types, prog=prog, description=description)
    *parsed, remaining = parser.parse_args_into_dataclasses(
        args=list(argv) if argv is not None else None, return_remaining_strings=True, look_for_args_file=False
    )
    sys.argv[:] = split_secrets(sys.argv)[0]  # before any tracker starts: wandb records sys.argv
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(split_secrets(remaining)[0])}")
    return tuple(parsed[: len(types)])  # after them: the namespace of --debug (read by run_cli)


def split_secrets(argv: Sequence[str], secrets: Iterable[str] = SECRET_FLAGS) -> tuple[list[str], dict[str, str]]:
    """``argv`` without the secret flags (:data:`SECRET_FLAGS`: ``--hub_token X``, ``--hub_token=X``,
    ``--hub-token X``) and their values, and the values by flag name (e.g. to hand a child process its token
    through the environment instead of its command line)."""
    names = {f"--{n}" for n in secrets} | {f"--{n.replace('_', '-')}" for n in secrets}
    kept, found, i = [], {}, 0
    argv = list(argv)
    while i < len(argv):
        flag, _, value = argv[i].partition("=")
        if flag in names:
            if not value and i + 1 < len(argv):
                i, value = i + 1, argv[i + 1]
            found[flag.lstrip("-").replace("-", "_")] = value
        else:
            kept.append(argv[i])
        i += 1
    return kept, found


def as_flags(**flags: Any) -> list[str]:
    """``--name str(value)`` for each keyword, in order: a command line from values (``as_flags(seed=7)`` is
    ``["--seed", "7"]``); flags without a value are added by the caller."""
    return [item for name, value in flags.items() for item in (f"--{name}", str(value))]


def flat_values(*values: Any, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The fields of dataclass instances as one flat ``{name: value}`` dict (later instances win), without the
    names in ``exclude`` (e.g. secrets)."""
    out: dict[str, Any] = {}
    skip = set(exclude)
    for value in values:
        if value is None:
            continue
        out.update({f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.name not in skip})
    return out


def run_config(*arguments: Any) -> dict[str, Any]:
    """The settings of a run as one flat dict (from its argument dataclasses), as recorded with trackers, in model
    cards and run files; secrets (:data:`SECRET_FLAGS`) removed."""
    return flat_values(*arguments, exclude=SECRET_FLAGS)


__all__ = [
    "SECRET_FLAGS",
    "HelpFormatter",
    "arg",
    "as_flags",
    "build_parser",
    "flat_values",
    "parse_arguments",
    "run_config",
    "split_secrets",
    "with_defaults",
]
