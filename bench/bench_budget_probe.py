"""The ``--time_budget`` probe against the run it sizes: ``pretrain --time_budget M`` times a few optimizer steps on a
copy of the model with the run's loader (workers, prefetch, pinned memory: :func:`training.budget.time_optimizer_steps`)
and converts the budget into steps; this bench compares the probe's seconds per step (``run_config.json``,
``time_budget_seconds_per_step``) with the run's own (``all_results.json``: ``train_runtime_s / global_step``, this
session's training time, evaluation and checkpoints excluded). Target: within 15% (ratio 0.85-1.15) with and without
DataLoader workers.

Each setting runs ``--repeats`` times in turn (workers 0, 2, 0, 2, ...), each run a ``python -m pretrain`` process of
its own on one prepared dataset (``python -m pretrain.prepare``, built once in ``--output_dir``); medians are
reported. Usage::

    python bench/bench_budget_probe.py --train_file corpus/*.txt.gz --output_dir out/probe \\
        [--config_name bert-tiny] [--time_budget 1] [--workers 0 2] [--repeats 3] [--threads 1] [--device_args ...]

Writes ``results.json`` and ``results.md`` in ``--output_dir`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import _script_env  # noqa: F401  (offline, the project root on sys.path; bench/ is the script's folder)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train_file", nargs="+", required=True, help="UTF-8 .txt / .txt.gz files")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--config_name", default="bert-tiny")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--time_budget", type=float, default=1.0, help="minutes of training per run")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="--dataloader_num_workers settings")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (the CPU)")
    p.add_argument("--mixed_precision", default="no", choices=["no", "bf16"])
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more pretrain flags, after everything")
    return p.parse_args(argv)


def prepare(args, out: Path) -> Path:
    """The prepared dataset of ``--train_file`` (tokenizer trained on it), built once."""
    prepared = out / "prepared"
    if not (prepared / "manifest.json").is_file():
        cmd = [sys.executable, "-m", "pretrain.prepare", "--train_file", *args.train_file]
        cmd += ["--vocab_size", str(args.vocab_size), "--max_seq_length", str(args.max_seq_length)]
        subprocess.run([*cmd, "--output_dir", str(prepared)], check=True, env=_env(args))
    return prepared


def _env(args) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(args.threads), "WANDB_MODE": "offline"}


def run_once(args, prepared: Path, workers: int, folder: Path) -> dict:
    """One ``pretrain --time_budget`` run; its probe's and its own seconds per optimizer step."""
    cmd = [sys.executable, "-m", "pretrain", "--prepared_dataset", str(prepared), "--config_name", args.config_name]
    cmd += ["--per_device_train_batch_size", str(args.batch_size), "--time_budget", str(args.time_budget)]
    cmd += ["--dataloader_num_workers", str(workers), "--mixed_precision", args.mixed_precision]
    cmd += ["--max_eval_samples", "32", "--eval_steps", "1000000", "--checkpointing_steps", "1000000"]
    cmd += ["--checkpoints_total_limit", "1", "--output_dir", str(folder), *args.extra]
    subprocess.run(cmd, check=True, env=_env(args), stdout=subprocess.DEVNULL)
    config = json.loads((folder / "run_config.json").read_text())
    results = json.loads((folder / "all_results.json").read_text())
    probe = config["time_budget_seconds_per_step"]
    run = results["train_runtime_s"] / results["global_step"]
    return {"steps": results["global_step"], "probe_s": probe, "run_s": run, "run_over_probe": run / probe}


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    prepared = prepare(args, out)
    runs: dict[int, list[dict]] = {w: [] for w in args.workers}
    for repeat in range(args.repeats):
        for workers in args.workers:
            result = run_once(args, prepared, workers, out / f"run-w{workers}-{repeat}")
            runs[workers].append(result)
            print(f"workers {workers}, repeat {repeat}: {json.dumps(result)}", flush=True)
    table = {
        w: {key: statistics.median(r[key] for r in rs) for key in ("steps", "probe_s", "run_s", "run_over_probe")}
        for w, rs in runs.items()
    }
    lines = [
        "| DataLoader workers | steps | probe s/step | run s/step | run / probe (target 0.85-1.15) |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {w} | {t['steps']:.0f} | {t['probe_s']:.4f} | {t['run_s']:.4f} | {t['run_over_probe']:.3f} |"
        for w, t in table.items()
    ]
    report = {"args": vars(args), "runs": runs, "median": table}
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
