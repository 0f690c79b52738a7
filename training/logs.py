"""Logging set-up of every command: INFO with timestamps on the main process, WARNING elsewhere."""

from __future__ import annotations

import logging

#: Loggers that repeat every step or file: warnings only.
NOISY_LOGGERS = ("datasets", "transformers", "accelerate.checkpointing", "accelerate.accelerator", "evaluate")


def setup_logging(is_main_process: bool = True) -> None:
    """INFO logging with timestamps on the main process, WARNING elsewhere; :data:`NOISY_LOGGERS` at WARNING."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logging.getLogger().setLevel(logging.INFO if is_main_process else logging.WARNING)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)  # "Removed shared tensor" of tied weights


__all__ = ["NOISY_LOGGERS", "setup_logging"]
