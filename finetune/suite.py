"""``python -m finetune.suite``: the GLUE score of one or more encoders over seeds, in one command.

Every cell -- model folder x task x seed -- is the run a user gets from ``python -m finetune.glue --model_name_or_path
MODEL --task_name TASK --glue_dir DIR --seed S`` with the protocol's flags (and, with ``--ner_dir``, ``python -m
finetune.ner`` on ``train.conll`` / ``dev.conll``), run in a child process by the cell runner shared with
``finetune.baselines`` (:mod:`finetune.cells`). Written in ``--output_dir``:

* ``results.json``: every cell's record (its metrics, command, time) and per model and task the official metric(s),
  the task score of each seed, its median, mean and standard deviation, and the GLUE score;
* ``results.md``: a model x task table (median, mean ± sd, each seed) with the GLUE score and the tasks it leaves out;
* ``results.png``: the same as grouped bars, each seed a dot;
* ``runs/<model>/<task>/seed-<S>/``: each run's folder, with ``seed-<S>.log`` (its output) and ``seed-<S>.cell.json``
  (the marker of a finished cell: a rerun of the same command skips it).

**Task score** (Wang et al. 2019, GLUE, section 3: a task with several metrics scores their unweighted mean): CoLA
Matthews correlation; STS-B mean of Pearson and Spearman; MRPC and QQP mean of F1 and accuracy; MNLI mean of the
matched and mismatched accuracy; accuracy otherwise. Each task's score is the median over seeds (ELECTRA, Clark et
al. 2020, reports medians over seeds); the **GLUE score** is the mean of those over the tasks run, WNLI left out
unless ``--score_wnli`` (BERT, Devlin et al. 2019, and Cramming exclude it: its dev set is adversarial to the
training set); ``results.md`` names the GLUE tasks absent from it. NER (``--ner_dir``) is reported beside it
(entity-level F1), never inside.

**Protocols** (``--protocol``):

* ``default``: this project's per-task defaults -- ``finetune.glue``'s own: 3 epochs, batch 32, 128 tokens, linear
  decay without warmup, the learning rate by backbone (:func:`finetune.arguments.default_learning_rate`).
* ``glue_sane``: Cramming's GLUE evaluation (Geiping & Goldstein 2023, "Cramming: training a language model on a
  single GPU in one day"; repository JonasGeiping/cramming, ``eval=GLUE_sane`` with ``eval.scheduler=cosine-decay
  eval.epochs=5 eval.batch_size=16 eval.optim.lr=4e-5``): the 8 tasks without WNLI, learning rate 4e-5, batch 16,
  5 epochs, cosine decay, 10% warmup, 128 tokens.

``--warm_start mnli`` (RoBERTa, Liu et al. 2019, and ModernBERT's / MosaicBERT's ``glue.py``): RTE, MRPC and STS-B
start from the model's MNLI run of the same seed (a new head), when MNLI is among the tasks. ``--parallel N`` runs N
cells at once (one GPU each, or the CPU cores split between them). Arguments after ``--`` go to every cell's command
(e.g. ``-- --max_train_samples 2000``).

Example::

    python -m finetune.suite outputs/minilm-sesame outputs/my-bert --glue_dir data/glue --seeds 1 2 3 \\
        --protocol glue_sane --output_dir outputs/suite -- --max_train_samples 2000
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from core.arguments import arg, parse_arguments
from core.errors import InputError, run_cli

logger = logging.getLogger("finetune.suite")


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A named fine-tuning protocol: the flags every cell gets, the tasks it runs by default, and where it is from."""

    name: str
    flags: tuple[str, ...]
    excluded: tuple[str, ...]
    source: str


PROTOCOLS = {
    "default": Protocol(
        "default",
        (),
        (),
        "sesame-lm's finetune.glue defaults: 3 epochs, batch 32, 128 tokens, linear decay, the learning rate by "
        "backbone (finetune.arguments.default_learning_rate)",
    ),
    "glue_sane": Protocol(
        "glue_sane",
        (
            "--learning_rate",
            "4e-5",
            "--per_device_train_batch_size",
            "16",
            "--num_train_epochs",
            "5",
            "--lr_scheduler_type",
            "cosine",
            "--warmup_ratio",
            "0.1",
            "--max_seq_length",
            "128",
        ),  # fmt: skip
        ("wnli",),
        "Cramming (Geiping & Goldstein 2023; JonasGeiping/cramming, eval=GLUE_sane eval.scheduler=cosine-decay "
        "eval.epochs=5 eval.batch_size=16 eval.optim.lr=4e-5): 8 tasks without WNLI, lr 4e-5, batch 16, 5 epochs, "
        "cosine decay, 10% warmup, 128 tokens",
    ),
}
#: Tasks started from the MNLI run with ``--warm_start mnli``.
WARM_STARTED = ("rte", "mrpc", "stsb")


@dataclasses.dataclass(frozen=True)
class SuiteArguments:
    """``python -m finetune.suite``: models, tasks, seeds, protocol and the output folder."""

    models: list[str] = arg(help="model folders (SesameBert, SesameElmo, converted, classic backbones)", nargs="+",
                            metavar="MODEL", positional=True)  # fmt: skip
    output_dir: str = arg(help="results.{json,md,png} and runs/")
    glue_dir: str | None = arg(None, "the official GLUE folder (SST-2/train.tsv, ...): its tasks are the suite's")
    tasks: list[str] | None = arg(None, "GLUE tasks to run (default: those found in --glue_dir)", nargs="+")
    seeds: list[int] = arg(default_factory=lambda: [42], help="one run per seed; the table shows the median", nargs="+")
    protocol: str = arg(
        "default",
        "; ".join(f"{p.name}: {p.source}" for p in PROTOCOLS.values()).replace("%", "%%"),  # argparse formats help
        choices=tuple(PROTOCOLS),
    )
    warm_start: str | None = arg(
        None, "mnli: start RTE, MRPC and STS-B from the model's MNLI run of the same seed", choices=("mnli",)
    )
    parallel: int = arg(1, "cells run at once (one GPU each, or the CPU cores split between them)")
    ner_dir: str | None = arg(None, "a folder with train.conll and dev.conll: NER (finetune.ner) as one more task")
    score_wnli: bool = arg(False, "count WNLI in the GLUE score (default: reported, left out as BERT and Cramming do)")
    update_model_card: bool = arg(
        False, "write the results into each model folder's README.md as the hub's model-index metadata"
    )


DESCRIPTION = (
    "The GLUE score of model folders over seeds: every model x GLUE task x seed a finetune.glue run (finished ones "
    "are not rerun); results.json, results.md, results.png. Arguments after -- go to every run."
)


def task_score(task: str, results: dict) -> float | None:
    """The GLUE task score of a run's ``all_results.json`` (see the module docstring); None when it lacks a metric."""
    keys = {
        "cola": ("eval_matthews_correlation",),
        "stsb": ("eval_pearson", "eval_spearmanr"),
        "mrpc": ("eval_f1", "eval_accuracy"),
        "qqp": ("eval_f1", "eval_accuracy"),
        "mnli": ("eval_matched_accuracy", "eval_mismatched_accuracy"),
        "ner": ("eval_f1",),
    }.get(task, ("eval_accuracy",))
    if task == "mnli" and keys[0] not in results:
        keys = ("eval_accuracy",)
    values = [results.get(k) for k in keys]
    return None if any(v is None for v in values) else sum(values) / len(values)


def task_metrics(task: str) -> str:
    """How a task's score is made, for the table header."""
    return {
        "cola": "MCC",
        "stsb": "Pearson/Spearman",
        "mrpc": "F1/acc",
        "qqp": "F1/acc",
        "mnli": "acc m/mm",
        "ner": "entity F1",
    }.get(task, "acc")


def glue_tasks_in(glue_dir: Path) -> list[str]:
    """The GLUE tasks whose training and validation files are in ``glue_dir``, in the GLUE paper's order."""
    from finetune.tasks import GLUE_TASKS

    found = []
    for name, task in GLUE_TASKS.items():
        splits = [f for s, f in task.files.items() if s == "train" or s.startswith("validation")]
        if all((glue_dir / f.path).is_file() for f in splits):
            found.append(name)
    return found


def check_inputs(args: SuiteArguments) -> list[str]:
    """Every argument checked before anything runs. Returns the tasks (NER last, as ``"ner"``).

    Raises:
        InputError: no such model folder, GLUE folder or NER folder; an unknown task; no task at all; ``--parallel``
            < 1; ``--warm_start mnli`` without MNLI among the tasks.
    """
    from finetune.tasks import get_task

    for model in args.models:
        if not (Path(model) / "config.json").is_file():
            raise InputError(f"MODEL {model}: no config.json there; expected a model folder written by save_pretrained")
    names = [model_name(m) for m in args.models]
    if len(set(names)) < len(names):
        raise InputError(f"MODEL: two model folders share a name ({', '.join(names)}); expected distinct folder names")
    if args.parallel < 1:
        raise InputError(f"--parallel {args.parallel}: expected an integer >= 1")
    tasks: list[str] = []
    if args.glue_dir:
        glue_dir = Path(args.glue_dir)
        if not glue_dir.is_dir():
            raise InputError(f"--glue_dir {glue_dir}: not a folder; expected the GLUE data folder")
        if args.tasks:
            tasks = [get_task(t).name for t in args.tasks]
        else:
            excluded = PROTOCOLS[args.protocol].excluded
            tasks = [t for t in glue_tasks_in(glue_dir) if t not in excluded]
            if not tasks:
                raise InputError(
                    f"--glue_dir {glue_dir}: no GLUE task there (train and dev files); expected e.g. SST-2/"
                )
    elif args.tasks:
        raise InputError("--tasks needs --glue_dir (the folder the tasks are read from)")
    if args.ner_dir:
        for name in ("train.conll", "dev.conll"):
            if not (Path(args.ner_dir) / name).is_file():
                raise InputError(f"--ner_dir {args.ner_dir}: no {name} there; expected train.conll and dev.conll")
        tasks.append("ner")
    if not tasks:
        raise InputError("no task: pass --glue_dir (and --tasks) and/or --ner_dir")
    if args.warm_start == "mnli" and "mnli" not in tasks:
        raise InputError("--warm_start mnli: MNLI is not among the tasks; expected MNLI in --glue_dir or --tasks")
    return tasks


def model_name(model: str) -> str:
    return Path(model).resolve().name


def cells_of(args: SuiteArguments, tasks: list[str], extra: list[str]):
    """The :class:`finetune.cells.Cell` of every model x task x seed, in table order."""
    from finetune.cells import Cell

    out = Path(args.output_dir)
    protocol = PROTOCOLS[args.protocol]
    cells = []
    for model in args.models:
        for task in tasks:
            for seed in args.seeds:
                run_dir = out / "runs" / model_name(model) / task / f"seed-{seed}"
                source, after, more = model, (), []
                if args.warm_start == "mnli" and task in WARM_STARTED:
                    source = str(out / "runs" / model_name(model) / "mnli" / f"seed-{seed}")
                    after, more = (f"mnli / {model_name(model)} / seed {seed}",), ["--ignore_mismatched_sizes"]
                if task == "ner":
                    ner = Path(args.ner_dir)
                    command = [sys.executable, "-m", "finetune.ner", "--model_name_or_path", source]
                    command += ["--train_file", str(ner / "train.conll"), "--validation_file", str(ner / "dev.conll")]
                else:
                    command = [sys.executable, "-m", "finetune.glue", "--model_name_or_path", source]
                    command += ["--task_name", task, "--glue_dir", str(args.glue_dir), *more]
                command += list(protocol.flags)
                command += ["--seed", str(seed), "--output_dir", str(run_dir), "--overwrite_output_dir"]
                command += ["--report_to", "none", *extra]
                cells.append(Cell(f"{task} / {model_name(model)} / seed {seed}", command, run_dir, after))
    return cells


def summarize(records: list[dict], tasks: list[str], score_wnli: bool) -> dict:
    """Per model: per task the seeds' scores, median, mean, sd (``statistics.stdev``, 0 for one seed) and the
    official metrics' medians; the GLUE score (mean over the GLUE tasks with a score of their median, WNLI only with
    ``score_wnli``), the tasks counted and the GLUE tasks absent from it."""
    from finetune.tasks import TASK_NAMES

    models: dict[str, dict] = {}
    for r in records:
        models.setdefault(r["model"], {}).setdefault(r["task"], []).append(r)
    summary = {}
    for model, by_task in models.items():
        rows = {}
        for task in tasks:
            runs = sorted(by_task.get(task, []), key=lambda r: r["seed"])
            ok = [r for r in runs if r.get("score") is not None]
            values = [r["score"] for r in ok]
            metric_keys = sorted({k for r in ok for k in r["eval"] if k != "eval_loss"})
            rows[task] = {
                "seeds": [r["seed"] for r in ok],
                "scores": values,
                "median": statistics.median(values) if values else None,
                "mean": statistics.fmean(values) if values else None,
                "sd": statistics.stdev(values) if len(values) > 1 else (0.0 if values else None),
                "failed": len(runs) - len(ok),
                "metrics": {k: statistics.median(r["eval"][k] for r in ok if k in r["eval"]) for k in metric_keys},
            }
        counted = [t for t in tasks if t != "ner" and rows[t]["median"] is not None and (score_wnli or t != "wnli")]
        summary[model] = {
            "tasks": rows,
            "glue_score": statistics.fmean(rows[t]["median"] for t in counted) if counted else None,
            "glue_tasks": counted,
            "absent": [t for t in TASK_NAMES if t not in counted],
            "wnli_counted": score_wnli and "wnli" in counted,
        }
    return summary


def write_results(out: Path, records: list[dict], tasks: list[str], args: SuiteArguments, picture: bool = True) -> dict:
    """``results.json``, ``results.md`` (atomically; after every cell) and with ``picture`` ``results.png`` (at the
    end). Returns the summary of :func:`summarize`."""
    from core.files import write_text_atomic

    summary = summarize(records, tasks, args.score_wnli)
    protocol = PROTOCOLS[args.protocol]
    doc = {"protocol": protocol.name, "protocol_source": protocol.source, "seeds": args.seeds, "tasks": tasks}
    doc.update(models=summary, runs=records)
    write_text_atomic(out / "results.json", json.dumps(doc, indent=2) + "\n")
    write_text_atomic(out / "results.md", results_markdown(summary, tasks, args))
    if picture:
        plot(out / "results.png", summary, tasks)
    return summary


def results_markdown(summary: dict, tasks: list[str], args: SuiteArguments) -> str:
    """The model x task table: per cell ``median (mean ± sd; seed values)``, x 100; the GLUE score column."""

    def pct(v):
        return "--" if v is None else f"{100 * v:.2f}"

    head = [f"{t} ({task_metrics(t)})" for t in tasks]
    lines = ["| model | " + " | ".join(head) + " | GLUE score |", "|---|" + "---:|" * (len(tasks) + 1)]
    for model, s in summary.items():
        cells = []
        for t in tasks:
            r = s["tasks"][t]
            if r["median"] is None:
                cells.append("failed" if r["failed"] else "--")
                continue
            seeds = ", ".join(f"{100 * v:.1f}" for v in r["scores"])
            failed = f"; {r['failed']} failed" if r["failed"] else ""
            cells.append(f"{pct(r['median'])} ({pct(r['mean'])} ± {pct(r['sd'])}; {seeds}{failed})")
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {pct(s['glue_score'])} |")
    notes = []
    for model, s in summary.items():
        notes.append(
            f"- {model}: GLUE score over {', '.join(s['glue_tasks']) or 'no task'}; absent from it: "
            f"{', '.join(s['absent']) or 'none'} (WNLI {'counted' if s['wnli_counted'] else 'not counted'})"
        )
    protocol = PROTOCOLS[args.protocol]
    return (
        "# GLUE dev results\n\n"
        f"Protocol `{protocol.name}`: {protocol.source}. Seeds {', '.join(map(str, args.seeds))}.\n\n"
        "Task score x 100 (CoLA MCC; STS-B mean of Pearson and Spearman; MRPC, QQP mean of F1 and accuracy; MNLI "
        "mean of matched and mismatched accuracy; accuracy otherwise; NER entity-level F1): median over seeds "
        "(mean ± sd; each seed's value). GLUE score: the mean of the task medians over the GLUE tasks run.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + "\n".join(notes)
        + "\n"
    )


def plot(path: Path, summary: dict, tasks: list[str]) -> None:
    """Grouped bars (one group per task plus the GLUE score, one bar per model: the median), each seed a dot."""
    from finetune.cells import grouped_bars

    def cell(model, task):
        row = summary[model]["tasks"].get(task)
        return (row.get("median"), row["scores"]) if row else None

    series = {m: [*(cell(m, t) for t in tasks), (summary[m]["glue_score"], ())] for m in summary}
    labels = [f"{t}\n" + task_metrics(t).replace("/", "/\n") for t in tasks]  # one metric name a line: no overlap
    grouped_bars(path, [*labels, "GLUE score"], series, "dev score x 100 (median over seeds)")


#: The hub's dataset id and metric names of each task, for ``model-index``.
_CARD_METRICS = {
    "cola": [("matthews_correlation", "eval_matthews_correlation")],
    "stsb": [("pearsonr", "eval_pearson"), ("spearmanr", "eval_spearmanr")],
    "mrpc": [("f1", "eval_f1"), ("accuracy", "eval_accuracy")],
    "qqp": [("f1", "eval_f1"), ("accuracy", "eval_accuracy")],
    "mnli": [("accuracy", "eval_matched_accuracy"), ("accuracy", "eval_mismatched_accuracy")],
    "ner": [("f1", "eval_f1"), ("precision", "eval_precision"), ("recall", "eval_recall")],
}


def update_model_card(model: str, summary: dict, args: SuiteArguments) -> Path:
    """Write the suite's results (medians over seeds) into ``model``'s ``README.md`` as ``model-index`` metadata
    (huggingface_hub's ``ModelCard`` / ``EvalResult``; an existing card keeps its text and other metadata; results of
    earlier suites replaced). Returns the card's path."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    path = Path(model) / "README.md"
    card = ModelCard.load(path) if path.is_file() else ModelCard(f"---\n---\n\n# {model_name(model)}\n")
    if card.data is None:
        card.data = ModelCardData()
    results = []
    for task, row in summary["tasks"].items():
        for metric, key in _CARD_METRICS.get(task, [("accuracy", "eval_accuracy")]):
            if key not in row["metrics"]:
                continue
            split = "validation_mismatched" if key == "eval_mismatched_accuracy" else "validation"
            results.append(
                EvalResult(
                    task_type="token-classification" if task == "ner" else "text-classification",
                    dataset_type=Path(args.ner_dir).name if task == "ner" else "nyu-mll/glue",
                    dataset_name=f"NER ({Path(args.ner_dir).name})" if task == "ner" else f"GLUE {task.upper()}",
                    dataset_config=None if task == "ner" else task,
                    dataset_split=split,
                    metric_type=metric,
                    metric_value=round(float(row["metrics"][key]), 4),
                    metric_name=f"{metric} (median of {len(row['scores'])} seeds, {args.protocol} protocol)",
                )
            )
    card.data.model_name = card.data.model_name or model_name(model)
    card.data.eval_results = results
    card.save(path)
    return path


def record_of(res, model: str, task: str, seed: int) -> dict:
    """The ``results.json`` record of a cell's :class:`finetune.cells.CellResult`."""
    record = {
        "model": model,
        "task": task,
        "seed": seed,
        "command": res.cell.command[1:],
        "wall_s": round(res.wall_s, 1),
    }
    if res.ok:
        record.update(
            score=task_score(task, res.results),
            eval={k: v for k, v in res.results.items() if k.startswith("eval_")},
            train_runtime_s=res.results.get("train_runtime_s"),
            skipped=res.skipped,
        )
    else:
        record["error"] = res.last_line or f"exit status {res.returncode}"
    return record


def main(argv: Sequence[str] | None = None) -> int:
    import threading

    from core.logs import setup_logging
    from finetune.cells import run_cells, split_command_line

    own, extra, env = split_command_line(argv)
    (args,) = parse_arguments([SuiteArguments], own, prog="python -m finetune.suite", description=DESCRIPTION)
    setup_logging()
    tasks = check_inputs(args)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = cells_of(args, tasks, extra)
    meta = {c.name: (model_name(m), t, s) for c, (m, t, s) in zip(cells, _grid(args, tasks))}
    records: dict[str, dict] = {}
    lock = threading.Lock()

    def on_result(res) -> None:
        model, task, seed = meta[res.cell.name]
        with lock:
            records[res.cell.name] = record_of(res, model, task, seed)
            write_results(out, [records[c.name] for c in cells if c.name in records], tasks, args, picture=False)

    results = run_cells(cells, args.parallel, env, on_result)
    summary = write_results(out, [records[c.name] for c in cells], tasks, args)
    if args.update_model_card:
        for model in args.models:
            logger.info("model card: %s", update_model_card(model, summary[model_name(model)], args))
    failed = [r for r in results if not r.ok]
    ran = sum(1 for r in results if r.ok and not r.skipped)
    for model, s in summary.items():
        score = "--" if s["glue_score"] is None else f"{100 * s['glue_score']:.2f}"
        print(f"{model}: GLUE score {score} over {', '.join(s['glue_tasks']) or 'no task'}")
    if failed:
        names = "; ".join(f"{r.cell.name} ({r.last_line or r.returncode})" for r in failed)
        print(
            f"error: {len(failed)} of {len(results)} cell(s) failed: {names}; their logs are runs/<model>/<task>/"
            f"seed-<S>.log in {out}; expected every cell to train",
            file=sys.stderr,
        )
        return 1
    print(f"results: {out / 'results.md'} ({ran} cell(s) run, {len(results) - ran} finished before)")
    return 0


def _grid(args: SuiteArguments, tasks: list[str]):
    return [(m, t, s) for m in args.models for t in tasks for s in args.seeds]


if __name__ == "__main__":
    sys.exit(run_cli(main))
