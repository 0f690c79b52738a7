"""Training throughput of the ELMo BiLM with sampled and adaptive softmax against the full softmax.

Builds one model per softmax kind from the same preset (default ``elmo-small``) and the same initial
weights, trains a word vocabulary of ``--vocab_size`` words on the given corpus (or loads
``--tokenizer_name``), cuts the corpus into windows of ``--seq_len`` tokens (``<S>`` + words + ``</S>``),
and times training steps (forward, backward, Adam step) in turn -- full, sampled, adaptive, full, ... --
so that load on the machine hits every kind alike. Reports the median step time of each kind, tokens/s and
the ratio to the full softmax, and the share of a full-softmax step spent in the softmax (the forward and
backward of the shared softmax + loss from the top LSTM states, timed on its own, interleaved as well).

Example (the figures of the report)::

    python bench/bench_elmo_softmax.py --train_file ../shared/data/corpus/news.txt.gz \\
        --vocab_size 30000 --seq_len 128 --batch_size 32 --threads 2 --steps 10

Prints a table and one JSON line. Not part of the test suite.

Measured on the idle 2-core development machine (``--tokenizer_name`` a 30,000-word vocabulary trained on the
first 200,000 lines of ``news.txt.gz``), ``elmo-small``, T = 128, B = 32, 2 threads, median of 10 steps:

* fused CPU BiLSTM (default): full softmax 3.117 s/step (1,314 tokens/s), softmax 72.0% of it; sampled (1024
  negatives) 0.989 s/step, **3.15x**; adaptive (cut-offs 1500 / 7500, div 4) 1.042 s/step, **2.99x**;
* ``--native_lstm`` (two ``nn.LSTM`` per layer): full 3.542 s, softmax 64.1%; sampled 1.386 s, 2.56x;
  adaptive 1.451 s, 2.44x.

With ELMo's 8192 negatives (27% of this vocabulary, 1% of ELMo's 793k) the sampled softmax gains less
(1.90x, measured under load with the native LSTM).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a shared machine, spinning threads of a busy process slow
# every step by 10x and more (measured). Must be set before torch loads the OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import modeling  # noqa: E402
from core.errors import InputError, add_debug_argument, run_cli  # noqa: E402
from modeling.elmo import SesameElmoForBidirectionalLM  # noqa: E402
from tokenizer.corpus import iter_text_lines  # noqa: E402


def make_batches(tokenizer, files, seq_len: int, batch_size: int, num_batches: int, max_lines: int):
    """``num_batches`` batches of ``batch_size`` windows of ``seq_len`` tokens cut from the corpus stream."""
    words: list[str] = []
    need = num_batches * batch_size * (seq_len - 2)
    for line in itertools.islice(iter_text_lines(files), max_lines):
        words.extend(tokenizer._tokenize(line))
        if len(words) >= need:
            break
    if len(words) < need:
        raise InputError(f"--train_file: only {len(words)} words; {need} needed for {num_batches} batches")
    windows = [words[i : i + seq_len - 2] for i in range(0, need, seq_len - 2)]
    return [
        tokenizer(windows[i : i + batch_size], is_split_into_words=True, return_tensors="pt")
        for i in range(0, len(windows), batch_size)
    ]


def build_parser() -> argparse.ArgumentParser:
    """The command line of this bench (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train_file", nargs="+", required=True, help="corpus (.txt / .txt.gz)")
    parser.add_argument("--tokenizer_name", default=None, help="a saved SesameElmoTokenizer (default: train one)")
    parser.add_argument("--config_name", default="elmo-small")
    parser.add_argument("--vocab_size", type=int, default=30000)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per kind (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--num_sampled", type=int, default=1024, help="negatives of the sampled softmax")
    parser.add_argument("--max_lines", type=int, default=200000, help="corpus lines read for the vocabulary")
    parser.add_argument("--kinds", nargs="+", default=["full", "sampled", "adaptive"])
    parser.add_argument(
        "--native_lstm",
        action="store_true",
        help="PyTorch's nn.LSTM kernel instead of the fused CPU BiLSTM (fused_cpu_lstm=False)",
    )
    add_debug_argument(parser)
    return parser


def load_tokenizer(args):
    """``--tokenizer_name``, or a word vocabulary of ``--vocab_size`` trained on the first ``--max_lines`` lines."""
    if args.tokenizer_name:
        from modeling.elmo.tokenization_elmo import SesameElmoTokenizer

        return SesameElmoTokenizer.from_pretrained(args.tokenizer_name)
    from tokenizer.elmo_training import train_elmo_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        sample = Path(tmp) / "sample.txt"
        sample.write_text(
            "\n".join(itertools.islice(iter_text_lines(args.train_file), args.max_lines)) + "\n", encoding="utf-8"
        )
        t0 = time.perf_counter()
        tokenizer = train_elmo_tokenizer([sample], args.vocab_size)
        print(f"vocabulary: {len(tokenizer)} words ({time.perf_counter() - t0:.1f} s)", flush=True)
    return tokenizer


def make_models(base, kinds):
    """One BiLM per softmax kind, all with the same ELMo weights (the first model's), and an Adam optimizer each:
    ``({kind: model}, {kind: optimizer})``."""
    models, opts = {}, {}
    reference = None
    for kind in kinds:
        model = SesameElmoForBidirectionalLM(copy.deepcopy(base).__class__(**{**base.to_dict(), "softmax": kind}))
        if reference is None:
            reference = model.elmo.state_dict()
        model.elmo.load_state_dict(reference)
        models[kind], opts[kind] = model.train(), torch.optim.Adam(model.parameters(), lr=1e-3)
    return models, opts


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = load_tokenizer(args)
    vocab = len(tokenizer)
    batches = make_batches(tokenizer, args.train_file, args.seq_len, args.batch_size, 4, args.max_lines)

    base = modeling.get_preset_config(
        args.config_name, vocab_size=vocab, num_sampled=args.num_sampled, fused_cpu_lstm=not args.native_lstm
    )
    models, opts = make_models(base, args.kinds)

    def train_step(kind: str, batch) -> float:
        model, opt = models[kind], opts[kind]
        t0 = time.perf_counter()
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    def softmax_part(batch) -> float:
        """Forward + backward of the full softmax and loss alone, from the (detached) top states."""
        model = models["full"]
        with torch.no_grad():
            top = model.elmo(batch["char_ids"], batch["attention_mask"]).last_hidden_state
        top.requires_grad_(True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        t0 = time.perf_counter()
        (hf, tf), (hb, tb) = model._directions(top, labels, batch["attention_mask"])
        loss = model._nll_sum(hf, tf, None) / tf.numel() + model._nll_sum(hb, tb, None) / tb.numel()
        loss.backward()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {k: [] for k in [*args.kinds, "softmax_part"]}
    for step in range(args.warmup + args.steps):
        batch = batches[step % len(batches)]
        for kind in args.kinds:
            dt = train_step(kind, batch)
            if step >= args.warmup:
                times[kind].append(dt)
        if "full" in args.kinds:
            dt = softmax_part(batch)
            if step >= args.warmup:
                times["softmax_part"].append(dt)
        print(f"step {step}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items() if v), flush=True)

    tokens = args.batch_size * args.seq_len
    med = {k: statistics.median(v) for k, v in times.items() if v}
    result = {
        "config": args.config_name,
        "vocab_size": vocab,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "steps": args.steps,
        "num_sampled": args.num_sampled,
        "fused_cpu_lstm": not args.native_lstm,
        "adaptive_cutoffs": base.__class__(**{**base.to_dict(), "softmax": "adaptive"}).resolved_adaptive_cutoffs(),
    }
    print(f"\n{'softmax':>10} {'median step s':>14} {'tokens/s':>10} {'x full':>8}")
    for kind in args.kinds:
        ratio = med["full"] / med[kind] if "full" in med else float("nan")
        print(f"{kind:>10} {med[kind]:>14.3f} {tokens / med[kind]:>10.0f} {ratio:>8.2f}")
        result[f"{kind}_step_s"] = round(med[kind], 4)
        result[f"{kind}_tokens_per_s"] = round(tokens / med[kind], 1)
        result[f"{kind}_speedup_vs_full"] = round(ratio, 3)
    if "softmax_part" in med:
        share = med["softmax_part"] / med["full"]
        print(f"softmax share of a full-softmax step: {share:.1%} ({med['softmax_part']:.3f} s of {med['full']:.3f} s)")
        result["full_softmax_share"] = round(share, 4)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
