"""Streaming reading of plain-text corpora (``.txt`` / ``.txt.gz``).

Shared by the tokenizer trainers (WordPiece for BERT-like models, word + character vocabularies for
ELMo-style models) and by ``pretrain``. A corpus is one or more UTF-8 text files, plain or gzip-compressed,
one paragraph (or sentence) per line, documents separated by blank lines. Files are read line by line
through a fixed-size buffer, so a corpus larger than memory can be used; only one line is held at a time.

Every refusal raises :class:`core.errors.InputError` with a message that names the argument, the file
and what was expected.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Union

from core.errors import InputError

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

#: Read buffer for the files (bytes); lines are split from it, never the whole file.
READ_BUFFER_BYTES = 1 << 20
#: Longest piece of a line handed on at once (bytes): a longer line is split at whitespace (a warning names it).
#: The tokenizers library needs ~150 times a line's size in memory to train on it (a 50 MB line: 7.3 GB).
MAX_LINE_BYTES = 1 << 20
#: A batch of :func:`iter_text_batches` ends before it holds more text than this (bytes).
MAX_BATCH_BYTES = 64 << 20

_GZIP_MAGIC = b"\x1f\x8b"
_UNSUPPORTED_SUFFIXES = {".bz2", ".xz", ".lzma", ".zst", ".zip", ".7z", ".tar"}
_WHITESPACE_BYTES = b" \t\r\n\x0b\x0c"


def _as_list(files: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(files, (str, os.PathLike)):
        return [Path(files)]
    return [Path(f) for f in files]


def _is_gz(path: Path) -> bool:
    return path.suffix.lower() == ".gz"


def _open_binary(path: Path) -> io.BufferedIOBase:
    """Open ``path`` for reading bytes, transparently decompressing ``.gz``."""
    if _is_gz(path):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb", buffering=READ_BUFFER_BYTES)


def check_text_files(files: PathLike | Iterable[PathLike], arg_name: str = "--train_file") -> list[Path]:
    """Check that every corpus file exists and holds text; return their resolved paths.

    Only the start of each file is read (up to its first non-whitespace byte); decoding errors further in
    are reported by :func:`iter_text_lines` when reached.

    Args:
        files: one path or several paths (``str`` / ``os.PathLike``); ``.gz`` files are gzip-compressed.
        arg_name: the command-line argument the files came from, used in error messages.

    Returns:
        The resolved paths, in the given order.

    Raises:
        InputError: no file given; a file is missing, is a directory or not a regular file (a FIFO, a device),
            is empty (0 bytes, or only whitespace, also after decompression), uses an unsupported compression
            (``.bz2``, ``.xz``, ``.zst``, ...), is named ``.gz`` but is not gzip, or is gzip but not named ``.gz``.
    """
    paths = _as_list(files)
    if not paths:
        raise InputError(f"{arg_name}: no file given; expected one or more .txt or .txt.gz files")
    resolved = []
    for path in paths:
        where = f"{arg_name} {path}"
        if not path.exists():
            raise InputError(f"{where}: no such file; expected a .txt or .txt.gz file")
        if path.is_dir():
            raise InputError(f"{where}: is a directory; expected a .txt or .txt.gz file")
        if not path.is_file():  # a FIFO (<(zcat ...)) is read once but the corpus is read twice; /dev/zero never ends
            raise InputError(
                f"{where}: not a regular file (a pipe, a device, a socket); expected a .txt or .txt.gz file on "
                "disk (decompress a stream into a file first, or give the .gz itself)"
            )
        if path.suffix.lower() in _UNSUPPORTED_SUFFIXES:
            raise InputError(f"{where}: unsupported compression {path.suffix!r}; expected .txt or .txt.gz")
        try:
            with open(path, "rb") as raw:
                head = raw.read(2)
        except OSError as err:
            raise InputError(f"{where}: cannot be read ({err.strerror}); expected a readable text file") from err
        if not head:
            raise InputError(f"{where}: file is empty (0 bytes); expected UTF-8 text")
        if _is_gz(path) and head != _GZIP_MAGIC:
            raise InputError(f"{where}: not a gzip file (named .gz); expected gzip-compressed UTF-8 text")
        if not _is_gz(path) and head == _GZIP_MAGIC:
            raise InputError(f"{where}: looks gzip-compressed but is not named .gz; rename it to {path.name}.gz")
        if not _has_text(path, where):
            what = "decompresses to nothing but whitespace" if _is_gz(path) else "holds only whitespace"
            raise InputError(f"{where}: file is empty ({what}); expected UTF-8 text")
        resolved.append(path.resolve())
    return resolved


def _has_text(path: Path, where: str) -> bool:
    """Whether ``path`` (decompressed) has a non-whitespace byte; reads chunk by chunk until it finds one."""
    try:
        with _open_binary(path) as f:
            while chunk := f.read(1 << 16):
                if chunk.strip(_WHITESPACE_BYTES):
                    return True
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise InputError(f"{where}: corrupt gzip data ({err}); expected gzip-compressed UTF-8 text") from err
    return False


def _bounded_lines(f, where: str, limit: int | None = None) -> Iterator[tuple[bytes, bool]]:
    """``(piece, continued)`` for the lines of the binary stream ``f``: whole lines, except that a line longer than
    ``limit`` bytes (default :data:`MAX_LINE_BYTES`) comes in pieces of at most ``limit`` bytes cut after the last
    whitespace byte (else before a UTF-8 character starts); ``continued`` is True for the pieces after the first."""
    limit = limit or MAX_LINE_BYTES
    carry, continued, warned = b"", False, False
    while True:
        raw = carry + f.readline(limit - len(carry) + 1)
        carry = b""
        if not raw:
            return
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield raw, continued
            continued = False
            continue
        cut = max(raw.rfind(b" ", 0, limit), raw.rfind(b"\t", 0, limit)) + 1
        if cut <= 0:  # no whitespace: cut before a UTF-8 continuation byte, never inside a character
            cut = limit
            while cut > 1 and raw[cut] & 0xC0 == 0x80:
                cut -= 1
        if not warned:
            warned = True
            logger.warning(
                "%s: a line longer than %d bytes is read in pieces of at most %d bytes, cut at whitespace",
                where,
                limit,
                limit,
            )
        yield raw[:cut], continued
        carry, continued = raw[cut:], True


def iter_text_lines(files: PathLike | Iterable[PathLike], arg_name: str = "--train_file") -> Iterator[str]:
    """Yield the stripped, non-empty lines of the corpus files, one at a time, in file order.

    Streaming: the files are read through a fixed-size buffer, never whole, and a line longer than
    :data:`MAX_LINE_BYTES` is handed on in pieces of at most that size, cut at whitespace (a word longer than that
    is cut; a warning names the file and line), so memory is bounded whatever the file. Text must be
    strict UTF-8 (a leading byte-order mark is dropped). Call :func:`check_text_files` first for clear
    errors about missing or empty files.

    Args:
        files: one path or several paths; ``.gz`` files are decompressed on the fly.
        arg_name: the command-line argument the files came from, used in error messages.

    Yields:
        ``str`` lines with surrounding whitespace (and the newline) removed; blank lines are skipped.

    Raises:
        InputError: a file cannot be opened; a byte is not valid UTF-8 (the message gives the file, the
            1-based line number and the 0-based byte offset -- of the decompressed stream for ``.gz``);
            corrupt or truncated gzip data.
    """
    for path in _as_list(files):
        where = f"{arg_name} {path}"
        try:
            f = _open_binary(path)
        except OSError as err:
            raise InputError(f"{where}: cannot be read ({err.strerror}); expected a .txt or .txt.gz file") from err
        with f:
            offset = 0
            lineno = 0
            try:
                for raw, continued in _bounded_lines(f, where):
                    lineno += 0 if continued else 1
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as err:
                        bad = raw[err.start]
                        stream = " of the decompressed text" if _is_gz(path) else ""
                        raise InputError(
                            f"{where}: line {lineno}, byte offset {offset + err.start}{stream}: "
                            f"invalid byte 0x{bad:02x} ({err.reason}); expected UTF-8 text"
                        ) from None
                    if lineno == 1 and not continued and line.startswith("\ufeff"):
                        line = line[1:]
                    offset += len(raw)
                    line = line.strip()
                    if line:
                        yield line
            except (gzip.BadGzipFile, EOFError, zlib.error) as err:
                raise InputError(
                    f"{where}: corrupt gzip data after line {lineno} ({err}); expected gzip-compressed UTF-8 text"
                ) from err


def iter_text_batches(
    files: PathLike | Iterable[PathLike], batch_size: int = 1000, arg_name: str = "--train_file"
) -> Iterator[list[str]]:
    """Yield the lines of :func:`iter_text_lines` in lists of at most ``batch_size`` lines and about
    :data:`MAX_BATCH_BYTES` characters (for ``tokenizers.Tokenizer.train_from_iterator``); the last list may be
    shorter, none is empty.

    Raises:
        InputError: as :func:`iter_text_lines`.
        ValueError: ``batch_size < 1`` (a programming error).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batch: list[str] = []
    size = 0
    for line in iter_text_lines(files, arg_name=arg_name):
        batch.append(line)
        size += len(line)
        if len(batch) == batch_size or size >= MAX_BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
