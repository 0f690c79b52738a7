"""``--plan_only``: the bench's phases and their estimated seconds on a planned machine (:data:`PLAN_COSTS`),
running nothing."""

from __future__ import annotations

import math
from pathlib import Path

from .common import PRETRAIN_PROBE_STEPS, SHAPES
from .downstream import FINETUNE, FINETUNE_MAX_TRAIN_SAMPLES
from .recipes import data_variant

#: GLUE training-set sizes (examples), for the plan when ``--glue_dir`` is not readable.
GLUE_TRAIN_SIZES = {
    "cola": 8551,
    "sst2": 67349,
    "mrpc": 3668,
    "qqp": 363846,
    "stsb": 5749,
    "mnli": 392702,
    "qnli": 104743,
    "rte": 2490,
    "wnli": 635,
}


#: Cost models of ``--plan_only``: seconds of each piece of work on one machine. ``measured`` entries are issue 30's
#: H100 figures (main at c9db05c, bert-base S128 x B256, bf16 both sides, vocabulary 8000, 16 cores); ``assumed``
#: entries were not measured there and are labelled as such in the plan's output.
PLAN_COSTS: dict[str, dict] = {
    "h100": {
        "machine": {"cuda": True, "cores": 16},
        "measured": {
            # budget probes: 619 steps in 75 s (transformers' plain loop), 592 for pretrain
            "reference_step_s": 75 / 619,
            "recipe_step_s": 75 / 592,
            "at": {"model_shape": "bert-base", "batch_size": 256, "max_seq_length": 128},
            # tokenizer + prepare + reference blocks + held-out, one worker per step, on the machine's 16 cores
            "data_one_worker_s": 210.0,
        },
        "assumed": {
            # the data phase's share that --preprocessing_num_workers spreads over processes (tokenizer training,
            # prepare's tokenize and pack maps, the reference's tokenization: 127 + 80 + ~50 s of 264 s with one
            # worker on the 2-core CPU; the files are read and decompressed in one process, hence less than that),
            # and what each worker after the first adds
            "data_parallel_share": 0.8,
            "worker_efficiency": 0.5,
            "prepare_share": 0.30,  # one more prepared variant (another --document_masking / --objective)
            "process_start_s": {"reference": 15.0, "recipe": 25.0, "finetune": 20.0},
            "checkpoint_save_s": 1.5,  # pretrain's save_state of a bert-base (weights + AdamW moments, ~1.3 GB)
            "score_s": 1.0,  # one held-out scoring on the device (698 blocks: ~2e13 FLOP in float32)
            "checkpoint_load_s": 0.5,  # a checkpoint's model.safetensors into the bench's scoring model
            "finetune_step_s": 0.04,  # bert-base, batch 32, float32, GLUE sentence lengths
            "finetune_eval_s": 3.0,
            "random_inits_s": 10.0,  # two random inits built, saved and scored
            "finetune_parallel_efficiency": 0.8,  # two fine-tunes sharing one GPU
        },
    },
}


def _shape_flops(shape: str) -> float:
    """Per-token training FLOP proxy of a :data:`SHAPES` entry: 6 x the encoder's weights (12 H^2 per layer)."""
    s = SHAPES[shape]
    return 6.0 * s["num_hidden_layers"] * 12 * s["hidden_size"] ** 2


def _data_phase(args, costs: dict) -> dict:
    """The data phase of :func:`plan_phases`: the one-worker time x the prepared variants, its parallel share spread
    over ``--preprocessing_num_workers``."""
    m, a = costs["measured"], costs["assumed"]
    variants = len({"prepared", *(data_variant(f) for f in args.recipe_table.values())})
    workers = args.preprocessing_num_workers
    speedup = 1 + (workers - 1) * a["worker_efficiency"]  # each worker after the first adds that share of one
    share = a["data_parallel_share"]
    seconds = m["data_one_worker_s"] * (1 + a["prepare_share"] * (variants - 1)) * ((1 - share) + share / speedup)
    return {
        "phase": "data",
        "seconds": seconds,
        "detail": f"{m['data_one_worker_s']:.0f} s with one worker (measured), {variants} prepared variant(s), "
        f"{share:.0%} of it over {workers} workers at {a['worker_efficiency']:.0%} efficiency (assumed)",
    }


def _step_seconds(args, costs: dict) -> dict[str, float]:
    """``{"reference", "recipe"}``: seconds per optimizer step, scaled from the measured shape and batch by
    :func:`_shape_flops` x tokens per step."""
    m = costs["measured"]
    at = m["at"]
    scale = (_shape_flops(args.model_shape) * args.batch_size * args.max_seq_length) / (
        _shape_flops(at["model_shape"]) * at["batch_size"] * at["max_seq_length"]
    )
    return {"reference": m["reference_step_s"] * scale, "recipe": m["recipe_step_s"] * scale}


def _sizing_seconds(args, step: dict[str, float]) -> dict[str, float]:
    """Seconds a run spends sizing its schedule in its process: with ``--budget_minutes`` the reference's
    ``--probe_steps`` and ours' :data:`PRETRAIN_PROBE_STEPS` steps (on copies of the models); none for tokens."""
    if args.budget_minutes is None:
        return {"reference": 0.0, "recipe": 0.0}
    return {"reference": args.probe_steps * step["reference"], "recipe": PRETRAIN_PROBE_STEPS * step["recipe"]}


def _training_phases(args, costs: dict) -> list[dict]:
    """The sweep and pretraining phases of :func:`plan_phases`."""
    a, step = costs["assumed"], _step_seconds(args, costs)
    start, sizing = a["process_start_s"], _sizing_seconds(args, step)
    k, r, paired = len(args.recipe_table), args.repeats, args.schedule == "paired"
    if args.budget_minutes is not None:
        run_s = {kind: args.budget_minutes * 60 for kind in step}
    else:
        tokens_per_step = args.batch_size * args.max_seq_length
        run_s = {kind: math.ceil(args.budget_tokens / tokens_per_step) * step[kind] for kind in step}
    lrs, sweep = len(args.reference_lrs), 0.0
    if lrs > 1:
        width = 1 if args.schedule == "sequential" else 2
        sweep = math.ceil(lrs / width) * (
            start["reference"] + sizing["reference"] + args.reference_sweep_fraction * run_s["reference"] + a["score_s"]
        )
    points = args.curve_points
    ref_run = start["reference"] + sizing["reference"] + run_s["reference"] + points * a["score_s"]
    ours_run = start["recipe"] + sizing["recipe"] + run_s["recipe"] + points * a["checkpoint_save_s"]
    ours_score = points * (a["checkpoint_load_s"] + a["score_s"])
    pretraining = (
        r * k * (max(ref_run, ours_run) + ours_score) if paired else r * (ref_run + k * (ours_run + ours_score))
    )
    sized = (
        f"; each run sizes its schedule in its process (probe: reference {args.probe_steps} steps of "
        f"{step['reference'] * 1000:.0f} ms, ours {PRETRAIN_PROBE_STEPS} of {step['recipe'] * 1000:.0f} ms)"
        if args.budget_minutes is not None
        else ""
    )
    return [
        {
            "phase": "sweep",
            "seconds": sweep,
            "detail": f"{lrs} learning rate(s), {args.reference_sweep_fraction:g} of the reference's steps each",
        },
        {
            "phase": "pretraining",
            "seconds": pretraining,
            "detail": f"{r} repeat(s) x {k} recipe(s) ({', '.join(args.recipe_table)}), {run_s['recipe']:.0f} s of "
            f"steps per run, {points} curve "
            f"points (reference: scored in its process; ours: saved, then scored in the bench){sized}",
        },
    ]


def _finetuning_phase(args, costs: dict, glue_sizes: dict[str, int] | None) -> dict:
    """The fine-tuning phase of :func:`plan_phases`: every model x task x seed, ``--finetune_parallel`` worker
    processes (one start-up each, the fine-tunes in them one after another)."""
    a = costs["assumed"]
    sizes = {**GLUE_TRAIN_SIZES, **(glue_sizes or {})}
    per_model = 0.0
    for task in args.tasks:
        caps = [x for x in (FINETUNE_MAX_TRAIN_SAMPLES.get(task), args.max_train_samples) if x is not None]
        n = min([sizes[task], *caps])
        steps = math.ceil(n / FINETUNE["per_device_train_batch_size"]) * args.finetune_epochs
        per_model += args.seeds * (steps * a["finetune_step_s"] + a["finetune_eval_s"])
    models = 1 + len(args.recipe_table) + len(args.random_inits)
    parallel = max(1.0, args.finetune_parallel * a["finetune_parallel_efficiency"])
    seconds = a["process_start_s"]["finetune"] + models * per_model / parallel if args.tasks else 0.0
    return {
        "phase": "finetuning",
        "seconds": seconds,
        "detail": f"{models} models x {len(args.tasks)} task(s) x {args.seeds} seed(s), in "
        f"{args.finetune_parallel} worker process(es)",
    }


def plan_phases(args, costs: dict, glue_sizes: dict[str, int] | None = None) -> list[dict]:
    """The bench's phases for ``args`` under the cost model ``costs`` (a :data:`PLAN_COSTS` entry): ``[{"phase",
    "seconds", "detail"}]`` in run order. Step times scale from the measured shape and batch by
    :func:`_shape_flops` x tokens per step; a wall-clock budget B gives every run B seconds of steps after its
    process's start-up and its in-process probe; the reference runs once per repeat under ``sequential`` /
    ``shared`` and once per recipe under ``paired`` (paired runs overlap: the pair costs its longer run).
    ``glue_sizes``: training examples per task (default :data:`GLUE_TRAIN_SIZES`), capped as
    :func:`finetune_argv` caps them."""
    return [
        _data_phase(args, costs),
        *_training_phases(args, costs),
        {"phase": "scoring", "seconds": costs["assumed"]["random_inits_s"], "detail": "random inits built and scored"},
        _finetuning_phase(args, costs, glue_sizes),
    ]


def glue_train_sizes(glue_dir: str, tasks: list[str]) -> dict[str, int]:
    """Training examples per task read from ``glue_dir`` (``<Task>/train.tsv`` lines minus the header; CoLA has
    none); tasks whose file is not there are left out."""
    folders = {
        "cola": "CoLA",
        "sst2": "SST-2",
        "mrpc": "MRPC",
        "qqp": "QQP",
        "stsb": "STS-B",
        "mnli": "MNLI",
        "qnli": "QNLI",
        "rte": "RTE",
        "wnli": "WNLI",
    }
    sizes = {}
    for task in tasks:
        path = Path(glue_dir) / folders[task] / "train.tsv"
        if path.is_file():
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = sum(1 for line in f if line.strip())
            sizes[task] = lines - (0 if task == "cola" else 1)
    return sizes


def print_plan(args, costs_name: str = "h100") -> float:
    """Print the phases of :func:`plan_phases` under ``PLAN_COSTS[costs_name]`` and their total; return the total
    in seconds."""
    costs = PLAN_COSTS[costs_name]
    phases = plan_phases(args, costs, glue_train_sizes(args.glue_dir, args.tasks))
    print(
        f"plan ({costs_name} cost model: measured {sorted(costs['measured'])}, assumed {sorted(costs['assumed'])}); "
        f"schedule {args.schedule}, reference mixed precision {args.reference_mixed_precision}, ours "
        f"{args.mixed_precision or 'pretrain default'}, {args.preprocessing_num_workers} data workers"
    )
    for ph in phases:
        print(f"  {ph['phase']:12s} {ph['seconds']:7.0f} s  {ph['detail']}")
    total = sum(ph["seconds"] for ph in phases)
    print(f"  {'total':12s} {total:7.0f} s  ({total / 60:.1f} minutes)")
    return total
