"""What the bench scripts set first: Hugging Face offline, tokenizers single-threaded (unless the caller's environment
says otherwise), and the project root on ``sys.path`` (they run as ``python bench/<script>.py``); and
:func:`write_report`, how they write their ``--output``. Imported before the
project and transformers, which the scripts import inside their functions."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_report(output: str | None, report: dict) -> dict:
    """Write ``report`` as indented JSON (one trailing newline) to the file ``output`` (a script's ``--output``),
    where one is given. Returns ``report``."""
    import json

    if output:
        Path(output).write_text(json.dumps(report, indent=2) + "\n")
    return report
