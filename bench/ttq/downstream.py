"""Fine-tuning (item 8 of the package docstring): the random inits, the fixed ``finetune.glue`` protocol,
every model on every task and seed, the classic baselines and what pretraining buys."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .common import SCRIPT, Job, child_env, log, median_or_none, run_jobs
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


def finetune_argv(model_dir: Path, task: str, seed: int, run_dir: Path, args) -> list[str]:
    """The ``finetune.glue`` arguments of the fixed protocol (see the package docstring, item 8)."""
    from core.arguments import as_flags  # not at import: the reference's process must not import the project

    cap = (
        min(x for x in (FINETUNE_MAX_TRAIN_SAMPLES.get(task), args.max_train_samples) if x is not None)
        if task in FINETUNE_MAX_TRAIN_SAMPLES or args.max_train_samples is not None
        else None
    )
    protocol = dict(learning_rate=args.finetune_learning_rate, num_train_epochs=args.finetune_epochs)
    protocol |= {k: FINETUNE[k] for k in ("per_device_train_batch_size", "warmup_ratio", "weight_decay")}
    protocol |= dict(max_seq_length=args.max_seq_length, seed=seed, mixed_precision="no", report_to="none")
    return [
        *as_flags(model_name_or_path=model_dir, task_name=task, glue_dir=args.glue_dir, output_dir=run_dir),
        "--overwrite_output_dir",
        *as_flags(**protocol),
        *(["--max_train_samples", str(cap)] if cap is not None else []),
    ]


def finetune_command(model_dir: Path, task: str, seed: int, run_dir: Path, args) -> list[str]:
    """The ``python -m finetune.glue`` command of the fixed protocol (:func:`finetune_argv`), one process per
    fine-tune (the bench runs them in worker processes instead: :func:`finetune_all`)."""
    return [sys.executable, "-m", "finetune.glue", *finetune_argv(model_dir, task, seed, run_dir, args)]


#: Exit statuses of a fine-tune stopped by SIGTERM / SIGINT (``training.signals``: 128 + the signal).
STOPPED_BY_SIGNAL = (143, 130)


def run_finetunes_in_process(jobs: list[dict]) -> dict[str, int]:
    """Run ``finetune.glue``'s ``main`` in this process for each job (``{"name", "argv", "log"}``) in turn, each with
    a fresh accelerate state and its output (file descriptors 1 and 2) in its own ``log`` file, as its own process
    would; returns ``{name: exit status}`` (``core.errors.run_cli``'s: 0, 2 for refused input; 1 for any other
    exception, its traceback in the log). A fine-tune stopped by SIGTERM / SIGINT (143 / 130: its checkpoint
    written) ends the loop: the later jobs are not run and have no status. The same metrics as a ``python -m
    finetune.glue`` process of the same arguments (tested): the run seeds everything it draws from."""
    import gc
    import traceback

    from accelerate.state import AcceleratorState, GradientState

    from core.errors import run_cli
    from finetune import glue

    status = {}
    for job in jobs:
        log_path = Path(job["log"])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        with open(log_path, "w", encoding="utf-8") as handle, _fds_to(handle):
            handle.write("$ python -m finetune.glue " + " ".join(job["argv"]) + "  (in-process)\n")
            handle.flush()
            try:
                status[job["name"]] = run_cli(glue.main, job["argv"])
            except Exception:  # noqa: BLE001 -- recorded as the job's failure, as a failed process would be
                sys.stderr.flush()
                handle.write(traceback.format_exc())
                handle.flush()
                status[job["name"]] = 1
        gc.collect()
        if status[job["name"]] in STOPPED_BY_SIGNAL:  # SIGTERM / Ctrl-C: the worker stops, as its process would
            break
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return status


class _fds_to:
    """Point file descriptors 1 and 2 (and so ``sys.stdout``/``sys.stderr`` and the logging handlers writing to
    them) at ``handle`` inside the ``with`` block; restore them after."""

    def __init__(self, handle):
        self.handle = handle

    def __enter__(self):
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        os.dup2(self.handle.fileno(), 1)
        os.dup2(self.handle.fileno(), 2)
        return self

    def __exit__(self, *exc):
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        return False


def finetune_worker_main(argv: list[str]) -> int:
    """``bench_time_to_quality.py _finetune JOBS.json``: :func:`run_finetunes_in_process` of the file's jobs, the
    statuses written to ``JOBS.status.json``; returns 0 (a failed fine-tune is recorded, not fatal)."""
    jobs_file = Path(argv[0])
    jobs = json.loads(jobs_file.read_text(encoding="utf-8"))
    status = run_finetunes_in_process(jobs)
    jobs_file.with_suffix(".status.json").write_text(json.dumps(status) + "\n", encoding="utf-8")
    return 0


def _worker_jobs(models: dict[str, Path], args, out: Path) -> list[dict]:
    """Every fine-tune of ``models`` x ``--tasks`` x ``--seeds``, task by task: ``{"name", "model", "task",
    "run_dir", "argv", "log"}``."""
    jobs = []
    for task in args.tasks:
        for name, folder in models.items():
            for seed in [42 + i for i in range(args.seeds)]:
                run_dir = out / "finetune" / name / f"{task}-s{seed}"
                jobs.append(
                    {
                        "name": f"{name} {task} seed {seed}",
                        "model": name,
                        "task": task,
                        "run_dir": str(run_dir),
                        "argv": finetune_argv(folder, task, seed, run_dir, args),
                        "log": str(out / "logs" / "finetune" / f"{name}-{task}-s{seed}.log"),
                    }
                )
    return jobs


def finetune_all(models: dict[str, Path], args, out: Path) -> dict[str, dict]:
    """Fine-tune every model on every task and seed in ``--finetune_parallel`` worker processes of one thread
    (``_finetune``, :func:`run_finetunes_in_process`: one process start-up per worker, not per fine-tune; the jobs
    dealt out in turn, task by task); ``{model: {"downstream": {task: median}, "downstream_seeds": {task: [value per
    seed]}, "errors": [...]}}``. A failed fine-tune is recorded, not fatal."""
    jobs = _worker_jobs(models, args, out)
    width = max(1, min(args.finetune_parallel, len(jobs)))
    workers = []
    for i in range(width):
        jobs_file = out / "logs" / "finetune" / f"worker-{i}.json"
        jobs_file.parent.mkdir(parents=True, exist_ok=True)
        jobs_file.with_suffix(".status.json").unlink(missing_ok=True)
        jobs_file.write_text(json.dumps(jobs[i::width], indent=1) + "\n", encoding="utf-8")
        cmd = [sys.executable, str(SCRIPT), "_finetune", str(jobs_file)]
        workers.append(Job(f"fine-tuning worker {i}", cmd, jobs_file.with_suffix(".log"), child_env(1)))
    log(f"fine-tuning: {len(jobs)} runs in {width} worker process(es)")
    run_jobs(workers, width, check=False)
    status = {}
    for worker in workers:
        path = Path(worker.log).with_suffix(".status.json")
        status.update(json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {})
    return _collect(jobs, status, models, args)


def _collect(jobs: list[dict], status: dict[str, int], models: dict[str, Path], args) -> dict[str, dict]:
    """:func:`finetune_all`'s record from the jobs' ``all_results.json`` and exit statuses."""
    results = {
        name: {"downstream": {}, "downstream_seeds": {t: [] for t in args.tasks}, "errors": []} for name in models
    }
    for job in jobs:
        name, task, run_dir = job["model"], job["task"], Path(job["run_dir"])
        res_file = run_dir / "all_results.json"
        key = f"eval_{TASK_METRICS[task]}"
        res = json.loads(res_file.read_text(encoding="utf-8")) if res_file.is_file() else {}
        code = status.get(job["name"])
        if code != 0 or key not in res:
            results[name]["errors"].append(f"{job['name']}: exit {code}, see {job['log']}")
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
