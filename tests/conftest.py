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
from _helpers import reset_accelerate_state, write_corpus
from _launch import ReferenceRuns, write_assets

#: Test modules whose tests share module- or session-scoped runs, servers or corpora: under pytest-xdist each of these
#: groups runs on one worker, in turn, so that what its tests share is made once (on two workers it would be made on
#: each, and a test would wait for a run its neighbour makes at the same time). Other tests go one by one to the
#: worker that is free. (xdist's own ``--dist loadgroup`` marks do not group with pytest 9.2: pytest-xdist#1386.)
WORKER_GROUPS = {
    "tests/finetune/test_explain.py": "explain",
    "tests/hub/test_cli_hub.py": "hub-cli",
    "tests/hub/test_every_save.py": "hub-every-save",
    "tests/pretrain/test_distributed.py": "distributed",
    "tests/squad/test_squad_predict.py": "squad-predict",
    # the users of ``reference_runs``
    "tests/pretrain/test_launch.py": "reference-runs",
    "tests/reliability/test_launcher.py": "reference-runs",
    "tests/reliability/test_preemption.py": "reference-runs",
}


def _group_of(nodeid: str) -> str:
    """The work unit of a test: its module's group in ``WORKER_GROUPS``, else the test alone."""
    return WORKER_GROUPS.get(nodeid.split("::", 1)[0], nodeid)


def pytest_xdist_make_scheduler(config, log):
    """``--dist load`` (the default of ``--numprocesses``) with the modules of ``WORKER_GROUPS`` kept together; the
    groups, having the most tests, are handed out first (xdist's loadscope order). Other ``--dist`` modes as given."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupedLoadScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(nodeid)

    return GroupedLoadScheduling(config, log)


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
    reset_accelerate_state()
    yield
    reset_accelerate_state()


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


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    """The reliability and launch tests' corpus, tokenizers, config and tiny model (:func:`_launch.write_assets`)."""
    return write_assets(tmp_path_factory.mktemp("reliability"))


@pytest.fixture(scope="session")
def reference_runs(assets, tmp_path_factory) -> ReferenceRuns:
    """The uninterrupted runs that the signal and launcher tests compare with (:class:`_launch.ReferenceRuns`)."""
    return ReferenceRuns(assets, tmp_path_factory.mktemp("reference-runs"))
