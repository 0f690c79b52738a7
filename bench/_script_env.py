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


def _status_mb(field: str) -> float | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in MB; None where there is none (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def start_peak_rss() -> float:
    """Start measuring this process's peak resident set (CPU memory): resets the kernel's high-water mark (``echo 5 >
    /proc/self/clear_refs``, Linux >= 4.0) and returns the resident set now (MB), the ``before`` of
    :func:`peak_rss_mb`.

    Not ``getrusage().ru_maxrss``: Linux carries it across ``exec``, so a process started by a parent that had used
    more memory reports the parent's peak (a bench's per-variant process after the parent had run every variant
    reported about 940 MB where its own peak was about 435 MB)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_mb("VmRSS") or 0.0


def peak_rss_mb(before: float) -> float:
    """The peak resident set since :func:`start_peak_rss` minus its ``before`` (MB): what the work in between added.
    ``VmHWM`` where the high-water mark could be reset; else ``ru_maxrss`` (then an upper bound, see above)."""
    import resource

    peak = _status_mb("VmHWM")
    if peak is None:
        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, kB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale / 1024
    return peak - before
