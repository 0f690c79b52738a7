"""Pretraining throughput: ``pretrain``'s loop (packing + sparse MLM, SesameBert) vs the Hugging Face run_mlm recipe.

Measures steady-state **training tokens per second** -- real text tokens (padding excluded) through forward,
backward and the optimizer step, batch preparation included -- in one process, at the same model size
(L4/H256/A4, intermediate 1024), block length and batch size (S128/B32 by default) and thread count:

* ``sesame``: ``training.loop.Trainer`` as ``pretrain`` runs it: documents tokenised and packed into full
  128-token blocks (``pretrain.data``), masked by ``pretrain.collators.MLMCollator``, ``SesameBertForMaskedLM``
  with sparse prediction (MLM head only at the ~15% predicted positions), AdamW, clipping. tokens/s per step
  from the loop's own log (``logging_steps=1``).
* ``hf-line-by-line`` (the reference for the ratio): transformers ``BertForMaskedLM`` fed by
  ``DataCollatorForLanguageModeling`` from ``run_mlm``'s ``--line_by_line --pad_to_max_length`` preprocessing:
  every non-empty line (paragraph) is one example, truncated and padded to 128 tokens; plain accelerate-style
  step (forward, backward, AdamW step, scheduler step, zero_grad).
* ``hf-group-texts``: the same model and collator on ``run_mlm``'s default ``group_texts`` blocks (concatenated
  and cut into 128-token blocks, no padding) -- isolates what sparse prediction + the model bring.

Each is warmed up, then timed for ``--steps`` steps; the median per-step tokens/s is reported and the ratio
``sesame / hf-line-by-line`` (target >= 2.5). Usage::

    python bench/bench_pretrain_throughput.py --train_file ../shared/data/corpus/wiki_sample.txt.gz --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import _script_env  # noqa: F401  (offline, the project root on sys.path; bench/ is the script's folder)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train_file", nargs="+", default=None, help="corpus files (default: the bundled corpus)")
    p.add_argument("--tokenizer_name", default=None, help="WordPiece tokenizer (default: train an 8k one on the files)")
    p.add_argument("--max_documents", type=int, default=120, help="documents used (preprocessing time)")
    p.add_argument("--seq_length", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--only", choices=["sesame", "hf-line-by-line", "hf-group-texts"], nargs="+", default=None)
    p.add_argument("--output", default=None, help="also write the results as JSON here")
    return p.parse_args(argv)


def load_documents(files, max_documents):
    from pretrain.data import DEFAULT_TRAIN_FILES, load_raw_datasets

    raw = load_raw_datasets(files or DEFAULT_TRAIN_FILES, None, validation_split_percentage=1)
    docs = raw["train"].select(range(min(max_documents, len(raw["train"]))))
    return docs


def bench_sesame(args, tokenizer, docs):
    import torch
    from datasets import DatasetDict

    import modeling
    from pretrain import data
    from pretrain.collators import MLMCollator
    from training.accelerator import make_accelerator
    from training.config import TrainingConfig
    from training.data import make_train_dataloader
    from training.loop import Trainer

    tokenized = data.tokenize_bert(DatasetDict({"train": docs}), tokenizer)
    blocks = data.pack_blocks(tokenized, args.seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id)["train"]
    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as out:
        config = TrainingConfig(
            output_dir=out, learning_rate=1e-3, max_train_steps=total, logging_steps=1, checkpoints_total_limit=1
        )
        accelerator = make_accelerator(config)
        torch.manual_seed(0)
        cfg = modeling.get_preset_config(
            "bert-mini",
            vocab_size=len(tokenizer),
            num_hidden_layers=args.layers,
            hidden_size=args.hidden,
            num_attention_heads=args.heads,
            intermediate_size=4 * args.hidden,
        )
        model = modeling.SesameBertForMaskedLM(cfg)
        loader = make_train_dataloader(data.IndexedDataset(blocks), args.batch_size, MLMCollator(tokenizer), seed=0)
        trainer = Trainer(accelerator, model, loader, config)
        trainer.train()
        rates = [r["tokens_per_second"] for r in trainer.log_history[args.warmup :]]
        tokens = [r["tokens_per_second"] for r in trainer.log_history]
    return {
        "median_tokens_per_second": statistics.median(rates),
        "steps": len(rates),
        "padding_fraction": 0.0,
        "blocks": len(blocks),
        "all_steps_tokens_per_second": tokens,
    }


def _hf_loop(args, tokenizer, dataset, padding_fraction):
    import torch
    from transformers import BertConfig, BertForMaskedLM, get_scheduler
    from ttq.reference import mlm_loader  # bench/ is the script's folder

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=512,
    )
    model = BertForMaskedLM(config).train()
    _, loader = mlm_loader(tokenizer, dataset, args.batch_size, seed=0)
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": 0.01,
        },
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    total = args.warmup + args.steps
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=total)
    rates = []
    it = iter(loader)
    for _ in range(total):
        t0 = time.perf_counter()
        batch = next(it)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        dt = time.perf_counter() - t0
        rates.append(int(batch["attention_mask"].sum()) / dt)
    timed = rates[args.warmup :]
    return {
        "median_tokens_per_second": statistics.median(timed),
        "steps": len(timed),
        "padding_fraction": padding_fraction,
        "examples": len(dataset),
        "all_steps_tokens_per_second": rates,
    }


def bench_hf_line_by_line(args, tokenizer, docs):
    lines = [ln for text in docs["text"] for ln in text.split("\n") if ln.strip()]
    enc = tokenizer(
        lines, truncation=True, max_length=args.seq_length, padding="max_length", return_special_tokens_mask=True
    )
    dataset = [{k: enc[k][i] for k in enc} for i in range(len(lines))]
    real = sum(sum(m) for m in enc["attention_mask"])
    return _hf_loop(args, tokenizer, dataset, 1 - real / (len(lines) * args.seq_length))


def bench_hf_group_texts(args, tokenizer, docs):
    enc = tokenizer(list(docs["text"]), return_special_tokens_mask=True, verbose=False)
    L = args.seq_length
    concatenated = {k: [t for seq in enc[k] for t in seq] for k in enc}
    n = (len(concatenated["input_ids"]) // L) * L
    dataset = [{k: concatenated[k][i : i + L] for k in concatenated} for i in range(0, n, L)]
    return _hf_loop(args, tokenizer, dataset, 0.0)


def main(argv=None):
    args = parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    docs = load_documents(args.train_file, args.max_documents)
    if args.tokenizer_name:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name)
    else:
        from tokenizer.wordpiece import train_wordpiece_tokenizer

        tmp = Path(tempfile.mkdtemp()) / "corpus.txt"
        tmp.write_text("\n".join(docs["text"]) + "\n", encoding="utf-8")
        tokenizer = train_wordpiece_tokenizer([tmp], 8000)
    runs = {"sesame": bench_sesame, "hf-line-by-line": bench_hf_line_by_line, "hf-group-texts": bench_hf_group_texts}
    results = {
        "config": {
            k: getattr(args, k)
            for k in ("layers", "hidden", "heads", "seq_length", "batch_size", "threads", "steps", "warmup")
        },
        "vocab_size": len(tokenizer),
        "load_average_1min": os.getloadavg()[0],
    }
    for name in args.only or list(runs):
        results[name] = runs[name](args, tokenizer, docs)
        print(
            f"{name:16s} median {results[name]['median_tokens_per_second']:10.0f} tokens/s  "
            f"(padding {results[name]['padding_fraction']:.1%})",
            flush=True,
        )
    if "sesame" in results and "hf-line-by-line" in results:
        results["ratio_vs_line_by_line"] = (
            results["sesame"]["median_tokens_per_second"] / results["hf-line-by-line"]["median_tokens_per_second"]
        )
        print(f"ratio sesame / hf-line-by-line: {results['ratio_vs_line_by_line']:.2f}x (target >= 2.5)")
    if "sesame" in results and "hf-group-texts" in results:
        results["ratio_vs_group_texts"] = (
            results["sesame"]["median_tokens_per_second"] / results["hf-group-texts"]["median_tokens_per_second"]
        )
        print(f"ratio sesame / hf-group-texts:   {results['ratio_vs_group_texts']:.2f}x")
    results["load_average_1min_end"] = os.getloadavg()[0]
    return _script_env.write_report(args.output, results)


if __name__ == "__main__":
    main()
