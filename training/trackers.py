"""Experiment trackers (``--report_to``) through accelerate: TensorBoard and Weights & Biases.

* ``tensorboard``: event files under ``<output_dir>/runs/<project_name>/``.
* ``wandb``: runs under ``<output_dir>/wandb/``. With no credentials configured (no ``WANDB_API_KEY``, no
  ``api.wandb.ai`` entry in ``~/.netrc``) and no ``WANDB_MODE`` set, the run is **offline** (sync it later with
  ``wandb sync <output_dir>/wandb/offline-run-*``); wandb never prompts for a login.
* ``all``: both; ``none``: no tracker (the default).
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path

from core.errors import InputError

REPORT_TO_CHOICES = ("none", "tensorboard", "wandb", "all")


def log_with(report_to: str | None) -> list[str] | None:
    """accelerate's ``log_with`` for a ``--report_to`` value.

    Raises:
        InputError: ``report_to`` is not one of :data:`REPORT_TO_CHOICES`.
    """
    if report_to in (None, "", "none"):
        return None
    if report_to == "all":
        return ["tensorboard", "wandb"]
    names = [n.strip() for n in str(report_to).split(",") if n.strip()]
    for name in names:
        if name not in ("tensorboard", "wandb"):
            raise InputError(f"--report_to {report_to!r}: expected one of {', '.join(REPORT_TO_CHOICES)}")
    return names


def _wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def prepare_environment(report_to: str | None, output_dir: str | os.PathLike) -> None:
    """Set the environment so that wandb writes under ``output_dir`` and runs offline without credentials."""
    names = log_with(report_to) or []
    if "wandb" in names:
        os.environ.setdefault("WANDB_DIR", str(Path(output_dir).resolve()))
        os.environ.setdefault("WANDB_SILENT", "true")
        if "WANDB_MODE" not in os.environ and not _wandb_has_credentials():
            os.environ["WANDB_MODE"] = "offline"
        Path(output_dir).mkdir(parents=True, exist_ok=True)


def sanitize_config(config: dict) -> dict:
    """A copy of ``config`` with only int/float/str/bool values (TensorBoard's hparams accept nothing else)."""
    clean = {}
    for key, value in config.items():
        if isinstance(value, (bool, int, float, str)):
            clean[key] = value
        elif value is None:
            clean[key] = "None"
        else:
            clean[key] = str(value)
    return clean
