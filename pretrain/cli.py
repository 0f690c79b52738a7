"""``accelerate launch pretrain``: pretrain a BERT-like (MLM, optionally NSP) or ELMo-style (BiLM) model.

With no data argument: the embedded demo job -- a WordPiece tokenizer (8k) trained on the corpus bundled in
``pretrain/corpus/``, a bert-tiny-sized SesameBert (L2/H128), documents packed into 128-token blocks, MLM, 300 steps;
a few minutes on a laptop CPU; writes ``outputs/pretrain-bert``. The demo's settings apply to the demo only: with
``--train_file`` / ``--dataset_name`` / ``--prepared_dataset`` the resolved arguments follow the data
(:func:`pretrain.arguments.resolve`).

What differs between families and objectives (MLM, MLM+NSP, BiLM) is read from one table, :mod:`pretrain.objectives`;
the skeleton shared with fine-tuning is :class:`training.driver.Run`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

from core.arguments import parse_arguments
from core.errors import InputError
from pretrain.arguments import (
    BudgetArguments,
    CorpusArguments,
    MaskingArguments,
    ModelArguments,
    ObjectiveArguments,
    PretrainArguments,
    PretrainTrainingArguments,
    TrainDataArguments,
    resolve,
)
from pretrain.blocks import check_predictable, data_fingerprint, held_out_source, load_blocks
from training.hub import HubArguments

logger = logging.getLogger("pretrain")

PROG = "accelerate launch pretrain"
DESCRIPTION = (
    "Pretrain a BERT-like encoder (MLM, optionally NSP) or an ELMo-style BiLM. With no data argument: the demo job, "
    "a bert-tiny-sized model with an 8k WordPiece tokenizer trained on the bundled corpus, 128-token packed "
    "blocks, 300 optimizer steps of batch 32 (a few minutes on a CPU), written to outputs/pretrain-bert. With "
    "your data (--train_file, --dataset_name or --prepared_dataset) the run lasts --num_train_epochs (1) unless "
    "--max_train_steps is given, warms up for --warmup_ratio 0.06, and evaluates and checkpoints every 10% of it."
)
#: The argument dataclasses of ``pretrain``, in ``--help`` order.
ARGUMENTS = (
    ModelArguments,
    CorpusArguments,
    TrainDataArguments,
    ObjectiveArguments,
    MaskingArguments,
    HubArguments,
    PretrainTrainingArguments,
    BudgetArguments,
)


def build_parser():
    """The ``HfArgumentParser`` of ``pretrain`` (for ``--help`` and tests)."""
    from core.arguments import build_parser as parser_of

    return parser_of(ARGUMENTS, prog=PROG, description=DESCRIPTION)


def parse(argv: Sequence[str] | None = None) -> PretrainArguments:
    """Parse ``argv`` and resolve the arguments (a prepared dataset's manifest is read and checked here).

    Raises:
        InputError: refused values; a prepared dataset that does not fit the run.
    """
    model, corpus, data, objective, masking, hub, training, budget = parse_arguments(
        ARGUMENTS, argv, prog=PROG, description=DESCRIPTION
    )
    manifest = None
    if data.prepared_dataset:
        from pretrain.prepare import check_manifest, read_manifest

        manifest = read_manifest(data.prepared_dataset)
        plan = resolve(model, objective, masking, corpus, data, training, hub, manifest, budget)
        check_manifest(plan, manifest)
        return plan
    return resolve(model, objective, masking, corpus, data, training, hub, manifest, budget)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from accelerate.utils import set_seed

    from core.files import check_output_dir_reuse
    from core.logs import setup_logging
    from pretrain.build import build_model, get_tokenizer, load_model_config
    from training.driver import Run

    plan = parse(argv)
    setup_logging()
    training = plan.training
    check_output_dir_reuse(training.output_dir, training.overwrite_output_dir, bool(training.resume_from_checkpoint))
    check_data_files(plan.corpus)
    plan = plan.with_model_config(load_model_config(plan))
    with Run(
        plan.training,
        plan.hub,
        plan.settings(),
        card_task=plan.objective.card_task,
        write_card=True,
        card_overrides={"objective": plan.objective.name.split("+"), "family": plan.family.spec.description},
        commit_message=f"pretrain: {plan.family.name} {plan.model.config_name}",
    ) as run:
        accelerator = run.start()
        tokenizer = get_tokenizer(
            plan.model,
            plan.family,
            plan.corpus,
            training.output_dir,
            prepared=plan.data.prepared_dataset,
            resuming=bool(training.resume_from_checkpoint),
            is_main_process=accelerator.is_main_process,
            wait_for_everyone=accelerator.wait_for_everyone,
        )
        train_blocks, valid_blocks = load_blocks(plan, tokenizer, accelerator)
        check_predictable(plan, tokenizer, train_blocks, valid_blocks)
        set_seed(training.seed)
        model = build_model(plan, tokenizer)
        return run.execute(pretraining_parts(plan, model, tokenizer, train_blocks, valid_blocks, accelerator))


#: Optimizer steps of a ``--time_budget`` probe, and how many of them are not timed (allocation, first calls).
BUDGET_PROBE_STEPS, BUDGET_PROBE_WARMUP = 10, 2


def make_run_plan(plan: PretrainArguments, model, loader, loop_kwargs, train_blocks: int | None, accelerator):
    """The :class:`training.plan.RunPlan` of the run (:func:`training.plan.make_plan`), made once, with a compute
    budget converted into steps and logged (main process) with the flag that repeats the run exactly, and the
    evaluation capped (``eval_examples``) on the user's data without ``--max_eval_samples``.

    Tokens: ``ceil(N / (global batch x max_seq_length))`` (:func:`training.plan.steps_for_tokens`). Time: the mean
    seconds of :data:`BUDGET_PROBE_STEPS` optimizer steps (the first :data:`BUDGET_PROBE_WARMUP` not timed) on a copy of
    ``model`` over ``loader`` (:func:`training.budget.time_optimizer_steps`, which leaves the model, data and random
    generators as they were), then ``floor(60 x minutes / seconds per step)``; a resumed run reads the steps from its
    checkpoint instead (no new probe: the schedule and the resume checks stay exact).

    Args:
        loop_kwargs: the objective's ``loss_fn`` / ``weight_fn`` for the probe.
        train_blocks: training blocks (None: a stream).
    """
    from training.plan import make_plan

    budget = plan.budget
    steps = seconds = how = None
    if budget.time_budget is not None:
        steps, seconds, how = time_budget_steps(plan, model, loader, loop_kwargs, accelerator)
    run_plan = make_plan(
        plan.training,
        train_examples=train_blocks,
        num_processes=accelerator.num_processes,
        max_seq_length=plan.corpus.max_seq_length,
        max_train_tokens=budget.max_train_tokens,
        max_train_steps=steps,
        seconds_per_step=seconds,
        cap_eval=not plan.demo and plan.data.max_eval_samples is None,
    )
    if budget.max_train_tokens is not None:
        how = f"--max_train_tokens {budget.max_train_tokens} / {run_plan.tokens_per_step} tokens per optimizer step"
    if budget.given and accelerator.is_main_process:
        logger.info(
            "budget: %s = %d optimizer steps (%.4g tokens); to repeat this run exactly: --max_train_steps %d "
            "instead of %s",
            how,
            run_plan.max_train_steps,
            run_plan.max_train_steps * run_plan.tokens_per_step,
            run_plan.max_train_steps,
            budget.given,
        )
    return run_plan


def time_budget_steps(
    plan: PretrainArguments, model, loader, loop_kwargs, accelerator
) -> tuple[int, float | None, str]:
    """``--time_budget`` in optimizer steps (see :func:`make_run_plan`): ``(steps, seconds per step (None: read from
    the checkpoint a resumed run continues), how they were found)``."""
    from training import budget as budgets
    from training.checkpoint_files import read_state, resolve_checkpoint
    from training.plan import steps_for_time

    training, minutes = plan.training, plan.budget.time_budget
    checkpoint = resolve_checkpoint(training.resume_from_checkpoint, os.path.join(training.output_dir, "checkpoints"))
    if checkpoint is not None:
        how = f"--time_budget {minutes:g} minutes, as converted when the run started ({checkpoint})"
        return int(read_state(checkpoint)["max_train_steps"]), None, how
    seconds = budgets.time_optimizer_steps(
        accelerator, model, loader, training, steps=BUDGET_PROBE_STEPS, warmup=BUDGET_PROBE_WARMUP, **loop_kwargs
    )
    how = (
        f"--time_budget {minutes:g} minutes / {seconds:.4g} s per optimizer step (timed over "
        f"{BUDGET_PROBE_STEPS - BUDGET_PROBE_WARMUP} steps on a copy of the model)"
    )
    return steps_for_time(minutes, seconds), seconds, how


def check_data_files(corpus: CorpusArguments) -> None:
    """Refuse missing, empty or non-UTF-8 ``--train_file`` / ``--validation_file`` before anything is built."""
    if corpus.train_file and not corpus.dataset_name:
        from tokenizer.corpus import check_text_files

        check_text_files(corpus.train_file, "--train_file")
        if corpus.validation_file:
            check_text_files([corpus.validation_file], "--validation_file")


def pretraining_parts(plan: PretrainArguments, model, tokenizer, train_blocks, valid_blocks, accelerator):
    """The :class:`training.driver.RunParts` of a pretraining run, with its plan made once (:func:`make_run_plan`) and
    logged on the main process (:func:`log_plan`): the training loader (shuffled blocks, or a stream), the held-out
    perplexity evaluation on the plan's ``eval_examples`` first validation blocks (:func:`held_out_evaluation`), the
    objective's loss, item count and extra output files, and the unigram plateau check (:func:`unigram_start`)."""
    from training.driver import RunParts

    objective, training = plan.objective, plan.training
    train_collator, eval_collator = objective.collators(tokenizer, plan.masking, training.seed)
    counts = unigram_start(plan, model, tokenizer, train_blocks, accelerator)
    loader = train_loader(plan, train_blocks, train_collator, accelerator.device.type)
    loop_kwargs = {k: getattr(objective, k) for k in ("weight_fn", "loss_fn") if getattr(objective, k) is not None}
    counted = None if plan.corpus.streaming else len(train_blocks)
    run_plan = make_run_plan(plan, model, loader, loop_kwargs, counted, accelerator)
    available = len(valid_blocks)
    if run_plan.eval_examples is not None and run_plan.eval_examples < available:
        valid_blocks = valid_blocks.select(range(run_plan.eval_examples))
    unigram = None
    if counts is not None and accelerator.is_main_process:
        from training.unigram import heldout_unigram_loss

        unigram = heldout_unigram_loss(train_blocks, valid_blocks, tokenizer, counts=counts)
    if accelerator.is_main_process:
        log_plan(plan, run_plan, model=model, train_blocks=counted, valid_blocks=len(valid_blocks), available=available)
        log_unigram_plateau(unigram)

    def check_result(result) -> None:
        """Warn about a model still on the unigram plateau; its ``next:`` line then says to train on, not to
        fine-tune (``parts.next_step`` is read after this, for the final lines)."""
        from training.unigram import plateau_message

        message = (
            None if unigram is None or "eval_loss" not in result else plateau_message(result["eval_loss"], unigram)
        )
        if message:
            logger.warning("%s", message)
            parts.next_step = (
                "train it longer before fine-tuning (it is still on the unigram plateau): the same command with more "
                "--max_train_steps / --num_train_epochs / --max_train_tokens, or continue from it with "
                f"--model_name_or_path {training.output_dir} --output_dir {training.output_dir}-more"
            )

    parts = RunParts(
        model=model,
        tokenizer=tokenizer,
        train_dataloader=loader,
        evaluate=held_out_evaluation(plan, valid_blocks, eval_collator, accelerator),
        loop_kwargs=loop_kwargs,
        plan=run_plan,
        write_outputs=(lambda folder, _: objective.write_outputs(folder, tokenizer))
        if objective.write_outputs
        else None,
        result_keys=("eval_loss", "perplexity", *objective.result_keys, "replica_max_abs_diff", "unigram_loss"),
        extra_results={} if unigram is None else {"unigram_loss": unigram},
        check_result=check_result,
        data_fingerprint=data_fingerprint(plan, tokenizer, train_blocks),
        next_step=(
            f"fine-tune it on a task: python -m finetune.glue --model_name_or_path {training.output_dir} "
            f"--task_name sst2 --glue_dir GLUE_DIR --output_dir {training.output_dir}-sst2 (your own task: "
            "--train_file F --validation_file F instead of --task_name/--glue_dir)"
        ),
    )
    return parts


def held_out_evaluation(plan: PretrainArguments, valid_blocks, eval_collator, accelerator):
    """``evaluate(prepared model) -> {eval_* metric: value}``: the objective's held-out metrics (perplexity) over
    ``valid_blocks`` from summed losses and counts (:func:`training.evaluation.evaluate_sums`, exact across
    processes)."""
    from pretrain import data
    from pretrain.objectives import lm_eval_step
    from training.evaluation import evaluate_sums

    objective, valid_data = plan.objective, data.IndexedDataset(valid_blocks)

    def evaluate(prepared_model) -> dict[str, float]:
        batch = plan.training.per_device_eval_batch_size
        step = objective.eval_step or lm_eval_step
        sums = evaluate_sums(accelerator, prepared_model, valid_data, eval_collator, batch, step, objective.eval_keys)
        if not sums.get("count", 1):  # never a loss over 0 tokens (check_predictable refuses most such sets first)
            raise InputError(
                f"{held_out_source(plan)}: the evaluation masked no token in its {len(valid_data)} validation "
                "block(s), so it has no loss to report; expected more held-out text (or a larger --max_eval_samples)"
            )
        return objective.metrics(sums)

    return evaluate


def unigram_start(plan: PretrainArguments, model, tokenizer, train_blocks, accelerator):
    """For the objectives that flag the unigram plateau: counts the training tokens
    (:func:`training.unigram.training_token_counts`; a stream, ``--streaming``: its first
    :data:`~training.unigram.MAX_STREAMED_COUNTED_TOKENS` tokens, :func:`~training.unigram.streamed_token_counts`; on
    every process: the same blocks give the same counts), starts a fresh model's output bias at their log frequencies
    (``--output_bias_init unigram``, :func:`init_output_bias`) and returns the counts (None: no plateau check), for the
    held-out unigram loss."""
    if not plan.objective.unigram_plateau:
        return None
    from training.unigram import streamed_token_counts, training_token_counts

    streaming = plan.corpus.streaming
    counts = (
        streamed_token_counts(train_blocks, tokenizer) if streaming else training_token_counts(train_blocks, tokenizer)
    )
    if plan.model.output_bias_init == "unigram" and plan.model.model_name_or_path is None and counts is not None:
        init_output_bias(model, counts)
        if accelerator.is_main_process:
            source = f"the first {int(counts.sum())} streamed" if streaming else "the"
            logger.info(
                "output bias: log unigram frequencies of %s training tokens (--output_bias_init unigram)", source
            )
    return counts


def init_output_bias(model, counts) -> None:
    """Sets the bias of ``model``'s output layer (``get_output_embeddings()``, the MLM decoder) to the log unigram
    frequencies ``counts`` ``(V,)`` (:func:`training.unigram.log_unigram_bias`), in the bias's dtype."""
    import torch

    from training.unigram import log_unigram_bias

    bias = model.get_output_embeddings().bias
    with torch.no_grad():
        bias.copy_(torch.as_tensor(log_unigram_bias(counts, bias.numel()), dtype=bias.dtype))


def train_loader(plan: PretrainArguments, train_blocks, collator, device_type: str):
    """The training loader: the blocks shuffled by ``(seed, epoch)`` (:func:`training.data.make_train_dataloader`),
    or a stream read in order (``--streaming``), with ``--dataloader_num_workers`` resolved for ``device_type``."""
    from pretrain import data
    from pretrain.collators import PackedSequences
    from training.data import make_stream_dataloader, make_train_dataloader, resolve_num_workers

    batch, streaming = plan.training.per_device_train_batch_size, plan.corpus.streaming
    workers = resolve_num_workers(plan.data.dataloader_num_workers, device_type, streaming)
    if streaming:
        return make_stream_dataloader(data.StreamedBlocks(train_blocks), batch, collator, num_workers=workers)
    return make_train_dataloader(  # the packed documents' sequences computed in the workers, not read from the GPU
        data.IndexedDataset(train_blocks), batch, PackedSequences(collator), plan.training.seed, num_workers=workers
    )


def _interval(steps: int | None) -> str:
    """``every N steps`` for a periodic action, ``at the end`` for one done only when training ends."""
    return f"every {steps} steps" if steps else "at the end"


def log_plan(plan: PretrainArguments, run_plan, *, model, train_blocks: int | None, valid_blocks: int, available: int):
    """Log (main process) the model's size, the run plan (:class:`training.plan.RunPlan`: global batch in sequences
    and tokens, steps, epochs, warmup, total tokens, the validation blocks (of ``available``, when the plan's
    evaluation cap chose fewer), evaluation/checkpoint intervals and the learning rate with its source) and a warning
    when the tokens are few for the model (:func:`warn_few_tokens`).

    Args:
        train_blocks: training blocks (None: a stream).
        valid_blocks: the validation blocks evaluated.
    """
    from training.plan import EVAL_SHARE

    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "%s (%s): %d parameters", plan.model.model_name_or_path or plan.model.config_name, plan.objective.name, n_params
    )
    data = (
        f"{run_plan.epochs:.3g} epochs of {train_blocks} training blocks"
        if train_blocks is not None
        else "a stream of training blocks"
    )
    validation = f"{valid_blocks} validation"
    if available > valid_blocks:
        validation = (
            f"{valid_blocks} of {available} validation blocks: evaluations within "
            f"~{EVAL_SHARE:.0%} of the training blocks, --max_eval_samples to choose"
        )
    logger.info(
        "run plan: %d optimizer steps = %s (%s); global batch %d sequences = "
        "%d tokens (%d processes x %d per device x %d accumulation), %.4g tokens in all; warmup %d steps; learning "
        "rate %g (%s); evaluation %s, checkpoints %s%s",
        run_plan.max_train_steps,
        data,
        validation,
        run_plan.global_batch_size,
        run_plan.tokens_per_step,
        run_plan.num_processes,
        run_plan.per_device_train_batch_size,
        run_plan.gradient_accumulation_steps,
        run_plan.tokens_per_step * run_plan.max_train_steps,
        run_plan.num_warmup_steps,
        plan.training.learning_rate,
        plan.learning_rate_source,
        _interval(run_plan.eval_steps),
        _interval(run_plan.checkpointing_steps),
        threads_clause(),
    )
    if not plan.demo and plan.model.model_name_or_path is None:
        warn_few_tokens(run_plan.tokens_per_step * run_plan.max_train_steps, n_params)


def threads_clause() -> str:
    """``"; 2 CPU threads per process (...)"`` for a plan line (:mod:`training.threads`), or ``""`` before the
    accelerator chose them."""
    from training.threads import chosen

    choice = chosen()
    return f"; {choice.describe()}" if choice else ""


def log_unigram_plateau(unigram: float | None) -> None:
    """Log the held-out unigram loss ``unigram`` (nats; None: not computed), the plateau a model must get below."""
    if unigram is not None:
        logger.info(
            "unigram plateau: held-out loss %.3f from the training word frequencies alone (perplexity %.4g); "
            "the model's held-out loss must get below it before its encoder says anything about its input",
            unigram,
            math.exp(unigram),
        )


#: A run from scratch with fewer planned tokens than this many per parameter gets a warning in its plan. Measured on
#: the time-to-quality benchmark (bert-tiny, 1.5M parameters, shared corpus, the default recipe): the held-out MLM
#: loss reached the unigram plateau only after ~0.4 tokens per parameter, was 0.33 nats below it at 1 and still
#: falling by ~0.1 nats per 0.2 tokens per parameter at 2.
MIN_TOKENS_PER_PARAMETER = 1.0


def warn_few_tokens(total_tokens: int, n_params: int, minimum: float = MIN_TOKENS_PER_PARAMETER) -> bool:
    """Log a warning (and return True) when ``total_tokens`` planned training tokens are fewer than ``minimum`` per
    parameter of the model (``n_params``, every parameter, embeddings included): the model would stop while it
    has barely left the word-frequency (unigram) plateau (see :data:`MIN_TOKENS_PER_PARAMETER`)."""
    if n_params <= 0 or total_tokens >= minimum * n_params:
        return False
    logger.warning(
        "run plan: %.3g training tokens for %.3g parameters (%.2g tokens per parameter, below %g): too few for the "
        "model to learn much beyond word frequencies (bert-tiny on the benchmark corpus left the unigram plateau "
        "only after ~0.4 tokens per parameter); train longer (--num_train_epochs, --max_train_tokens) or pick a "
        "smaller --config_name",
        total_tokens,
        n_params,
        total_tokens / n_params,
        minimum,
    )
    return True


__all__ = [
    "ARGUMENTS",
    "MIN_TOKENS_PER_PARAMETER",
    "build_parser",
    "check_data_files",
    "held_out_evaluation",
    "log_plan",
    "log_unigram_plateau",
    "main",
    "parse",
    "pretraining_parts",
    "train_loader",
    "make_run_plan",
    "time_budget_steps",
    "unigram_start",
    "warn_few_tokens",
]
