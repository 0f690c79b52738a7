"""Where the time goes on the host: the per-optimizer-step cost of everything in ``pretrain`` that is not the model, at
the default recipe (document masking on, ``--mlm_probability 0.3``, sparse head), measured on this machine's CPU.

Pieces, each timed alone on the batch of one optimizer step (``--batch_size`` packed blocks of ``--seq_len`` tokens,
bert-base vocabulary; median of ``--repeats`` repetitions, ms per step):

* ``read``: the sampler's indices and ``IndexedDataset.__getitems__`` (Arrow rows to Python lists);
* ``collate``: ``MLMCollator`` on those examples, whole: padding to tensors, random draws, masking, position ids;
  and its parts ``draws`` (the per-example generators), ``masking`` (``mask_tokens``), ``pad`` (the
  ``input_ids`` / ``position_ids`` lists to tensors, through numpy) and ``pad_torch_tensor`` (the same with
  ``torch.tensor``, as before issue 30);
* ``mask``: the model's attention mask for packed documents, host side only (built for two rows on the CPU, so that
  Python and the dispatcher are timed, not arithmetic, which runs on the GPU on CUDA): ``document_ids`` and the
  dense (B, 1, T, T) SDPA mask as transformers' ``create_bidirectional_mask`` builds it (``vmap``; the path before
  issue 30), as ``document_dense_mask`` builds it (broadcasting), the FlexAttention ``BlockMask`` of
  ``document_block_mask`` (the path on CUDA without attention dropout) and the sequences of ``document_sequences``
  (the path on CUDA in training with attention dropout, the default recipe's; on CUDA it also waits once for the
  device, which a CPU cannot time);
* ``loop``: ``training.loop.Trainer``'s own per-step work (loss normalisation, statistics, clipping, the optimizer
  call, the logging every ``--logging_steps``), timed as the Trainer's step with a one-parameter model on
  pre-collated batches.

The total of what runs in the main process is compared with the model step on one H100 (``--gpu_step_ms``, default
75 ms: ``bench/bench_gpu_mlm.py`` eager SesameBert bert-base S128 B256 bf16, issue 30); the data pieces (read,
collate) move to DataLoader workers on CUDA (``--dataloader_num_workers auto``), where they overlap the step. Usage::

    python bench/bench_host_side.py                       # B256 S128, 20 repetitions
    python bench/bench_host_side.py --batch_size 8 --repeats 2 --loop_steps 3    # smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import _script_env  # noqa: F401  (offline, the project root on sys.path; bench/ is the script's folder)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--vocab_size", type=int, default=30522)
    p.add_argument("--mlm_probability", type=float, default=0.3)
    p.add_argument("--mean_document_tokens", type=int, default=60, help="mean document length of the packed blocks")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--loop_steps", type=int, default=30, help="Trainer steps timed for the loop's own work")
    p.add_argument("--logging_steps", type=int, default=10)
    p.add_argument("--gpu_step_ms", type=float, default=75.0, help="the model step to compare with (H100, eager)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the main process of a GPU run)")
    p.add_argument("--output", default=None, help="also write the results as JSON here")
    return p.parse_args(argv)


class _Tok:
    """What MLMCollator reads of a WordPiece tokenizer (special ids 0-4, size)."""

    def __init__(self, vocab_size):
        self.vocab_size, self.pad_token_id, self.mask_token_id = vocab_size, 0, 4
        self.all_special_ids = [0, 1, 2, 3, 4]

    def __len__(self):
        return self.vocab_size


def packed_blocks(n: int, seq_len: int, vocab_size: int, mean_doc: int, seed: int = 0) -> list[dict]:
    """``n`` full blocks as ``pack_documents`` writes them: documents of geometric lengths (mean ``mean_doc``), each
    piece starting with [CLS] (id 2) at position 0, position ids restarting per document."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        ids = rng.integers(5, vocab_size, seq_len)
        positions, t = np.zeros(seq_len, dtype=np.int64), 0
        while t < seq_len:
            length = min(int(rng.geometric(1 / mean_doc)), seq_len - t)
            positions[t : t + length] = np.arange(length)
            ids[t] = 2
            t += length
        rows.append({"input_ids": ids.tolist(), "word_start": [1] * seq_len, "position_ids": positions.tolist()})
    return rows


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def time_data(args) -> dict[str, float]:
    import torch
    from datasets import Dataset

    from modeling.bert.modeling_sesame_bert import (
        document_block_mask,
        document_ids,
        document_mask_function,
        document_sequences,
    )
    from pretrain.collators import MLMCollator, _pad, mask_tokens
    from pretrain.data import IndexedDataset
    from training.data import EpochShuffleSampler

    n = args.batch_size * 8
    dataset = IndexedDataset(
        Dataset.from_list(packed_blocks(n, args.seq_len, args.vocab_size, args.mean_document_tokens))
    )
    sampler = EpochShuffleSampler(n, seed=0)
    collator = MLMCollator(_Tok(args.vocab_size), mlm_probability=args.mlm_probability, seed=0)
    indices = list(sampler)[: args.batch_size]
    examples = dataset.__getitems__(indices)
    batch = collator(examples)
    ids = _pad([e["input_ids"] for e in examples], 0)
    candidates = ~torch.isin(ids, collator.special_ids)
    draws = collator.random_draws(indices, args.seq_len)

    from transformers.masking_utils import create_bidirectional_mask

    from modeling import SesameBertConfig
    from modeling.bert.modeling_sesame_bert import document_dense_mask

    config = SesameBertConfig(vocab_size=args.vocab_size)
    config._attn_implementation = "sdpa"
    # host side only: two rows on the CPU, so that the time is Python and the dispatcher, not arithmetic (on CUDA the
    # arithmetic runs on the GPU, asynchronously; each op adds a kernel launch of a few microseconds)
    position_ids = batch["position_ids"][:2]
    hidden = torch.empty(2, args.seq_len, 8)

    def transformers_mask():  # the dense mask as built before issue 30
        docs = document_ids(position_ids)
        return create_bidirectional_mask(config, hidden, None, and_mask_function=document_mask_function(docs))

    return {
        "read": _median_ms(lambda: dataset.__getitems__(list(sampler)[: args.batch_size]), args.repeats),
        "collate": _median_ms(lambda: collator(examples), args.repeats),
        "collate.draws": _median_ms(lambda: collator.random_draws(indices, args.seq_len), args.repeats),
        "collate.masking": _median_ms(
            lambda: mask_tokens(ids, candidates, *draws, 4, args.mlm_probability), args.repeats
        ),
        "collate.pad": _median_ms(
            lambda: (_pad([e["input_ids"] for e in examples], 0), _pad([e["position_ids"] for e in examples], 0)),
            args.repeats,
        ),
        "collate.pad_torch_tensor": _median_ms(  # the padding before issue 30: torch.tensor on the nested lists
            lambda: (
                torch.tensor([e["input_ids"] for e in examples]),
                torch.tensor([e["position_ids"] for e in examples]),
            ),
            args.repeats,
        ),
        "mask.transformers_vmap": _median_ms(transformers_mask, args.repeats),
        "mask.dense_sdpa": _median_ms(lambda: document_dense_mask(document_ids(position_ids)), args.repeats),
        "mask.flex_block_mask": _median_ms(lambda: document_block_mask(document_ids(position_ids)), args.repeats),
        "mask.varlen_sequences": _median_ms(lambda: document_sequences(document_ids(position_ids)), args.repeats),
        "_batch": batch,
    }


class _OneParameter:
    """A model of one parameter that reads the batch as the MLM models do (labels) and costs next to nothing."""

    def __new__(cls):
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.ones(()))

            def forward(self, input_ids=None, labels=None, **kwargs):
                import types

                return types.SimpleNamespace(loss=self.w * (labels[:1, :1] != -100).float().sum())

        return Model()


def time_loop(args, batch) -> float:
    """ms per optimizer step of ``Trainer`` with a one-parameter model on pre-collated copies of ``batch``."""
    import torch

    from training.accelerator import make_accelerator
    from training.config import TrainingConfig
    from training.loop import Trainer

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return args.loop_steps + 5

        def __getitem__(self, i):
            return batch

    loader = torch.utils.data.DataLoader(Batches(), batch_size=None)
    cfg = TrainingConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-host-"),
        learning_rate=1e-4,
        max_train_steps=args.loop_steps + 5,
        logging_steps=args.logging_steps,
        checkpoints_total_limit=None,
    )
    trainer = Trainer(make_accelerator(cfg, mixed_precision="no"), _OneParameter(), loader, cfg)
    trainer.save_checkpoint = lambda: None
    marks = []
    original = trainer.scheduler.step

    def mark(*a, **k):
        original(*a, **k)
        marks.append(time.perf_counter())

    trainer.scheduler.step = mark
    trainer.train()
    steps = [b - a for a, b in zip(marks[4:], marks[5:])]  # after 5 warm-up steps
    return 1000 * statistics.median(steps) if steps else float("nan")


def main(argv=None):
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    os.environ["ACCELERATE_USE_CPU"] = "1"
    data = time_data(args)
    batch = data.pop("_batch")
    loop = time_loop(args, batch)
    # the default recipe trains with attention dropout: the CUDA path builds the varlen sequences
    main_process = {"read": data["read"], "collate": data["collate"], "mask (CUDA path)": data["mask.varlen_sequences"]}
    main_process["loop"] = loop
    total_no_workers = sum(main_process.values())
    total_workers = main_process["mask (CUDA path)"] + loop
    report = {
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "mlm_probability": args.mlm_probability,
        "threads": torch.get_num_threads(),
        "ms_per_step": {**data, "loop": loop},
        "main_process_ms_without_workers": total_no_workers,
        "main_process_ms_with_workers": total_workers,
        "gpu_step_ms": args.gpu_step_ms,
    }
    print(
        f"host side per optimizer step, B{args.batch_size} S{args.seq_len}, mlm_probability {args.mlm_probability}, "
        f"{torch.get_num_threads()} thread(s), median of {args.repeats}:"
    )
    for name, value in {**data, "loop": loop}.items():
        print(f"  {name:24s} {value:8.2f} ms")
    print(
        f"  in the main process without workers: {total_no_workers:.2f} ms ({total_no_workers / args.gpu_step_ms:.1%} "
        f"of a {args.gpu_step_ms:g} ms GPU step)"
    )
    print(f"  in the main process with workers:    {total_workers:.2f} ms ({total_workers / args.gpu_step_ms:.1%})")
    return _script_env.write_report(args.output, report)


if __name__ == "__main__":
    main()
