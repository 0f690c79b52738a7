"""Loop overhead: the same model, data and optimizer through ``pretrain``'s loop (``training.loop.Trainer``) and
through a bare step loop; prints tokens/s of both and their ratio (target: >= 0.95 on CPU, >= 0.9 on a GPU at
bert-base S128 B256 bf16).

* ``bare``: ``for batch in loader: forward (autocast), backward, clip_grad_norm_, AdamW step, scheduler step,
  zero_grad`` -- the least any loop does; no logging, no statistics, no host read of the loss.
* ``loop``: ``Trainer.train()`` as ``pretrain`` runs it (accelerate-prepared model, optimizer and loader,
  token-weighted loss normalisation, non-finite checks, logging every ``--logging_steps``); the final
  checkpoint is not written (it is not per-step work).

Both read the same packed random blocks through the same ``MLMCollator`` and DataLoader (``--num_workers``), so the
difference is the loop's own cost. Rounds alternate (bare, loop, bare, loop, ...), each from the same initial
weights for ``--steps`` timed steps after ``--warmup`` untimed ones; the medians over ``--rounds`` are reported.
Tokens/s counts real tokens through forward, backward and the optimizer step. Usage::

    python bench/bench_loop_overhead.py                                   # CPU, bert-tiny S128 B32
    python bench/bench_loop_overhead.py --device cuda --config_name bert-base --batch_size 256 --mixed_precision bf16
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

import _script_env  # noqa: F401  (offline, the project root on sys.path; bench/ is the script's folder)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config_name", default="bert-tiny", help="SesameBert preset")
    p.add_argument("--vocab_size", type=int, default=30522)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--mixed_precision",
        default="no",
        choices=["no", "bf16"],
        help="autocast dtype (fp16 is left out: the loop's GradScaler has no counterpart in the bare loop)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default: torch's)")
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--logging_steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    if args.warmup < 1:
        p.error(
            f"--warmup {args.warmup}: expected >= 1 (the loop's timing starts at the end of the warm-up's last step)"
        )
    return args


class _Tok:
    """What MLMCollator reads of a WordPiece tokenizer (special ids, size)."""

    def __init__(self, vocab_size):
        self.vocab_size, self.pad_token_id, self.unk_token_id, self.cls_token_id = vocab_size, 0, 1, 2
        self.sep_token_id, self.mask_token_id = 3, 4
        self.all_special_ids = [0, 1, 2, 3, 4]

    def __len__(self):
        return self.vocab_size


def _setup(args):
    """The shared pieces of both loops: data, collator, initial model, loop settings, accelerator."""
    import types

    import torch
    from datasets import Dataset

    import modeling
    from pretrain.collators import MLMCollator
    from pretrain.data import IndexedDataset
    from training.accelerator import make_accelerator
    from training.config import TrainingConfig

    n_blocks = args.batch_size * (args.warmup + args.steps) + args.batch_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, args.vocab_size, (n_blocks, args.seq_len), generator=g)
    ids[:, 0] = 2
    ds = IndexedDataset(Dataset.from_dict({"input_ids": ids.tolist(), "word_start": torch.ones_like(ids).tolist()}))
    config = modeling.get_preset_config(args.config_name, vocab_size=args.vocab_size)
    torch.manual_seed(0)
    init = modeling.SesameBertForMaskedLM(config)
    total_steps = args.warmup + args.steps
    cfg = TrainingConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-loop-"),
        learning_rate=1e-4,
        max_train_steps=total_steps,
        num_warmup_steps=1,
        logging_steps=args.logging_steps,
        checkpoints_total_limit=None,
    )
    accelerator = make_accelerator(cfg, mixed_precision=args.mixed_precision)
    return types.SimpleNamespace(
        ds=ds,
        collator=MLMCollator(_Tok(args.vocab_size), seed=0),
        init=init,
        cfg=cfg,
        total_steps=total_steps,
        accelerator=accelerator,
        device=accelerator.device,
    )


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def bare_round(args, s) -> float:
    """Tokens/s of a plain step loop (forward, backward, clipping, AdamW, schedule) after ``args.warmup`` steps."""
    import torch

    from training.data import make_train_dataloader
    from training.optim import create_optimizer, create_scheduler

    model = copy.deepcopy(s.init).to(s.device).train()
    opt = create_optimizer(model, 1e-4, 0.01)
    sched = create_scheduler("linear", opt, 1, s.total_steps)
    loader = make_train_dataloader(s.ds, args.batch_size, s.collator, seed=0, num_workers=args.num_workers)
    it, tokens, t0 = iter(loader), 0, None
    for step in range(s.total_steps):
        if step == args.warmup:
            _sync(s.device)
            t0 = time.perf_counter()
        batch = {k: v.to(s.device, non_blocking=True) for k, v in next(it).items()}
        with s.accelerator.autocast():
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step >= args.warmup:
            tokens += int(batch["input_ids"].numel())
    _sync(s.device)
    return tokens / (time.perf_counter() - t0)


def loop_round(args, s) -> float:
    """Tokens/s of ``training.loop.Trainer`` on the same model and data after ``args.warmup`` steps (checkpoints
    left out: they are no per-step work)."""
    from training.data import make_train_dataloader
    from training.loop import Trainer

    model = copy.deepcopy(s.init)
    loader = make_train_dataloader(s.ds, args.batch_size, s.collator, seed=0, num_workers=args.num_workers)
    trainer = Trainer(s.accelerator, model, loader, s.cfg)
    trainer.save_checkpoint = lambda: None
    marks = {}
    original = trainer.scheduler.step

    def timed_step(*a, **k):  # the scheduler steps once per optimizer step: mark the warm-up's end there
        original(*a, **k)
        if trainer.state.global_step + 1 == args.warmup:
            _sync(s.device)
            marks["t0"] = time.perf_counter()

    trainer.scheduler.step = timed_step
    trainer.train()
    _sync(s.device)
    elapsed = time.perf_counter() - marks["t0"]
    s.accelerator.free_memory()
    return args.steps * args.batch_size * args.seq_len / elapsed


def main(argv=None):
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "1"
    setup = _setup(args)
    results = {"bare": [], "loop": []}
    for _ in range(args.rounds):
        results["bare"].append(bare_round(args, setup))
        results["loop"].append(loop_round(args, setup))
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["loop"] / med["bare"]
    report = {
        "device": str(setup.device),
        "config": args.config_name,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "mixed_precision": args.mixed_precision,
        "threads": torch.get_num_threads(),
        "rounds": results,
        "median_tokens_per_second": med,
        "ratio_loop_over_bare": ratio,
    }
    print(
        f"{args.config_name} S{args.seq_len} B{args.batch_size} {args.mixed_precision} on {setup.device} "
        f"({torch.get_num_threads()} threads), median of {args.rounds} rounds x {args.steps} steps:"
    )
    print(f"  bare step loop   {med['bare']:10.0f} tokens/s   {[round(x) for x in results['bare']]}")
    print(f"  pretrain loop    {med['loop']:10.0f} tokens/s   {[round(x) for x in results['loop']]}")
    print(f"  ratio loop/bare  {ratio:.3f}")
    return _script_env.write_report(args.output, report)


if __name__ == "__main__":
    main()
