"""The reference process (item 4 of the package docstring): transformers' ``BertForMaskedLM`` trained the
``run_mlm`` way in a child process that refuses to import any project package (:func:`block_project_imports`).
The child is ``bench_time_to_quality.py _reference ...``: it loads ``ttq.cli`` and through it every module of this
package, so none of them may import a project package at its top (their project imports are inside functions;
tests/bench/test_time_to_quality.py checks that the child loaded none)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from .common import SHAPES, BenchError
from .scoring import heldout_loss

#: The project's packages: the reference process refuses to import them (:func:`block_project_imports`).
PROJECT_PACKAGES = ("modeling", "training", "pretrain", "finetune", "tokenizer")


REFERENCE_LOG = "reference_log.json"


def reference_log(folder: Path) -> dict:
    """The ``reference_log.json`` of a reference run folder (:func:`reference_main`).

    Raises:
        BenchError: the file is missing (the run did not finish).
    """
    path = Path(folder) / REFERENCE_LOG
    if not path.is_file():
        raise BenchError(f"no {path}; expected the reference run's log")
    return json.loads(path.read_text(encoding="utf-8"))


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
