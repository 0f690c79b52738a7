"""The :class:`training.plan.RunPlan` of a pretraining run: a compute budget (``--max_train_tokens``,
``--time_budget``, the latter measured by a probe of a few optimizer steps) converted into steps once, the plan's log
line with pretrain's data phrase, and the warning for a run from scratch with too few tokens for its model."""

from __future__ import annotations

import logging
import os

from pretrain.arguments import PretrainArguments

logger = logging.getLogger("pretrain")

#: Optimizer steps of a ``--time_budget`` probe, and how many of them are not timed (allocation, first calls).
BUDGET_PROBE_STEPS, BUDGET_PROBE_WARMUP = 10, 2

#: A run from scratch with fewer planned tokens than this many per parameter gets a warning in its plan. Measured on
#: the time-to-quality benchmark (bert-tiny, 1.5M parameters, shared corpus, the default recipe): the held-out MLM
#: loss reached the unigram plateau only after ~0.4 tokens per parameter, was 0.33 nats below it at 1 and still
#: falling by ~0.1 nats per 0.2 tokens per parameter at 2.
MIN_TOKENS_PER_PARAMETER = 1.0


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
        if run_plan.batch_warmup is not None:
            how += f" (the batch-size warmup's {run_plan.batch_warmup.steps} smaller steps counted)"
    if budget.given and accelerator.is_main_process:
        logger.info(
            "budget: %s = %d optimizer steps (%.4g tokens); to repeat this run exactly: --max_train_steps %d "
            "instead of %s",
            how,
            run_plan.max_train_steps,
            run_plan.total_tokens,
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


def log_plan(plan: PretrainArguments, run_plan, *, model, train_blocks: int | None, valid_blocks: int, available: int):
    """Log (main process) the model's size (with the device's defaults taken and why: ``plan.device_choice``), the run
    plan (:meth:`training.plan.RunPlan.summary`) with the data
    phrase (epochs of ``train_blocks`` training blocks, None: a stream; the ``valid_blocks`` validation blocks
    evaluated, of ``available`` when the plan's evaluation cap chose fewer) and a warning when the tokens are few
    for the model (:func:`warn_few_tokens`)."""
    from training.plan import EVAL_SHARE

    n_params = sum(p.numel() for p in model.parameters())
    choice = f" ({plan.device_choice})" if plan.device_choice else ""
    logger.info(
        "%s (%s): %d parameters%s",
        plan.model.model_name_or_path or plan.model.config_name,
        plan.objective.name,
        n_params,
        choice,
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
    phase = phase_phrase(plan, model)
    data = f"{data} ({validation})" + (f", {phase}" if phase else "")
    if plan.data.short_seq_length is not None:
        data += (
            f", {plan.data.short_seq_probability:.0%} of the batches in rows of {plan.data.short_seq_length} tokens "
            f"(blocks of {plan.corpus.max_seq_length} cut, --short_seq_probability)"
        )
    logger.info("%s", run_plan.summary(data, plan.training.learning_rate, plan.learning_rate_source))
    if not plan.demo and plan.model.model_name_or_path is None:
        warn_few_tokens(run_plan.total_tokens, n_params)


def phase_phrase(plan: PretrainArguments, model) -> str | None:
    """The plan line's phrase of a new phase (``--continue_from_checkpoint``; None otherwise): the checkpoint, and
    what the phase changes, e.g. a context extension's ``blocks of 8192 tokens (were 1024), global rotary base
    160000 (was 10000)``, read from the checkpoint's ``trainer_state.json`` (its data fingerprint and model config)."""
    spec = plan.training.continue_from_checkpoint
    if not spec:
        return None
    from training.checkpoint_files import read_state

    saved = read_state(spec)
    lengths = [e.get("value") for e in saved.get("data_fingerprint") or () if e.get("name") == "max_seq_length"]
    changes = []
    if lengths and str(plan.corpus.max_seq_length) != lengths[0]:
        changes.append(f"blocks of {plan.corpus.max_seq_length} tokens (were {lengths[0]})")
    old, new = _global_base(saved.get("model_config") or {}), _global_base(model.config.to_dict())
    if getattr(model.config, "position_embedding_type", None) == "rope" and old is not None and old != new:
        changes.append(f"global rotary base {new:g} (was {old:g})")
    what = ", ".join(changes) or "the same blocks and model"
    return f"a new phase from {spec} (step {saved.get('global_step')} of its run): {what}"


def _global_base(fields: dict) -> float | None:
    """The rotary base of full-attention layers in a config's ``fields`` (``rope_parameters``; ``rope_theta`` in
    a checkpoint of an earlier version), or None."""
    return ((fields.get("rope_parameters") or {}).get("full_attention") or {}).get(
        "rope_theta", fields.get("rope_theta")
    )


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
    "BUDGET_PROBE_STEPS",
    "BUDGET_PROBE_WARMUP",
    "MIN_TOKENS_PER_PARAMETER",
    "log_plan",
    "make_run_plan",
    "phase_phrase",
    "time_budget_steps",
    "warn_few_tokens",
]
