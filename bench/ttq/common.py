"""What the bench commands share: the model shapes, the bench's error, child processes (:class:`Job`,
:func:`run_jobs`), cached build folders, argv flag values, file digests and the log line."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The command (``bench/bench_time_to_quality.py``): the reference child process runs it with ``_reference``.
SCRIPT = Path(__file__).resolve().parents[1] / "bench_time_to_quality.py"


#: Model shapes (Turc et al. 2019; intermediate size 4H), the same as the ``--config_name`` presets of ``pretrain``.
SHAPES: dict[str, dict[str, int]] = {
    "bert-tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),
    "bert-mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "bert-small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
}


#: ModernBERT's layout (Warner et al. 2024; transformers' ``ModernBertConfig`` defaults: GeGLU, RoPE 160k / 10k, no
#: biases, a global layer every third) at the sizes of ``pretrain``'s modern presets, keyed by the ``--model_shape``
#: whose width they share (:data:`MODERN_PRESET_OF`): the transformers ModernBERT reference (``--reference_model
#: modernbert``) at the size of the ``sesame-modern`` recipe (modernbert-tiny at bert-tiny).
MODERN_SHAPES: dict[str, dict[str, int]] = {
    "bert-tiny": dict(
        num_hidden_layers=3, hidden_size=128, num_attention_heads=2, intermediate_size=192, local_attention=64
    ),
    "bert-mini": dict(
        num_hidden_layers=6, hidden_size=256, num_attention_heads=4, intermediate_size=384, local_attention=64
    ),
    "bert-base": dict(
        num_hidden_layers=22, hidden_size=768, num_attention_heads=12, intermediate_size=1152, local_attention=128
    ),
}
#: ``--model_shape`` -> the modern preset of :data:`MODERN_SHAPES`' sizes.
MODERN_PRESET_OF = {"bert-tiny": "modernbert-tiny", "bert-mini": "modernbert-mini", "bert-base": "modernbert-base"}
#: The reference models (``--reference_model``): transformers' BERT (``BertForMaskedLM``, the default) or ModernBERT
#: (``ModernBertForMaskedLM``), each trained the ``run_mlm`` way.
REFERENCE_MODELS = ("bert", "modernbert")


#: Optimizer steps of ``pretrain --time_budget``'s in-process probe (``pretrain.run_plan.BUDGET_PROBE_STEPS``; tested).
PRETRAIN_PROBE_STEPS = 10


class BenchError(RuntimeError):
    """A step of the bench failed (a child process, a missing file); the message names it and its log."""


def flag_value(flags: list[str], name: str, default: str | None = None) -> str | None:
    """The value of ``name`` in an argv-style list (``--name v`` or ``--name=v``; the last one wins), or ``default``."""
    value = default
    for i, item in enumerate(flags):
        if item == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif item.startswith(name + "="):
            value = item.split("=", 1)[1]
    return value


@dataclass
class Job:
    """One child process: ``cmd`` run with ``env`` added, stdout+stderr into ``log``."""

    name: str
    cmd: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    returncode: int | None = None
    wall_s: float = 0.0


def child_env(threads: int) -> dict[str, str]:
    """Environment of a child: ``threads`` OpenMP/MKL threads, passive OpenMP waiting (idle threads sleep instead of
    spinning, which on a shared 2-core machine starves the other process), offline hubs."""
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
    }


def run_jobs(jobs: list[Job], parallel: int, check: bool = True, on_poll=None, on_done=None) -> list[Job]:
    """Run ``jobs`` at most ``parallel`` at a time, in order; fill ``returncode`` and ``wall_s``. ``on_poll()``, if
    given, is called every 0.2 s while they run; ``on_done(job)``, if given, as soon as a job has ended with exit
    status 0 (while the others go on).

    Raises:
        BenchError: with ``check``, the first failed job (its log's last lines in the message).
    """
    pending, running = list(jobs), []
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                job.log.parent.mkdir(parents=True, exist_ok=True)
                handle = open(job.log, "w", encoding="utf-8")
                handle.write("$ " + shlex.join(job.cmd) + "\n")
                handle.flush()
                proc = subprocess.Popen(job.cmd, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **job.env})
                running.append((job, proc, handle, time.perf_counter()))
            time.sleep(0.2)
            if on_poll is not None:
                on_poll()
            for item in list(running):
                job, proc, handle, start = item
                if proc.poll() is not None:
                    handle.close()
                    job.returncode, job.wall_s = proc.returncode, time.perf_counter() - start
                    running.remove(item)
                    if check and job.returncode != 0:
                        tail = "\n".join(job.log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
                        raise BenchError(f"{job.name} failed (exit {job.returncode}); log {job.log}:\n{tail}")
                    if on_done is not None and job.returncode == 0:
                        on_done(job)
    finally:  # a failure, Ctrl-C or SIGTERM: stop our own children, the ones still running
        for _, proc, handle, _ in running:
            proc.terminate()
            proc.wait()
            handle.close()
    return jobs


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached(folder: Path, stamp: dict, build) -> Path:
    """``folder`` as built by ``build(folder)``, reused when its stamp file (``.<name>.stamp.json`` beside it)
    equals ``stamp`` (a JSON-able record of what it was built from)."""
    marker = folder.parent / f".{folder.name}.stamp.json"
    stamp = json.loads(json.dumps(stamp))  # tuples as lists, as read back
    if folder.is_dir() and marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == stamp:
        log(f"reusing {folder}")
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    build(folder)
    marker.write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
    return folder


def median_or_none(values):
    """The median of the values that are not None (None when there are none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
