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

What runs (every run is a child process; the project is driven through its command lines, the fine-tunes through
``finetune.glue``'s ``main`` with the same arguments):

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
3. **Budget to steps.** With ``--budget_minutes`` every run sizes its own schedule in its own process, no process
   started for it: ours with ``pretrain --time_budget`` (it times 10 optimizer steps, the first 2 not counted, on a
   copy of the model, then ``--max_train_steps N = floor(budget / mean seconds per step)``; recorded in its
   ``run_config.json``), the reference with ``--time_budget_s`` (the same on a copy of its model, ``--probe_steps``
   steps of which ``--probe_warmup`` are not counted, defaults 10 and 2 as pretrain's; recorded in its
   ``reference_log.json``), so that every schedule knows its length; both probes leave the model, the data order and
   every random generator as they were (the run is the run of ``--max_train_steps N``). Under ``paired`` the reference
   probes (at least its ``--probe_steps``) until our run has logged its run plan, keeping its core busy while ours
   starts up and probes, and counts its last steps: both probes time steps with two runs training, as the runs
   will; each reference copy (one per recipe) sizes itself. With ``--budget_tokens`` N = ceil(tokens / tokens per step).
4. **The reference** (:func:`reference_main`, a child process that refuses to import any project package):
   ``BertForMaskedLM`` (``attn_implementation="sdpa"``) of the shape, ``DataCollatorForLanguageModeling``
   (``mlm_probability`` 0.15) on the reference blocks, shuffled each epoch; AdamW (fused where available, weight decay
   ``--reference_weight_decay`` 0.0, betas (0.9, 0.999), eps 1e-8), linear decay to 0 without warmup, gradient clipping
   at 1.0 -- transformers ``TrainingArguments``' defaults, which run_mlm uses -- in a plain PyTorch loop. With
   ``--reference_model modernbert`` the model is ``ModernBertForMaskedLM`` at the modern preset of the shape's width
   (modernbert-tiny at bert-tiny, ``common.MODERN_SHAPES``; the ``sesame-modern`` recipe's peer), the loop the same.
   Its peak learning rate is the best (lowest final held-out loss) of ``--reference_lrs`` after
   ``--reference_sweep_fraction`` of its steps (a sweep run's schedule decays over those steps).
5. **Our recipes** (:data:`RECIPES`; ``--recipes`` picks, ``--recipe_flags`` adds): ``python -m pretrain
   --prepared_dataset D/prepared --config_name SHAPE --per_device_train_batch_size B <recipe flags>`` plus the bench's
   run flags (``--time_budget`` or ``--max_train_steps``, ``--seed``, ``--checkpointing_steps`` (``--curve_points``
   per run; under a time budget the fraction of the run that gives the same steps, :func:`runs.checkpoint_fraction`),
   ``--checkpoints_total_limit 0``, ``--logging_steps`` = the checkpoint interval (1 under a time budget: the
   checkpoint steps are not known before the run, and each needs its logged training time), ``--eval_steps`` past
   the last step and
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
8. **Fine-tuning** (``finetune.glue``'s ``main`` called in-process, one fine-tune after another, in
   ``--finetune_parallel`` worker processes of one thread (``bench_time_to_quality.py _finetune``: one process
   start-up per worker, not per fine-tune; a fresh accelerate state and its own log per fine-tune; the same metrics
   as a ``python -m finetune.glue`` process, tested), one fixed protocol: every final model (the first repeat's;
   the reference's first copy) and the random inits of
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

import os

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
