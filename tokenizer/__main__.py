"""Command line: ``python -m tokenizer train`` -- train a tokenizer on plain-text files and save it;
``python -m tokenizer vectors`` -- fastText word vectors for a word tokenizer (:mod:`tokenizer.vectors`).

    python -m tokenizer train --model_type bert --train_file corpus.txt.gz [more.txt ...] \\
        --vocab_size 16000 --output_dir out/tok [--no-lowercase] [--min_frequency 2]

``--model_type`` names the family whose trainer runs (:attr:`modeling.spec.ModelSpec.tokenizer_trainer`: WordPiece for
bert, the word + character tokenizer for elmo). Either way ``AutoTokenizer.from_pretrained(output_dir)``
loads the result. Refused input (missing / empty / non-UTF-8 file, too small ``--vocab_size``, an
``--output_dir`` that is a file) gives one ``error:`` line and exit status 2; nothing is written then.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence

from core.arguments import HelpFormatter, arg
from core.errors import add_debug_argument, run_cli
from modeling import SPECS
from tokenizer import train_tokenizer


@dataclasses.dataclass(frozen=True)
class TokenizerTrainingArguments:
    """``python -m tokenizer train``: the family, the corpus, the vocabulary size and the output folder; options left
    None keep the family's trainer's own defaults."""

    model_type: str = arg(help="the model family", choices=list(SPECS))
    train_file: list[str] = arg(help="UTF-8 .txt or .txt.gz files, read streaming", nargs="+", metavar="F")
    vocab_size: int = arg(help="vocabulary size, special tokens included")
    output_dir: str = arg(help="folder to save the tokenizer in (written atomically)")
    lowercase: bool | None = arg(
        None,
        "lowercase (and, for bert, strip accents); --no-lowercase keeps case "
        "(default: lowercase for bert, as uncased BERT; the ELMo trainer's default, cased, for elmo)",
        action=argparse.BooleanOptionalAction,
    )
    min_frequency: int | None = arg(
        None, "minimum corpus count of a word piece (bert, default 2) / of a word (elmo, the trainer's default)"
    )


@dataclasses.dataclass(frozen=True)
class WordVectorArguments:
    """``python -m tokenizer vectors``: gensim fastText settings (:func:`tokenizer.vectors.train_word_vectors`)."""

    train_file: list[str] = arg(help="UTF-8 .txt or .txt.gz files", nargs="+", metavar="F")
    tokenizer_name: str = arg(help="folder of the word tokenizer (tokenizer train --model_type elmo)")
    output_dir: str = arg(help="folder for the tokenizer + word_vectors.{safetensors,json}")
    vector_size: int = arg(100, "dimension (default %(default)s)")
    epochs: int = arg(5, "passes over the corpus (default %(default)s)")
    min_count: int = arg(5, "gensim vocabulary threshold (default %(default)s)")
    window: int = arg(5, "context window (default %(default)s)")
    min_n: int = arg(3, "shortest character n-gram (default %(default)s)")
    max_n: int = arg(6, "longest character n-gram (default %(default)s)")
    bucket: int = arg(100_000, "n-gram hash buckets (default %(default)s)")
    sg: bool = arg(False, "skip-gram (default: CBOW)")
    seed: int = arg(42, "seed; training uses one worker, so runs repeat (default %(default)s)")


#: The subcommands: name -> (arguments, --help line, description).
COMMANDS = {
    "train": (
        TokenizerTrainingArguments,
        "train a tokenizer and save it (save_pretrained) in --output_dir",
        "Train a WordPiece (bert) or word + character (elmo) tokenizer on .txt / .txt.gz files.",
    ),
    "vectors": (
        WordVectorArguments,
        "train fastText subword vectors (gensim) for the words of an ELMo-style word tokenizer",
        "Train fastText word vectors on .txt / .txt.gz files for the vocabulary of --tokenizer_name "
        "(tokenizer.vectors); the classic baselines are initialised from them (python -m finetune.baselines "
        "--embeddings).",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m tokenizer``: one ``HfArgumentParser`` subcommand per :data:`COMMANDS`
    entry, over its dataclass."""
    from transformers import HfArgumentParser

    parser = argparse.ArgumentParser(
        prog="python -m tokenizer", description="Train a tokenizer for sesame-lm models on plain-text files."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=HfArgumentParser)
    for name, (types, help, description) in COMMANDS.items():
        sub = commands.add_parser(
            name, dataclass_types=[types], help=help, description=description, formatter_class=HelpFormatter
        )
        add_debug_argument(sub)
    return parser


def parse(argv: Sequence[str] | None = None):
    """``(command, its arguments dataclass)`` from ``argv`` (None: ``sys.argv[1:]``).

    Raises:
        SystemExit: ``--help`` (status 0) or a usage error (status 2), as argparse.
    """
    namespace = build_parser().parse_args(argv)
    types = COMMANDS[namespace.command][0]
    return namespace.command, types(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(types)})


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, train, save and print a one-line summary; returns the exit status (0)."""
    command, args = parse(argv)
    if command == "vectors":
        return _vectors(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    # Options left out keep the trainer's own defaults.
    options = {k: v for k in ("lowercase", "min_frequency") if (v := getattr(args, k)) is not None}
    start = time.perf_counter()
    try:
        spec, tty = SPECS[args.model_type], sys.stderr.isatty()
        tok = train_tokenizer(spec, args.train_file, args.vocab_size, args.output_dir, show_progress=tty, **options)
    except KeyboardInterrupt:  # Ctrl-C / SIGINT: the output folder is written atomically, so nothing is half-written
        print(
            f"error: interrupted; --output_dir {args.output_dir} is only written once training completes, "
            "expected an uninterrupted run: re-run the command",
            file=sys.stderr,
        )
        return 130
    seconds = time.perf_counter() - start
    size = f"vocab_size {len(tok)}"
    if len(tok) != args.vocab_size:
        size += f" (of {args.vocab_size} asked: the corpus has no more at this --min_frequency)"
    print(
        f"trained {args.model_type} tokenizer: {size} on {len(args.train_file)} file(s) "
        f"({', '.join(args.train_file)}) -> {args.output_dir} in {seconds:.1f} s"
    )
    return 0


def _vectors(args) -> int:
    from tokenizer.vectors import train_word_vectors

    start = time.perf_counter()
    names = ("train_file", "tokenizer_name", "output_dir")
    options = {k: v for k, v in dataclasses.asdict(args).items() if k not in names}
    info = train_word_vectors(args.train_file, args.tokenizer_name, args.output_dir, **options)
    print(
        f"trained fastText vectors (d={info['vector_size']}) on {info['corpus_words']} words: "
        f"{info['tokenizer_words_in_gensim_vocab']} of {info['tokenizer_vocab_size']} tokenizer words in gensim's "
        f"vocabulary -> {args.output_dir} in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
