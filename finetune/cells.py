"""The cell runner of the result tables (``finetune.suite``, ``finetune.baselines``): one fine-tuning run per cell.

A cell is one command line (``python -m finetune.glue ...`` or ``python -m finetune.ner ...``) run in a child
process, exactly as a user would run it, its output (stdout and stderr) written to ``<run_dir>.log`` as it comes, a
progress line logged every :data:`PROGRESS_EVERY_S` seconds. :func:`run_cells` runs several cells at once
(``--parallel N``): each child gets one GPU (``CUDA_VISIBLE_DEVICES``) when there are GPUs, else an equal share of
the CPU cores (``OMP_NUM_THREADS``, which :mod:`training.threads` takes as the user's choice).

A finished cell is recorded in ``<run_dir>.cell.json`` (its command and exit status) once its ``all_results.json``
exists; :func:`is_finished` tells a rerun of the same table to skip it (the run folder is written atomically by the
command, so ``all_results.json`` is there only when the run completed).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("finetune.cells")

#: Seconds between two progress lines while a cell trains (:func:`run_command`).
PROGRESS_EVERY_S = 60.0


@dataclass(frozen=True)
class Cell:
    """One run of a table.

    Attributes:
        name: how the cell is named in logs (``"sst2 / minilm / seed 1"``).
        command: the full command line (``[sys.executable, "-m", "finetune.glue", ...]``).
        run_dir: the run's ``--output_dir``.
        after: names of the cells whose runs this one starts from (``--warm_start``): run first.
    """

    name: str
    command: list[str]
    run_dir: Path
    after: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CellResult:
    """What a cell's run gave: its exit status, ``all_results.json`` (empty on failure), wall time, the last stderr
    line (the error of a failed run), and whether it was skipped as finished before."""

    cell: Cell
    returncode: int
    results: dict
    wall_s: float
    last_line: str = ""
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.results)


def split_command_line(argv: Sequence[str] | None) -> tuple[list[str], list[str], dict[str, str]]:
    """A table command's own arguments, the arguments after ``--`` for every cell, and the cells' environment.

    A ``--hub_token`` among the cells' arguments goes to them through the environment (``HF_TOKEN``), never on a
    command line, in a results file or in the log.

    Returns:
        ``(own arguments, cell arguments without secrets, environment)`` (``argv`` None: ``sys.argv[1:]``).
    """
    import sys

    from core.arguments import split_secrets

    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    extra, secrets = split_secrets(rest)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if secrets.get("hub_token"):
        env["HF_TOKEN"] = secrets["hub_token"]
    return own, extra, env


def _marker(run_dir: Path) -> Path:
    return run_dir.with_name(run_dir.name + ".cell.json")


def is_finished(cell: Cell) -> bool:
    """Whether ``cell`` ran to the end before with the same command (its marker and ``all_results.json`` exist)."""
    marker = _marker(cell.run_dir)
    if not marker.is_file() or not (cell.run_dir / "all_results.json").is_file():
        return False
    saved = json.loads(marker.read_text(encoding="utf-8"))
    return saved.get("command") == list(cell.command[1:]) and saved.get("returncode") == 0


def run_command(cmd: Sequence[str], env: Mapping[str, str] | None, log: Path, name: str) -> tuple[int, str]:
    """Run ``cmd``, its stdout and stderr written to ``log`` as they come, and log a progress line every
    :data:`PROGRESS_EVERY_S` seconds while it runs (the cell, the minutes so far, the child's last stderr line).

    ``env``: the child's environment (None: this process's).

    Returns:
        ``(exit status, the child's last non-empty stderr line or "")``.
    """
    last = [""]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.PIPE, text=True, env=None if env is None else dict(env)
        )
        lock = threading.Lock()

        def pump() -> None:
            for line in proc.stderr:
                with lock:
                    out.write(line)
                    out.flush()
                if line.strip():
                    last[0] = line.strip()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        start = time.perf_counter()
        while True:
            try:
                proc.wait(timeout=PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                minutes = (time.perf_counter() - start) / 60
                logger.info("%s: training, %.1f min so far; last line: %s", name, minutes, last[0] or "(none yet)")
        reader.join()
    return proc.returncode, last[0]


def run_cell(cell: Cell, env: Mapping[str, str]) -> CellResult:
    """Run one cell (its log ``<run_dir>.log``); on success write its marker (:func:`is_finished`)."""
    logger.info("%s: %s", cell.name, " ".join(cell.command))
    start = time.perf_counter()
    returncode, last = run_command(
        cell.command, {**env, **cell.env}, cell.run_dir.with_name(cell.run_dir.name + ".log"), cell.name
    )
    wall = time.perf_counter() - start
    path = cell.run_dir / "all_results.json"
    results = json.loads(path.read_text(encoding="utf-8")) if returncode == 0 and path.is_file() else {}
    if returncode == 0 and results:
        marker = {"command": list(cell.command[1:]), "returncode": 0, "wall_s": round(wall, 1)}
        _marker(cell.run_dir).write_text(json.dumps(marker) + "\n", encoding="utf-8")
    else:
        logger.warning("%s failed: %s", cell.name, last or f"exit status {returncode}")
    return CellResult(cell, returncode, results, wall, last)


def worker_envs(parallel: int, env: Mapping[str, str], gpus: int | None = None, cpus: int | None = None) -> list[dict]:
    """The environment of each of ``parallel`` workers: one GPU each (round robin over ``gpus``, default: the CUDA
    devices torch sees) or, without GPUs, ``OMP_NUM_THREADS`` = the usable CPUs (``cpus``, default
    :func:`training.threads.usable_cpus`) divided by ``parallel`` (at least 1)."""
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    envs = []
    for i in range(parallel):
        extra = {"CUDA_VISIBLE_DEVICES": str(i % gpus)} if gpus else {"OMP_NUM_THREADS": str(max(1, cpus // parallel))}
        envs.append({**env, **extra})
    return envs


def run_cells(
    cells: Sequence[Cell],
    parallel: int,
    env: Mapping[str, str],
    on_result: Callable[[CellResult], None] | None = None,
    worker_env: Sequence[Mapping[str, str]] | None = None,
) -> list[CellResult]:
    """Run ``cells`` ``parallel`` at a time; finished ones (:func:`is_finished`) are skipped, a cell waits for the cells
    it starts from (``after``; one that failed fails it too). ``on_result`` is called (under a lock, in the calling
    thread's order of completion) with each result, skipped ones included.

    Returns:
        The results in ``cells``' order.
    """
    envs = list(worker_env or worker_envs(parallel, env))
    free = list(range(parallel))
    lock = threading.Lock()
    done: dict[str, threading.Event] = {c.name: threading.Event() for c in cells}
    results: dict[str, CellResult] = {}

    def one(cell: Cell) -> CellResult:
        for name in cell.after:
            if name in done:
                done[name].wait()
        failed = [n for n in cell.after if n in results and not results[n].ok]
        if is_finished(cell):
            res = CellResult(
                cell, 0, json.loads((cell.run_dir / "all_results.json").read_text("utf-8")), 0.0, skipped=True
            )
            logger.info("%s: finished before with the same command: skipped", cell.name)
        elif failed:
            res = CellResult(cell, 1, {}, 0.0, f"not run: {', '.join(failed)} failed")
        else:
            with lock:
                slot = free.pop()
            try:
                res = run_cell(cell, envs[slot])
            finally:
                with lock:
                    free.append(slot)
        with lock:
            results[cell.name] = res
            if on_result is not None:
                on_result(res)
        done[cell.name].set()
        return res

    # cells that others start from go first, so that a worker never waits on a cell not yet started
    order = sorted(cells, key=lambda c: bool(c.after))
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        list(pool.map(one, order))
    return [results[c.name] for c in cells]


def grouped_bars(path: Path, groups: Sequence[str], series: Mapping[str, Sequence], ylabel: str, title: str = ""):
    """A grouped bar chart of scores x 100 as a PNG (120 dpi): one group per label of ``groups``, in it one bar per
    ``series`` name at the group's ``(value, seed_values)`` (``None``: no bar), labelled with the value, each seed's
    value a dot on its bar when there are several; the legend below. matplotlib's Agg canvas (no pyplot: the
    process's backend stays as it is). Returns the matplotlib ``Figure``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.0, 0.6 * len(groups) * max(1, len(series))), 4.4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / max(1, len(series))
    for j, (name, cells) in enumerate(series.items()):
        points = [(i + (j - (len(series) - 1) / 2) * width, c) for i, c in enumerate(cells) if c and c[0] is not None]
        bars = ax.bar([x for x, _ in points], [100 * value for _, (value, _) in points], width, label=name)
        ax.bar_label(bars, fmt="%.1f", fontsize=6, padding=1)
        for x, (_, seeds) in points:
            if len(seeds) > 1:
                ax.plot([x] * len(seeds), [100 * v for v in seeds], "k.", markersize=3)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(4, len(series)))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig


__all__ = [
    "PROGRESS_EVERY_S",
    "Cell",
    "CellResult",
    "grouped_bars",
    "is_finished",
    "run_cell",
    "run_cells",
    "run_command",
    "split_command_line",
    "worker_envs",
]
