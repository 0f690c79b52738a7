"""Time to quality: held-out MLM quality per second and per token, ours (``python -m pretrain`` recipes) against
transformers' ``BertForMaskedLM`` trained the ``run_mlm`` way, then what the pretraining buys on GLUE dev.

    python bench/bench_time_to_quality.py --train_file F [F ...] --validation_file F --glue_dir DIR \\
        --budget_minutes M [--budget_tokens N] [--model_shape bert-tiny] [--tasks sst2 mrpc stsb cola] [--seeds 3] \\
        [--baselines_results results.json] [--recipes NAME ...] [--recipe_flags NAME='--flag v ...'] --output_dir D \\
        [--preprocessing_num_workers N] [--mixed_precision no|bf16] [--plan_only]

Device defaults: on CUDA ``--schedule sequential``, ``--reference_mixed_precision bf16`` and ``--mixed_precision bf16``
(ours: added before each recipe's flags, so a recipe's own value wins); on the CPU ``paired``, the reference in
float32 and nothing added to our recipes. ``--plan_only`` prints the phases with their estimated seconds on the
planned machine (:data:`PLAN_COSTS`, :func:`plan_phases`) and runs nothing.

What runs (every run is a child process; the project is driven through its command lines only):

1. **Shared data**, cached in ``D`` (a re-run with the same files and settings reuses them), built with
   ``--preprocessing_num_workers`` N processes (default: the cores, at most 16; the tokenizer trainer's threads,
   ``pretrain.prepare --preprocessing_num_workers N``, the reference's tokenization): one WordPiece tokenizer
   (``python -m tokenizer train --model_type bert --vocab_size V`` -> ``D/tokenizer``), one prepared dataset
   (``python -m pretrain.prepare ... --tokenizer_name D/tokenizer`` -> ``D/prepared``) that every recipe trains on, and
   the reference's blocks (``D/reference_blocks``): the training documents tokenized with the tokenizer's special
   tokens (``[CLS] doc [SEP]``), concatenated and cut into ``--max_seq_length`` blocks per map batch of 1,000
   documents, the remainder dropped -- ``group_texts`` of transformers' ``examples/pytorch/language-modeling/
   run_mlm.py``. (run_mlm's text loader makes one example per *line*; here an example is a *document*, blank-line
   separated, as ``pretrain`` reads the files, so that both see the same text with the same special tokens.)
2. **Fixed held-out set** (``D/heldout.safetensors`` + ``D/heldout.json``): every ``--validation_file`` document is
   cut into chunks of ``max_seq_length - 2`` tokens, each wrapped as ``[CLS] chunk [SEP]`` (a block never spans two
   documents, so models trained with and without document masking see the same boundary-free inputs); masked *once*
   by transformers' ``DataCollatorForLanguageModeling`` (15% of the non-special tokens, 80/10/10 [MASK]/random/keep)
   with its generator seeded by ``--heldout_seed``, block by block. Its SHA-256 (of ``input_ids``, ``labels``,
   ``lengths`` as little-endian int64, in that order) is in ``results.json``. Score = mean cross-entropy in nats over
   all masked positions, computed here from each model's full MLM logits (``AutoModelForMaskedLM``, eval mode, batches
   of equal-length blocks: no padding) by :func:`heldout_loss`, the same code for every model.
3. **Budget to steps.** With ``--budget_minutes`` each run first trains ``--probe_steps`` steps under the same
   conditions as the real run (a probe; the first ``--probe_warmup`` steps are not counted), and its budget becomes
   ``--max_train_steps N = budget / mean seconds per step``, so that every schedule knows its length. With
   ``--budget_tokens`` N = ceil(tokens / tokens per step). The reference's N is the median over its probes (one
   reference trajectory for every pairing).
4. **The reference** (:func:`reference_main`, a child process that refuses to import any project package):
   ``BertForMaskedLM`` (``attn_implementation="sdpa"``) of the shape, ``DataCollatorForLanguageModeling``
   (``mlm_probability`` 0.15) on the reference blocks, shuffled each epoch; AdamW (fused where available, weight decay
   ``--reference_weight_decay`` 0.0, betas (0.9, 0.999), eps 1e-8), linear decay to 0 without warmup, gradient clipping
   at 1.0 -- transformers ``TrainingArguments``' defaults, which run_mlm uses -- in a plain PyTorch loop. Its peak
   learning rate is the best (lowest final held-out loss) of ``--reference_lrs`` after
   ``--reference_sweep_fraction`` of its steps (a sweep run's schedule decays over those steps).
5. **Our recipes** (:data:`RECIPES`; ``--recipes`` picks, ``--recipe_flags`` adds): ``python -m pretrain
   --prepared_dataset D/prepared --config_name SHAPE --per_device_train_batch_size B <recipe flags>`` plus the bench's
   run flags (``--max_train_steps``, ``--seed``, ``--checkpointing_steps`` (``--curve_points`` per run),
   ``--checkpoints_total_limit 0``, ``--logging_steps`` = the checkpoint interval, ``--eval_steps N+1`` and
   ``--max_eval_samples 32``: the run's own evaluation then runs only before the first and after the last step, on 32
   blocks, outside the timed steps).
6. **Curves** (no process is started to score): the reference scores its live model at its save steps in its own
   process, on its device, outside its timed steps (``--heldout``; the same number as its saved checkpoint would
   give); every checkpoint's weights of ours are scored on the held-out set after training, in the bench's process
   on the device (CUDA when there is one), one model per run with each checkpoint's
   weights loaded into it (:class:`CheckpointScorer`) (a run that saved a
   ``generator/`` -- ``--objective rtd``, ELECTRA -- is scored by its generator, the MLM it trains beside the
   discriminator: a model of 1/4 the width, so its curve is labelled "generator" and the quality-per-token and
   time-to-quality ratios, which compare MLMs of the same shape, are ``None`` for it with the reason in
   ``not_applicable``; its downstream rows fine-tune the discriminator, the run folder's model) (checkpoint writing and
   scoring are never timed). Training seconds at a step: for ours, the sum of ``trainer_log.json``'s interval times up
   to it, an interval's time being its blocks / its ``samples_per_second`` (the blocks of each optimizer step follow
   from the block count, the batch and the epoch length: only an epoch's last step is short); tokens = time x
   ``tokens_per_second``. The loop times each step from fetching its batch to the end of the optimizer step,
   evaluation and checkpoints excluded. The reference times the same span per step with ``time.perf_counter``.
7. **Noise** (``--schedule``): ``paired`` (the CPU default) runs each recipe at the same time as its own copy of the
   reference (same seed and steps: the same trajectory), ``--threads`` threads each (default 1, so that two runs fill
   two cores and share the machine's noise; the copy takes its first step once ``pretrain`` has logged its run plan,
   so that it does not train alone during ``pretrain``'s start-up; whichever finishes first leaves the other alone
   for its last steps); ``sequential`` (the CUDA default) runs one run at a time: per repeat one reference copy
   (alone, the copies of a repeat are the same run), then each recipe; its copy serves every recipe. Each recipe's
   ratios use its own paired copy; ``--repeats R`` repeats every pair with pretraining seeds ``seed + r``; the ratios
   quoted are medians over repeats.
8. **Fine-tuning** (``python -m finetune.glue``, one fixed protocol, ``--finetune_parallel`` processes of one thread
   at a time): every final model (the first repeat's; the reference's first copy) and the random inits of
   ``--random_inits`` (default ``sesame``), on ``--tasks`` with ``--seeds`` seeds (42, 43, ...): lr
   ``--finetune_learning_rate`` 1e-4, batch 32, 3 epochs, 10% warmup, weight decay 0.01, ``--max_seq_length`` 128,
   float32, SST-2 on its first 20,000 training examples (``--max_train_samples`` caps every task); the task's main
   metric on the dev set; median over seeds.
   Random inits: ``random-sesame`` = SesameBertForMaskedLM of the preset (the comparison for our recipes),
   ``random-bert`` = the reference's BertForMaskedLM (:func:`reference_model`), both built after
   ``torch.manual_seed(--seed)``; both are always scored on the held-out set (their ``final_eval_loss`` is the
   untrained level). With the same seed the two compute the same function (measured: the same held-out loss to 14
   digits; SesameBert draws its initial weights as transformers' BERT does), so by default only ``random-sesame`` is
   fine-tuned: one set of fine-tunes serves as the no-pretraining row of both families.

Ratios (printed last; each recipe against its paired reference copy, median over repeats; the top-level pair is the
``--default_recipe``'s):

* ``quality_per_token`` = (unigram - ours) / (unigram - reference), both held-out losses linearly interpolated on
  their loss-vs-tokens curves at T = the smaller of the two final token counts (> 1: ours got further below the
  unigram plateau with the same tokens). ``None`` when the reference is not below the unigram loss.
* ``time_to_quality`` = reference seconds / ours: the target is the reference's final held-out loss, the reference
  seconds its training seconds, ours the first crossing of the target on our loss-vs-seconds curve (linear between
  checkpoints; the first checkpoint's seconds when already reached there, flagged); ``None`` = not reached.
* **what pretraining buys**: each run's median downstream metric minus its random init's (ours: ``random-sesame``,
  the reference: ``random-bert``, the other when only one is fine-tuned) and minus the best classic baseline of
  ``--baselines_results`` (a ``python -m finetune.baselines`` results.json; records with the same metric).
* ``unigram_loss``: predicting every masked held-out token from the training blocks' non-special token frequencies
  (add-one smoothed over the non-special vocabulary): the plateau a model must leave.

Output in ``D``: ``results.json``, ``results.md`` (tables, ratios, protocol, command), ``results.png`` (held-out loss
vs training seconds and vs tokens, all runs, the unigram level; downstream bars), and the run folders (``runs/``,
``models/``, ``finetune/``, ``logs/``). ``results.json`` keys:

* ``command``: the bench's argv. ``protocol``: every setting above (budget, shape, batch, tokens_per_step, schedule,
  threads, repeats, probe, curve points, the reference's optimizer, sweep and chosen learning rate, the recipes' flags,
  the fine-tuning protocol, the held-out settings, the device, the load average before/after).
* ``heldout_sha256``; ``heldout``: ``{"blocks", "tokens", "masked", "seed"}``.
* ``unigram_loss``: nats.
* ``ratios``: ``{"default_recipe", "quality_per_token", "time_to_quality", "by_recipe": {recipe: {
  "quality_per_token", "time_to_quality", "tokens_compared", "loss_at_tokens": {"ours", "reference"},
  "target_loss", "reference_seconds", "seconds_to_target" (None: not reached), "reached_by_first_point",
  "per_repeat": [...]}}}``.
* ``runs``: ``{name: {"kind": "reference" | "recipe" | "random-init", "flags" (a recipe's pretrain flags),
  "final_eval_loss" (nats), "tokens", "seconds" (training seconds), "steps", "tokens_per_second", "learning_rate"
  (peak), "curve": [{"seconds", "tokens", "step", "eval_loss"}], "downstream": {task: median metric},
  "downstream_seeds": {task: [metric per seed]}, "errors": [failed fine-tunes], "copies": [{"name", "repeat",
  "seed", "paired_with", "final_eval_loss", "tokens", "seconds", "steps", "tokens_per_second", "learning_rate",
  "curve"}]}}``; the top-level numbers of a run are medians over its copies (one copy per
  repeat; the reference: one per recipe and repeat), ``curve`` is its first copy's. Random inits have
  ``final_eval_loss`` (the untrained model's held-out loss) and, when fine-tuned, the downstream keys only.
* ``pretraining_buys``: ``{run: {task: {"metric", "value", "random_init", "vs_random_init", "best_classic",
  "best_classic_value", "vs_best_classic"}}}`` (metric values as ``finetune.glue`` reports them, 0-1).
* ``baselines``: ``{task: {backbone: value}}`` from ``--baselines_results``.
* ``sweep``: ``{lr: final held-out loss}`` of the reference's sweep; ``timings``: wall seconds per phase.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

#: The project's packages: the reference process refuses to import them (:func:`block_project_imports`).
PROJECT_PACKAGES = ("modeling", "training", "pretrain", "finetune", "tokenizer")

#: Model shapes (Turc et al. 2019; intermediate size 4H), the same as the ``--config_name`` presets of ``pretrain``.
SHAPES: dict[str, dict[str, int]] = {
    "bert-tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),
    "bert-mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "bert-small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
}

#: Our recipes: name -> the ``python -m pretrain`` flags added to ``--prepared_dataset D/prepared --config_name SHAPE
#: --per_device_train_batch_size B`` and the bench's run flags (:data:`BENCH_FLAGS` may not be set by a recipe).
#: ``note`` says what the recipe is. ``--recipe_flags NAME='--flag v ...'`` adds one for a single invocation.
RECIPES: dict[str, dict] = {
    "sesame-default": dict(
        flags=[],
        note="the default for user data: no flags (post-LN preset: lr 2e-3 x 128 / "
        "hidden size, 30% masking, warmup 6%, stable, 1 - sqrt decay over the "
        "last 20%, weight decay 0.01, float32)",
    ),
    "sesame-before-22": dict(
        flags=[
            "--learning_rate",
            "1e-4",
            "--mlm_probability",
            "0.15",
            "--lr_scheduler_type",
            "linear",
            "--document_masking",
            "false",
        ],
        note="the default before issue 22, spelled out: lr 1e-4 (BERT's), 15% masking, linear "
        "decay, documents joined by [SEP]",
    ),
    "sesame-lr1e-3": dict(flags=["--learning_rate", "1e-3"], note="the default with peak learning rate 1e-3"),
    "sesame-lr1e-3-bf16": dict(
        flags=["--learning_rate", "1e-3", "--mixed_precision", "bf16"],
        note="lr 1e-3 with bf16 autocast (README: the CPU choice for pretraining)",
    ),
    "rtd": dict(
        flags=["--objective", "rtd", "--learning_rate", "1e-3"],
        note="ELECTRA replaced-token detection (issue 21), lr 1e-3 as sesame-lr1e-3: a generator of 1/4 the "
        "width and the discriminator (the preset's shape, fine-tuned downstream); its held-out curve is "
        "the generator's MLM loss, so the MLM ratios do not apply",
    ),
}
DEFAULT_RECIPES = ("sesame-default", "sesame-before-22")

#: ``pretrain`` flags the bench sets itself: a recipe giving one of them is refused.
BENCH_FLAGS = (
    "--prepared_dataset",
    "--train_file",
    "--validation_file",
    "--dataset_name",
    "--tokenizer_name",
    "--model_name_or_path",
    "--output_dir",
    "--overwrite_output_dir",
    "--max_train_steps",
    "--num_train_epochs",
    "--checkpointing_steps",
    "--checkpoints_total_limit",
    "--logging_steps",
    "--eval_steps",
    "--max_eval_samples",
    "--max_train_samples",
    "--seed",
    "--report_to",
    "--resume_from_checkpoint",
    "--push_to_hub",
    "--load_best_model_at_end",
    "--early_stopping_patience",
    "--streaming",
    "--max_seq_length",
)

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

HELDOUT_FILE, HELDOUT_INFO = "heldout.safetensors", "heldout.json"
#: The cap of the default ``--preprocessing_num_workers`` (more processes than this gain little on corpora this size).
MAX_DEFAULT_WORKERS = 16
REFERENCE_LOG = "reference_log.json"


class BenchError(RuntimeError):
    """A step of the bench failed (a child process, a missing file); the message names it and its log."""


# -- command line ---------------------------------------------------------------------------------------------------
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
    b.add_argument("--probe_steps", type=int, default=20, help="steps of a budget probe (default 20)")
    b.add_argument("--probe_warmup", type=int, default=5, help="probe steps not counted (default 5)")
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
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


def select_recipes(names: list[str], ad_hoc: list[str]) -> dict[str, list[str]]:
    """``{name: pretrain flags}`` of ``--recipes`` (from :data:`RECIPES`) then ``--recipe_flags`` entries
    (``NAME='--flag v ...'``, split as a shell would).

    Raises:
        ValueError: an unknown recipe name, a malformed or duplicate entry, or a flag of :data:`BENCH_FLAGS`.
    """
    table: dict[str, list[str]] = {}
    for name in names:
        if name not in RECIPES:
            raise ValueError(f"--recipes {name}: unknown; expected one of {', '.join(RECIPES)} (or --recipe_flags)")
        table[name] = list(RECIPES[name]["flags"])
    for entry in ad_hoc:
        name, sep, flags = entry.partition("=")
        if not sep or not name or name in table or name.startswith("reference") or name.startswith("random"):
            raise ValueError(f"--recipe_flags {entry!r}: expected NAME='--flag value ...' with a new name")
        table[name] = shlex.split(flags)
    for name, flags in table.items():
        taken = [f for f in flags if f.split("=")[0] in BENCH_FLAGS]
        if taken:
            raise ValueError(f"recipe {name}: {' '.join(taken)} is set by the bench; expected other pretrain flags")
    if not table:
        raise ValueError("no recipe: expected at least one of --recipes / --recipe_flags")
    return table


def flag_value(flags: list[str], name: str, default: str | None = None) -> str | None:
    """The value of ``name`` in an argv-style list (``--name v`` or ``--name=v``; the last one wins), or ``default``."""
    value = default
    for i, item in enumerate(flags):
        if item == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif item.startswith(name + "="):
            value = item.split("=", 1)[1]
    return value


# -- child processes ------------------------------------------------------------------------------------------------
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


# -- shared data ----------------------------------------------------------------------------------------------------
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


def data_variant(flags: list[str]) -> str:
    """The prepared dataset a recipe trains on, named by what its blocks depend on among the recipe's flags:
    ``prepared`` (the objective's default blocks: mlm with document boundaries), ``prepared-nodoc``
    (``--document_masking false``: documents joined by ``[SEP]``, no ``position_ids``), ``prepared-<objective>``
    (``--objective X`` other than mlm), or both suffixes."""
    objective = flag_value(flags, "--objective", "mlm")
    document_masking = (flag_value(flags, "--document_masking") or "").lower()
    return (
        "prepared"
        + ("" if objective == "mlm" else f"-{objective}")
        + ("-nodoc" if document_masking in ("false", "0", "no") else "")
    )


def variant_flags(name: str) -> list[str]:
    """The ``pretrain.prepare`` flags of a :func:`data_variant` name."""
    flags, rest = [], name[len("prepared") :]
    if rest.endswith("-nodoc"):
        flags, rest = ["--document_masking", "false"], rest[: -len("-nodoc")]
    return (["--objective", rest[1:]] if rest else []) + flags


def prepare_shared_data(args, out: Path) -> dict:
    """Tokenizer, prepared datasets (one per :func:`data_variant` of the recipes) and reference blocks in ``out``
    (cached); returns their paths and the sources."""
    sources = {
        "train": [(str(Path(f).resolve()), file_sha256(f)) for f in args.train_file],
        "validation": (str(Path(args.validation_file).resolve()), file_sha256(args.validation_file)),
    }
    py = sys.executable
    workers = args.preprocessing_num_workers
    tok_stamp = {"train": sources["train"], "vocab_size": args.vocab_size}
    tok = cached(
        out / "tokenizer",
        tok_stamp,
        lambda d: run_jobs(
            [
                Job(
                    "tokenizer",
                    [
                        py,
                        "-m",
                        "tokenizer",
                        "train",
                        "--model_type",
                        "bert",
                        "--train_file",
                        *args.train_file,
                        "--vocab_size",
                        str(args.vocab_size),
                        "--output_dir",
                        str(d),
                    ],
                    out / "logs" / "tokenizer.log",
                    tokenizer_env(workers),
                )
            ],
            1,
        ),
    )
    tok_sha = file_sha256(tok / "tokenizer.json")
    prep_stamp = {**sources, "tokenizer": tok_sha, "max_seq_length": args.max_seq_length}
    variants = {}
    # pretrain.prepare packs per map batch: its processes' shards move a few batch edges, so the blocks depend on N
    workers_flags = ["--preprocessing_num_workers", str(workers)] if workers > 1 else []
    for name in sorted({"prepared", *(data_variant(f) for f in args.recipe_table.values())}):
        extra = variant_flags(name)
        command = [
            py,
            "-m",
            "pretrain.prepare",
            "--train_file",
            *args.train_file,
            "--validation_file",
            args.validation_file,
            "--tokenizer_name",
            str(tok),
            "--max_seq_length",
            str(args.max_seq_length),
            *extra,
            *workers_flags,
            "--output_dir",
        ]
        folder = cached(
            out / name,
            {**prep_stamp, "flags": extra + workers_flags},
            lambda d, command=command, name=name: run_jobs(
                [Job("prepare", [*command, str(d)], out / "logs" / f"{name}.log")], 1
            ),
        )
        variants[name] = {
            "path": folder,
            "manifest": json.loads((folder / "manifest.json").read_text(encoding="utf-8")),
        }
    ref_blocks = cached(
        out / "reference_blocks",
        prep_stamp,
        lambda d: build_reference_blocks(args.train_file, tok, args.max_seq_length, d, workers),
    )
    return {
        "tokenizer": tok,
        "tokenizer_sha256": tok_sha,
        "prepared": variants["prepared"]["path"],
        "manifest": variants["prepared"]["manifest"],
        "variants": variants,
        "reference_blocks": ref_blocks,
        "sources": sources,
    }


def tokenizer_env(workers: int) -> dict[str, str]:
    """Environment of the ``python -m tokenizer train`` child: the Rust trainer's threads (``RAYON_NUM_THREADS``) =
    ``workers``, its parallelism on when ``workers`` > 1 (the bench turns it off for itself)."""
    return {"TOKENIZERS_PARALLELISM": "true" if workers > 1 else "false", "RAYON_NUM_THREADS": str(workers)}


def load_documents(files: list[str], num_proc: int | None = None):
    """The documents of text files (blank-line separated; ``datasets``' text loader with ``sample_by="paragraph"``,
    stripped, empty ones dropped) as a ``datasets.Dataset`` with a ``text`` column, in file order (``num_proc``
    processes for the strip and the filter: the same rows in the same order)."""
    from datasets import load_dataset

    num_proc = num_proc if num_proc and num_proc > 1 else None
    ds = load_dataset("text", data_files={"train": list(files)}, sample_by="paragraph")["train"]
    ds = ds.map(lambda b: {"text": [t.strip() for t in b["text"]]}, batched=True, num_proc=num_proc)
    return ds.filter(lambda b: [bool(t) for t in b["text"]], batched=True, num_proc=num_proc)


def group_texts(batch: dict[str, list[list[int]]], block_size: int) -> dict[str, list[list[int]]]:
    """run_mlm's ``group_texts``: concatenate every column of a map batch and cut it into ``block_size`` pieces,
    dropping the remainder (kept whole when the batch holds less than one block)."""
    joined = {k: list(itertools.chain.from_iterable(v)) for k, v in batch.items()}
    total = len(next(iter(joined.values())))
    if total >= block_size:
        total = total // block_size * block_size
    return {k: [v[i : i + block_size] for i in range(0, total, block_size)] for k, v in joined.items()}


def _tokenize_documents(batch: dict, tokenizer) -> dict:
    """One map batch of :func:`build_reference_blocks`: the documents with the special tokens and their mask."""
    return tokenizer(batch["text"], return_special_tokens_mask=True)


def build_reference_blocks(
    files: list[str], tokenizer_dir: Path, block_size: int, folder: Path, num_proc: int | None = None
) -> None:
    """The reference's training blocks (run_mlm without ``--line_by_line``): documents tokenized with the special
    tokens and ``special_tokens_mask`` (``num_proc`` processes: a document's tokens do not depend on its batch),
    grouped by :func:`group_texts` per map batch of 1,000 in one process (processes would move the batch edges, and
    with them the dropped remainders); ``save_to_disk``. The blocks are the same for every ``num_proc``."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "sequence length is longer than the specified maximum": documents, not inputs
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    num_proc = num_proc if num_proc and num_proc > 1 else None
    docs = load_documents(files, num_proc)
    enc = docs.map(
        _tokenize_documents,
        batched=True,
        remove_columns=["text"],
        fn_kwargs={"tokenizer": tok},
        num_proc=num_proc,
    )
    enc.map(group_texts, batched=True, batch_size=1000, fn_kwargs={"block_size": block_size}).save_to_disk(str(folder))


# -- held-out set ---------------------------------------------------------------------------------------------------
def heldout_blocks(documents: list[str], tokenizer, max_len: int) -> list[list[int]]:
    """Every document cut into chunks of ``max_len - 2`` tokens (the last one shorter), each as
    ``[CLS] chunk [SEP]``: lists of token ids, document order; no block spans two documents."""
    blocks = []
    width = max_len - 2
    for ids in tokenizer(list(documents), add_special_tokens=False)["input_ids"]:
        for i in range(0, len(ids), width):
            blocks.append([tokenizer.cls_token_id, *ids[i : i + width], tokenizer.sep_token_id])
    return blocks


def mask_heldout(blocks: list[list[int]], tokenizer, seed: int, mlm_probability: float = 0.15) -> dict:
    """Mask ``blocks`` once with transformers' ``DataCollatorForLanguageModeling`` (``seed``: its own generator),
    one block per call, in order.

    Returns:
        ``{"input_ids": (N,) int64, "labels": (N,) int64 (-100 where not masked), "lengths": (n_blocks,) int64}``:
        the blocks concatenated (N tokens).
    """
    import torch
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, seed=seed)
    ids, labels = [], []
    for block in blocks:
        special = tokenizer.get_special_tokens_mask(block, already_has_special_tokens=True)
        batch = collator([{"input_ids": block, "special_tokens_mask": special}])
        ids.append(batch["input_ids"][0])
        labels.append(batch["labels"][0])
    return {
        "input_ids": torch.cat(ids).long(),
        "labels": torch.cat(labels).long(),
        "lengths": torch.tensor([len(b) for b in blocks], dtype=torch.long),
    }


def heldout_sha256(heldout: dict) -> str:
    """SHA-256 of ``input_ids``, ``labels`` and ``lengths`` as little-endian int64, in that order."""
    h = hashlib.sha256()
    for key in ("input_ids", "labels", "lengths"):
        h.update(np.ascontiguousarray(heldout[key].numpy().astype("<i8")).tobytes())
    return h.hexdigest()


def build_heldout(args, out: Path, data: dict) -> tuple[dict, dict]:
    """The fixed held-out set in ``out`` (reused when built with the same tokenizer, file and settings)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    settings = {
        "validation": data["sources"]["validation"],
        "tokenizer": data["tokenizer_sha256"],
        "max_seq_length": args.max_seq_length,
        "seed": args.heldout_seed,
        "mlm_probability": 0.15,
        "mask_replace_prob": 0.8,
        "random_replace_prob": 0.1,
        "max_blocks": args.max_heldout_blocks,
    }
    settings = json.loads(json.dumps(settings))  # tuples as lists, as read back
    info_path = out / HELDOUT_INFO
    if info_path.is_file() and (out / HELDOUT_FILE).is_file():
        info = json.loads(info_path.read_text(encoding="utf-8"))
        heldout = load_file(str(out / HELDOUT_FILE))
        if info.get("settings") == settings and heldout_sha256(heldout) == info.get("sha256"):
            log(f"reusing {out / HELDOUT_FILE}")
            return heldout, info
    hf_logging.set_verbosity_error()  # "sequence length is longer than the specified maximum": documents, not inputs
    tok = AutoTokenizer.from_pretrained(str(data["tokenizer"]))
    blocks = heldout_blocks(list(load_documents([args.validation_file])["text"]), tok, args.max_seq_length)
    heldout = mask_heldout(blocks[: args.max_heldout_blocks], tok, args.heldout_seed)
    save_file(heldout, str(out / HELDOUT_FILE))
    info = {
        "settings": settings,
        "sha256": heldout_sha256(heldout),
        "blocks": len(heldout["lengths"]),
        "tokens": int(heldout["lengths"].sum()),
        "masked": int((heldout["labels"] != -100).sum()),
    }
    info_path.write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return heldout, info


def heldout_batches(heldout: dict, max_tokens: int = 4096):
    """``(input_ids, labels)`` batches of equal-length blocks (no padding), each (B, S) int64, B x S <= max_tokens
    (at least one block), in order of length then position."""
    import torch

    lengths = heldout["lengths"].tolist()
    starts = [0, *itertools.accumulate(lengths)][:-1]
    for length, group in itertools.groupby(
        sorted(range(len(lengths)), key=lambda i: (lengths[i], i)), key=lambda i: lengths[i]
    ):
        group = list(group)
        per = max(1, max_tokens // length)
        for i in range(0, len(group), per):
            rows = [slice(starts[j], starts[j] + length) for j in group[i : i + per]]
            yield (
                torch.stack([heldout["input_ids"][r] for r in rows]),
                torch.stack([heldout["labels"][r] for r in rows]),
            )


def heldout_loss(model, heldout: dict, device=None) -> float:
    """Mean cross-entropy (nats) over the masked held-out positions, from ``model``'s full MLM logits in eval mode
    (``model(input_ids, attention_mask=1, token_type_ids=0).logits`` of shape (B, S, V), any
    ``AutoModelForMaskedLM``), accumulated in float64.

    Raises:
        BenchError: the logits are not (B, S, V) (e.g. a model that predicts only at labelled positions).
    """
    import torch

    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    nll, count = torch.zeros((), dtype=torch.float64), 0
    with torch.inference_mode():
        for ids, labels in heldout_batches(heldout):
            ids, labels = ids.to(device), labels.to(device)
            logits = model(
                input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids)
            ).logits
            if tuple(logits.shape[:2]) != tuple(ids.shape):
                raise BenchError(
                    f"{type(model).__name__}: logits {tuple(logits.shape)} for inputs {tuple(ids.shape)}; "
                    "expected full (B, S, V) MLM logits in eval mode"
                )
            sel = labels != -100
            nll += torch.nn.functional.cross_entropy(logits[sel].float(), labels[sel], reduction="sum").double().cpu()
            count += int(sel.sum())
    model.train(was_training)
    return float(nll) / max(count, 1)


def scored_by_generator(folder: Path) -> bool:
    """Whether the run in ``folder`` saved an MLM generator beside its model (``--objective rtd``): then the held-out
    MLM score is the generator's (:func:`load_scored_mlm`)."""
    return (folder / "generator" / "config.json").is_file()


def load_scored_mlm(folder: Path, weights: Path | None = None):
    """The MLM that a run of ours is scored with: :func:`load_mlm` of the run folder, or for an RTD run its generator
    (``folder/generator``; with ``weights``, a checkpoint's ``model.safetensors`` of the whole RTD model, the
    ``generator.`` part of it).

    Raises:
        BenchError: the checkpoint's generator weights do not fit the saved generator.
    """
    if not scored_by_generator(folder):
        return load_mlm(folder, weights)
    model = load_mlm(folder / "generator")
    if weights is not None:
        from safetensors.torch import load_file

        state = {k[len("generator.") :]: v for k, v in load_file(str(weights)).items() if k.startswith("generator.")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {"cls.decoder.weight"}:  # the decoder is tied to the word embeddings
            raise BenchError(
                f"{weights}: the generator's weights do not fit {folder / 'generator'} (missing "
                f"{sorted(missing)}, unexpected {sorted(unexpected)})"
            )
    return model


def load_mlm(folder: Path, weights: Path | None = None):
    """``AutoModelForMaskedLM.from_pretrained`` of a model folder; with ``weights`` (a checkpoint's
    ``model.safetensors``), the folder's config with those weights (through a temporary folder of links)."""
    import tempfile

    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    import modeling  # noqa: F401  (registers SesameBert with the Auto classes)

    hf_logging.disable_progress_bar()
    if weights is None:
        return AutoModelForMaskedLM.from_pretrained(str(folder))
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink((folder / "config.json").resolve(), Path(tmp) / "config.json")
        os.symlink(weights.resolve(), Path(tmp) / "model.safetensors")
        return AutoModelForMaskedLM.from_pretrained(tmp)


# -- unigram plateau ------------------------------------------------------------------------------------------------
def training_unigram_loss(reference_blocks: Path, tokenizer_dir: Path, heldout: dict) -> float:
    """:func:`training.unigram.unigram_loss` of the held-out labels under the reference blocks' non-special token
    frequencies (the same function ``pretrain`` logs its plateau with)."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from training.unigram import token_counts, unigram_loss

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    blocks = load_from_disk(str(reference_blocks))
    counts = sum(
        token_counts(batch["input_ids"], len(tok), tok.all_special_ids) for batch in blocks.iter(batch_size=4096)
    )
    return unigram_loss(counts, heldout["labels"].numpy(), tok.all_special_ids)


# -- curves and ratios ----------------------------------------------------------------------------------------------
def interpolate(curve: list[dict], x_key: str, x: float) -> float:
    """The held-out loss of ``curve`` (points with ``x_key`` increasing and ``eval_loss``) at ``x``, linear between
    points (``numpy.interp``; clamped to the end points outside them)."""
    return float(np.interp(x, [p[x_key] for p in curve], [p["eval_loss"] for p in curve]))


def quality_per_token(ours: list[dict], reference: list[dict], unigram: float) -> dict:
    """(unigram - ours) / (unigram - reference) at T tokens, T = the smaller final token count, both losses
    interpolated on their loss-vs-tokens curves. ``ratio`` None when the reference is not below ``unigram``."""
    tokens = min(ours[-1]["tokens"], reference[-1]["tokens"])
    lo, lr = interpolate(ours, "tokens", tokens), interpolate(reference, "tokens", tokens)
    ratio = (unigram - lo) / (unigram - lr) if unigram - lr > 0 else None
    return {"quality_per_token": ratio, "tokens_compared": tokens, "loss_at_tokens": {"ours": lo, "reference": lr}}


def seconds_to_reach(curve: list[dict], target: float) -> tuple[float | None, bool]:
    """The training seconds at which ``curve`` first reaches ``eval_loss <= target`` (linear between the two points
    around the crossing), and whether its first point already does (then its seconds: an upper bound);
    ``(None, False)`` when never reached."""
    if curve and curve[0]["eval_loss"] <= target:
        return curve[0]["seconds"], True
    for prev, cur in zip(curve, curve[1:]):
        if cur["eval_loss"] <= target < prev["eval_loss"]:
            frac = (prev["eval_loss"] - target) / (prev["eval_loss"] - cur["eval_loss"])
            return prev["seconds"] + frac * (cur["seconds"] - prev["seconds"]), False
    return None, False


def time_to_quality(ours: list[dict], reference: list[dict]) -> dict:
    """Target = the reference's final held-out loss; ratio = the reference's final training seconds / the seconds
    ``ours`` needs to reach the target (None: not reached)."""
    target, ref_seconds = reference[-1]["eval_loss"], reference[-1]["seconds"]
    seconds, first = seconds_to_reach(ours, target)
    return {
        "time_to_quality": ref_seconds / seconds if seconds else None,
        "target_loss": target,
        "reference_seconds": ref_seconds,
        "seconds_to_target": seconds,
        "reached_by_first_point": first,
    }


def median_or_none(values):
    """The median of the values that are not None (None when there are none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# -- runs -----------------------------------------------------------------------------------------------------------
def steps_samples(step: int, n_blocks: int, per_step: int) -> int:
    """Blocks in optimizer step ``step`` (1-based) of a loop over ``n_blocks`` blocks per epoch, ``per_step`` per
    step, the last batch of an epoch short (``drop_last=False``)."""
    steps_per_epoch = math.ceil(n_blocks / per_step)
    return per_step if step % steps_per_epoch else n_blocks - per_step * (steps_per_epoch - 1)


def times_from_trainer_log(records: list[dict], n_blocks: int, per_step: int) -> dict[int, dict]:
    """``{step: {"seconds", "tokens"}}`` cumulative at every logged step of ``pretrain``'s ``trainer_log.json``:
    an interval's seconds = its blocks (:func:`steps_samples`) / its ``samples_per_second``; its tokens = seconds x
    ``tokens_per_second``."""
    out, seconds, tokens, prev = {}, 0.0, 0.0, 0
    for rec in sorted(records, key=lambda r: r["step"]):
        blocks = sum(steps_samples(s, n_blocks, per_step) for s in range(prev + 1, rec["step"] + 1))
        dt = blocks / rec["samples_per_second"]
        seconds, tokens, prev = seconds + dt, tokens + dt * rec["tokens_per_second"], rec["step"]
        out[rec["step"]] = {"seconds": seconds, "tokens": tokens}
    return out


@dataclass
class Run:
    """One training process: a recipe copy or a reference copy (``lr`` set), in ``folder``."""

    name: str
    kind: str  # "recipe" | "reference"
    folder: Path
    seed: int
    recipe: str = ""  # the recipe of a recipe run, or the one a reference copy is paired with
    steps: int = 0
    flags: list[str] = field(default_factory=list)
    lr: float | None = None
    repeat: int = 0
    paired_with: str | None = None


def save_steps(steps: int, points: int) -> list[int]:
    """The checkpoint steps of a run: every ceil(steps / points) steps, and the last step."""
    every = max(1, math.ceil(steps / points))
    return sorted({*range(every, steps + 1, every), steps})


def materialize_configs(flags: list[str], out: Path) -> list[str]:
    """``flags`` with a ``--config_name PRESET:field=value,...`` written out as a config folder in ``out/configs``
    (the preset with those fields; values read as JSON where they parse, else as strings)."""
    value = flag_value(flags, "--config_name")
    if value is None or ":" not in value:
        return list(flags)
    import modeling

    preset, _, fields = value.partition(":")
    overrides = {}
    for item in filter(None, fields.split(",")):
        key, _, raw = item.partition("=")
        try:
            overrides[key] = json.loads(raw)
        except ValueError:
            overrides[key] = raw
    folder = out / "configs" / value.replace(":", "-").replace(",", "-").replace("=", "_")
    modeling.get_preset_config(preset, **overrides).save_pretrained(str(folder))
    result, skip = [], False
    for item in flags:
        if skip:
            skip = False
        elif item == "--config_name":
            result += [item, str(folder)]
            skip = True
        elif item.startswith("--config_name="):
            result.append(f"--config_name={folder}")
        else:
            result.append(item)
    return result


def run_command(run: Run, args, data: dict, steps: int, points: int, probe: bool = False) -> list[str]:
    """The child command of ``run`` for ``steps`` optimizer steps (``probe``: log every step, no checkpoints)."""
    py = sys.executable
    every = steps + 1 if probe else max(1, math.ceil(steps / points))
    if run.kind == "reference":
        return [
            py,
            str(Path(__file__).resolve()),
            "_reference",
            "--blocks",
            str(data["reference_blocks"]),
            "--tokenizer",
            str(data["tokenizer"]),
            "--model_shape",
            args.model_shape,
            "--learning_rate",
            str(run.lr),
            "--max_train_steps",
            str(steps),
            "--batch_size",
            str(args.batch_size),
            "--seed",
            str(run.seed),
            "--save_steps",
            *([] if probe else map(str, save_steps(steps, points))),
            "--weight_decay",
            str(args.reference_weight_decay),
            "--mixed_precision",
            args.reference_mixed_precision,
            "--threads",
            str(args.threads),
            *([] if probe else ["--heldout", str(Path(args.output_dir) / HELDOUT_FILE)]),
            *(["--save_checkpoints"] if args.keep_checkpoints and not probe else []),
            "--output_dir",
            str(run.folder),
        ]
    prepared = data["variants"][data_variant(run.flags)]["path"]
    return [
        py,
        "-m",
        "pretrain",
        "--prepared_dataset",
        str(prepared),
        "--config_name",
        args.model_shape,
        "--per_device_train_batch_size",
        str(args.batch_size),
        *(["--mixed_precision", args.mixed_precision] if args.mixed_precision else []),
        *materialize_configs(run.flags, run.folder.parent),
        "--output_dir",
        str(run.folder),
        "--overwrite_output_dir",
        "--max_train_steps",
        str(steps),
        "--seed",
        str(run.seed),
        "--checkpointing_steps",
        str(every),
        "--checkpoints_total_limit",
        "0",
        "--logging_steps",
        "1" if probe else str(every),
        "--eval_steps",
        str(steps + 1),
        "--max_eval_samples",
        "32",
        "--report_to",
        "none",
    ]


def per_step_blocks(run: Run, args) -> int:
    """Blocks per optimizer step of ``run`` (its recipe's batch x accumulation, else ``--batch_size``)."""
    if run.kind == "reference":
        return args.batch_size
    batch = int(flag_value(run.flags, "--per_device_train_batch_size", str(args.batch_size)))
    return batch * int(flag_value(run.flags, "--gradient_accumulation_steps", "1"))


def reference_log(folder: Path) -> dict:
    """The ``reference_log.json`` of a reference run folder (:func:`reference_main`).

    Raises:
        BenchError: the file is missing (the run did not finish).
    """
    path = Path(folder) / REFERENCE_LOG
    if not path.is_file():
        raise BenchError(f"no {path}; expected the reference run's log")
    return json.loads(path.read_text(encoding="utf-8"))


def step_times(run: Run, args, data: dict) -> dict[int, dict]:
    """``{step: {"seconds", "tokens"}}`` cumulative training time and tokens of a finished run (see the docstring)."""
    if run.kind == "reference":
        records = reference_log(run.folder)["steps"]
        return {r["step"]: {"seconds": r["seconds"], "tokens": r["tokens"]} for r in records}
    path = run.folder / "trainer_log.json"
    if not path.is_file():
        raise BenchError(f"{run.name}: no {path}; expected pretrain's run files")
    manifest = data["variants"][data_variant(run.flags)]["manifest"]
    return times_from_trainer_log(
        json.loads(path.read_text(encoding="utf-8")), manifest["blocks"]["train"], per_step_blocks(run, args)
    )


def probe_seconds_per_step(run: Run, args, data: dict) -> float:
    """Mean training seconds per step of a probe run after its first ``--probe_warmup`` steps."""
    times = step_times(run, args, data)
    last = max(times)
    return (times[last]["seconds"] - times[args.probe_warmup]["seconds"]) / (last - args.probe_warmup)


def groups_for(schedule: str, pairs: list[tuple[Run, Run]]) -> list[list[Run]]:
    """Runs started together: each (reference copy, recipe) pair at once (``paired``); one at a time, per repeat
    its first reference copy and then every recipe (``sequential``: a copy alone has the same seed, steps and
    conditions as the others of its repeat, so one serves them all; :func:`shared_copies` fills them in); or per
    repeat its first pair, then the other recipes two at a time without reference copies (``shared``, likewise)."""
    if schedule == "paired":
        return [list(p) for p in pairs]
    if schedule == "sequential":
        groups, seen = [], set()
        for ref, ours in pairs:
            if ref.repeat not in seen:
                seen.add(ref.repeat)
                groups.append([ref])
            groups.append([ours])
        return groups
    groups = []
    for repeat in sorted({ours.repeat for _, ours in pairs}):
        mine = [p for p in pairs if p[1].repeat == repeat]
        rest = [ours for _, ours in mine[1:]]
        groups += [list(mine[0])] + [rest[i : i + 2] for i in range(0, len(rest), 2)]
    return groups


def shared_copies(pairs: list[tuple[Run, Run]], copies: dict[str, dict]) -> None:
    """``--schedule shared``: every reference copy that did not run is its repeat's run (the same seed and steps:
    the same trajectory; its seconds were measured beside the first recipe only)."""
    ran = {ref.repeat: copies[ref.name] for ref, _ in pairs if ref.name in copies}
    for ref, _ in pairs:
        copies.setdefault(ref.name, {**ran[ref.repeat], "paired_with": f"{ran[ref.repeat]['paired_with']} (shared)"})


#: What ``pretrain`` logs once its set-up is done, right before its first step (README: "the run plan").
RUN_PLAN_LINE = "run plan:"


def train_groups(
    groups: list[list[Run]], args, data: dict, out: Path, steps_of, points: int, probe=False, on_done=None
):
    """Run each group's runs at the same time (``--threads`` threads each), group after group. In a group with a
    recipe run, the reference copies wait (``--start_file``) until the recipe has logged its run plan (or ended), so
    that both start their first step together rather than the reference training during ``pretrain``'s start-up.
    ``on_done(run)``, if given, is called as soon as a run has ended, while the others of its group go on."""
    for group in groups:
        jobs, start = [], None
        recipe = next((r for r in group if r.kind == "recipe"), None)
        for run in group:
            cmd = run_command(run, args, data, steps_of(run), points, probe)
            if run.kind == "reference" and recipe is not None:
                start = out / "logs" / f".start-{run.folder.name}"
                start.unlink(missing_ok=True)
                cmd += ["--start_file", str(start)]
            jobs.append(
                Job(
                    f"{run.name} ({'probe' if probe else 'train'})",
                    cmd,
                    out / "logs" / f"{run.folder.name}.log",
                    child_env(args.threads),
                )
            )
        log("  ".join(f"{j.name}: {steps_of(r)} steps" for j, r in zip(jobs, group)))
        on_poll = None
        if start is not None:
            recipe_job = jobs[group.index(recipe)]

            def on_poll(start=start, recipe_job=recipe_job):
                if not start.exists() and (
                    recipe_job.returncode is not None
                    or RUN_PLAN_LINE in recipe_job.log.read_text(encoding="utf-8", errors="replace")
                ):
                    start.touch()

        done = None if on_done is None else (lambda job, group=group, jobs=jobs: on_done(group[jobs.index(job)]))
        run_jobs(jobs, parallel=len(jobs), on_poll=on_poll, on_done=done)
        if start is not None:
            start.unlink(missing_ok=True)


def learning_rate_of(run: Run, out: Path) -> float | None:
    """The run's peak learning rate: the reference's, a recipe's ``--learning_rate``, else the one ``pretrain``'s
    run plan line logged ("learning rate X (source)")."""
    if run.lr is not None:
        return run.lr
    given = flag_value(run.flags, "--learning_rate")
    if given is not None:
        return float(given)
    text = (out / "logs" / f"{run.folder.name}.log").read_text(encoding="utf-8", errors="replace")
    found = re.search(r"learning rate ([0-9.eE+-]+) \(", text)
    return float(found.group(1)) if found else None


def scoring_device():
    """Where the bench scores checkpoints: the first CUDA device when there is one, else the CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class CheckpointScorer:
    """Scores a run's checkpoints in this process on ``device``: the run's scored MLM (:func:`load_scored_mlm` of the
    run folder) is built once, then each checkpoint's ``model.safetensors`` is loaded into it (``load_state_dict``;
    an RTD checkpoint's ``generator.`` part) and scored by :func:`heldout_loss` -- the same numbers as building the
    model from each checkpoint (:func:`load_scored_mlm`; tested), without a model construction per checkpoint.

    Raises:
        BenchError: a checkpoint's weights do not fit the model (a key missing that is not tied to a loaded one, an
            unexpected key, or a tensor of another shape).
    """

    def __init__(self, folder: Path, device=None):
        self.folder = Path(folder)
        self.device = device if device is not None else scoring_device()
        self.generator = scored_by_generator(self.folder)
        self.model = load_scored_mlm(self.folder).to(self.device)

    def load(self, weights: Path):
        """Load the weights of a checkpoint's ``model.safetensors`` into the model; return the model."""
        from safetensors.torch import load_file

        state = load_file(str(weights), device=str(self.device))
        if self.generator:
            state = {k[len("generator.") :]: v for k, v in state.items() if k.startswith("generator.")}
        own = self.model.state_dict()
        try:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
        except RuntimeError as err:  # a tensor of another shape
            raise BenchError(f"{weights}: the weights do not fit {self.folder}: {err}") from err
        loaded = {own[k].data_ptr() for k in state if k in own}
        untied = [k for k in missing if own[k].data_ptr() not in loaded]
        if unexpected or untied:
            raise BenchError(
                f"{weights}: the weights do not fit {self.folder} (missing {sorted(untied)}, unexpected "
                f"{sorted(unexpected)})"
            )
        return self.model

    def score(self, weights: Path, heldout: dict) -> float:
        """:func:`heldout_loss` (nats) of the checkpoint ``weights``."""
        return heldout_loss(self.load(weights), heldout, self.device)


def score_run(run: Run, args, data: dict, heldout: dict, final_only: bool = False) -> list[dict]:
    """The run's curve: ``[{"seconds", "tokens", "step", "eval_loss"}]`` at its checkpoints (the last only with
    ``final_only``), scored by :func:`heldout_loss`: a reference run's scores as its own process logged them (it
    scores its live model at its save steps, :func:`reference_main`), a recipe run's checkpoints in this process on
    the scoring device (:class:`CheckpointScorer`); the checkpoints are removed unless ``--keep_checkpoints``.

    Raises:
        BenchError: a scored step without a logged training time.
    """
    times = step_times(run, args, data)
    folder = run.folder / "checkpoints"
    logged = {}
    if run.kind == "reference":
        logged = {int(k): v for k, v in reference_log(run.folder).get("scores", {}).items()}
    if logged:
        steps = sorted(logged)
    else:
        steps = sorted(int(p.name.split("_")[1]) for p in folder.glob("step_*")) if folder.is_dir() else []
    if final_only:
        steps = steps[-1:]
    curve, scorer = [], None
    for step in steps:
        if step not in times:
            raise BenchError(f"{run.name}: no training time logged at checkpoint step {step}")
        if step in logged:
            loss = logged[step]
        elif run.kind == "reference":
            loss = heldout_loss(load_mlm(folder / f"step_{step}").to(scoring_device()), heldout)
        else:
            scorer = scorer or CheckpointScorer(run.folder)
            loss = scorer.score(folder / f"step_{step}" / "model.safetensors", heldout)
        curve.append(
            {"seconds": times[step]["seconds"], "tokens": times[step]["tokens"], "step": step, "eval_loss": loss}
        )
    if not args.keep_checkpoints and folder.is_dir():
        shutil.rmtree(folder)
    return curve


def copy_record(run: Run, curve: list[dict], out: Path) -> dict:
    """The ``copies`` entry of a scored run."""
    last = curve[-1]
    return {
        "name": run.folder.name,
        "repeat": run.repeat,
        "seed": run.seed,
        "paired_with": run.paired_with,
        "heldout_model": "generator" if run.kind == "recipe" and scored_by_generator(run.folder) else "model",
        "final_eval_loss": last["eval_loss"],
        "tokens": last["tokens"],
        "seconds": last["seconds"],
        "steps": last["step"],
        "tokens_per_second": last["tokens"] / max(last["seconds"], 1e-9),
        "learning_rate": learning_rate_of(run, out),
        "curve": curve,
    }


def summarize(kind: str, flags, copies: list[dict]) -> dict:
    """A ``runs`` entry: medians over ``copies``, the first copy's curve."""
    med = {
        k: statistics.median(c[k] for c in copies)
        for k in ("final_eval_loss", "tokens", "seconds", "steps", "tokens_per_second")
    }
    return {
        "kind": kind,
        "flags": flags,
        **med,
        "learning_rate": copies[0]["learning_rate"],
        "heldout_model": copies[0].get("heldout_model", "model"),
        "curve": copies[0]["curve"],
        "copies": copies,
    }


# -- the reference process ------------------------------------------------------------------------------------------
class _ProjectImportBlocker:
    """A ``sys.meta_path`` finder that refuses the project's packages (:data:`PROJECT_PACKAGES`)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in PROJECT_PACKAGES:
            raise ImportError(f"the reference run imports no project code (tried {name})")
        return None


def block_project_imports() -> None:
    """Make every later import of a project package fail in this process (the reference's guarantee)."""
    if not any(isinstance(f, _ProjectImportBlocker) for f in sys.meta_path):
        sys.meta_path.insert(0, _ProjectImportBlocker())


def reference_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_time_to_quality.py _reference",
        description="transformers' BertForMaskedLM trained the run_mlm way (internal)",
    )
    p.add_argument("--blocks", required=True, help="save_to_disk folder of group_texts blocks")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--model_shape", choices=list(SHAPES), required=True)
    p.add_argument("--learning_rate", type=float, required=True)
    p.add_argument("--max_train_steps", type=int, required=True)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--save_steps", type=int, nargs="*", default=[], help="steps whose weights are scored (and saved)")
    p.add_argument(
        "--heldout",
        default=None,
        help="a heldout.safetensors: score the model on it at --save_steps, in this process on its device, outside "
        "the timed steps (the curve in reference_log.json's 'scores')",
    )
    p.add_argument(
        "--save_checkpoints",
        action="store_true",
        help="also save_pretrained the model at --save_steps (checkpoints/step_N; always without --heldout)",
    )
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--mixed_precision", choices=["no", "bf16"], default="no")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--start_file", default=None, help="wait for this file to exist before the first step")
    p.add_argument("--output_dir", required=True)
    return p


def reference_model(shape: str, tokenizer):
    """transformers' ``BertForMaskedLM`` of ``shape`` (:data:`SHAPES`, BERT's other defaults) for ``tokenizer``,
    with SDPA attention."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **SHAPES[shape])
    config._attn_implementation = "sdpa"
    return BertForMaskedLM(config)


def _wait_for_start_file(start_file: str | None) -> float:
    """Wait until ``start_file`` exists (None: no wait; TimeoutError after 600 s); return the seconds waited."""
    waited = time.perf_counter()
    while start_file and not os.path.exists(start_file):  # the paired run's set-up (not timed)
        if time.perf_counter() - waited > 600:
            raise TimeoutError(f"--start_file {start_file}: not created within 600 s")
        time.sleep(0.1)
    return time.perf_counter() - waited


def reference_main(argv=None) -> dict:
    """Train the reference (see the module docstring, item 4) and write ``output_dir``: ``reference_log.json``
    (``steps``: per step the cumulative training ``seconds`` and ``tokens`` and the loss; ``scores``: ``{step:
    held-out loss}`` at ``--save_steps`` with ``--heldout`` (:func:`heldout_loss` of the live model, float32, eval
    mode, on the training device; it draws no random numbers, so the trajectory is the same as without it) and
    ``scoring_s`` (seconds spent scoring and saving, outside the timed steps); the model, collator and optimizer
    classes; project modules loaded, which must be none), ``checkpoints/step_N/`` (``save_pretrained``) at
    ``--save_steps`` without ``--heldout`` or with ``--save_checkpoints``, and the final model + tokenizer. Returns
    the log."""
    block_project_imports()
    args = reference_parser().parse_args(argv)
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling, get_linear_schedule_with_warmup

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    blocks = load_from_disk(args.blocks)
    heldout = None
    if args.heldout:
        from safetensors.torch import load_file

        heldout = load_file(args.heldout)
    torch.manual_seed(args.seed)
    model = reference_model(args.model_shape, tokenizer).to(device).train()
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    loader = torch.utils.data.DataLoader(
        blocks,
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=collator,
        generator=torch.Generator().manual_seed(args.seed),
        drop_last=False,
    )
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=args.learning_rate,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=args.weight_decay,
        fused=True,
    )  # TrainingArguments: adamw_torch_fused
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, args.max_train_steps)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.mixed_precision == "bf16")
    waited = _wait_for_start_file(args.start_file)
    records, scores, scoring_s, seconds, tokens, step = [], {}, 0.0, 0.0, 0, 0
    saves = set(args.save_steps)
    while step < args.max_train_steps:
        batches = iter(loader)
        while step < args.max_train_steps:
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break  # the epoch is over: a new shuffle
            batch = {k: v.to(device) for k, v in batch.items()}
            with autocast:
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = float(loss)  # waits for the device: the step's time is complete
            seconds += time.perf_counter() - t0
            step += 1
            tokens += int(batch["attention_mask"].sum())
            records.append({"step": step, "seconds": seconds, "tokens": tokens, "loss": loss_value})
            if step in saves:  # outside the timed span
                t_score = time.perf_counter()
                if heldout is not None:  # float32, eval mode: the same function as scoring a saved checkpoint
                    scores[step] = heldout_loss(model, heldout, device)
                if heldout is None or args.save_checkpoints:
                    model.save_pretrained(str(out / "checkpoints" / f"step_{step}"))
                scoring_s += time.perf_counter() - t_score
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    result = {
        "steps": records,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "collator_class": f"{type(collator).__module__}.{type(collator).__qualname__}",
        "optimizer_class": f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
        "attn_implementation": model.config._attn_implementation,
        "learning_rate": args.learning_rate,
        "weight_decay": args.weight_decay,
        "mixed_precision": args.mixed_precision,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "waited_for_start_s": waited,
        "scores": {str(k): v for k, v in scores.items()},
        "scoring_s": scoring_s,
        "project_modules_loaded": sorted(m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES),
    }
    (out / REFERENCE_LOG).write_text(json.dumps(result) + "\n", encoding="utf-8")
    return result


# -- fine-tuning ----------------------------------------------------------------------------------------------------
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


# -- the plan (--plan_only) -----------------------------------------------------------------------------------------
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


def plan_phases(args, costs: dict, glue_sizes: dict[str, int] | None = None) -> list[dict]:
    """The bench's phases for ``args`` under the cost model ``costs`` (a :data:`PLAN_COSTS` entry): ``[{"phase",
    "seconds", "detail"}]`` in run order. Step times scale from the measured shape and batch by
    :func:`_shape_flops` x tokens per step; a wall-clock budget B gives every run B seconds of steps; the
    reference runs once per repeat under ``sequential`` / ``shared`` and once per recipe under ``paired`` (paired
    runs overlap: the pair costs its longer run). ``glue_sizes``: training examples per task (default
    :data:`GLUE_TRAIN_SIZES`), capped as :func:`finetune_command` caps them."""
    m, a = costs["measured"], costs["assumed"]
    at = m["at"]
    scale = (_shape_flops(args.model_shape) * args.batch_size * args.max_seq_length) / (
        _shape_flops(at["model_shape"]) * at["batch_size"] * at["max_seq_length"]
    )
    step = {"reference": m["reference_step_s"] * scale, "recipe": m["recipe_step_s"] * scale}
    start = a["process_start_s"]
    k, r, paired = len(args.recipe_table), args.repeats, args.schedule == "paired"
    variants = len({"prepared", *(data_variant(f) for f in args.recipe_table.values())})
    workers = args.preprocessing_num_workers
    speedup = 1 + (workers - 1) * a["worker_efficiency"]  # each worker after the first adds that share of one
    share = a["data_parallel_share"]
    data = m["data_one_worker_s"] * (1 + a["prepare_share"] * (variants - 1)) * ((1 - share) + share / speedup)
    if args.budget_minutes is not None:
        run_s = {kind: args.budget_minutes * 60 for kind in step}
    else:
        tokens_per_step = args.batch_size * args.max_seq_length
        run_s = {kind: math.ceil(args.budget_tokens / tokens_per_step) * step[kind] for kind in step}
    probe = {kind: start[kind] + args.probe_steps * step[kind] for kind in step}
    points = args.curve_points
    phases = [
        {
            "phase": "data",
            "seconds": data,
            "detail": f"{m['data_one_worker_s']:.0f} s with one worker (measured), {variants} prepared variant(s), "
            f"{share:.0%} of it over {workers} workers at {a['worker_efficiency']:.0%} efficiency (assumed)",
        }
    ]
    if args.budget_minutes is not None:
        seconds = k * max(probe.values()) if paired else probe["reference"] + k * probe["recipe"]
        phases.append(
            {
                "phase": "probes",
                "seconds": seconds,
                "detail": f"{args.probe_steps} steps + start-up per probe run; reference "
                f"{step['reference'] * 1000:.0f} ms/step, ours {step['recipe'] * 1000:.0f} ms/step",
            }
        )
    lrs = len(args.reference_lrs)
    sweep = 0.0
    if lrs > 1:
        width = 1 if args.schedule == "sequential" else 2
        sweep = math.ceil(lrs / width) * (
            start["reference"] + args.reference_sweep_fraction * run_s["reference"] + a["score_s"]
        )
    phases.append(
        {
            "phase": "sweep",
            "seconds": sweep,
            "detail": f"{lrs} learning rate(s), {args.reference_sweep_fraction:g} of the reference's steps each",
        }
    )
    ref_run = start["reference"] + run_s["reference"] + points * a["score_s"]
    ours_run = start["recipe"] + run_s["recipe"] + points * a["checkpoint_save_s"]
    ours_score = points * (a["checkpoint_load_s"] + a["score_s"])
    if paired:
        pretraining = r * k * (max(ref_run, ours_run) + ours_score)
    else:
        pretraining = r * (ref_run + k * (ours_run + ours_score))
    phases.append(
        {
            "phase": "pretraining",
            "seconds": pretraining,
            "detail": f"{r} repeat(s) x {k} recipe(s), {run_s['recipe']:.0f} s of steps per run, {points} curve "
            f"points (reference: scored in its process; ours: saved, then scored in the bench)",
        }
    )
    phases.append({"phase": "scoring", "seconds": a["random_inits_s"], "detail": "random inits built and scored"})
    sizes = {**GLUE_TRAIN_SIZES, **(glue_sizes or {})}
    per_model = 0.0
    for task in args.tasks:
        caps = [x for x in (FINETUNE_MAX_TRAIN_SAMPLES.get(task), args.max_train_samples) if x is not None]
        n = min([sizes[task], *caps])
        steps = math.ceil(n / FINETUNE["per_device_train_batch_size"]) * args.finetune_epochs
        per_model += args.seeds * (start["finetune"] + steps * a["finetune_step_s"] + a["finetune_eval_s"])
    models = 1 + k + len(args.random_inits)
    parallel = max(1.0, args.finetune_parallel * a["finetune_parallel_efficiency"])
    phases.append(
        {
            "phase": "finetuning",
            "seconds": models * per_model / parallel if args.tasks else 0.0,
            "detail": f"{models} models x {len(args.tasks)} task(s) x {args.seeds} seed(s), "
            f"{args.finetune_parallel} at a time",
        }
    )
    return phases


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


# -- the bench ------------------------------------------------------------------------------------------------------
def plan_pairs(args, out: Path) -> list[tuple[Run, Run]]:
    """(reference copy, recipe run) for every repeat and recipe, in run order."""
    pairs = []
    for r in range(args.repeats):
        for name, flags in args.recipe_table.items():
            suffix = f"-r{r}" if args.repeats > 1 else ""
            ours = Run(
                f"{name}{suffix}",
                "recipe",
                out / "runs" / f"{name}{suffix}",
                args.seed + r,
                name,
                flags=flags,
                repeat=r,
            )
            ref = Run(
                f"reference{suffix}@{name}",
                "reference",
                out / "runs" / f"reference{suffix}@{name}",
                args.seed + r,
                name,
                repeat=r,
                paired_with=ours.name,
            )
            ours.paired_with = ref.name
            pairs.append((ref, ours))
    return pairs


def budget_steps(args, data: dict, out: Path, pairs: list[tuple[Run, Run]]) -> tuple[int, dict[str, int], dict]:
    """``(reference steps, {recipe: steps}, probe record)`` for the budget: probes for ``--budget_minutes``
    (repeat 0's pairs, run as the real runs will be), the tokens per step for ``--budget_tokens``."""
    first = [p for p in pairs if p[0].repeat == 0]
    if args.budget_tokens is not None:
        ref_steps = math.ceil(args.budget_tokens / (args.batch_size * args.max_seq_length))
        recipe_steps = {
            ours.recipe: math.ceil(args.budget_tokens / (per_step_blocks(ours, args) * args.max_seq_length))
            for _, ours in first
        }
        return ref_steps, recipe_steps, {}
    probes = []
    for ref, ours in first:
        probes.append(
            (
                Run(
                    f"probe {ref.name}",
                    "reference",
                    out / "probes" / f"probe-{ref.folder.name}",
                    ref.seed,
                    lr=args.reference_lrs[0],
                ),
                Run(
                    f"probe {ours.name}",
                    "recipe",
                    out / "probes" / f"probe-{ours.folder.name}",
                    ours.seed,
                    flags=ours.flags,
                ),
            )
        )
    log(f"probing {args.probe_steps} steps per run")
    groups = groups_for(args.schedule, probes)
    train_groups(groups, args, data, out, lambda r: args.probe_steps, 1, probe=True)
    budget_s = args.budget_minutes * 60
    ran = {r.name for g in groups for r in g}  # sequential / shared: one reference probe per repeat
    ref_per_step = statistics.median(probe_seconds_per_step(r, args, data) for r, _ in probes if r.name in ran)
    recipe_per_step = {ours.recipe: probe_seconds_per_step(p, args, data) for (_, ours), (_, p) in zip(first, probes)}
    shutil.rmtree(out / "probes")
    record = {
        "probe_steps": args.probe_steps,
        "probe_warmup": args.probe_warmup,
        "seconds_per_step": {"reference": ref_per_step, **recipe_per_step},
    }
    return (
        max(1, int(budget_s / ref_per_step)),
        {n: max(1, int(budget_s / s)) for n, s in recipe_per_step.items()},
        record,
    )


def reference_sweep(args, data: dict, out: Path, heldout: dict, ref_steps: int) -> tuple[float, dict]:
    """The reference's learning rate: the lowest final held-out loss of ``--reference_lrs`` after
    ``--reference_sweep_fraction`` of its steps (2 runs at a time when ``paired``). Returns it and ``{lr: loss}``."""
    if len(args.reference_lrs) == 1:
        return args.reference_lrs[0], {}
    steps = max(1, round(ref_steps * args.reference_sweep_fraction))
    runs = [
        Run(f"sweep lr {lr:g}", "reference", out / "sweep" / f"reference-lr{lr:g}", args.seed, lr=lr)
        for lr in args.reference_lrs
    ]
    width = 1 if args.schedule == "sequential" else 2
    groups = [runs[i : i + width] for i in range(0, len(runs), width)]
    log(f"reference learning-rate sweep: {', '.join(f'{lr:g}' for lr in args.reference_lrs)} for {steps} steps")
    train_groups(groups, args, data, out, lambda r: steps, 1)
    sweep = {run.lr: score_run(run, args, data, heldout, final_only=True)[-1]["eval_loss"] for run in runs}
    return min(sweep, key=sweep.get), {"steps": steps, "final_eval_loss": {f"{k:g}": v for k, v in sweep.items()}}


#: Why a run scored by its generator (``heldout_model`` "generator") has no MLM ratios.
NOT_APPLICABLE = (
    "scored by its generator (an MLM of 1/4 the width, trained beside the discriminator that is "
    "fine-tuned): its held-out loss is not the loss of a model of the reference's shape"
)


def ratios_for(pairs_scored: list[tuple[dict, dict]], unigram: float) -> dict:
    """A recipe's ratios from its (reference copy, ours) ``copies`` entries, one pair per repeat: medians, repeat
    0's details and every repeat's ratios. A run scored by its generator gets ``None`` ratios and
    ``not_applicable`` (:data:`NOT_APPLICABLE`)."""
    if pairs_scored and pairs_scored[0][1].get("heldout_model") == "generator":
        return {"quality_per_token": None, "time_to_quality": None, "not_applicable": NOT_APPLICABLE, "per_repeat": []}
    per = []
    for ref, ours in pairs_scored:
        per.append(
            {
                "repeat": ours["repeat"],
                **quality_per_token(ours["curve"], ref["curve"], unigram),
                **time_to_quality(ours["curve"], ref["curve"]),
            }
        )
    first = dict(per[0])
    first.update(
        quality_per_token=median_or_none(p["quality_per_token"] for p in per),
        time_to_quality=median_or_none(p["time_to_quality"] for p in per),
        per_repeat=per,
    )
    return first


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def _pretrain_and_score(pairs: list[tuple[Run, Run]], args, data: dict, out: Path, heldout: dict) -> dict[str, dict]:
    """Train the runs of ``pairs`` (steps and learning rates already set) group by group per ``args.schedule``, scoring
    each on ``heldout``; return {run name: copy_record}. A run is scored after its group, or on the CPU as soon as
    it has ended while others of its group still run (the reference copy scores itself in its process: our run's
    scoring then takes our run's core, so the machine's load stays that of the pair); never while a run of the
    next group trains."""
    copies: dict[str, dict] = {}

    def score(run: Run) -> None:
        copies[run.name] = copy_record(run, score_run(run, args, data, heldout), out)
        log(
            f"{run.name}: held-out loss {copies[run.name]['final_eval_loss']:.4f} after "
            f"{copies[run.name]['steps']} steps, {copies[run.name]['tokens']:.3g} tokens, "
            f"{copies[run.name]['seconds']:.0f} s"
        )

    def score_early(run: Run) -> None:  # beside a run still training: the threads our run had, not more
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(min(threads, args.threads))
        try:
            score(run)
        finally:
            torch.set_num_threads(threads)

    early = scoring_device().type == "cpu"
    for group in groups_for(args.schedule, pairs):
        on_done = score_early if early and len(group) > 1 else None
        train_groups([group], args, data, out, lambda r: r.steps, args.curve_points, on_done=on_done)
        for run in group:
            if run.name not in copies:
                score(run)
    return copies


def _summarize_pairs(args, pairs: list[tuple[Run, Run]], copies: dict[str, dict], unigram: float) -> tuple[dict, dict]:
    """Take the pairs, their scored ``copies`` and the unigram loss; return (runs: the reference's and every recipe's
    summary, ratios: {recipe: ratios_for its pairs})."""
    ref_copies = [copies[ref.name] for ref, _ in pairs]
    runs = {"reference": summarize("reference", [], ref_copies)}
    ratios = {}
    for name, flags in args.recipe_table.items():
        mine = [(copies[ref.name], copies[ours.name]) for ref, ours in pairs if ours.recipe == name]
        runs[name] = summarize("recipe", flags, [o for _, o in mine])
        ratios[name] = ratios_for(mine, unigram)
    return runs, ratios


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_reference":
        reference_main(argv[1:])
        return 0
    args = parse_args(argv)
    if args.plan_only:
        print_plan(args, args.plan_only)
        return 0
    signal.signal(signal.SIGTERM, _terminate)  # unwind (children stopped by run_jobs) instead of dying at once
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    timings, t0 = {}, time.perf_counter()
    load_before = os.getloadavg()[0]

    def lap(phase: str) -> None:
        nonlocal t0
        timings[phase] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()

    data = prepare_shared_data(args, out)
    heldout, hinfo = build_heldout(args, out, data)
    unigram = training_unigram_loss(data["reference_blocks"], data["tokenizer"], heldout)
    log(
        f"held-out: {hinfo['blocks']} blocks, {hinfo['masked']} masked tokens, sha256 {hinfo['sha256'][:12]}; "
        f"unigram loss {unigram:.4f}"
    )
    lap("data")
    pairs = plan_pairs(args, out)
    ref_steps, recipe_steps, probe = budget_steps(args, data, out, pairs)
    lap("probes")
    lr, sweep = reference_sweep(args, data, out, heldout, ref_steps)
    log(
        f"reference learning rate {lr:g}; reference {ref_steps} steps; "
        + ", ".join(f"{n} {s} steps" for n, s in recipe_steps.items())
    )
    lap("sweep")
    for ref, ours in pairs:
        ref.lr, ref.steps = lr, ref_steps
        ours.steps = recipe_steps[ours.recipe]
    copies = _pretrain_and_score(pairs, args, data, out, heldout)
    shared_copies(pairs, copies)
    lap("pretraining")
    runs, ratios = _summarize_pairs(args, pairs, copies, unigram)
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
    lap("scoring")
    baselines = read_baselines(args.baselines_results, args.tasks)
    results = {
        "command": ["python", os.path.relpath(__file__), *argv],
        "protocol": protocol(args, data, lr, ref_steps, recipe_steps, probe, load_before),
        "heldout_sha256": hinfo["sha256"],
        "heldout": {k: hinfo[k] for k in ("blocks", "tokens", "masked")} | {"seed": args.heldout_seed},
        "unigram_loss": unigram,
        "ratios": {
            "default_recipe": args.default_recipe,
            "quality_per_token": ratios[args.default_recipe]["quality_per_token"],
            "time_to_quality": ratios[args.default_recipe]["time_to_quality"],
            "by_recipe": ratios,
        },
        "runs": runs,
        "pretraining_buys": {},
        "baselines": baselines,
        "sweep": sweep,
        "timings": timings,
    }
    write_outputs(results, out)  # the pretraining figures, in case fine-tuning is cut short
    if args.tasks:
        for name, rec in finetune_all(models, args, out).items():
            runs[name].update(rec)
        lap("finetuning")
        results["pretraining_buys"] = pretraining_buys(runs, baselines)
        write_outputs(results, out)
    print_ratios(results)
    return 0


def write_outputs(results: dict, out: Path) -> None:
    """``results.json``, ``results.md`` and ``results.png`` in ``out`` (the load average now as ``after``)."""
    results["protocol"]["load_average_after"] = os.getloadavg()[0]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (out / "results.md").write_text(results_markdown(results), encoding="utf-8")
    plot_results(results, out / "results.png")


def _reference_protocol(args, lr: float) -> dict:
    """Take the parsed args and the reference's chosen learning rate; return protocol["reference"]."""
    return {
        "model": "transformers BertForMaskedLM, attn_implementation sdpa, BertConfig defaults otherwise",
        "collator": "DataCollatorForLanguageModeling(mlm_probability=0.15)",
        "data": "run_mlm group_texts blocks of the documents ([CLS] doc [SEP]), shuffled per epoch",
        "optimizer": "torch AdamW fused, betas (0.9, 0.999), eps 1e-8",
        "weight_decay": args.reference_weight_decay,
        "schedule": "linear decay to 0, no warmup",
        "max_grad_norm": 1.0,
        "mixed_precision": args.reference_mixed_precision,
        "learning_rates_swept": args.reference_lrs,
        "sweep_fraction": args.reference_sweep_fraction,
        "learning_rate": lr,
    }


def _prepared_dataset_protocol(data: dict) -> dict:
    """Take prepare_shared_data's dict; return protocol["prepared_dataset"] (paths and sizes of the blocks)."""
    manifest = data["manifest"]
    return {
        "path": str(data["prepared"]),
        "blocks": manifest["blocks"],
        "tokens": manifest["tokens"],
        "variants": {
            n: {
                "path": str(v["path"]),
                "blocks": v["manifest"]["blocks"],
                "tokens": v["manifest"]["tokens"],
                "document_boundaries": v["manifest"].get("document_boundaries", False),
            }
            for n, v in data["variants"].items()
        },
    }


def _finetune_protocol(args) -> dict:
    """Take the parsed args; return protocol["finetune"] (the fine-tuning settings, per-task caps included)."""
    cap = {
        t: min(x for x in (FINETUNE_MAX_TRAIN_SAMPLES.get(t), args.max_train_samples) if x is not None)
        for t in args.tasks
        if t in FINETUNE_MAX_TRAIN_SAMPLES or args.max_train_samples is not None
    }
    return {
        **FINETUNE,
        "num_train_epochs": args.finetune_epochs,
        "learning_rate": args.finetune_learning_rate,
        "max_seq_length": args.max_seq_length,
        "max_train_samples": cap,
        "seeds": [42 + i for i in range(args.seeds)],
        "tasks": args.tasks,
        "metric": {t: TASK_METRICS[t] for t in args.tasks},
        "mixed_precision": "no",
        "parallel": args.finetune_parallel,
        "statistic": "median over seeds",
    }


def protocol(args, data: dict, lr: float, ref_steps: int, recipe_steps: dict, probe: dict, load_before: float) -> dict:
    """The ``protocol`` block of ``results.json``: every setting the figures depend on."""
    import torch
    import transformers

    manifest = data["manifest"]
    return {
        "budget_minutes": args.budget_minutes,
        "budget_tokens": args.budget_tokens,
        "model_shape": args.model_shape,
        "shape": SHAPES[args.model_shape],
        "vocab_size": manifest["tokenizer_size"],
        "max_seq_length": args.max_seq_length,
        "batch_size": args.batch_size,
        "tokens_per_step": args.batch_size * args.max_seq_length,
        "schedule": args.schedule,
        "threads_per_run": args.threads,
        "repeats": args.repeats,
        "pretraining_seeds": [args.seed + r for r in range(args.repeats)],
        "curve_points": args.curve_points,
        "budget_to_steps": probe or "tokens / tokens per step",
        "steps": {"reference": ref_steps, **recipe_steps},
        "reference": _reference_protocol(args, lr),
        "recipes": {
            n: {"flags": f, "note": RECIPES.get(n, {}).get("note", "--recipe_flags")}
            for n, f in args.recipe_table.items()
        },
        "default_recipe": args.default_recipe,
        "prepared_dataset": _prepared_dataset_protocol(data),
        "finetune": _finetune_protocol(args),
        "random_inits": [f"random-{k}" for k in args.random_inits],
        "heldout": {
            "file": str(Path(args.output_dir) / HELDOUT_FILE),
            "seed": args.heldout_seed,
            "mlm_probability": 0.15,
            "mask_replace_prob": 0.8,
            "random_replace_prob": 0.1,
            "blocks": "one document per block, [CLS] chunk [SEP], <= max_seq_length tokens",
            "score": "mean cross-entropy (nats) over masked positions, full logits, eval mode",
        },
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "mixed_precision": {
            "reference": args.reference_mixed_precision,
            "ours": args.mixed_precision or "pretrain default",
        },
        "preprocessing_num_workers": args.preprocessing_num_workers,
        "scoring": "reference: in its own process at its save steps; ours: checkpoints in the bench process; "
        f"both on {scoring_device()}",
        "cpu_count": os.cpu_count(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "load_average_before": load_before,
    }


def _fmt(value, spec: str = ".3f", none: str = "--") -> str:
    return none if value is None else format(value, spec)


def _md_ratio_lines(results: dict) -> list[str]:
    """Take results.json's dict; return results.md's title, held-out summary and ratios table, as lines."""
    proto, ratios = results["protocol"], results["ratios"]
    budget = (
        f"{proto['budget_minutes']:g} minutes"
        if proto["budget_minutes"] is not None
        else f"{proto['budget_tokens']:,} tokens"
    )
    lines = [
        f"# Time to quality: {proto['model_shape']}, {budget} per run",
        "",
        f"Unigram held-out loss {results['unigram_loss']:.4f} nats; held-out set {results['heldout']['blocks']} "
        f"blocks, {results['heldout']['masked']} masked tokens "
        f"(sha256 `{results['heldout_sha256'][:16]}...`).",
        "",
        f"## Ratios (default recipe: {ratios['default_recipe']})",
        "",
        f"Each recipe against its paired reference copy. The two ratios are medians over {proto['repeats']} "
        "repeat(s) (every repeat in results.json); the other columns are repeat 0's.",
        "",
        "| recipe | quality per token | at tokens | loss ours / reference there | time to quality | target loss "
        "| reference s | ours s to target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in ratios["by_recipe"].items():
        if r.get("not_applicable"):
            lines.append(f"| {name} | n/a | | | n/a | | | {r['not_applicable']} |")
            continue
        reached = (
            "not reached"
            if r["seconds_to_target"] is None
            else f"{r['seconds_to_target']:.0f}" + (" (<= first point)" if r["reached_by_first_point"] else "")
        )
        qpt = _fmt(r["quality_per_token"], ".3f", "-- (reference not below unigram)")
        lines.append(
            f"| {name} | {qpt} | {r['tokens_compared']:.3g} | "
            f"{r['loss_at_tokens']['ours']:.4f} / {r['loss_at_tokens']['reference']:.4f} | "
            f"{_fmt(r['time_to_quality'], '.2f', 'not reached')} | {r['target_loss']:.4f} | "
            f"{r['reference_seconds']:.0f} | {reached} |"
        )
    return lines


def _md_runs_lines(runs: dict, tasks: list[str]) -> list[str]:
    """Take results["runs"] and the fine-tuning tasks; return results.md's "Runs" section, as lines."""
    head = "| run | lr | steps | tokens | train s | tokens/s | held-out loss |" + "".join(f" {t} |" for t in tasks)
    lines = [
        "",
        "## Runs",
        "",
        "Medians over copies (the reference: one copy per recipe and repeat); downstream: "
        "median over fine-tuning seeds, metric x 100.",
        "",
        head,
        "|---" * (7 + len(tasks)) + "|",
    ]
    for name, run in runs.items():
        down = run.get("downstream", {})
        cells = [
            _fmt(run.get("learning_rate"), "g"),
            _fmt(run.get("steps"), ".0f"),
            _fmt(run.get("tokens"), ".3g"),
            _fmt(run.get("seconds"), ".0f"),
            _fmt(run.get("tokens_per_second"), ".0f"),
            _fmt(run.get("final_eval_loss"), ".4f")
            + (" (generator)" if run.get("heldout_model") == "generator" else ""),
        ]
        cells += [_fmt(None if down.get(t) is None else 100 * down[t], ".1f") for t in tasks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _md_pretraining_buys_lines(buys: dict, tasks: list[str]) -> list[str]:
    """Take results["pretraining_buys"] (non-empty) and the tasks; return the "What pretraining buys" section."""
    lines = [
        "",
        "## What pretraining buys (metric x 100)",
        "",
        "| run | " + " | ".join(f"{t}: vs random init | {t}: vs best classic" for t in tasks) + " |",
        "|---" * (1 + 2 * len(tasks)) + "|",
    ]
    for name, per in buys.items():
        cells = []
        for t in tasks:
            b = per.get(t, {})
            vs_init = None if b.get("vs_random_init") is None else 100 * b["vs_random_init"]
            vs_best = None if b.get("vs_best_classic") is None else 100 * b["vs_best_classic"]
            cells += [
                f"{_fmt(vs_init, '+.1f')} ({b.get('random_init') or '--'})",
                f"{_fmt(vs_best, '+.1f')} ({b.get('best_classic') or 'no baselines'})",
            ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _md_protocol_lines(results: dict) -> list[str]:
    """Take results.json's dict; return results.md's "Protocol" and "Command" sections, as lines."""
    proto = results["protocol"]
    ft = proto["finetune"]
    lines = [
        "",
        "## Protocol",
        "",
        f"- shape {proto['model_shape']} {proto['shape']}, vocabulary {proto['vocab_size']}, batch "
        f"{proto['batch_size']} x {proto['max_seq_length']} = {proto['tokens_per_step']} tokens per step; "
        f"steps {proto['steps']}",
        f"- schedule `{proto['schedule']}`, {proto['threads_per_run']} thread(s) per run, {proto['repeats']} "
        f"repeat(s), seeds {proto['pretraining_seeds']}; budget to steps: {proto['budget_to_steps']}",
        f"- reference: {proto['reference']['model']}; {proto['reference']['collator']}; "
        f"{proto['reference']['data']}; {proto['reference']['optimizer']}, weight decay "
        f"{proto['reference']['weight_decay']}, {proto['reference']['schedule']}, clip 1.0, mixed precision "
        f"{proto['reference']['mixed_precision']}; learning rate {proto['reference']['learning_rate']:g} of "
        f"{proto['reference']['learning_rates_swept']} (sweep {results['sweep'] or 'none'})",
        *[
            f"- recipe `{n}`: `{' '.join(r['flags']) or '(no flags)'}` -- {r['note']}"
            for n, r in proto["recipes"].items()
        ],
        f"- fine-tuning: `python -m finetune.glue`, lr {ft['learning_rate']:g}, batch "
        f"{ft['per_device_train_batch_size']}, {ft['num_train_epochs']:g} epochs, warmup ratio "
        f"{ft['warmup_ratio']}, weight decay {ft['weight_decay']}, max_seq_length {ft['max_seq_length']}, "
        f"training caps {ft['max_train_samples']}, seeds {ft['seeds']}, {ft['statistic']}; random inits "
        f"{proto['random_inits']}",
        f"- device {proto['device']} ({proto['cpu_count']} cores), load average "
        f"{proto['load_average_before']:.1f} before, {proto.get('load_average_after', float('nan')):.1f} after; "
        f"wall seconds per phase {results['timings']}",
        "",
        "## Command",
        "",
        "```",
        shlex.join(results["command"]),
        "```",
        "",
    ]
    return lines


def results_markdown(results: dict) -> str:
    """``results.md``: the ratios, a table per run, what pretraining buys, the protocol and the command."""
    tasks = results["protocol"]["finetune"]["tasks"]
    lines = _md_ratio_lines(results) + _md_runs_lines(results["runs"], tasks)
    if results["pretraining_buys"]:
        lines += _md_pretraining_buys_lines(results["pretraining_buys"], tasks)
    lines += _md_protocol_lines(results)
    return "\n".join(lines)


def _plot_loss_panel(ax, key: str, label: str, results: dict, recipes: dict, colors: dict) -> None:
    """Draw held-out loss vs ``key`` ("seconds" or "tokens", x label ``label``) on ``ax``: the ``recipes`` runs in
    ``colors``, the reference copies and the unigram/untrained/target levels of ``results``; returns None."""
    runs = results["runs"]
    for name, run in recipes.items():
        generator = run.get("heldout_model") == "generator"  # an RTD run: its generator's MLM loss
        ax.plot(
            [p[key] for p in run["curve"]],
            [p["eval_loss"] for p in run["curve"]],
            marker="x" if generator else "o",
            markersize=3,
            linestyle=":" if generator else "-",
            color=colors[name],
            label=f"{name} (lr {run['learning_rate']:g})" + (": generator's MLM loss" if generator else ""),
        )
    # the reference: vs seconds each recipe's paired copy (dashed, the recipe's colour: its time-to-quality
    # partner); vs tokens one copy (the copies of a repeat share the trajectory)
    copies = [c for c in runs.get("reference", {}).get("copies", []) if c["repeat"] == 0]
    copies = list({c["name"]: c for c in reversed(copies)}.values())[::-1]  # --schedule shared: one run, once
    for copy in copies if key == "seconds" else copies[:1]:
        paired = next((n for n in recipes if copy["paired_with"] == n or copy["name"].endswith("@" + n)), None)
        ax.plot(
            [p[key] for p in copy["curve"]],
            [p["eval_loss"] for p in copy["curve"]],
            marker="o",
            markersize=3,
            linestyle="--",
            color=colors.get(paired, "black") if key == "seconds" else "black",
            label=f"reference (lr {copy['learning_rate']:g})" + (f", paired with {paired}" if key == "seconds" else ""),
        )
    ax.axhline(results["unigram_loss"], color="gray", linestyle=":", label="unigram plateau")
    if "random-sesame" in runs:
        ax.axhline(
            runs["random-sesame"]["final_eval_loss"],
            color="tab:red",
            linestyle=":",
            linewidth=0.8,
            label="random init (untrained)",
        )
    if copies:
        ax.axhline(
            copies[0]["final_eval_loss"],
            color="black",
            linewidth=0.6,
            linestyle="-.",
            label="reference final (target)",
        )
    ax.set_xlabel(label)
    ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    ax.set_ylabel("held-out MLM loss (nats)")
    ax.grid(alpha=0.3)


def _plot_downstream_panel(ax, results: dict, tasks: list[str], colors: dict) -> None:
    """Draw the downstream medians of ``results`` per task in ``tasks`` as grouped bars on ``ax`` (run colours from
    ``colors``), with the best classic baseline marked; returns None."""
    runs = results["runs"]
    names = [n for n, r in runs.items() if r.get("downstream")]
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(tasks))]
        ys = [100 * (runs[name]["downstream"].get(t) or 0.0) for t in tasks]
        color = colors.get(name, {"reference": "0.3", "random-sesame": "0.7"}.get(name, "0.5"))
        ax.bar_label(ax.bar(xs, ys, width, label=name, color=color), fmt="%.1f", fontsize=6, padding=1)
    for i, t in enumerate(tasks):
        best = max((v for b, v in results["baselines"].get(t, {}).items() if b in CLASSIC_BASELINES), default=None)
        if best is not None:
            ax.hlines(
                100 * best,
                i - 0.45,
                i + 0.45,
                color="black",
                linewidth=1.2,
                label="best classic baseline" if i == 0 else None,
            )
    labels = [t + "\n(" + TASK_METRICS[t].replace("_", "\n") + ")" for t in tasks]  # matthews\ncorrelation
    ax.set_xticks(range(len(tasks)), labels)
    ax.set_ylabel("GLUE dev metric x 100 (median over seeds)")
    ax.set_title("downstream after fine-tuning")
    ax.axhline(0, color="black", linewidth=0.5)


def plot_results(results: dict, path: Path) -> None:
    """``results.png``: held-out loss vs training seconds and vs tokens (every trained run's first copy, the unigram
    level, the untrained level, the reference's final loss), and the downstream medians as grouped bars (the best
    classic baseline marked)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: the process's backend stays as it is
    from matplotlib.figure import Figure

    runs, tasks = results["runs"], results["protocol"]["finetune"]["tasks"]
    fig = Figure(figsize=(16, 6.0))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3 if tasks else 2)
    recipes = {n: r for n, r in runs.items() if r.get("kind") == "recipe"}
    colors = {n: f"C{i}" for i, n in enumerate(recipes)}
    for ax, key, label in ((axes[0], "seconds", "training seconds"), (axes[1], "tokens", "training tokens")):
        _plot_loss_panel(ax, key, label, results, recipes, colors)
    axes[0].set_title("held-out loss vs training seconds")
    axes[1].set_title("held-out loss vs tokens")
    if tasks:
        _plot_downstream_panel(axes[2], results, tasks, colors)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:  # the bar panel is empty before fine-tuning
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    proto = results["protocol"]
    budget = (
        f"{proto['budget_minutes']:g} min"
        if proto["budget_minutes"] is not None
        else f"{proto['budget_tokens']:,} tokens"
    )
    fig.suptitle(f"time to quality: {proto['model_shape']}, {budget} per run, schedule {proto['schedule']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_ratios(results: dict) -> None:
    """The summary lines, the default recipe's ratios last."""
    for name, run in results["runs"].items():
        if "steps" in run:
            which = " (generator)" if run.get("heldout_model") == "generator" else ""
            print(
                f"{name:24s} held-out loss {run['final_eval_loss']:.4f}{which}  {run['steps']:.0f} steps  "
                f"{run['tokens']:.3g} tokens  {run['seconds']:.0f} s  {run['tokens_per_second']:.0f} tokens/s"
            )
    print(f"unigram loss {results['unigram_loss']:.4f}")
    ratios = results["ratios"]
    for name, r in ratios["by_recipe"].items():
        if r.get("not_applicable"):
            print(f"{name}: no quality per token / time to quality: {r['not_applicable']}")
        elif name != ratios["default_recipe"]:
            qpt = _fmt(r["quality_per_token"], ".3f", "None (reference not below unigram)")
            print(
                f"{name}: quality per token {qpt}, time to quality {_fmt(r['time_to_quality'], '.2f', 'not reached')}"
            )
    r = ratios["by_recipe"][ratios["default_recipe"]]
    if r.get("not_applicable"):
        return
    print(
        f"{ratios['default_recipe']} vs reference: quality per token "
        f"{_fmt(r['quality_per_token'], '.3f', 'None (reference not below unigram)')} "
        f"(at {r['tokens_compared']:.3g} tokens); time to quality {_fmt(r['time_to_quality'], '.2f', 'not reached')} "
        f"(target {r['target_loss']:.4f}: reference {r['reference_seconds']:.0f} s, ours "
        + ("not reached)" if r["seconds_to_target"] is None else f"{r['seconds_to_target']:.0f} s)")
    )


if __name__ == "__main__":
    sys.exit(main())
