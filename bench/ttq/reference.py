"""The reference process (item 4 of the package docstring): transformers' ``BertForMaskedLM`` trained the
``run_mlm`` way in a child process that refuses to import any project package (:func:`block_project_imports`).
The child is ``bench_time_to_quality.py _reference ...``: it loads ``ttq.cli`` and through it every module of this
package, so none of them may import a project package at its top (their project imports are inside functions;
tests/bench/test_time_to_quality.py checks that the child loaded none)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

from .common import MODERN_SHAPES, REFERENCE_MODELS, SHAPES, BenchError
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
    """The arguments of the reference process (``bench_time_to_quality.py _reference``)."""
    p = argparse.ArgumentParser(
        prog="bench_time_to_quality.py _reference",
        description="transformers' BertForMaskedLM trained the run_mlm way (internal)",
    )
    p.add_argument("--blocks", required=True, help="save_to_disk folder of group_texts blocks")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--model_shape", choices=list(SHAPES), required=True)
    p.add_argument(
        "--reference_model",
        choices=REFERENCE_MODELS,
        default="bert",
        help="BertForMaskedLM at --model_shape, or ModernBertForMaskedLM at the modern preset of its width",
    )
    p.add_argument("--learning_rate", type=float, required=True)
    length = p.add_mutually_exclusive_group(required=True)
    length.add_argument("--max_train_steps", type=int, default=None)
    length.add_argument(
        "--time_budget_s",
        type=float,
        default=None,
        help="size the schedule in this process: max_train_steps = max(1, floor(S / the mean seconds of a probe "
        "step)), the probe timed on a copy of the model (:func:`probe_seconds_per_step`) before --start_file",
    )
    p.add_argument("--probe_steps", type=int, default=10, help="steps of the --time_budget_s probe")
    p.add_argument("--probe_warmup", type=int, default=2, help="probe steps not timed")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--save_steps", type=int, nargs="*", default=[], help="steps whose weights are scored (and saved)")
    p.add_argument(
        "--save_points",
        type=int,
        default=None,
        help="instead of --save_steps: every ceil(steps / N) steps and the last (bench.ttq.runs.save_steps), once "
        "the steps are known",
    )
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


def reference_model(shape: str, tokenizer, family: str = "bert"):
    """transformers' ``BertForMaskedLM`` of ``shape`` (:data:`SHAPES`, BERT's other defaults) for ``tokenizer``, or
    (``family`` ``"modernbert"``) its ``ModernBertForMaskedLM`` at the modern preset of that width
    (:data:`MODERN_SHAPES`, ModernBERT's other defaults: dense MLM head, no dropout, the tokenizer's special ids),
    with SDPA attention.

    Raises:
        BenchError: a shape without a modern size (``bert-small``) for ModernBERT.
    """
    if family == "modernbert":
        from transformers import ModernBertConfig, ModernBertForMaskedLM

        if shape not in MODERN_SHAPES:
            raise BenchError(f"--model_shape {shape}: no ModernBERT size; expected one of {', '.join(MODERN_SHAPES)}")
        ids = {f"{k}_token_id": getattr(tokenizer, f"{k}_token_id") for k in ("pad", "cls", "sep", "mask")}
        ids.update(bos_token_id=ids["cls_token_id"], eos_token_id=ids["sep_token_id"])
        sizes = MODERN_SHAPES[shape]
        config = ModernBertConfig(vocab_size=len(tokenizer), global_attn_every_n_layers=3, **ids, **sizes)
        config._attn_implementation = "sdpa"
        return ModernBertForMaskedLM(config)
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


def mlm_loader(tokenizer, blocks, batch_size: int, seed: int):
    """run_mlm's data path: ``DataCollatorForLanguageModeling`` (15% masked, BERT's 80/10/10) over ``blocks`` in
    shuffled batches of ``batch_size`` (the order drawn from ``seed``; the last batch kept). Returns (collator,
    DataLoader)."""
    import torch
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    order = torch.Generator().manual_seed(seed)
    return collator, torch.utils.data.DataLoader(
        blocks, batch_size=batch_size, shuffle=True, collate_fn=collator, generator=order, drop_last=False
    )


def reference_optimizer(model, args):
    """The reference's AdamW: ``TrainingArguments``' ``adamw_torch_fused`` (betas (0.9, 0.999), eps 1e-8,
    ``args.learning_rate``, ``args.weight_decay``)."""
    import torch

    return torch.optim.AdamW(
        model.parameters(),
        lr=args.learning_rate,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=args.weight_decay,
        fused=True,
    )


def _train_step(model, optimizer, batch, device, autocast, scheduler=None) -> tuple[float, int]:
    """One optimizer step of the reference on ``batch`` (forward under ``autocast``, backward, clipping at 1.0,
    AdamW, the scheduler if given); returns ``(loss, tokens)``, the loss read back (the device synchronised)."""
    import torch

    batch = {k: v.to(device) for k, v in batch.items()}
    with autocast:
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach()), int(batch["attention_mask"].sum())


def probe_seconds_per_step(model, blocks, collator, args, device, autocast, keep_going=None) -> tuple[float, int]:
    """Mean seconds of a reference optimizer step over the last ``args.probe_steps - args.probe_warmup`` of at least
    ``args.probe_steps`` steps (the first ``args.probe_warmup`` never counted), timed as :func:`reference_main` times
    its steps (fetching the batch to the loss read back), on a *copy* of ``model`` with an AdamW of its own and a
    sequential loader of ``blocks`` of its own (re-read when it ends): ``model`` and every random generator (torch
    CPU and CUDA, Python's, NumPy's) are left as they were, so the run that follows is the one ``--max_train_steps``
    of the steps found gives (tested). ``keep_going()``, if given, is asked after each step once ``probe_steps``
    have run: while it is true the probe goes on (the reference keeps its core busy, as in training, while its
    paired run starts up and probes; the steps counted are the last ones, beside the paired run's probe).
    ``pretrain --time_budget`` sizes our runs the same way (``training.budget.time_optimizer_steps``).

    Returns:
        ``(seconds per step, probe steps run)``.

    Raises:
        ValueError: ``probe_steps <= probe_warmup`` or an empty ``blocks``.
    """
    import collections
    import copy
    import random

    import numpy as np
    import torch

    if args.probe_steps <= args.probe_warmup or args.probe_warmup < 0:
        raise ValueError(
            f"--probe_steps {args.probe_steps} --probe_warmup {args.probe_warmup}: expected 0 <= warmup < steps"
        )
    loader = torch.utils.data.DataLoader(
        blocks, batch_size=args.batch_size, collate_fn=collator, generator=torch.Generator()
    )
    states = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    py_state, np_state = random.getstate(), np.random.get_state()
    timed = collections.deque(maxlen=args.probe_steps - args.probe_warmup)
    try:
        twin = copy.deepcopy(model).to(device).train()
        optimizer = reference_optimizer(twin, args)
        batches, i = iter(loader), 0
        while i < args.probe_steps or (keep_going is not None and keep_going()):
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                batches = iter(loader)
                batch = next(batches, None)
                if batch is None:
                    raise ValueError("--blocks: no training block for the time budget probe")
            _train_step(twin, optimizer, batch, device, autocast)
            if i >= args.probe_warmup:
                timed.append(time.perf_counter() - t0)
            i += 1
        del twin, optimizer
    finally:
        torch.set_rng_state(states[0])
        if states[1] is not None:
            torch.cuda.set_rng_state_all(states[1])
        random.setstate(py_state)
        np.random.set_state(np_state)
    return sum(timed) / len(timed), i


def _setup(args) -> dict:
    """The reference's parts for ``args``: ``device``, ``tokenizer``, ``blocks``, ``heldout`` (None without
    ``--heldout``), ``model`` (built after ``torch.manual_seed(--seed)``), ``collator``, ``loader`` (shuffled per
    epoch by a generator seeded with ``--seed``) and ``autocast``."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    blocks = load_from_disk(args.blocks)
    heldout = None
    if args.heldout:
        from safetensors.torch import load_file

        heldout = load_file(args.heldout)
    torch.manual_seed(args.seed)
    model = reference_model(args.model_shape, tokenizer, args.reference_model).to(device).train()
    collator, loader = mlm_loader(tokenizer, blocks, args.batch_size, args.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.mixed_precision == "bf16")
    return dict(
        device=device,
        tokenizer=tokenizer,
        blocks=blocks,
        heldout=heldout,
        model=model,
        collator=collator,
        loader=loader,
        autocast=autocast,
    )


def _size_schedule(args, parts: dict) -> dict:
    """Fill ``args.max_train_steps`` (from ``--time_budget_s`` by a probe, :func:`probe_seconds_per_step`) and
    ``args.save_steps`` (from ``--save_points``); return the ``budget`` record of the log (empty when the steps
    were given)."""
    budget = {}
    if args.time_budget_s is not None:
        t0 = time.perf_counter()
        start_file = args.start_file

        def keep_going() -> bool:  # until the paired run has logged its run plan (600 s at most, as the wait)
            return bool(start_file) and not os.path.exists(start_file) and time.perf_counter() - t0 < 600

        per_step, ran = probe_seconds_per_step(
            parts["model"], parts["blocks"], parts["collator"], args, parts["device"], parts["autocast"], keep_going
        )
        args.max_train_steps = max(1, int(args.time_budget_s / per_step))
        budget = {
            "time_budget_s": args.time_budget_s,
            "probe_steps": args.probe_steps,
            "probe_warmup": args.probe_warmup,
            "probe_steps_run": ran,
            "seconds_per_step": per_step,
            "max_train_steps": args.max_train_steps,
            "probe_wall_s": time.perf_counter() - t0,
        }
    if args.save_points is not None:
        every = max(1, math.ceil(args.max_train_steps / args.save_points))
        args.save_steps = sorted({*range(every, args.max_train_steps + 1, every), args.max_train_steps})
    return budget


def _train(args, parts: dict, out: Path) -> tuple[list[dict], dict, float]:
    """The reference's training loop (see :func:`reference_main`): ``(per-step records, {step: held-out loss},
    seconds spent scoring and saving)``."""
    from transformers import get_linear_schedule_with_warmup

    model, device, heldout = parts["model"], parts["device"], parts["heldout"]
    optimizer = reference_optimizer(model, args)  # TrainingArguments: adamw_torch_fused
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, args.max_train_steps)
    records, scores, scoring_s, seconds, tokens, step = [], {}, 0.0, 0.0, 0, 0
    saves = set(args.save_steps)
    while step < args.max_train_steps:
        batches = iter(parts["loader"])
        while step < args.max_train_steps:
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break  # the epoch is over: a new shuffle
            loss_value, n_tokens = _train_step(model, optimizer, batch, device, parts["autocast"], scheduler)
            seconds += time.perf_counter() - t0
            step += 1
            tokens += n_tokens
            records.append({"step": step, "seconds": seconds, "tokens": tokens, "loss": loss_value})
            if step in saves:  # outside the timed span
                t_score = time.perf_counter()
                if heldout is not None:  # float32, eval mode: the same function as scoring a saved checkpoint
                    scores[step] = heldout_loss(model, heldout, device)
                if heldout is None or args.save_checkpoints:
                    model.save_pretrained(str(out / "checkpoints" / f"step_{step}"))
                scoring_s += time.perf_counter() - t_score
    return records, scores, scoring_s


def reference_main(argv=None) -> dict:
    """Train the reference (see the module docstring, item 4) and write ``output_dir``: ``reference_log.json``
    (``steps``: per step the cumulative training ``seconds`` and ``tokens`` and the loss; ``scores``: ``{step:
    held-out loss}`` at ``--save_steps`` with ``--heldout`` (:func:`heldout_loss` of the live model, float32, eval
    mode, on the training device; it draws no random numbers, so the trajectory is the same as without it) and
    ``scoring_s`` (seconds spent scoring and saving, outside the timed steps); ``budget``: with ``--time_budget_s``
    the probe's seconds per step and the steps it gave (:func:`_size_schedule`); the model, collator and optimizer
    classes; project modules loaded, which must be none), ``checkpoints/step_N/`` (``save_pretrained``) at
    ``--save_steps`` without ``--heldout`` or with ``--save_checkpoints``, and the final model + tokenizer. The
    probe runs until ``--start_file`` exists (beside the paired run's start-up and its own probe: both probes time
    steps with two runs training, as the runs will). Returns the log."""
    block_project_imports()
    args = reference_parser().parse_args(argv)
    import torch

    out = Path(args.output_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    parts = _setup(args)
    budget = _size_schedule(args, parts)
    waited = _wait_for_start_file(args.start_file)
    records, scores, scoring_s = _train(args, parts, out)
    model = parts["model"]
    model.save_pretrained(str(out))
    parts["tokenizer"].save_pretrained(str(out))
    result = {
        "steps": records,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "collator_class": f"{type(parts['collator']).__module__}.{type(parts['collator']).__qualname__}",
        "optimizer_class": f"{torch.optim.AdamW.__module__}.{torch.optim.AdamW.__qualname__}",
        "attn_implementation": model.config._attn_implementation,
        "learning_rate": args.learning_rate,
        "weight_decay": args.weight_decay,
        "mixed_precision": args.mixed_precision,
        "device": str(parts["device"]),
        "threads": torch.get_num_threads(),
        "waited_for_start_s": waited,
        "budget": budget,
        "scores": {str(k): v for k, v in scores.items()},
        "scoring_s": scoring_s,
        "project_modules_loaded": sorted(m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES),
    }
    (out / REFERENCE_LOG).write_text(json.dumps(result) + "\n", encoding="utf-8")
    return result
