"""Starting ``pretrain`` as users do, in subprocesses (shared by the launch and preemption tests).

Importable from any test module: ``pyproject.toml`` puts ``tests/`` on ``sys.path`` (pytest ``pythonpath``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_2PROC = ROOT / "configs" / "cpu-2proc.yaml"


def subprocess_env() -> dict:
    """The test process's environment, offline, quiet and single-threaded (2 processes share 2 cores)."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="offline",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env


def pretrain_command(processes: int) -> list[str]:
    """``python -m pretrain`` for 1 process, ``accelerate launch --config_file configs/cpu-2proc.yaml pretrain``
    for 2."""
    if processes == 1:
        return [sys.executable, "-m", "pretrain"]
    assert processes == 2, "configs/cpu-2proc.yaml starts 2 processes"
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC), "pretrain"]
