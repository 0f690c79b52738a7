"""The command line of ``bench/bench_time_to_quality.py`` (its arguments, the device defaults) and :func:`main`, which
runs the phases in order (or the reference process, ``_reference``, or the plan, ``--plan_only``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from . import __doc__ as BENCH_DOC
from .common import REFERENCE_MODELS, SCRIPT, SHAPES, log
from .data import build_heldout, prepare_shared_data
from .downstream import (
    FINETUNE,
    TASK_METRICS,
    finetune_all,
    finetune_worker_main,
    make_random_inits,
    pretraining_buys,
    read_baselines,
)
from .phases import budget_steps, pretrain_and_score, reference_sweep, summarize_pairs
from .plan import PLAN_COSTS, print_plan
from .recipes import DEFAULT_RECIPES, RECIPES, select_recipes
from .reference import reference_main
from .report import budget_protocol, print_ratios, protocol, write_outputs
from .runs import plan_pairs, shared_copies
from .scoring import heldout_loss, load_mlm, scoring_device, training_unigram_loss

#: The cap of the default ``--preprocessing_num_workers`` (more processes than this gain little on corpora this size).
MAX_DEFAULT_WORKERS = 16


def _add_data_args(p: argparse.ArgumentParser) -> None:
    """Add the "data" argument group to parser ``p``; returns None."""
    d = p.add_argument_group("data")
    d.add_argument("--train_file", nargs="+", required=True, help="pretraining text files (.txt/.txt.gz)")
    d.add_argument("--validation_file", required=True, help="held-out documents (the fixed masked set)")
    d.add_argument("--glue_dir", required=True, help="GLUE folder (SST-2/train.tsv, ...)")
    d.add_argument("--output_dir", required=True, help="results.{json,md,png} and every run folder; caches data")
    d.add_argument("--vocab_size", type=int, default=8000, help="WordPiece vocabulary (default 8000)")
    d.add_argument("--max_seq_length", type=int, default=128, help="block length (default 128)")
    d.add_argument("--heldout_seed", type=int, default=1234, help="seed of the held-out masks")
    d.add_argument("--max_heldout_blocks", type=int, default=None, help="use the first N held-out blocks")
    d.add_argument(
        "--preprocessing_num_workers",
        type=int,
        default=None,
        help="processes (threads for the tokenizer trainer) of the data phase "
        f"(default: the machine's cores, at most {MAX_DEFAULT_WORKERS})",
    )


def _add_budget_args(p: argparse.ArgumentParser) -> None:
    """Add the "budget and runs" argument group to parser ``p``; returns None."""
    b = p.add_argument_group("budget and runs")
    b.add_argument("--budget_minutes", type=float, default=None, help="training minutes per run")
    b.add_argument("--budget_tokens", type=int, default=None, help="training tokens per run (instead of minutes)")
    b.add_argument("--model_shape", choices=list(SHAPES), default="bert-tiny")
    b.add_argument(
        "--reference_model",
        choices=REFERENCE_MODELS,
        default="bert",
        help="the reference trained the run_mlm way: transformers' BertForMaskedLM at --model_shape (default), or "
        "ModernBertForMaskedLM at the modern preset of its width (modernbert-tiny at bert-tiny: the peer of the "
        "sesame-modern recipe)",
    )
    b.add_argument("--batch_size", type=int, default=32, help="blocks per optimizer step (default 32)")
    b.add_argument(
        "--recipes",
        nargs="*",
        default=list(DEFAULT_RECIPES),
        help=f"our recipes, of {', '.join(RECIPES)} (default: {' '.join(DEFAULT_RECIPES)})",
    )
    b.add_argument(
        "--recipe_flags",
        nargs="+",
        default=[],
        metavar="NAME='--flag v ...'",
        help="ad-hoc recipes: pretrain flags for a new name (run after --recipes)",
    )
    b.add_argument("--default_recipe", default=None, help="the recipe of the top-level ratios (default: the first)")
    b.add_argument(
        "--reference_lrs",
        nargs="+",
        type=float,
        default=[5e-4, 1e-3, 2e-3],
        help="the reference's learning-rate sweep (one value: no sweep)",
    )
    b.add_argument(
        "--reference_sweep_fraction",
        type=float,
        default=0.25,
        help="sweep runs last this fraction of the reference's steps (default 0.25)",
    )
    b.add_argument("--reference_weight_decay", type=float, default=0.0, help="run_mlm's default 0.0")
    b.add_argument(
        "--reference_mixed_precision",
        choices=["no", "bf16"],
        default=None,
        help="the reference's autocast (default: bf16 on CUDA; no on the CPU, run_mlm's default)",
    )
    b.add_argument(
        "--mixed_precision",
        choices=["no", "bf16"],
        default=None,
        help="our recipes' --mixed_precision, before each recipe's own flags (a recipe's own value wins; default: "
        "bf16 on CUDA; on the CPU none is added: pretrain's default)",
    )
    b.add_argument("--seed", type=int, default=42, help="pretraining seed of repeat 0; random-init seed")
    b.add_argument(
        "--schedule",
        choices=["paired", "sequential", "shared"],
        default=None,
        help="paired (the CPU default): each recipe runs at the same time as its reference copy; sequential (the "
        "CUDA default): one run at a time, one reference run per repeat serving every recipe; "
        "shared (--budget_tokens only; a recipe search): one reference run per repeat, paired with "
        "the first recipe, serves every recipe; the other recipes run two at a time",
    )
    b.add_argument("--threads", type=int, default=1, help="threads per training process (OMP_NUM_THREADS)")
    b.add_argument("--repeats", type=int, default=1, help="repeat every pair with seeds seed+r; medians reported")
    b.add_argument(
        "--probe_steps",
        type=int,
        default=10,
        help="steps of the reference's budget probe, in its process (default 10, as pretrain --time_budget's)",
    )
    b.add_argument("--probe_warmup", type=int, default=2, help="probe steps not timed (default 2, as pretrain's)")
    b.add_argument("--curve_points", type=int, default=10, help="held-out scores per run (checkpoints)")
    b.add_argument("--keep_checkpoints", action="store_true", help="keep the runs' checkpoints after scoring")
    b.add_argument(
        "--plan_only",
        nargs="?",
        const="h100",
        default=None,
        choices=["h100"],
        help="print the phases and their estimated seconds for these flags on that machine (PLAN_COSTS; its "
        "device's defaults and cores) and exit; runs nothing, reads nothing but --glue_dir's train.tsv sizes",
    )


def _add_finetune_args(p: argparse.ArgumentParser) -> None:
    """Add the "fine-tuning" argument group to parser ``p``; returns None."""
    f = p.add_argument_group("fine-tuning")
    f.add_argument("--tasks", nargs="*", default=["sst2", "mrpc", "stsb", "cola"], help="GLUE tasks (none: skip)")
    f.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds per task (42, 43, ...)")
    f.add_argument("--finetune_learning_rate", type=float, default=1e-4)
    f.add_argument("--finetune_epochs", type=float, default=FINETUNE["num_train_epochs"])
    f.add_argument("--max_train_samples", type=int, default=None, help="cap every task's training examples")
    f.add_argument("--finetune_parallel", type=int, default=2, help="fine-tuning processes at once (1 thread each)")
    f.add_argument(
        "--random_inits",
        nargs="*",
        choices=["sesame", "bert"],
        default=["sesame"],
        help="random inits fine-tuned as the no-pretraining baseline (default: sesame)",
    )
    f.add_argument("--baselines_results", default=None, help="a finetune.baselines results.json")
    f.add_argument("--keep_finetuned", action="store_true", help="keep the fine-tuned weights")


def default_workers() -> int:
    """The data phase's default processes: the cores this process may use, at most :data:`MAX_DEFAULT_WORKERS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def apply_device_defaults(args: argparse.Namespace, cuda: bool) -> argparse.Namespace:
    """Fill the device-dependent defaults that were not given: on CUDA ``--schedule sequential`` and bf16 for both
    sides (``--reference_mixed_precision bf16``, ``--mixed_precision bf16``); on the CPU ``paired``, the reference in
    float32 and no ``--mixed_precision`` for our recipes (pretrain's default). Also ``--preprocessing_num_workers``
    (:func:`default_workers`). Returns ``args``."""
    if args.schedule is None:
        args.schedule = "sequential" if cuda else "paired"
    if args.reference_mixed_precision is None:
        args.reference_mixed_precision = "bf16" if cuda else "no"
    if args.mixed_precision is None and cuda:
        args.mixed_precision = "bf16"
    if args.preprocessing_num_workers is None:
        args.preprocessing_num_workers = default_workers()
    return args


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Validate ``args`` (p.error if bad); fill in recipe_table and default_recipe; return args."""
    if args.preprocessing_num_workers is not None and args.preprocessing_num_workers < 1:
        p.error(f"--preprocessing_num_workers {args.preprocessing_num_workers}: expected at least 1")
    if (args.budget_minutes is None) == (args.budget_tokens is None):
        p.error("give exactly one of --budget_minutes and --budget_tokens")
    if args.repeats < 1 or args.seeds < 1 or args.curve_points < 1 or args.threads < 1:
        p.error("--repeats, --seeds, --curve_points and --threads must be >= 1")
    if args.schedule == "shared" and args.budget_tokens is None:
        p.error("--schedule shared: needs --budget_tokens (a wall-clock budget is converted per run, paired)")
    if args.probe_steps <= args.probe_warmup:
        p.error("--probe_steps must exceed --probe_warmup")
    unknown = [t for t in args.tasks if t not in TASK_METRICS]
    if unknown:
        p.error(f"--tasks {' '.join(unknown)}: expected GLUE tasks of {', '.join(TASK_METRICS)}")
    try:
        args.recipe_table = select_recipes(args.recipes, args.recipe_flags)
    except ValueError as err:
        p.error(str(err))
    args.default_recipe = args.default_recipe or next(iter(args.recipe_table))
    if args.default_recipe not in args.recipe_table:
        p.error(f"--default_recipe {args.default_recipe}: not one of the recipes run ({', '.join(args.recipe_table)})")
    return args


def parse_args(argv=None, cuda: bool | None = None) -> argparse.Namespace:
    """The bench's arguments (see the module docstring); the device defaults (:func:`apply_device_defaults`) follow
    ``cuda`` (None: ``torch.cuda.is_available()``)."""
    p = argparse.ArgumentParser(description=BENCH_DOC.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    _add_data_args(p)
    _add_budget_args(p)
    _add_finetune_args(p)
    args = p.parse_args(argv)
    if args.plan_only:  # the defaults of the planned machine, not of this one
        machine = PLAN_COSTS[args.plan_only]["machine"]
        cuda = machine["cuda"]
        if args.preprocessing_num_workers is None:
            args.preprocessing_num_workers = min(machine["cores"], MAX_DEFAULT_WORKERS)
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return _check_args(p, apply_device_defaults(args, cuda))


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


class _Laps:
    """Wall seconds per phase (``results.json``'s ``timings``): :meth:`lap` closes the phase running since the
    last lap."""

    def __init__(self):
        self.timings: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def lap(self, phase: str) -> None:
        self.timings[phase] = round(time.perf_counter() - self.t0, 1)
        self.t0 = time.perf_counter()


def _pretrain_all(args, out: Path, data: dict, heldout: dict, unigram: float, laps: _Laps) -> dict:
    """The budget, the reference's sweep, every pair trained and scored, the summaries and the random inits:
    ``{"lr", "sweep", "steps" ({run: steps}), "budget" (how the budget became steps), "runs", "ratios",
    "models" (the folders to fine-tune)}``."""
    pairs = plan_pairs(args, out)
    ref_steps, recipe_steps = budget_steps(args, pairs)
    lr, sweep = reference_sweep(args, data, out, heldout, ref_steps)
    log(f"reference learning rate {lr:g}")
    laps.lap("sweep")
    for ref, ours in pairs:
        ref.lr, ref.steps = lr, ref_steps
        ours.steps = recipe_steps[ours.recipe]
    copies = pretrain_and_score(pairs, args, data, out, heldout)
    shared_copies(pairs, copies)
    laps.lap("pretraining")
    runs, ratios = summarize_pairs(args, pairs, copies, unigram)
    models = {"reference": pairs[0][0].folder}
    models.update({ours.recipe: ours.folder for _, ours in pairs if ours.repeat == 0})
    inits = make_random_inits(args, out, data)
    for name, folder in inits.items():
        runs[name] = {
            "kind": "random-init",
            "flags": [],
            "final_eval_loss": heldout_loss(load_mlm(folder).to(scoring_device()), heldout),
        }
    models.update({name: folder for name, folder in inits.items() if name[len("random-") :] in args.random_inits})
    laps.lap("scoring")
    steps = {name: run["steps"] for name, run in runs.items() if "steps" in run}
    return dict(
        lr=lr, sweep=sweep, steps=steps, budget=budget_protocol(args, copies), runs=runs, ratios=ratios, models=models
    )


def _results(args, argv: list[str], data: dict, hinfo: dict, unigram: float, done: dict, laps: _Laps, load: float):
    """``results.json``'s record (see the package docstring) of the pretraining phases' ``done``
    (:func:`_pretrain_all`), before fine-tuning."""
    ratios = done["ratios"]
    return {
        "command": ["python", os.path.relpath(SCRIPT), *argv],
        "protocol": protocol(args, data, done["lr"], done["steps"], done["budget"], load),
        "heldout_sha256": hinfo["sha256"],
        "heldout": {k: hinfo[k] for k in ("blocks", "tokens", "masked")} | {"seed": args.heldout_seed},
        "unigram_loss": unigram,
        "ratios": {
            "default_recipe": args.default_recipe,
            "quality_per_token": ratios[args.default_recipe]["quality_per_token"],
            "time_to_quality": ratios[args.default_recipe]["time_to_quality"],
            "by_recipe": ratios,
        },
        "runs": done["runs"],
        "pretraining_buys": {},
        "baselines": read_baselines(args.baselines_results, args.tasks),
        "sweep": done["sweep"],
        "timings": laps.timings,
    }


def main(argv=None) -> int:
    """The bench (see the package docstring): its phases in order, or the reference process (``_reference``), the
    fine-tuning worker (``_finetune``) or the plan (``--plan_only``). Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_reference":
        reference_main(argv[1:])
        return 0
    if argv and argv[0] == "_finetune":
        return finetune_worker_main(argv[1:])
    args = parse_args(argv)
    if args.plan_only:
        print_plan(args, args.plan_only)
        return 0
    signal.signal(signal.SIGTERM, _terminate)  # unwind (children stopped by run_jobs) instead of dying at once
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    laps, load_before = _Laps(), os.getloadavg()[0]
    data = prepare_shared_data(args, out)
    heldout, hinfo = build_heldout(args, out, data)
    unigram = training_unigram_loss(data["reference_blocks"], data["tokenizer"], heldout)
    log(
        f"held-out: {hinfo['blocks']} blocks, {hinfo['masked']} masked tokens, sha256 {hinfo['sha256'][:12]}; "
        f"unigram loss {unigram:.4f}"
    )
    laps.lap("data")
    done = _pretrain_all(args, out, data, heldout, unigram, laps)
    results = _results(args, argv, data, hinfo, unigram, done, laps, load_before)
    write_outputs(results, out)  # the pretraining figures, in case fine-tuning is cut short
    if args.tasks:
        for name, rec in finetune_all(done["models"], args, out).items():
            results["runs"][name].update(rec)
        laps.lap("finetuning")
        results["pretraining_buys"] = pretraining_buys(results["runs"], results["baselines"])
        write_outputs(results, out)
    print_ratios(results)
    return 0
