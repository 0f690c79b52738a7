"""Run scaffolding shared by ``pretrain``, ``finetune.glue`` and ``finetune.squad``: help formatting, logging
set-up, the recorded run configuration, the model-fits checks, the output-folder rule, the epoch seed and the
run files (results, histories, curves).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from training.errors import InputError

#: Loggers that repeat every step or file: warnings only.
NOISY_LOGGERS = ("datasets", "transformers", "accelerate.checkpointing", "accelerate.accelerator", "evaluate")
#: Arguments never written to trackers, model cards or run files.
SECRET_ARGUMENTS = ("hub_token",)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with one default per flag: argparse's ``(default: X)`` is appended once, and left out where the
    default is ``None`` or ``False`` (the help text then says what applies) or the help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text.lower() or action.default in (None, False, argparse.SUPPRESS)
                or not action.option_strings):
            return text
        return super()._get_help_string(action)


def setup_logging(is_main_process: bool = True) -> None:
    """INFO logging with timestamps on the main process, WARNING elsewhere; :data:`NOISY_LOGGERS` at WARNING."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logging.getLogger().setLevel(logging.INFO if is_main_process else logging.WARNING)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)  # "Removed shared tensor" of tied weights


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments of a run as recorded with trackers and in run files (secrets removed)."""
    return {k: v for k, v in vars(args).items() if k not in SECRET_ARGUMENTS}


def check_model_fits(config, tokenizer, max_seq_length: int | None, tokenizer_arg: str = "--tokenizer_name") -> None:
    """Refuse a tokenizer with more tokens than the model's embeddings, or blocks longer than its positions.

    Raises:
        InputError: one line naming the argument, the sizes found and the size expected.
    """
    vocab_size = getattr(config, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise InputError(f"{tokenizer_arg}: {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}; "
                         f"expected the tokenizer the model was trained with (at most {vocab_size} tokens)")
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_seq_length is not None and max_pos is not None and max_seq_length > max_pos:
        raise InputError(f"--max_seq_length {max_seq_length}: exceeds the model's max_position_embeddings {max_pos}; "
                         f"expected at most {max_pos}")


def check_output_dir_reuse(output_dir: str | os.PathLike, overwrite: bool, resuming: bool) -> None:
    """A non-empty ``--output_dir`` is an earlier run's: refuse it unless resuming or ``--overwrite_output_dir``
    (transformers' Trainer rule), so that nothing of that run (its tokenizer, checkpoints) is reused silently.

    Raises:
        InputError: ``output_dir`` exists, is not empty, and neither flag is given.
    """
    out = Path(output_dir)
    if resuming or overwrite or not out.is_dir() or not any(out.iterdir()):
        return
    raise InputError(f"--output_dir {out}: exists and is not empty (an earlier run?); expected a new or empty folder, "
                     "--resume_from_checkpoint latest to continue that run, or --overwrite_output_dir to replace it")


def epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit seed for the data order of ``epoch`` (``numpy.random.SeedSequence([seed, epoch])``): the same on
    every process and after a resume, independent of the global RNG."""
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1)[0])


def write_run_files(folder: str | os.PathLike, result: dict[str, Any], results: dict[str, Any], name: str) -> None:
    """The run files of a finished run, written into ``folder`` (the scripts' temporary output folder):
    ``all_results.json`` (``results``) and, for a training run (``result`` from :meth:`training.loop.Trainer.train`,
    with ``log_history``), ``eval_history.json``, ``trainer_log.json`` and ``curves.png`` titled ``name``
    (:func:`training.plot.write_curves`)."""
    import json

    folder = Path(folder)

    def dump(file: str, obj) -> None:
        (folder / file).write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")

    dump("all_results.json", results)
    if "log_history" in result:
        from training.plot import write_curves

        dump("eval_history.json", result.get("eval_history", []))
        dump("trainer_log.json", result["log_history"])
        write_curves(dict(result, name=name), folder / "curves.png")
