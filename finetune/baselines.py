"""``python -m finetune.baselines``: the GLUE baseline table -- classic encoders (and pretrained models) on GLUE tasks.

For every task and backbone it runs ``finetune.glue`` (the same command a user runs, in a child process) with the
backbone's recipe (:data:`RECIPES`), then writes in ``--output_dir``:

* ``results.json`` -- one record per run: task, backbone, the task's main metric (:attr:`GlueTask.main_metric`)
  and its value on the dev set, every ``eval_*`` figure, ``train_runtime_s``, the recipe and the exact
  ``finetune.glue`` command; for the Tree-LSTM whether the trees were given or latent;
* ``results.md`` -- a task x backbone table (metric x 100, training time);
* ``results.png`` -- the same figures as grouped bars (matplotlib, Agg);
* ``models/<backbone>/`` -- the freshly initialised baseline folders (config, weights, word tokenizer) that
  ``finetune.glue`` fine-tunes, and ``runs/<task>-<backbone>/`` -- each run's folder.

Backbones: ``cbow``, ``fasttext``, ``cnn``, ``rnn``, ``treelstm`` (:mod:`modeling.baselines`; words from the word
tokenizer of ``--embeddings`` or ``--tokenizer_name``, embeddings from ``--embeddings`` or random), or a
model folder (a pretrained SesameBert / SesameElmo, fine-tuned with the recipe of its ``model_type``).

Example::

    python -m tokenizer train --model_type elmo --lowercase --train_file corpus.txt.gz --vocab_size 50000 \\
        --output_dir wordtok
    python -m tokenizer vectors --train_file corpus.txt.gz --tokenizer_name wordtok --output_dir vectors
    python -m finetune.baselines --glue_dir data/glue --tasks sst2 mrpc stsb cola \\
        --backbones cbow fasttext cnn rnn treelstm runs/bert-mini runs/elmo-small --embeddings vectors \\
        --output_dir table

Arguments after ``--`` go to every ``finetune.glue`` run (e.g. ``-- --max_train_samples 1000``); a ``--hub_token``
among them reaches the runs as ``HF_TOKEN`` in their environment, never on a command line, in ``results.json`` or
in the log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from training.arguments import arg, parse_arguments
from training.errors import InputError, run_cli

logger = logging.getLogger("finetune.baselines")

BASELINES = ("cbow", "fasttext", "cnn", "rnn", "treelstm")

#: Fine-tuning recipe of each backbone: finetune.glue arguments, epochs per task ("default" for the rest), and
#: optionally ``max_train_samples`` and further finetune.glue arguments (``extra_args``) per task.
#: Small enough for a CPU; the baselines train everything (embeddings included unless static) with AdamW.
#: ``max_train_samples``: per task, train on the first N examples only (the latent Tree-LSTM's CPU time).
RECIPES: dict[str, dict] = {
    "cbow": dict(
        learning_rate=3e-3,
        per_device_train_batch_size=128,
        weight_decay=0.0,
        num_warmup_steps=0,
        epochs={"sst2": 3, "default": 3},
    ),
    "fasttext": dict(
        learning_rate=3e-3,
        per_device_train_batch_size=128,
        weight_decay=0.0,
        num_warmup_steps=0,
        epochs={"sst2": 3, "default": 3},
    ),
    # SST-2: 6 epochs, keeping the checkpoint with the best dev accuracy (evaluated every half epoch), as the GLUE
    # paper's baselines stopped early on dev; 3 epochs without it ended at 79.6-80.3, still rising
    "cnn": dict(
        learning_rate=2e-3,
        per_device_train_batch_size=128,
        weight_decay=0.0,
        num_warmup_steps=0,
        epochs={"sst2": 6, "default": 3},
        extra_args={"sst2": ["--eval_steps", "264", "--load_best_model_at_end"]},
    ),
    "rnn": dict(
        learning_rate=1e-3,
        per_device_train_batch_size=64,
        weight_decay=0.0,
        num_warmup_steps=0,
        epochs={"sst2": 1, "default": 3},
    ),
    "treelstm": dict(
        learning_rate=1e-3,
        per_device_train_batch_size=64,
        weight_decay=0.0,
        num_warmup_steps=0,
        epochs={"sst2": 1, "default": 3},
        max_train_samples={"sst2": 20000},
    ),
    "sesame-bert": dict(
        learning_rate=1e-4,
        per_device_train_batch_size=32,
        weight_decay=0.01,
        num_warmup_steps=50,
        epochs={"sst2": 1, "default": 3},
    ),
    "sesame-elmo": dict(
        learning_rate=3e-3,
        per_device_train_batch_size=32,
        weight_decay=0.0,
        num_warmup_steps=50,
        epochs={"sst2": 1, "default": 3},
    ),
    "default": dict(
        learning_rate=5e-5,
        per_device_train_batch_size=32,
        weight_decay=0.01,
        num_warmup_steps=50,
        epochs={"sst2": 1, "default": 3},
    ),
}


@dataclasses.dataclass(frozen=True)
class BaselinesArguments:
    """``python -m finetune.baselines``: tasks, backbones, word vectors and the output folder."""

    glue_dir: str = arg(help="the official GLUE folder (SST-2/train.tsv, ...)")
    tasks: list[str] = arg(help="GLUE tasks (sst2 mrpc stsb cola ...)", nargs="+")
    backbones: list[str] = arg(
        help=f"{' | '.join(BASELINES)} | a model folder (SesameBert, SesameElmo, ...)", nargs="+"
    )
    output_dir: str = arg(help="results.{json,md,png}, models/, runs/")
    embeddings: str | None = arg(
        None,
        "word vectors folder of python -m tokenizer vectors (its word tokenizer is used); default: random embeddings",
    )
    tokenizer_name: str | None = arg(
        None, "word tokenizer (python -m tokenizer train --model_type elmo) when no --embeddings"
    )
    embedding_dim: int | None = arg(None, "without --embeddings (default 100)")
    max_seq_length: int = arg(64, "tokens per input")
    seed: int = arg(42, "random seed")
    num_train_epochs: float | None = arg(None, "override every recipe's epochs")


DESCRIPTION = (
    "Fine-tune classic baselines (cbow, fasttext, cnn, rnn, treelstm) and pretrained model folders on GLUE "
    "tasks with finetune.glue; write results.json, results.md and results.png. Arguments after -- are passed "
    "to every finetune.glue run."
)


def init_baseline_model(
    backbone: str,
    output_dir: str | os.PathLike,
    *,
    embeddings: str | None = None,
    tokenizer_name: str | None = None,
    embedding_dim: int | None = None,
    seed: int = 42,
    **overrides,
) -> Path:
    """Write a freshly initialised baseline folder that ``finetune.glue`` (``AutoModelForSequenceClassification``)
    loads: ``config.json`` (the ``baseline-<backbone>`` preset), ``model.safetensors`` (a
    :class:`~modeling.baselines.SesameBaselineModel`; the classifier is added by the head), the word tokenizer.

    Args:
        backbone: one of ``cbow fasttext cnn rnn treelstm``.
        output_dir: the folder (written atomically).
        embeddings: a ``python -m tokenizer vectors`` folder: its tokenizer, and the embeddings initialised from
            its vectors (:func:`modeling.baselines.load_word_vectors`). None: random embeddings.
        tokenizer_name: the word tokenizer when ``embeddings`` is None.
        embedding_dim: embedding size without ``embeddings`` (default 100).
        seed: initialisation seed.
        **overrides: config fields replacing the preset's (e.g. ``embedding_mode="static"``).

    Raises:
        InputError: an unknown backbone, or neither ``embeddings`` nor ``tokenizer_name``.
    """
    import torch
    from transformers import AutoTokenizer

    import modeling
    from modeling.baselines import SesameBaselineModel, load_word_vectors
    from training.files import atomic_output_dir

    if backbone not in BASELINES:
        raise InputError(
            f"--backbones {backbone}: not a baseline; expected one of {', '.join(BASELINES)} or a model folder"
        )
    source = embeddings or tokenizer_name
    if source is None:
        raise InputError("the baselines need a word tokenizer: pass --embeddings (vectors folder) or --tokenizer_name")
    tokenizer = AutoTokenizer.from_pretrained(source)
    info = None
    if embeddings is not None:
        from tokenizer.vectors import VECTORS_CONFIG

        info = json.loads((Path(embeddings) / VECTORS_CONFIG).read_text(encoding="utf-8"))
        dim = info["vector_size"]
        overrides.setdefault("ngram_min_n", info["min_n"])
        overrides.setdefault("ngram_max_n", info["max_n"])
        overrides.setdefault("ngram_buckets", info["bucket"])
    else:
        dim = embedding_dim or 100
    config = modeling.get_preset_config(
        f"baseline-{backbone}", vocab_size=len(tokenizer), embedding_dim=dim, **overrides
    )
    torch.manual_seed(seed)
    model = SesameBaselineModel(config)
    if embeddings is not None:
        load_word_vectors(model, embeddings, vocab=[tokenizer.convert_ids_to_tokens(i) for i in range(len(tokenizer))])
    with atomic_output_dir(output_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(output_dir)


def recipe_for(backbone: str) -> tuple[str, dict]:
    """``(recipe name, recipe)`` of a backbone: its own for a baseline, by ``model_type`` for a model folder."""
    if backbone in BASELINES:
        return backbone, RECIPES[backbone]
    config = Path(backbone) / "config.json"
    if not config.is_file():
        raise InputError(
            f"--backbones {backbone}: not a baseline ({', '.join(BASELINES)}) and no config.json there; "
            "expected a model folder written by save_pretrained"
        )
    model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type", "")
    return (model_type, RECIPES[model_type]) if model_type in RECIPES else ("default", RECIPES["default"])


def glue_command(
    task: str, model_dir: str, run_dir: Path, recipe: dict, args: BaselinesArguments, extra: list[str]
) -> list[str]:
    """The ``finetune.glue`` command line of one run (``--overwrite_output_dir``: a table cell run again replaces
    the earlier run of that cell, its checkpoints deleted first)."""
    epochs = args.num_train_epochs or recipe["epochs"].get(task, recipe["epochs"]["default"])
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
        "--max_seq_length",
        str(args.max_seq_length),
        "--learning_rate",
        str(recipe["learning_rate"]),
        "--per_device_train_batch_size",
        str(recipe["per_device_train_batch_size"]),
        "--weight_decay",
        str(recipe["weight_decay"]),
        "--num_warmup_steps",
        str(recipe["num_warmup_steps"]),
        "--num_train_epochs",
        str(epochs),
        "--seed",
        str(args.seed),
        "--report_to",
        "none",
        "--overwrite_output_dir",
        *(
            ["--max_train_samples", str(recipe["max_train_samples"][task])]
            if task in recipe.get("max_train_samples", {})
            else []
        ),
        *recipe.get("extra_args", {}).get(task, []),
        *extra,
    ]


def backbone_name(backbone: str) -> str:
    return backbone if backbone in BASELINES else Path(backbone).name


def main(argv: Sequence[str] | None = None) -> int:
    from training.arguments import split_secrets

    argv = list(sys.argv[1:] if argv is None else argv)
    # a --hub_token for the children goes to them through the environment (HF_TOKEN), never on a command line,
    # in results.json or in the log
    extra, secrets = split_secrets(argv[argv.index("--") + 1 :] if "--" in argv else [])
    child_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if secrets.get("hub_token"):
        child_env["HF_TOKEN"] = secrets["hub_token"]
    (args,) = parse_arguments(
        [BaselinesArguments],
        argv[: argv.index("--")] if "--" in argv else argv,
        prog="python -m finetune.baselines",
        description=DESCRIPTION,
    )
    from training.logs import setup_logging

    setup_logging()
    from finetune.tasks import get_task

    tasks = {name: get_task(name) for name in args.tasks}
    glue_dir = Path(args.glue_dir)
    if not glue_dir.is_dir():
        raise InputError(f"--glue_dir {glue_dir}: not a folder; expected the GLUE data folder")
    recipes = {b: recipe_for(b) for b in args.backbones}
    if any(b in BASELINES for b in args.backbones) and not (args.embeddings or args.tokenizer_name):
        raise InputError("the baselines need a word tokenizer: pass --embeddings (vectors folder) or --tokenizer_name")
    for flag in ("embeddings", "tokenizer_name"):
        if getattr(args, flag) and not Path(getattr(args, flag)).is_dir():
            raise InputError(
                f"--{flag} {getattr(args, flag)}: not a folder; expected "
                + ("python -m tokenizer vectors output" if flag == "embeddings" else "a word tokenizer folder")
            )
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tree_source = _init_baselines(args, out)
    records: list[dict] = []
    for task_name, task in tasks.items():
        for b in args.backbones:
            name = backbone_name(b)
            model_dir = out / "models" / b if b in BASELINES else Path(b)
            run_dir = out / "runs" / f"{task_name}-{name}"
            recipe_name, recipe = recipes[b]
            cmd = glue_command(task_name, str(model_dir), run_dir, recipe, args, extra)
            logger.info("%s / %s: %s", task_name, name, " ".join(cmd))
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env)
            wall = time.perf_counter() - start
            (out / "runs").mkdir(exist_ok=True)
            (out / "runs" / f"{task_name}-{name}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
            record = {
                "task": task_name,
                "backbone": name,
                "source": str(b),
                "recipe": recipe_name,
                "metric": task.main_metric,
                "command": cmd[1:],
                "wall_s": round(wall, 1),
            }
            if name in tree_source:
                record["tree_source"] = tree_source[name]
            if b in BASELINES:
                record["embeddings"] = args.embeddings or "random"
            if proc.returncode != 0:
                record["error"] = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
                logger.warning("%s / %s failed: %s", task_name, name, record["error"])
            else:
                res = json.loads((run_dir / "all_results.json").read_text(encoding="utf-8"))
                record.update(
                    value=res.get(f"eval_{task.main_metric}"),
                    train_runtime_s=res.get("train_runtime_s"),
                    eval={k: v for k, v in res.items() if k.startswith("eval_")},
                )
                logger.info("%s / %s: %s = %.4f (%.0f s)", task_name, name, task.main_metric, record["value"], wall)
            records = [r for r in records if (r["task"], r["backbone"]) != (task_name, name)] + [record]
            write_results(out, records)
    return 0


def _init_baselines(args: BaselinesArguments, out: Path) -> dict[str, str]:
    """Initialise the model folder ``out/models/<backbone>`` of every classic baseline among ``args.backbones``
    (reused when its ``init.json`` records the same settings: backbone, embeddings, tokenizer, embedding size, seed).

    Returns:
        backbone -> the source of its parse trees, for the backbones that compose trees (the Tree-LSTM).
    """
    tree_source = {}
    for b in args.backbones:
        if b in BASELINES:
            settings = {
                "backbone": b,
                "embeddings": args.embeddings,
                "tokenizer_name": args.tokenizer_name,
                "embedding_dim": args.embedding_dim,
                "seed": args.seed,
            }
            marker = out / "models" / b / "init.json"
            if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == settings:
                logger.info("%s: reusing %s (initialised with the same settings)", b, marker.parent)
            else:
                init_baseline_model(
                    b,
                    out / "models" / b,
                    embeddings=args.embeddings,
                    tokenizer_name=args.tokenizer_name,
                    embedding_dim=args.embedding_dim,
                    seed=args.seed,
                )
                marker.write_text(json.dumps(settings) + "\n", encoding="utf-8")
            if b == "treelstm":  # GLUE files carry no parse trees: the Tree-LSTM composes latent trees
                tree_source[b] = "latent (Gumbel-softmax, Choi et al. 2018): the GLUE files have no tree column"
    return tree_source


def write_results(out: Path, records: list[dict]) -> None:
    """``results.json``, ``results.md`` and ``results.png`` from the run records (rewritten after every run).

    Records already in ``results.json`` for other (task, backbone) cells are kept, under a file lock, so that
    several invocations (e.g. the baselines and the pretrained rows in parallel) can fill one table."""
    import fcntl

    with open(out / ".results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = out / "results.json"
        old = json.loads(path.read_text(encoding="utf-8"))["runs"] if path.is_file() else []
        mine = {(r["task"], r["backbone"]) for r in records}
        records = [r for r in old if (r["task"], r["backbone"]) not in mine] + records
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"runs": records}, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        _write_table(out, records)


def _write_table(out: Path, records: list[dict]) -> None:
    from finetune.tasks import TASK_NAMES

    tasks = sorted(
        dict.fromkeys(r["task"] for r in records), key=lambda t: (TASK_NAMES.index(t) if t in TASK_NAMES else 99, t)
    )
    seen = list(dict.fromkeys(r["backbone"] for r in records))  # baselines in their usual order, then model folders
    backbones = [b for b in BASELINES if b in seen] + [b for b in seen if b not in BASELINES]
    cell = {(r["task"], r["backbone"]): r for r in records}
    metric = {r["task"]: r["metric"] for r in records}

    def fmt(r):
        if r is None:
            return "--"
        if "error" in r:
            return "failed"
        return f"{100 * r['value']:.2f} ({r['train_runtime_s'] / 60:.1f} min)"

    lines = ["| backbone | " + " | ".join(f"{t} {metric[t]}" for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    lines += [f"| {b} | " + " | ".join(fmt(cell.get((t, b))) for t in tasks) + " |" for b in backbones]
    notes = sorted({f"{r['backbone']}: trees {r['tree_source']}" for r in records if "tree_source" in r})
    text = (
        "# GLUE dev results\n\nMetric x 100 on the dev set (training time in minutes).\n\n"
        + "\n".join(lines)
        + "\n"
        + "".join(f"\n{n}\n" for n in notes)
    )
    (out / "results.md").write_text(text, encoding="utf-8")
    plot_results(out / "results.png", tasks, backbones, cell, metric)


def plot_results(path: Path, tasks, backbones, cell, metric) -> None:
    """Grouped bars: one group per task, one bar per backbone, labelled with the value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: the process's backend stays as it is
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.0, 1.6 * len(tasks) * max(1, len(backbones)) / 3), 4.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / max(1, len(backbones))
    for j, b in enumerate(backbones):
        xs, ys = [], []
        for i, t in enumerate(tasks):
            r = cell.get((t, b))
            if r is not None and r.get("value") is not None:
                xs.append(i + (j - (len(backbones) - 1) / 2) * width)
                ys.append(100 * r["value"])
        bars = ax.bar(xs, ys, width, label=b)
        ax.bar_label(bars, fmt="%.1f", fontsize=6, padding=1)
    ax.set_xticks(range(len(tasks)), [f"{t}\n({metric[t]})" for t in tasks])
    ax.set_ylabel("dev metric x 100")
    ax.set_title("GLUE dev: classic baselines and pretrained models")
    ax.legend(fontsize=7, ncol=min(4, len(backbones)), loc="upper center", bbox_to_anchor=(0.5, -0.18))
    ax.axhline(0, color="black", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(run_cli(main))
