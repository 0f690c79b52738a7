"""Logging set-up of every command: INFO with timestamps on the main process, WARNING elsewhere."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

#: Loggers that repeat every step or file: warnings only.
NOISY_LOGGERS = ("datasets", "transformers", "accelerate.checkpointing", "accelerate.accelerator", "evaluate")


def setup_logging(is_main_process: bool = True) -> None:
    """INFO logging with timestamps on the main process, WARNING elsewhere; :data:`NOISY_LOGGERS` at WARNING; when
    stderr is not a terminal (output to a file), no ``datasets`` progress bars (the loop then logs plain progress
    lines, :meth:`training.loop.Trainer._log_progress`)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logging.getLogger().setLevel(logging.INFO if is_main_process else logging.WARNING)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)  # "Removed shared tensor" of tied weights
    if not _stderr_is_terminal():  # progress bars redraw with carriage returns: in a file they glue onto log lines
        with contextlib.suppress(ImportError):
            import datasets

            datasets.disable_progress_bars()
        with contextlib.suppress(ImportError):
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()  # "Loading weights", "Writing model shards"


def _stderr_is_terminal() -> bool:
    import sys

    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


class _HeldRecords(logging.Filter):
    """Holds back the records of a logger (returns False), keeping them to be shown on failure."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.held.append(record)
        return False


@contextlib.contextmanager
def without_load_report() -> Iterator[None]:
    """Hide transformers' LOAD REPORT table (missing / unexpected keys, logged as a warning by ``from_pretrained``)
    for the ``with`` block; :func:`load_report_line` says what matters of it in one line. If the block raises (e.g.
    mismatched shapes, whose details are in the report), the held-back report is logged before the error."""
    log = logging.getLogger("transformers.modeling_utils")
    held = _HeldRecords()
    log.addFilter(held)
    try:
        yield
    except BaseException:
        log.removeFilter(held)
        for record in held.held:
            log.handle(record)
        raise
    finally:
        log.removeFilter(held)


def _modules(keys) -> list[str]:
    """Parameter names reduced to their modules (``classifier.weight`` -> ``classifier``), sorted."""
    return sorted({str(k).rsplit(".", 1)[0] for k in keys})


def load_report_line(source: str, info: dict[str, Any]) -> str | None:
    """One plain line for ``from_pretrained(..., output_loading_info=True)``'s ``info`` (``missing_keys``,
    ``unexpected_keys``, ``mismatched_keys``): the modules newly initialised (a task head to train) and how many
    checkpoint weights were not used (e.g. the pretraining head). None when nothing was newly initialised."""
    missing = [k for k in info.get("missing_keys", ())]
    mismatched = [m[0] if isinstance(m, (tuple, list)) else m for m in info.get("mismatched_keys", ())]
    if not missing and not mismatched:
        return None
    line = f"{source}: newly initialised, to be trained: {', '.join(_modules([*missing, *mismatched]))}"
    unexpected = list(info.get("unexpected_keys", ()))
    if unexpected:
        line += f"; {len(unexpected)} weights of the checkpoint not used ({', '.join(_modules(unexpected)[:3])}"
        line += ", ...)" if len(_modules(unexpected)) > 3 else ")"
    return line


def from_pretrained_quietly(load: Callable[..., Any], logger: logging.Logger) -> Callable[..., Any]:
    """``load`` (a ``from_pretrained``) without transformers' LOAD REPORT table: its news, a newly initialised
    head, is logged on ``logger`` as one :func:`load_report_line`."""

    def quiet(source, *args, **kwargs):
        with without_load_report():
            model, info = load(source, *args, output_loading_info=True, **kwargs)
        line = load_report_line(str(source), info)
        if line:
            logger.info("%s", line)
        return model

    return quiet


__all__ = ["NOISY_LOGGERS", "from_pretrained_quietly", "load_report_line", "setup_logging", "without_load_report"]
