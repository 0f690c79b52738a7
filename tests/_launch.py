"""Starting ``pretrain`` as users do: its argument lists for the test corpora, and subprocesses (shared by the
pretrain, launch and reliability tests).

Importable from any test module: ``pyproject.toml`` puts ``tests/`` on ``sys.path`` (pytest ``pythonpath``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_2PROC = ROOT / "configs" / "cpu-2proc.yaml"


def load_module(path: Path, name: str):
    """Import the file at ``path`` (a script or helper outside any package) as module ``name``, registered in
    ``sys.modules`` under that name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: Settings of every test subprocess: no dataset downloads, offline wandb, quiet tokenizers, one thread (2 processes
#: share 2 cores).
QUIET = {"HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def subprocess_env() -> dict:
    """The test process's environment, offline, quiet and single-threaded (2 processes share 2 cores)."""
    return {**os.environ, **QUIET, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def hub_env(
    url: str, home: Path, *, offline: bool = False, strip: tuple[str, ...] = ("HF_", "HUGGING"), **settings: str
) -> dict[str, str]:
    """The environment of a client process of the test hub at ``url``: this process's without the variables whose
    names start with ``strip``, ``HF_ENDPOINT=url``, ``HF_HOME=home``, Xet off, hub and transformers online (offline
    where ``offline``); then ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(strip)}
    flag = "1" if offline else "0"
    env.update(
        HF_ENDPOINT=url, HF_HOME=str(home), HF_HUB_DISABLE_XET="1", HF_HUB_OFFLINE=flag, TRANSFORMERS_OFFLINE=flag
    )
    env.update(settings)
    return env


def launch_two_processes(*target: str) -> list[str]:
    """``accelerate launch --config_file configs/cpu-2proc.yaml`` and then ``target``: more launcher options and the
    script (``"pretrain"``, or ``"-m", "finetune.squad"``)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC), *target]


def pretrain_command(processes: int) -> list[str]:
    """``python -m pretrain`` for 1 process, ``accelerate launch --config_file configs/cpu-2proc.yaml pretrain``
    for 2."""
    if processes == 1:
        return [sys.executable, "-m", "pretrain"]
    assert processes == 2, "configs/cpu-2proc.yaml starts 2 processes"
    return launch_two_processes("pretrain")


def run_pretrain(processes: int, args: list[str], timeout: float = 300) -> None:
    """Run :func:`pretrain_command` ``processes`` with ``args`` in the repository with :func:`subprocess_env`; fail
    the test with the end of its stderr unless it exits 0 within ``timeout`` seconds."""
    run_ok(pretrain_command(processes) + args, ROOT, subprocess_env(), timeout)


def run_pretrain_here(args: list[str]) -> None:
    """Run ``pretrain`` with ``args`` in this process (``run_cli``, as ``python -m pretrain`` calls it), in a fresh
    accelerate state (reset after it too); fail the test unless it exits 0. One process start fewer than
    ``run_pretrain(1, args)``, for a 1-process reference run whose process boundary is not under test."""
    from _helpers import reset_accelerate_state

    from core.errors import run_cli
    from pretrain.cli import main

    reset_accelerate_state()
    try:
        assert run_cli(main, args) == 0
    finally:
        reset_accelerate_state()


def start_pretrain(processes: int, args: list[str], text: bool = False):
    """Start :func:`pretrain_command` ``processes`` with ``args`` in the repository with :func:`subprocess_env`, in a
    session of its own (its process group can be signalled), stdout discarded, stderr piped (``str`` where ``text``,
    else ``bytes``). Returns the ``subprocess.Popen``."""
    import subprocess

    cmd, env = pretrain_command(processes) + args, subprocess_env()
    pipes = dict(stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=text)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, **pipes)


def asset_args(
    assets: Path, out: Path, *extra: str, train: Path | None = None, config: Path | str = "bert-tiny"
) -> list[str]:
    """``pretrain`` arguments of a ``config`` run (sequences of 32, batches of 4) on the reliability assets or a
    :func:`write_tiny_corpus` folder: ``train`` (default ``assets/train.txt``), ``valid.txt`` and the ``wordpiece/``
    tokenizer, into ``out``; then ``extra``."""
    return [
        "--train_file",
        str(train or assets / "train.txt"),
        "--validation_file",
        str(assets / "valid.txt"),
        "--tokenizer_name",
        str(assets / "wordpiece"),
        "--config_name",
        str(config),
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "4",
        "--output_dir",
        str(out),
        *extra,
    ]


def checkpoint_args(steps: int | None, every: int) -> list[str]:
    """Arguments of a run of ``steps`` optimizer steps (no ``--max_train_steps`` where ``None``) with a checkpoint
    every ``every`` steps, all kept, and a log line every step (for ``pretrain`` and ``finetune``)."""
    length = [] if steps is None else ["--max_train_steps", str(steps)]
    return [*length, *f"--checkpointing_steps {every} --checkpoints_total_limit 0 --logging_steps 1".split()]


def tiny_run_args(assets: Path, out: Path, *extra: str) -> list[str]:
    """``pretrain`` arguments of a 40-step bert-tiny run on the reliability assets (``train.txt``, ``valid.txt``,
    ``wordpiece/``), a checkpoint every 4 steps, all kept."""
    schedule = [*checkpoint_args(40, 4), "--learning_rate", "2e-3", "--num_warmup_steps", "2"]
    return asset_args(assets, out, *schedule, *extra)


def corpus_args(
    corpus_dir: Path,
    out: Path,
    *extra: str,
    tokenizer: Path | str | None = None,
    config: str | None = "bert-tiny",
    valid: str = "valid.txt.gz",
) -> list[str]:
    """``pretrain`` arguments of a run on the pretrain tests' corpus (``train.txt``, ``valid``) into ``out``, with
    ``--tokenizer_name tokenizer`` where given, ``--config_name config`` (none where ``None``), sequences of 32 and
    batches of 8; then ``extra``."""
    return [
        "--train_file",
        str(corpus_dir / "train.txt"),
        "--validation_file",
        str(corpus_dir / valid),
        *(["--tokenizer_name", str(tokenizer)] if tokenizer is not None else []),
        "--output_dir",
        str(out),
        *(["--config_name", config] if config is not None else []),
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "8",
        *extra,
    ]


def prepare_args(corpus_dir: Path, tokenizer: Path | str, out: Path, *extra: str) -> list[str]:
    """``pretrain.prepare`` arguments (also the data part of a ``pretrain`` command) for the pretrain tests' corpus
    (``train.txt``, ``valid.txt.gz``), tokenized by ``tokenizer`` into sequences of 32, written to ``out``; then
    ``extra``."""
    return [
        "--train_file",
        str(corpus_dir / "train.txt"),
        "--validation_file",
        str(corpus_dir / "valid.txt.gz"),
        "--tokenizer_name",
        str(tokenizer),
        "--max_seq_length",
        "32",
        "--output_dir",
        str(out),
        *extra,
    ]


#: The vocabulary of :func:`documents`.
WORDS = (
    "the senate adjourned after a long debate on budget whale rose from sea sailors shouted lowered boats "
    "it rained in afternoon and streets of city were wet"
).split()


def documents(n: int, seed: int = 0) -> list[str]:
    """``n`` random documents of 2-6 sentences of 5-25 :data:`WORDS`, one sentence a line."""
    import random

    rng = random.Random(seed)
    return [
        "\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 25))) + "." for _ in range(rng.randint(2, 6))
        )
        for _ in range(n)
    ]


def write_assets(root: Path) -> Path:
    """The reliability and launch tests' files in ``root``: ``train.txt`` / ``valid.txt`` (72 / 8 documents), a
    WordPiece tokenizer ``wordpiece/`` (vocabulary ~120) and a bigger one ``wordpiece-big/``, a bert-tiny config of
    that vocabulary and 64 positions ``bert-tiny-config/``, and a saved tiny classifier ``tiny-model/`` (weights and
    tokenizer)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    import modeling
    from tokenizer.wordpiece import train_wordpiece_tokenizer

    docs = documents(80)
    (root / "train.txt").write_text("\n\n".join(docs[:72]) + "\n", encoding="utf-8")
    (root / "valid.txt").write_text("\n\n".join(docs[72:]) + "\n", encoding="utf-8")
    tok = train_wordpiece_tokenizer([root / "train.txt"], 120, root / "wordpiece", min_frequency=1)
    config = modeling.get_preset_config("bert-tiny", vocab_size=len(tok), max_position_embeddings=64)
    config.save_pretrained(root / "bert-tiny-config")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(root / "tiny-model")
    tok.save_pretrained(root / "tiny-model")
    big = train_wordpiece_tokenizer([root / "train.txt"], 400, root / "wordpiece-big", min_frequency=1)
    assert len(big) > len(tok), "a tokenizer with more tokens than the tiny model's vocabulary"
    return root


def reference_args(assets: Path, out: Path, *extra: str) -> list[str]:
    """:func:`tiny_run_args` with whole-word masking: the run that the signal and launcher tests stop, kill and
    resume, and compare with :class:`ReferenceRuns`."""
    return tiny_run_args(assets, out, "--whole_word_mask", *extra)


class ReferenceRuns:
    """The uninterrupted :func:`reference_args` runs on ``assets``, with 1 process (``python -m pretrain``) and with
    2 (``accelerate launch --config_file configs/cpu-2proc.yaml``), each made on first use into ``root``.

    One set per test session (the ``reference_runs`` fixture); under pytest-xdist the modules that use it run on one
    worker (``WORKER_GROUPS`` in tests/conftest.py), so each run is made once."""

    def __init__(self, assets: Path, root: Path):
        self.assets, self.root, self.made = assets, root, set()

    def full(self, processes: int) -> Path:
        """The output folder of the run with ``processes`` processes (40 steps, a checkpoint every 4, all kept)."""
        out = self.root / f"full-{processes}"
        if processes not in self.made:
            run_pretrain(processes, reference_args(self.assets, out))
            self.made.add(processes)
        return out


def write_tiny_corpus(root: Path) -> Path:
    """80 random documents over a 17-word vocabulary: ``root/train.txt`` (72) and ``root/valid.txt`` (8), a 120-piece
    WordPiece tokenizer in ``root/wordpiece`` and a dropout-free bert-tiny config in ``root/bert-nodrop``."""
    import random

    import modeling
    from tokenizer.wordpiece import train_wordpiece_tokenizer

    rng = random.Random(0)
    words = (
        "the senate adjourned after a long debate on budget whale rose from sea sailors shouted lowered boats".split()
    )
    docs = [
        "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) for _ in range(rng.randint(2, 6)))
        for _ in range(80)
    ]
    (root / "train.txt").write_text("\n\n".join(docs[:72]) + "\n")
    (root / "valid.txt").write_text("\n\n".join(docs[72:]) + "\n")
    train_wordpiece_tokenizer([root / "train.txt"], 120, root / "wordpiece", min_frequency=1)
    modeling.get_preset_config("bert-tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).save_pretrained(
        root / "bert-nodrop"
    )
    return root


#: The opening of a remote-code script: the project's packages cannot be imported after it (``json`` and ``sys``
#: imported).
BLOCK_PROJECT_IMPORTS = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("modeling", "tokenizer", "training", "finetune", "pretrain"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
"""


def run_ok(cmd: list[str], cwd: Path, env: dict, timeout: float = 300):
    """Run ``cmd`` in ``cwd`` with ``env`` (text output captured); fail the test with the last 3000 characters of its
    stderr unless it exits 0 within ``timeout`` seconds. Returns the ``subprocess.CompletedProcess``."""
    import subprocess

    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_remote_code_script(script: str, tmp_path: Path, *args: str) -> dict:
    """Run ``script`` (which blocks the project's packages and loads with ``trust_remote_code``) in a fresh
    interpreter, with its own module cache, offline; return the JSON its last stdout line prints."""
    import json

    env = {
        **os.environ,
        "HF_MODULES_CACHE": str(tmp_path / "hf_modules"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = run_ok([sys.executable, "-c", script, *args], tmp_path, env, timeout=120)
    return json.loads(proc.stdout.strip().splitlines()[-1])
