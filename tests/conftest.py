"""Shared pytest set-up: offline, quiet and deterministic; tiny fixtures written by the tests."""

from __future__ import annotations

import os

# Must be set before transformers / datasets / huggingface_hub are imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine spinning threads of one
# process starve the others (a tiny-model step went from 0.81 s to 0.07 s with this).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# pytest-xdist runs the suite in several worker processes ([tool.pytest.ini_options] addopts): the workers share the
# cores, so each takes its share of them (training.threads keeps a user's OMP_NUM_THREADS, so runs started in-process
# or as subprocesses of a worker keep it too). Set before torch is imported, which reads it once.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    _cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cpus // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

from pathlib import Path

import pytest
from _helpers import write_corpus

TINY_TEXT = [
    "The Senate adjourned after a long debate on the budget.",
    "It rained in the afternoon, and the streets of the city were wet.",
    "Elizabeth walked to the house and spoke with her sister about the ball.",
    "The whale rose from the sea; the sailors shouted and lowered the boats.",
    "Congress shall make no law respecting an establishment of religion.",
    "A quick brown fox jumps over the lazy dog near the river bank.",
]


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """A small plain-text corpus: 30 documents of 6 sentences, ~2k words."""
    docs = [[TINY_TEXT[(i + j) % len(TINY_TEXT)] for j in range(6)] for i in range(30)]
    return write_corpus(tmp_path / "tiny.txt", docs)


@pytest.fixture
def tiny_corpus_gz(tmp_path: Path) -> Path:
    """The same kind of corpus, gzip-compressed."""
    docs = [[TINY_TEXT[(i * 5 + j) % len(TINY_TEXT)] for j in range(6)] for i in range(30)]
    return write_corpus(tmp_path / "tiny.txt.gz", docs)


@pytest.fixture
def fresh_state():
    """A fresh accelerate state before and after the test, for CLIs run in-process (``run_cli(main, ...)``)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture
def seeded_single_thread():
    """``torch.manual_seed(0)`` and one torch thread for the test (restored after it): numeric tests that compare
    against references stay deterministic and do not fight over the 2 cores."""
    import torch

    torch.manual_seed(0)
    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # a run in the test keeps it (training.threads: the user's choice wins)
    yield
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp
