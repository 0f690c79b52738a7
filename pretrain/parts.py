"""The :class:`training.driver.RunParts` of a pretraining run, complete when built: loader, plan, held-out evaluation,
the objective's loss and outputs, the unigram plateau (:class:`training.unigram.UnigramPlateau`)."""

from __future__ import annotations

import dataclasses
import logging

from core.errors import InputError
from pretrain.arguments import PretrainArguments
from pretrain.blocks import data_fingerprint, held_out_source
from pretrain.run_plan import log_plan, make_run_plan

logger = logging.getLogger("pretrain")


def pretraining_parts(plan: PretrainArguments, model, tokenizer, train_blocks, valid_blocks, accelerator):
    """The :class:`training.driver.RunParts` of a pretraining run, with its plan made once (:func:`make_run_plan`) and
    logged on the main process (:func:`log_plan`): the training loader (shuffled blocks, or a stream), the held-out
    perplexity evaluation on the plan's ``eval_examples`` first validation blocks (:func:`held_out_evaluation`), the
    objective's loss, item count and extra output files, and the unigram plateau (:func:`unigram_plateau`)."""
    from training.driver import RunParts

    objective, training, masking = plan.objective, plan.training, plan.masking
    train_collator, eval_collator = objective.collators(tokenizer, masking, training.seed)
    scheduled = masking.mlm_probability_end is not None
    if scheduled:  # masked at the larger rate, then at each step's (MaskingRateSchedule); evaluation: fixed
        from pretrain.collators import keep_selection_draws, select_at_rate

        ceiling = max(masking.mlm_probability, masking.mlm_probability_end)
        train_collator, _ = objective.collators(
            tokenizer, dataclasses.replace(masking, mlm_probability=ceiling), training.seed
        )
        keep_selection_draws(train_collator)
    if plan.data.short_seq_length is not None:  # mixing lengths: some batches in short rows
        from pretrain.collators import ShortRows

        short = (plan.data.short_seq_length, plan.data.short_seq_probability, training.seed)
        train_collator = ShortRows(train_collator, *short)
    plateau = unigram_plateau(plan, model, tokenizer, train_blocks, accelerator)
    loader = train_loader(plan, train_blocks, train_collator, accelerator.device.type)
    loop_kwargs = {k: getattr(objective, k) for k in ("weight_fn", "loss_fn") if getattr(objective, k) is not None}
    counted = None if plan.corpus.streaming else len(train_blocks)
    probe_kwargs = dict(loop_kwargs)
    if scheduled:  # a --time_budget probe times steps at the first step's rate
        probe_kwargs["batch_fn"] = lambda batch, step: select_at_rate(batch, masking.mlm_probability)
    run_plan = make_run_plan(plan, model, loader, probe_kwargs, counted, accelerator)
    if scheduled:
        from pretrain.collators import MaskingRateSchedule

        schedule = MaskingRateSchedule(masking.mlm_probability, masking.mlm_probability_end, run_plan.max_train_steps)
        loop_kwargs.update(batch_fn=schedule, log_fn=schedule.logged)
    available = len(valid_blocks)
    if run_plan.eval_examples is not None and run_plan.eval_examples < available:
        valid_blocks = valid_blocks.select(range(run_plan.eval_examples))
    plateau = plateau.with_heldout(valid_blocks, tokenizer) if plateau and accelerator.is_main_process else None
    if accelerator.is_main_process:
        log_plan(plan, run_plan, model=model, train_blocks=counted, valid_blocks=len(valid_blocks), available=available)
        if plateau is not None and plateau.log_line():
            logger.info("%s", plateau.log_line())

    def check_result(result) -> str | None:
        """Warn about a model still on the unigram plateau, and then say to train on, not to fine-tune."""
        message = plateau.end_message(result) if plateau is not None else None
        if not message:
            return None
        logger.warning("%s", message)
        return (
            "train it longer before fine-tuning (it is still on the unigram plateau): the same command with more "
            "--max_train_steps / --num_train_epochs / --max_train_tokens, or continue from it with "
            f"--model_name_or_path {training.output_dir} --output_dir {training.output_dir}-more"
        )

    return RunParts(
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
        extra_results=plateau.results() if plateau is not None else {},
        check_result=check_result,
        data_fingerprint=data_fingerprint(plan, tokenizer, train_blocks),
        next_step=(
            f"fine-tune it on a task: python -m finetune.glue --model_name_or_path {training.output_dir} "
            f"--task_name sst2 --glue_dir GLUE_DIR --output_dir {training.output_dir}-sst2 (your own task: "
            "--train_file F --validation_file F instead of --task_name/--glue_dir)"
        ),
    )


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


def unigram_plateau(plan: PretrainArguments, model, tokenizer, train_blocks, accelerator):
    """For the objectives that flag the unigram plateau: the training tokens counted once
    (:meth:`training.unigram.UnigramPlateau.count`; on every process: the same blocks give the same counts), and a
    fresh model's output bias (``model.get_output_embeddings().bias``, the MLM decoder, in its dtype) started at their
    log frequencies with ``--output_bias_init unigram``. Returns the plateau (None: no plateau check)."""
    if not plan.objective.unigram_plateau:
        return None
    from training.unigram import UnigramPlateau

    plateau = UnigramPlateau.count(train_blocks, tokenizer, streamed=plan.corpus.streaming)
    if plan.model.output_bias_init == "unigram" and plan.model.model_name_or_path is None and plateau is not None:
        import torch

        bias = model.get_output_embeddings().bias
        with torch.no_grad():
            bias.copy_(torch.as_tensor(plateau.output_bias(bias.numel()), dtype=bias.dtype))
        if accelerator.is_main_process:
            logger.info("%s", plateau.bias_line())
    return plateau


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


__all__ = ["held_out_evaluation", "pretraining_parts", "train_loader", "unigram_plateau"]
