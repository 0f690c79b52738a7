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

import os
from collections.abc import Sequence

from core.arguments import parse_arguments
from pretrain.arguments import (
    BudgetArguments,
    CorpusArguments,
    MaskingArguments,
    ObjectiveArguments,
    PretrainArguments,
    PretrainModelArguments,
    PretrainTrainingArguments,
    RecipeArguments,
    TrainDataArguments,
    resolve,
)
from pretrain.blocks import check_predictable, load_blocks
from training.hub import HubArguments

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
    PretrainModelArguments,
    CorpusArguments,
    TrainDataArguments,
    ObjectiveArguments,
    MaskingArguments,
    HubArguments,
    PretrainTrainingArguments,
    BudgetArguments,
    RecipeArguments,
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
    model, corpus, data, objective, masking, hub, training, budget, _ = parse_arguments(
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


def known_flags() -> set[str]:
    """The names of ``pretrain``'s flags without the leading ``--`` (those a ``--recipe`` phase may set)."""
    parser = build_parser()
    return {s[2:] for s in parser._option_string_actions if s.startswith("--") and "-" not in s[2:]}


def main(argv: Sequence[str] | None = None) -> int:
    """``pretrain``: one run, or with ``--recipe FILE`` the recipe's phases in turn (:mod:`pretrain.recipe`).
    Returns the exit status.

    Raises:
        InputError: refused input (one line; exit status 2 under :func:`core.errors.run_cli`).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import sys

    from pretrain.recipe import run_recipe, split_recipe

    recipe, rest = split_recipe(sys.argv[1:] if argv is None else argv)
    if recipe is not None:
        return run_recipe(recipe, rest, main, parse, known_flags())
    from accelerate.utils import set_seed

    from core.files import check_output_dir_reuse, check_sources_outside
    from core.logs import setup_logging
    from pretrain.build import build_model, get_tokenizer, load_model_config
    from pretrain.parts import pretraining_parts
    from training.driver import Run
    from training.pretrained import check_sequence_length

    plan = parse(argv)
    setup_logging()
    training = plan.training
    check_output_dir_reuse(training.output_dir, training.overwrite_output_dir, bool(training.resume_from_checkpoint))
    if training.overwrite_output_dir and not training.resume_from_checkpoint:  # it deletes checkpoints/, tokenizer/
        sources = {
            "--model_name_or_path": plan.model.model_name_or_path,
            "--tokenizer_name": plan.model.tokenizer_name,
            "--train_file": plan.corpus.train_file,
            "--validation_file": plan.corpus.validation_file,
            "--prepared_dataset": plan.data.prepared_dataset,
            "--continue_from_checkpoint": training.continue_from_checkpoint,
        }
        check_sources_outside(training.output_dir, sources, replaced=("checkpoints", "tokenizer"))
    check_data_files(plan.corpus)
    config = load_model_config(plan)
    check_sequence_length(config, plan.corpus.max_seq_length)  # before a tokenizer is trained for nothing
    plan = plan.with_model_config(config)
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


def check_data_files(corpus: CorpusArguments) -> None:
    """Refuse missing, empty or non-UTF-8 ``--train_file`` / ``--validation_file`` before anything is built."""
    if corpus.train_file and not corpus.dataset_name:
        from tokenizer.corpus import check_text_files

        check_text_files(corpus.train_file, "--train_file")
        if corpus.validation_file:
            check_text_files([corpus.validation_file], "--validation_file")


__all__ = ["ARGUMENTS", "build_parser", "check_data_files", "main", "parse"]
