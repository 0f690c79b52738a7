"""ELMo-style BiLM recipes against each other: held-out perplexity per second and per token of ``elmo-small`` trained
with today's default settings and with other recipes, then the frozen-ScalarMix SST-2 fine-tune of each final model.

    python bench/bench_elmo_recipe.py --train_file F [F ...] --validation_file F --glue_dir DIR \\
        (--budget_minutes M | --budget_tokens N) [--recipes NAME ...] [--recipe_flags NAME='--flag v ...'] \\
        [--tasks sst2] [--seeds 3] --output_dir D

The companion of ``bench_time_to_quality.py`` (issue 22, item 5), built from its parts (child processes, caching, the
curve arithmetic, ``finetune.glue`` fine-tunes); every run goes through the project's command lines:

1. **Shared data**, cached in ``D``: one word vocabulary (``python -m tokenizer train --model_type elmo
   --vocab_size V``), and a prepared dataset per block length the recipes use (``python -m pretrain.prepare
   --model_type elmo --max_seq_length L``; the recipes' ``--max_seq_length``, default the family's).
2. **A fixed held-out set**: the first ``--max_heldout_blocks`` validation blocks of length ``--heldout_seq_length``
   (the ``--validation_file`` documents as ``pretrain`` packs them); every checkpoint is scored on it by
   :func:`heldout_perplexity`: the exact (full-softmax) perplexity over both directions, eval mode, whatever softmax
   the model trained with.
3. **Recipes** (:data:`RECIPES`; ``--recipes`` picks, ``--recipe_flags`` adds): ``python -m pretrain --model_type elmo
   --prepared_dataset D/prepared-L<L> --config_name elmo-small <flags>`` plus the bench's run flags: the budget
   (``--max_train_tokens N`` / ``--time_budget M``: pretrain's own conversions into steps, the latter by a probe on a
   copy of the model), ``--checkpointing_steps 1/points``,
   ``--logging_steps 1`` (a training time at every step), the run's own evaluation on 8 blocks at the end only.
   A ``--config_name PRESET:field=value,...`` flag is written out as a config of that preset with those fields (e.g.
   ``elmo-small:softmax=adaptive``; ``ttq.recipes.materialize_configs``).
4. **Noise**: the recipes run two at a time, one thread each (``--threads``), so that each pair shares the machine's
   noise; the seconds of a step come from ``trainer_log.json`` (evaluation and checkpoints excluded).
5. **Fine-tuning**: every final model with ``python -m finetune.glue`` (the ELMo default head: frozen BiLM, learned
   ScalarMix and its task head), the fine-tuning protocol of ``bench_time_to_quality.py`` (batch 32, 10% warmup,
   weight decay 0.01, ``--max_seq_length`` 128, SST-2 on its first 20,000 examples, median over ``--seeds``) with
   lr ``--finetune_learning_rate`` 3e-3 and ``--finetune_epochs`` 3.

Output in ``D``: ``results.json`` (``runs``: per recipe ``flags``, ``final_perplexity``, ``tokens``, ``seconds``,
``steps``, ``tokens_per_second``, ``curve`` [{``seconds``, ``tokens``, ``step``, ``perplexity``}], ``downstream``,
``downstream_seeds``; ``ratios``: per recipe against ``--baseline_recipe`` the perplexity at the baseline's final
tokens and seconds and the seconds to reach the baseline's final perplexity; ``protocol``, ``heldout``, ``timings``),
``results.md`` and ``results.png`` (perplexity vs seconds and vs tokens).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the ttq package, also when loaded by path

import ttq.common  # noqa: E402
import ttq.data  # noqa: E402
import ttq.downstream  # noqa: E402
import ttq.recipes  # noqa: E402
import ttq.scoring  # noqa: E402


def default_seq_length() -> int:
    """The block length of a recipe that does not set ``--max_seq_length``: the ELMo-style family's default."""
    from pretrain.objectives import FAMILIES

    return int(FAMILIES["elmo"].data_defaults["max_seq_length"])


#: ELMo recipes: name -> ``pretrain`` flags (added to ``--model_type elmo --config_name elmo-small``) and a note.
RECIPES: dict[str, dict] = {
    "elmo-default": dict(
        flags=[
            "--learning_rate",
            "1e-3",
            "--per_device_train_batch_size",
            "16",
            "--max_seq_length",
            "32",
            "--config_name",
            "elmo-small:softmax=full",
            "--lr_scheduler_type",
            "linear",
        ],
        note="the defaults before issue 22, spelled out: elmo-small (full softmax), lr 1e-3, linear decay, batch "
        "16 x 32 words",
    ),
    "elmo-new-default": dict(
        flags=[],
        note="no flags: the ELMo-style default for user data (issue 22: adaptive softmax, lr 2e-3, warmup-stable-"
        "1-sqrt decay, batch 16 x 32 words)",
    ),
    "elmo-adaptive": dict(
        flags=[
            "--config_name",
            "elmo-small:softmax=adaptive",
            "--learning_rate",
            "1e-3",
            "--lr_scheduler_type",
            "linear",
        ],
        note="the defaults before issue 22 with the adaptive softmax",
    ),
}
DEFAULT_RECIPES = ("elmo-default", "elmo-new-default")
#: ``pretrain`` flags the bench sets itself.
BENCH_FLAGS = (
    "--prepared_dataset",
    "--train_file",
    "--validation_file",
    "--tokenizer_name",
    "--output_dir",
    "--max_train_steps",
    "--num_train_epochs",
    "--time_budget",
    "--max_train_tokens",
    "--checkpointing_steps",
    "--checkpoints_total_limit",
    "--logging_steps",
    "--eval_steps",
    "--max_eval_samples",
    "--seed",
    "--report_to",
    "--resume_from_checkpoint",
    "--model_type",
    "--objective",
)


def parse_args(argv=None) -> argparse.Namespace:
    """The bench's arguments (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--train_file", nargs="+", required=True)
    p.add_argument("--validation_file", required=True)
    p.add_argument("--glue_dir", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--vocab_size", type=int, default=20000, help="word vocabulary (default 20000)")
    p.add_argument("--heldout_seq_length", type=int, default=64, help="block length of the held-out set")
    p.add_argument("--max_heldout_blocks", type=int, default=200)
    p.add_argument("--budget_minutes", type=float, default=None, help="training minutes per run")
    p.add_argument("--budget_tokens", type=int, default=None, help="training tokens per run")
    p.add_argument("--recipes", nargs="*", default=list(DEFAULT_RECIPES), help=f"of {', '.join(RECIPES)}")
    p.add_argument("--recipe_flags", nargs="+", default=[], metavar="NAME='--flag v ...'")
    p.add_argument("--baseline_recipe", default=None, help="the recipe the ratios compare with (default: the first)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--curve_points", type=int, default=5)
    p.add_argument("--tasks", nargs="*", default=["sst2"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--finetune_learning_rate", type=float, default=3e-3)
    p.add_argument("--finetune_epochs", type=float, default=3)
    p.add_argument("--max_train_samples", type=int, default=None)
    p.add_argument("--finetune_parallel", type=int, default=2)
    p.add_argument("--keep_finetuned", action="store_true")
    args = p.parse_args(argv)
    if (args.budget_minutes is None) == (args.budget_tokens is None):
        p.error("give exactly one of --budget_minutes and --budget_tokens")
    table = {name: list(RECIPES[name]["flags"]) for name in args.recipes if name in RECIPES}
    unknown = [n for n in args.recipes if n not in RECIPES]
    if unknown:
        p.error(f"--recipes {' '.join(unknown)}: unknown; expected some of {', '.join(RECIPES)}")
    for entry in args.recipe_flags:
        name, sep, flags = entry.partition("=")
        if not sep or not name or name in table:
            p.error(f"--recipe_flags {entry!r}: expected NAME='--flag value ...' with a new name")
        table[name] = shlex.split(flags)
    for name, flags in table.items():
        taken = [f for f in flags if f.split("=")[0] in BENCH_FLAGS]
        if taken:
            p.error(f"recipe {name}: {' '.join(taken)} is set by the bench")
    if not table:
        p.error("no recipe: expected --recipes or --recipe_flags")
    args.recipe_table = table
    args.baseline_recipe = args.baseline_recipe or next(iter(table))
    return args


def seq_length(flags: list[str]) -> int:
    """The block length a recipe trains on."""
    return int(ttq.common.flag_value(flags, "--max_seq_length", str(default_seq_length())))


def prepare_data(args, out: Path) -> dict:
    """The word vocabulary and one prepared dataset per block length (recipes' and the held-out one), cached."""
    sources = [(str(Path(f).resolve()), ttq.common.file_sha256(f)) for f in [*args.train_file, args.validation_file]]
    tok = ttq.common.cached(
        out / "tokenizer",
        {"sources": sources, "vocab_size": args.vocab_size},
        lambda d: ttq.common.run_jobs(
            [
                ttq.common.Job(
                    "tokenizer",
                    ttq.data.tokenizer_command("elmo", args.train_file, args.vocab_size, d),
                    out / "logs" / "tokenizer.log",
                )
            ],
            1,
        ),
    )
    prepared = {}
    for length in sorted({args.heldout_seq_length, *(seq_length(f) for f in args.recipe_table.values())}):
        command = ttq.data.prepare_command(args, tok, length, "--model_type", "elmo")
        folder = ttq.common.cached(
            out / f"prepared-L{length}",
            {"sources": sources, "length": length, "tokenizer": ttq.common.file_sha256(tok / "vocab.txt")},
            lambda d, command=command, length=length: ttq.common.run_jobs(
                [ttq.common.Job("prepare", [*command, str(d)], out / "logs" / f"prepare-L{length}.log")], 1
            ),
        )
        prepared[length] = {"path": folder, "manifest": json.loads((folder / "manifest.json").read_text())}
    return {"tokenizer": tok, "prepared": prepared}


def run_command(name: str, flags: list[str], args, data: dict, out: Path) -> list[str]:
    """The ``pretrain`` command of a recipe (see the module docstring, item 3)."""
    length = seq_length(flags)
    if args.budget_tokens is not None:
        budget = ["--max_train_tokens", str(args.budget_tokens)]
    else:
        budget = ["--time_budget", str(args.budget_minutes)]
    every = f"{1 / args.curve_points:.6g}" if args.curve_points > 1 else "1000000000"
    return [
        sys.executable,
        "-m",
        "pretrain",
        "--model_type",
        "elmo",
        "--config_name",
        "elmo-small",
        *ttq.recipes.materialize_configs(flags, out),
        "--prepared_dataset",
        str(data["prepared"][length]["path"]),
        "--output_dir",
        str(out / "runs" / name),
        "--overwrite_output_dir",
        *budget,
        "--seed",
        str(args.seed),
        "--checkpointing_steps",
        every,
        "--checkpoints_total_limit",
        "0",
        "--logging_steps",
        "1",
        "--eval_steps",
        "1000000000",
        "--max_eval_samples",
        "8",
        "--report_to",
        "none",
    ]


def heldout_batches(validation, n_blocks: int, tokenizer, batch_size: int = 32):
    """The held-out set as ``BiLMCollator`` batches: the first ``n_blocks`` validation blocks, in order."""
    from pretrain.collators import BiLMCollator

    collator = BiLMCollator(tokenizer)
    rows = [validation[i] for i in range(min(n_blocks, len(validation)))]
    return [collator(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]


def heldout_perplexity(model, batches) -> float:
    """exp(mean NLL) over both directions' predicted tokens of ``batches``, ``model`` in eval mode: the exact
    full-softmax perplexity (:func:`pretrain.objectives.bilm_eval_step`), accumulated in float64."""
    import torch

    from pretrain.objectives import bilm_eval_step

    model.eval()
    nll, count = 0.0, 0.0
    with torch.inference_mode():
        for batch in batches:
            sums = bilm_eval_step(model, batch)
            nll += float(sums["nll_sum"])
            count += float(sums["count"])
    return math.exp(nll / max(count, 1.0))


def load_bilm(folder: Path, weights: Path | None = None):
    """``AutoModelForPreTraining`` of a run folder, optionally with a checkpoint's ``model.safetensors``."""
    from transformers import AutoModelForPreTraining

    import modeling  # noqa: F401

    return ttq.scoring.from_pretrained_with(AutoModelForPreTraining, folder, weights)


def score_run(name: str, flags: list[str], data: dict, out: Path, batches) -> list[dict]:
    """The run's curve at its checkpoints: training seconds and tokens (``trainer_log.json``), held-out perplexity."""
    folder = out / "runs" / name
    manifest = data["prepared"][seq_length(flags)]["manifest"]
    config = json.loads((folder / "run_config.json").read_text())
    batch = config["per_device_train_batch_size"] * config["gradient_accumulation_steps"]
    times = ttq.scoring.times_from_trainer_log(
        json.loads((folder / "trainer_log.json").read_text()), manifest["blocks"]["train"], batch
    )
    curve = []
    for ckpt in sorted((folder / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1])):
        step = int(ckpt.name.split("_")[1])
        model = load_bilm(folder, ckpt / "model.safetensors")
        curve.append(
            {
                "seconds": times[step]["seconds"],
                "tokens": times[step]["tokens"],
                "step": step,
                "perplexity": heldout_perplexity(model, batches),
            }
        )
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    return curve


def compare(ours: list[dict], base: list[dict]) -> dict:
    """Against the baseline's curve: our perplexity at its final tokens and seconds (log-perplexity interpolated),
    and the seconds we need to reach its final perplexity (None: not reached) and the ratio to its seconds."""

    def at(curve, key, x):
        return float(math.exp(np.interp(x, [p[key] for p in curve], [math.log(p["perplexity"]) for p in curve])))

    target = base[-1]["perplexity"]
    as_loss = [{**p, "eval_loss": math.log(p["perplexity"])} for p in ours]
    seconds, _ = ttq.scoring.seconds_to_reach(as_loss, math.log(target))
    return {
        "perplexity_at_baseline_tokens": at(ours, "tokens", base[-1]["tokens"]),
        "perplexity_at_baseline_seconds": at(ours, "seconds", base[-1]["seconds"]),
        "baseline_perplexity": target,
        "seconds_to_baseline_perplexity": seconds,
        "time_to_quality": base[-1]["seconds"] / seconds if seconds else None,
    }


def _run_record(name, flags, curve):
    """Take a recipe's name, its flag list and its scored curve; return its entry for results["runs"]."""
    last = curve[-1]
    return {
        "flags": flags,
        "note": RECIPES.get(name, {}).get("note", "--recipe_flags"),
        "final_perplexity": last["perplexity"],
        "tokens": last["tokens"],
        "seconds": last["seconds"],
        "steps": last["step"],
        "tokens_per_second": last["tokens"] / max(last["seconds"], 1e-9),
        "curve": curve,
    }


def _protocol(args, batches, load_before):
    """Take the parsed args, the held-out batches and the load average at start; return results["protocol"]."""
    return {
        "budget_minutes": args.budget_minutes,
        "budget_tokens": args.budget_tokens,
        "vocab_size": args.vocab_size,
        "threads_per_run": args.threads,
        "seed": args.seed,
        "heldout": {
            "seq_length": args.heldout_seq_length,
            "blocks": sum(len(b["input_ids"]) for b in batches),
            "score": "exact full-softmax perplexity, both directions, eval mode",
        },
        "finetune": {
            **ttq.downstream.FINETUNE,
            "learning_rate": args.finetune_learning_rate,
            "num_train_epochs": args.finetune_epochs,
            "tasks": args.tasks,
            "seeds": [42 + i for i in range(args.seeds)],
            "head": "finetune.glue default for SesameElmo: frozen BiLM + ScalarMix",
        },
        "load_average_before": load_before,
        "cpu_count": os.cpu_count(),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    timings, t0, load_before = {}, time.perf_counter(), os.getloadavg()[0]
    data = prepare_data(args, out)
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    import modeling  # noqa: F401  (the ELMo tokenizer)

    tokenizer = AutoTokenizer.from_pretrained(str(data["tokenizer"]))
    validation = load_from_disk(str(data["prepared"][args.heldout_seq_length]["path"] / "validation"))
    batches = heldout_batches(validation, args.max_heldout_blocks, tokenizer)
    timings["data"] = round(time.perf_counter() - t0, 1)
    names = list(args.recipe_table)
    runs = {}
    for i in range(0, len(names), 2):
        group = names[i : i + 2]
        jobs = [
            ttq.common.Job(
                n,
                run_command(n, args.recipe_table[n], args, data, out),
                out / "logs" / f"{n}.log",
                ttq.common.child_env(args.threads),
            )
            for n in group
        ]
        ttq.common.log("  ".join(group))
        ttq.common.run_jobs(jobs, parallel=len(jobs))
        for n in group:
            curve = score_run(n, args.recipe_table[n], data, out, batches)
            last = curve[-1]
            runs[n] = _run_record(n, args.recipe_table[n], curve)
            ttq.common.log(
                f"{n}: held-out perplexity {last['perplexity']:.1f} after {last['step']} steps, "
                f"{last['tokens']:.3g} tokens, {last['seconds']:.0f} s"
            )
    timings["pretraining"] = round(time.perf_counter() - t0 - timings["data"], 1)
    base = runs[args.baseline_recipe]["curve"]
    results = {
        "command": ["python", os.path.relpath(__file__), *(argv if argv is not None else sys.argv[1:])],
        "protocol": _protocol(args, batches, load_before),
        "baseline_recipe": args.baseline_recipe,
        "ratios": {n: compare(r["curve"], base) for n, r in runs.items()},
        "runs": runs,
        "timings": timings,
    }
    write_outputs(results, out)
    if args.tasks:
        finetune_args = argparse.Namespace(**{**vars(args), "max_seq_length": 128})
        for name, rec in ttq.downstream.finetune_all({n: out / "runs" / n for n in runs}, finetune_args, out).items():
            runs[name].update(rec)
        timings["finetuning"] = round(time.perf_counter() - t0 - sum(timings.values()), 1)
        write_outputs(results, out)
    for name, run in runs.items():
        r = results["ratios"][name]
        print(
            f"{name:20s} perplexity {run['final_perplexity']:8.1f}  {run['steps']} steps  {run['tokens']:.3g} "
            f"tokens  {run['seconds']:.0f} s  {run['tokens_per_second']:.0f} tokens/s  at the baseline's seconds "
            f"{r['perplexity_at_baseline_seconds']:.1f}  {run.get('downstream', {})}"
        )
    return 0


def write_outputs(results: dict, out: Path) -> None:
    """``results.json``, ``results.md`` and ``results.png``."""
    results["protocol"]["load_average_after"] = os.getloadavg()[0]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    tasks = results["protocol"]["finetune"]["tasks"]
    lines = [
        f"# ELMo recipes (baseline: {results['baseline_recipe']})",
        "",
        "| recipe | steps | tokens | train s | tokens/s | held-out perplexity | at baseline tokens | at baseline "
        "seconds | s to baseline perplexity |" + "".join(f" {t} |" for t in tasks),
        "|---" * (9 + len(tasks)) + "|",
    ]
    for name, run in results["runs"].items():
        r = results["ratios"][name]
        down = run.get("downstream", {})
        reached = r["seconds_to_baseline_perplexity"]
        lines.append(
            f"| {name} | {run['steps']} | {run['tokens']:.3g} | {run['seconds']:.0f} | "
            f"{run['tokens_per_second']:.0f} | {run['final_perplexity']:.1f} | "
            f"{r['perplexity_at_baseline_tokens']:.1f} | {r['perplexity_at_baseline_seconds']:.1f} | "
            f"{'not reached' if reached is None else f'{reached:.0f}'} |"
            + "".join(f" {'--' if down.get(t) is None else f'{100 * down[t]:.1f}'} |" for t in tasks)
        )
    lines += [
        "",
        *[f"- `{n}`: `{' '.join(r['flags']) or '(no flags)'}` -- {r['note']}" for n, r in results["runs"].items()],
        "",
        f"Protocol: {json.dumps(results['protocol'])}",
        "",
        "```",
        shlex.join(results["command"]),
        "```",
        "",
    ]
    (out / "results.md").write_text("\n".join(lines), encoding="utf-8")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for ax, key in zip(axes, ("seconds", "tokens")):
        for name, run in results["runs"].items():
            ax.plot([p[key] for p in run["curve"]], [p["perplexity"] for p in run["curve"]], marker="o", label=name)
        ax.set_xlabel(f"training {key}")
        ax.set_ylabel("held-out perplexity (exact)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("ELMo-style BiLM recipes")
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=100)


if __name__ == "__main__":
    sys.exit(main())
