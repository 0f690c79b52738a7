"""Rebuild the corpus bundled in ``pretrain/corpus/`` from ``shared/data/corpus``.

The bundled corpus is public-domain English prose (see ``pretrain/corpus/README.md``):

* Jane Austen's six novels, one document per chapter, and Herman Melville's *Moby-Dick*
  (etymology, extracts, chapters, epilogue) -- the last 405 documents of ``gutenberg.txt.gz``,
  which follow its Shakespeare scenes;
* the U.S. State of the Union addresses from 1901 on (``sotu.txt.gz``, one address per document).

Validation: the documents of ``validation.txt.gz`` whose ``validation_docs.tsv`` row names the
``austen`` or ``sotu`` sources (SOTU only from 1901 on), so no validation document occurs in training.

Usage::

    python tools/build_default_corpus.py ../shared/data/corpus pretrain/corpus

Output is deterministic: documents in source order, gzip without name or timestamp (``mtime=0``).
"""

from __future__ import annotations

import csv
import gzip
import sys
from pathlib import Path

GUTENBERG_SHAKESPEARE_DOCS = 731  # gutenberg.txt.gz: 740 Shakespeare documents minus 9 moved to validation
FIRST_SOTU_YEAR = 1901
FIRST_MODERN_SOTU_DOC = 111  # 0-based index of the 1901 address in sotu.txt.gz
SOTU_1901_OPENING = "To the Senate and House of Representatives: The Congress assembles this year under the shadow"


def read_docs(path: Path) -> list[str]:
    """Return the blank-line separated documents of a gzipped corpus file, stripped."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [d.strip() for d in f.read().split("\n\n") if d.strip()]


def write_docs(path: Path, docs: list[str]) -> None:
    """Write documents separated by one blank line, gzip-compressed deterministically."""
    data = ("\n\n".join(docs) + "\n").encode("utf-8")
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as f:
        f.write(data)


def main(src: str, dst: str) -> None:
    src_dir, dst_dir = Path(src), Path(dst)
    dst_dir.mkdir(parents=True, exist_ok=True)
    gutenberg = read_docs(src_dir / "gutenberg.txt.gz")
    austen_moby = gutenberg[GUTENBERG_SHAKESPEARE_DOCS:]
    sotu = read_docs(src_dir / "sotu.txt.gz")
    validation = read_docs(src_dir / "validation.txt.gz")
    with open(src_dir / "validation_docs.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == len(validation), (len(rows), len(validation))
    # SOTU: the addresses are in year order and carry no year, so the 1901 one (Theodore Roosevelt's
    # first, after McKinley's assassination) is found by position and checked by its opening words.
    assert sotu[FIRST_MODERN_SOTU_DOC].startswith(SOTU_1901_OPENING), sotu[FIRST_MODERN_SOTU_DOC][:120]
    modern_sotu = sotu[FIRST_MODERN_SOTU_DOC:]
    val_docs = []
    for row, doc in zip(rows, validation):
        name = row["doc_id"].split("/")[0]
        if name == "austen":
            val_docs.append(doc)
        elif name == "sotu" and int(row["doc_id"].split("/")[1][:4]) >= FIRST_SOTU_YEAR:
            val_docs.append(doc)
    write_docs(dst_dir / "train.txt.gz", austen_moby + modern_sotu)
    write_docs(dst_dir / "validation.txt.gz", val_docs)
    print(
        f"train: {len(austen_moby)} Austen/Moby-Dick + {len(modern_sotu)} SOTU documents; validation: {len(val_docs)}"
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
