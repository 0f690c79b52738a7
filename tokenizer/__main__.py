"""Command line: ``python -m tokenizer train`` -- train a tokenizer on plain-text files and save it;
``python -m tokenizer vectors`` -- fastText word vectors for a word tokenizer (:mod:`tokenizer.vectors`).

    python -m tokenizer train --model_type bert --train_file corpus.txt.gz [more.txt ...] \\
        --vocab_size 16000 --output_dir out/tok [--no-lowercase] [--min_frequency 2]

``--model_type`` names the family whose trainer runs (:attr:`modeling.spec.ModelSpec.train_tokenizer`: WordPiece for
bert, the word + character tokenizer for elmo). Either way ``AutoTokenizer.from_pretrained(output_dir)``
loads the result. Refused input (missing / empty / non-UTF-8 file, too small ``--vocab_size``, an
``--output_dir`` that is a file) gives one ``error:`` line and exit status 2; nothing is written then.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from modeling import SPECS
from tokenizer import train_tokenizer
from training.errors import add_debug_argument, run_cli


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m tokenizer``."""
    parser = argparse.ArgumentParser(
        prog="python -m tokenizer", description="Train a tokenizer for sesame-lm models on plain-text files."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser(
        "train",
        help="train a tokenizer and save it (save_pretrained) in --output_dir",
        description="Train a WordPiece (bert) or word + character (elmo) tokenizer on .txt / .txt.gz files.",
    )
    train.add_argument("--model_type", choices=list(SPECS), required=True, help="the model family")
    train.add_argument(
        "--train_file", nargs="+", required=True, metavar="F", help="UTF-8 .txt or .txt.gz files, read streaming"
    )
    train.add_argument("--vocab_size", type=int, required=True, help="vocabulary size, special tokens included")
    train.add_argument("--output_dir", required=True, help="folder to save the tokenizer in (written atomically)")
    train.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lowercase (and, for bert, strip accents); --no-lowercase keeps case "
        "(default: lowercase for bert, as uncased BERT; the ELMo trainer's default, cased, for elmo)",
    )
    train.add_argument(
        "--min_frequency",
        type=int,
        default=None,
        help="minimum corpus count of a word piece (bert, default 2) / of a word (elmo, the trainer's default)",
    )
    add_debug_argument(train)
    vectors = commands.add_parser(
        "vectors",
        help="train fastText subword vectors (gensim) for the words of an ELMo-style word tokenizer",
        description="Train fastText word vectors on .txt / .txt.gz files for the vocabulary of --tokenizer_name "
        "(tokenizer.vectors); the classic baselines are initialised from them (python -m finetune.baselines "
        "--embeddings).",
    )
    vectors.add_argument("--train_file", nargs="+", required=True, metavar="F", help="UTF-8 .txt or .txt.gz files")
    vectors.add_argument(
        "--tokenizer_name", required=True, help="folder of the word tokenizer (tokenizer train --model_type elmo)"
    )
    vectors.add_argument(
        "--output_dir", required=True, help="folder for the tokenizer + word_vectors.{safetensors,json}"
    )
    vectors.add_argument("--vector_size", type=int, default=100, help="dimension (default %(default)s)")
    vectors.add_argument("--epochs", type=int, default=5, help="passes over the corpus (default %(default)s)")
    vectors.add_argument("--min_count", type=int, default=5, help="gensim vocabulary threshold (default %(default)s)")
    vectors.add_argument("--window", type=int, default=5, help="context window (default %(default)s)")
    vectors.add_argument("--min_n", type=int, default=3, help="shortest character n-gram (default %(default)s)")
    vectors.add_argument("--max_n", type=int, default=6, help="longest character n-gram (default %(default)s)")
    vectors.add_argument("--bucket", type=int, default=100_000, help="n-gram hash buckets (default %(default)s)")
    vectors.add_argument("--sg", action="store_true", help="skip-gram (default: CBOW)")
    vectors.add_argument(
        "--seed", type=int, default=42, help="seed; training uses one worker, so runs repeat (default %(default)s)"
    )
    add_debug_argument(vectors)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, train, save and print a one-line summary; returns the exit status (0)."""
    args = build_parser().parse_args(argv)
    if args.command == "vectors":
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
    names = ("vector_size", "epochs", "min_count", "window", "min_n", "max_n", "bucket", "sg", "seed")
    options = {name: getattr(args, name) for name in names}
    info = train_word_vectors(args.train_file, args.tokenizer_name, args.output_dir, **options)
    print(
        f"trained fastText vectors (d={info['vector_size']}) on {info['corpus_words']} words: "
        f"{info['tokenizer_words_in_gensim_vocab']} of {info['tokenizer_vocab_size']} tokenizer words in gensim's "
        f"vocabulary -> {args.output_dir} in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
