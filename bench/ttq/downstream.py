"""Fine-tuning (item 8 of the package docstring): the random inits, the fixed ``finetune.glue`` protocol,
every model on every task and seed, the classic baselines and what pretraining buys."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .common import Job, child_env, log, median_or_none, run_jobs
from .reference import reference_model

#: GLUE tasks -> the main metric (the first of the task's metrics, as ``finetune.glue`` / ``finetune.baselines``).
TASK_METRICS = {
    "cola": "matthews_correlation",
    "sst2": "accuracy",
    "mrpc": "f1",
    "qqp": "f1",
    "stsb": "pearson",
    "mnli": "accuracy",
    "qnli": "accuracy",
    "rte": "accuracy",
    "wnli": "accuracy",
}


#: The classic backbones of ``finetune.baselines`` (their rows in ``--baselines_results``).
CLASSIC_BASELINES = ("cbow", "fasttext", "cnn", "rnn", "treelstm")


#: The fine-tuning protocol (``finetune.glue`` flags); SST-2 on its first 20,000 training examples.
FINETUNE = dict(per_device_train_batch_size=32, num_train_epochs=3, warmup_ratio=0.1, weight_decay=0.01)


FINETUNE_MAX_TRAIN_SAMPLES = {"sst2": 20000}


def make_random_inits(args, out: Path, data: dict) -> dict[str, Path]:
    """``random-sesame`` (SesameBertForMaskedLM of the ``--model_shape`` preset) and ``random-bert``
    (:func:`reference_model`), each initialised after ``torch.manual_seed(--seed)`` and saved with the tokenizer in
    ``out/models/``; returns their folders."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(data["tokenizer"]))
    folders = {}
    for kind in ("sesame", "bert"):
        torch.manual_seed(args.seed)
        if kind == "sesame":
            import modeling

            config = modeling.get_preset_config(args.model_shape, vocab_size=len(tok), pad_token_id=tok.pad_token_id)
            model = AutoModelForMaskedLM.from_config(config)
        else:
            model = reference_model(args.model_shape, tok)
        folder = out / "models" / f"random-{kind}"
        if folder.exists():
            shutil.rmtree(folder)
        model.save_pretrained(str(folder))
        tok.save_pretrained(str(folder))
        folders[f"random-{kind}"] = folder
    return folders


def finetune_command(model_dir: Path, task: str, seed: int, run_dir: Path, args) -> list[str]:
    """The ``finetune.glue`` command of the fixed protocol (see the module docstring, item 8)."""
    cap = (
        min(x for x in (FINETUNE_MAX_TRAIN_SAMPLES.get(task), args.max_train_samples) if x is not None)
        if task in FINETUNE_MAX_TRAIN_SAMPLES or args.max_train_samples is not None
        else None
    )
    return [
        sys.executable,
        "-m",
        "finetune.glue",
        "--model_name_or_path",
        str(model_dir),
        "--task_name",
        task,
        "--glue_dir",
        args.glue_dir,
        "--output_dir",
        str(run_dir),
        "--overwrite_output_dir",
        "--learning_rate",
        str(args.finetune_learning_rate),
        "--num_train_epochs",
        str(args.finetune_epochs),
        "--per_device_train_batch_size",
        str(FINETUNE["per_device_train_batch_size"]),
        "--warmup_ratio",
        str(FINETUNE["warmup_ratio"]),
        "--weight_decay",
        str(FINETUNE["weight_decay"]),
        "--max_seq_length",
        str(args.max_seq_length),
        "--seed",
        str(seed),
        "--mixed_precision",
        "no",
        "--report_to",
        "none",
        *(["--max_train_samples", str(cap)] if cap is not None else []),
    ]


def finetune_all(models: dict[str, Path], args, out: Path) -> dict[str, dict]:
    """Fine-tune every model on every task and seed; ``{model: {"downstream": {task: median},
    "downstream_seeds": {task: [value per seed]}, "errors": [...]}}``. A failed fine-tune is recorded, not fatal."""
    seeds = [42 + i for i in range(args.seeds)]
    jobs, where = [], {}
    for name, folder in models.items():
        for task in args.tasks:
            for seed in seeds:
                run_dir = out / "finetune" / name / f"{task}-s{seed}"
                job = Job(
                    f"{name} {task} seed {seed}",
                    finetune_command(folder, task, seed, run_dir, args),
                    out / "logs" / "finetune" / f"{name}-{task}-s{seed}.log",
                    child_env(1),
                )
                jobs.append(job)
                where[id(job)] = (name, task, run_dir)
    log(f"fine-tuning: {len(jobs)} runs, {args.finetune_parallel} at a time")
    run_jobs(jobs, args.finetune_parallel, check=False)
    results = {
        name: {"downstream": {}, "downstream_seeds": {t: [] for t in args.tasks}, "errors": []} for name in models
    }
    for job in jobs:
        name, task, run_dir = where[id(job)]
        res_file = run_dir / "all_results.json"
        key = f"eval_{TASK_METRICS[task]}"
        res = json.loads(res_file.read_text(encoding="utf-8")) if res_file.is_file() else {}
        if job.returncode != 0 or key not in res:
            results[name]["errors"].append(f"{job.name}: exit {job.returncode}, see {job.log}")
            continue
        results[name]["downstream_seeds"][task].append(res[key])
        if not args.keep_finetuned:
            for item in ("checkpoints", "model.safetensors"):
                target = run_dir / item
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    for rec in results.values():
        rec["downstream"] = {t: median_or_none(v) for t, v in rec["downstream_seeds"].items()}
    return results


def read_baselines(path: str | None, tasks: list[str]) -> dict[str, dict[str, float]]:
    """``{task: {backbone: value}}`` of a ``finetune.baselines`` results.json (``{"runs": [{"task", "backbone",
    "metric", "value", ...}]}``), records of ``tasks`` with the task's main metric and a value only."""
    if not path:
        return {}
    records = json.loads(Path(path).read_text(encoding="utf-8")).get("runs", [])
    table: dict[str, dict[str, float]] = {}
    for r in records:
        if r.get("task") in tasks and r.get("metric") == TASK_METRICS[r["task"]] and r.get("value") is not None:
            table.setdefault(r["task"], {})[r["backbone"]] = r["value"]
    return table


def pretraining_buys(runs: dict, baselines: dict) -> dict:
    """Per trained run and task: its median downstream metric minus its random init's (ours: ``random-sesame``,
    the reference: ``random-bert``; the other one when only one was fine-tuned) and minus the best classic
    baseline."""
    buys = {}
    for name, run in runs.items():
        if run["kind"] == "random-init" or not run.get("downstream"):
            continue
        tuned = [n for n, r in runs.items() if r["kind"] == "random-init" and r.get("downstream")]
        own = "random-bert" if run["kind"] == "reference" else "random-sesame"
        init = own if own in tuned else next(iter(tuned), None)
        buys[name] = {}
        for task, value in run["downstream"].items():
            base = runs[init]["downstream"].get(task) if init else None
            classic = {b: v for b, v in baselines.get(task, {}).items() if b in CLASSIC_BASELINES}
            best = max(classic, key=classic.get) if classic else None
            buys[name][task] = {
                "metric": TASK_METRICS[task],
                "value": value,
                "random_init": init,
                "vs_random_init": value - base if value is not None and base is not None else None,
                "best_classic": best,
                "best_classic_value": classic.get(best),
                "vs_best_classic": value - classic[best] if value is not None and best else None,
            }
    return buys
