"""Time one MLM training step of SesameBertForMaskedLM against transformers' BertForMaskedLM.

    python bench/bench_bert_mlm_step.py [--steps 10] [--warmup 3] [--threads 2] [--device cpu]

Same config for both (BERT-mini size: L4 / H256 / A4, intermediate 1024, vocab 30522, dropout 0.1 unless --dropout),
same weights
(SesameBert is converted from the transformers model), the same batch (B32 x S128, no padding, 15 % of the tokens
replaced by [MASK] and predicted). A step is forward + backward + AdamW step + zero_grad. The models' steps are
interleaved (one of each per round) so that they share the machine's noise; the medians over ``--steps`` rounds
after ``--warmup`` rounds are printed, with the ratio transformers / SesameBert (> 1: SesameBert is faster).
SesameBert runs with sparse prediction (the MLM head only at the 15 % predicted positions) and, for the
explanation of the gain, also with ``sparse_prediction=False`` (dense head, as transformers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from _mlm_common import make_batch, reference_bert_config, sync  # bench/ is the script's folder
from transformers import BertForMaskedLM

from modeling import SesameBertConfig, SesameBertForMaskedLM
from modeling.bert.sources import bert


def make_models(args):
    torch.manual_seed(0)
    shape = (args.hidden_size, args.layers, args.heads, 4 * args.hidden_size)
    hf_config = reference_bert_config(args.vocab_size, *shape, args.seq_len, args.dropout)
    hf = BertForMaskedLM(hf_config)
    config = bert.SOURCE.sesame_config(hf_config)
    models = {"transformers": hf}
    for name, sparse in (("sesame_sparse", True), ("sesame_dense", False)):
        model = SesameBertForMaskedLM(SesameBertConfig(**{**config.to_diff_dict(), "sparse_prediction": sparse}))
        model.load_state_dict(bert.SOURCE.sesame_state(hf.state_dict(), "BertForMaskedLM"))
        models[name] = model
    return {k: m.to(args.device).train() for k, m in models.items()}


def parse_args(argv=None):
    """Parse the command line ``argv`` (None = sys.argv) and return the argparse namespace."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="measured rounds (median over them)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--mlm_probability", type=float, default=0.15)
    parser.add_argument(
        "--dropout",
        type=float,
        default=0.1,
        help="hidden and attention dropout of both models (0.1 = BERT; Cramming pretrains with 0)",
    )
    parser.add_argument("--no_dense", action="store_true", help="skip the SesameBert dense-head variant")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the encoder alone (forward + backward of a surrogate loss, no MLM head, no "
        "optimizer) for transformers and SesameBert; step - encoder = MLM head + loss + AdamW",
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    models = make_models(args)
    if args.no_dense:
        del models["sesame_dense"]
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    batch = make_batch(args.batch_size, args.seq_len, args.vocab_size, args.mlm_probability, args.device)
    encoder_batch = {k: v for k, v in batch.items() if k != "labels"}
    weight = torch.randn(args.batch_size, args.seq_len, args.hidden_size, generator=torch.Generator().manual_seed(3))
    weight = weight.to(args.device)

    def full_step(name):
        loss = models[name](**batch).loss
        loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
        return loss.item()

    def encoder_step(name):
        model = models[name.removesuffix("_encoder")]
        (model.bert(**encoder_batch).last_hidden_state * weight).sum().backward()
        model.zero_grad(set_to_none=True)

    steps = {name: full_step for name in models}
    if args.breakdown:
        steps.update(transformers_encoder=encoder_step, sesame_sparse_encoder=encoder_step)
    times = {k: [] for k in steps}
    losses = {}
    for round_ in range(args.warmup + args.steps):
        for name, step in steps.items():
            sync(args.device)
            start = time.perf_counter()
            loss = step(name)
            sync(args.device)
            if round_ >= args.warmup:
                times[name].append(time.perf_counter() - start)
            if round_ == 0 and loss is not None:
                losses[name] = loss
    medians = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "config": f"L{args.layers}/H{args.hidden_size}/A{args.heads}/S{args.seq_len}/B{args.batch_size}"
        f"/V{args.vocab_size}",
        "device": args.device,
        "threads": args.threads,
        "dropout": args.dropout,
        "steps": args.steps,
        "first_step_loss": losses,
        "median_step_s": medians,
        "ratio_transformers_over_sesame_sparse": medians["transformers"] / medians["sesame_sparse"],
    }
    if "sesame_dense" in medians:
        result["ratio_transformers_over_sesame_dense"] = medians["transformers"] / medians["sesame_dense"]
    for name, seconds in medians.items():
        print(f"{name:>14}: median {seconds * 1000:8.1f} ms/step")
    ratio = result["ratio_transformers_over_sesame_sparse"]
    print(f"ratio transformers / SesameBert (sparse prediction): {ratio:.2f}x")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
