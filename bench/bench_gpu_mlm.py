"""MLM training-step throughput on a GPU (or the CPU): SesameBertForMaskedLM vs transformers' BertForMaskedLM.

    python bench/bench_gpu_mlm.py                                   # BERT-base, S128 x B256, cuda, bf16
    python bench/bench_gpu_mlm.py --seq_len 512 --batch_size 64
    python bench/bench_gpu_mlm.py --device cpu --config_name bert-tiny --seq_len 64 --batch_size 8 \\
        --peak_flops 1e12 --threads 1                               # a smoke run on the CPU

What is compared, on one device, in one process:

* ``transformers``: ``BertForMaskedLM`` with ``attn_implementation="sdpa"`` (its fastest attention); its MLM head
  runs over every position.
* ``sesame``: ``SesameBertForMaskedLM`` with the **same weights** (copied with ``modeling.bert.convert``) and
  sparse prediction (the MLM head only at the predicted positions).
* each ``eager`` and ``torch.compile``-d (``--compile both|eager|compiled``; the compiled models are separate
  copies with the same initial weights).

A step is forward under ``torch.autocast`` (``--mixed_precision bf16`` by default; ``no`` = float32) + backward +
AdamW step (``fused=True`` where the device has the fused kernel, else the default) + ``zero_grad``, on a fixed
batch of random token ids (``--mlm_probability`` 15% replaced by [MASK] and predicted, no padding). The variants'
steps are **interleaved** (one of each per round) so that they share the machine's drift; after ``--warmup``
rounds (compilation happens there) the **median** over ``--steps`` rounds is reported as tokens/s
(``batch_size * seq_len / median step time``), with the ratios SesameBert / transformers and the model FLOPs
utilisation

    MFU = tokens/s * (6 N + 12 L S H + 6 p (H^2 + H V)) / peak_flops

(N = non-embedding parameters of the encoder, L layers, S sequence length, H hidden size, V vocabulary, p the MLM
probability: the 6N training FLOPs of the weights, the attention scores and weighted sums, and the MLM head at
the predicted positions only -- the FLOPs the step *needs*, the same count for both models). ``--peak_flops``
defaults to 989e12 (an H100 SXM's dense bf16 tensor-core peak) on CUDA; on the CPU pass the machine's peak (no
MFU is printed without it). The first step's losses are printed too: the eager models must agree (same weights,
same batch, dropout aside).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _mlm_common import make_batch, reference_bert_config, sync  # noqa: E402  (bench/ is the script's folder)

from training.optim import create_optimizer  # noqa: E402

H100_BF16_PEAK_FLOPS = 989e12


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:1, cpu, ...")
    p.add_argument(
        "--config_name", default="bert-base", help="a SesameBert preset (bert-tiny, bert-mini, bert-small, bert-base)"
    )
    p.add_argument("--vocab_size", type=int, default=30522)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--mlm_probability", type=float, default=0.15)
    p.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout of both models (BERT: 0.1)")
    p.add_argument(
        "--mixed_precision", default="bf16", choices=["bf16", "fp16", "no"], help="autocast dtype of the forward"
    )
    p.add_argument("--compile", default="both", choices=["both", "eager", "compiled"], help="which variants to time")
    p.add_argument(
        "--fused_adamw",
        default="auto",
        choices=["auto", "on", "off"],
        help="fused AdamW: auto = where the device has the kernel",
    )
    p.add_argument("--steps", type=int, default=20, help="timed rounds (median over them)")
    p.add_argument("--warmup", type=int, default=5, help="untimed rounds first (torch.compile compiles there)")
    p.add_argument(
        "--peak_flops",
        type=float,
        default=None,
        help="peak FLOP/s of the device for MFU (default 989e12 on CUDA: H100 dense bf16; none on the CPU)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--output", default=None, help="also write the results as JSON here")
    return p.parse_args(argv)


def make_models(args, device):
    """(transformers BertForMaskedLM (sdpa), SesameBertForMaskedLM with the same weights), in training mode."""
    from transformers import BertForMaskedLM

    import modeling
    from modeling import SesameBertForMaskedLM
    from modeling.bert.sources import bert

    preset = modeling.get_preset_config(args.config_name)
    torch.manual_seed(0)
    shape = (preset.hidden_size, preset.num_hidden_layers, preset.num_attention_heads, preset.intermediate_size)
    hf_config = reference_bert_config(args.vocab_size, *shape, args.seq_len, args.dropout, attn_implementation="sdpa")
    hf = BertForMaskedLM(hf_config)
    sesame = SesameBertForMaskedLM(bert.SOURCE.sesame_config(hf_config))
    sesame.config.sparse_prediction = True
    sesame.load_state_dict(bert.SOURCE.sesame_state(hf.state_dict(), "BertForMaskedLM"))
    return hf.to(device).train(), sesame.to(device).train()


def flops_per_token(model, args) -> float:
    """Training FLOPs needed per token: 6 N + 12 L S H + 6 p (H^2 + H V) (see the module docstring)."""
    c = model.config
    n = sum(p.numel() for p in model.bert.encoder.parameters())
    h, layers, v = c.hidden_size, c.num_hidden_layers, c.vocab_size
    return 6 * n + 12 * layers * args.seq_len * h + 6 * args.mlm_probability * (h * h + h * v)


def _setup_torch(args):
    """Apply the thread count and TF32 settings for ``args``; return the torch.device to run on."""
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 parts (optimizer, norms) on tensor cores
        torch.backends.cudnn.allow_tf32 = True
    return device


def _speed_ratios(tokens_per_s):
    """Take {model name: tokens/s} and return {"a / b": throughput ratio} for the compared pairs both measured."""
    pairs = [
        ("sesame eager", "transformers eager"),
        ("sesame compiled", "transformers compiled"),
        ("sesame compiled", "transformers eager"),
        ("sesame compiled", "sesame eager"),
    ]
    ratios = {}
    for a, b in pairs:
        if a in tokens_per_s and b in tokens_per_s:
            ratios[f"{a} / {b}"] = tokens_per_s[a] / tokens_per_s[b]
    return ratios


def _print_report(result, args, fused, peak):
    """Print the human-readable summary of ``result`` (the dict main returns); returns None."""
    tokens_per_s, first_loss = result["tokens_per_s"], result["first_step_loss"]
    print(
        f"{result['config']} on {result['device']}, {args.mixed_precision} autocast, fused AdamW {bool(fused)}, "
        f"median of {args.steps} interleaved steps"
    )
    for name, value in tokens_per_s.items():
        mfu = f"  MFU {100 * result['mfu'][name]:5.1f}%" if peak else ""
        print(f"  {name:>22}: {value:12,.0f} tokens/s{mfu}  (first loss {first_loss[name]:.4f})")
    for pair, ratio in result["ratios"].items():
        print(f"  {pair}: {ratio:.2f}x")


def main(argv=None):
    args = parse_args(argv)
    device = _setup_torch(args)
    hf, sesame = make_models(args, device)
    fused = {"on": True, "off": False, "auto": None}[args.fused_adamw]  # None: where torch has it (create_optimizer)
    models = {}
    if args.compile in ("both", "eager"):
        models.update({"transformers eager": hf, "sesame eager": sesame})
    if args.compile in ("both", "compiled"):
        models.update(
            {
                "transformers compiled": torch.compile(copy.deepcopy(hf)),
                "sesame compiled": torch.compile(copy.deepcopy(sesame)),
            }
        )
    optimizers = {k: create_optimizer(m, 1e-4, weight_decay=0.0, fused=fused) for k, m in models.items()}
    fused = bool(next(iter(optimizers.values())).defaults.get("fused"))  # what create_optimizer chose
    batch = make_batch(args.batch_size, args.seq_len, args.vocab_size, args.mlm_probability, device)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": None}[args.mixed_precision]
    # one GradScaler per model: an inf in one model must not lower the scale of the others
    scalers = {k: torch.amp.GradScaler(device.type) if amp is torch.float16 else None for k in models}

    def step(name):
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = models[name](**batch).loss
        scaler = scalers[name]
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizers[name])
            scaler.update()
        else:
            loss.backward()
            optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
        return loss.detach()

    times = {k: [] for k in models}
    first_loss = {}
    for round_ in range(args.warmup + args.steps):
        for name in models:
            sync(device)
            start = time.perf_counter()
            loss = step(name)
            sync(device)
            if round_ >= args.warmup:
                times[name].append(time.perf_counter() - start)
            if round_ == 0:
                first_loss[name] = float(loss)
    tokens = args.batch_size * args.seq_len
    tokens_per_s = {k: tokens / statistics.median(v) for k, v in times.items()}
    peak = args.peak_flops or (H100_BF16_PEAK_FLOPS if device.type == "cuda" else None)
    per_token = flops_per_token(sesame, args)
    result = {
        "config": f"{args.config_name} L{sesame.config.num_hidden_layers}/H{sesame.config.hidden_size}"
        f"/V{args.vocab_size} S{args.seq_len} x B{args.batch_size}",
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads)",
        "torch": torch.__version__,
        "mixed_precision": args.mixed_precision,
        "fused_adamw": bool(fused),
        "dropout": args.dropout,
        "steps": args.steps,
        "warmup": args.warmup,
        "first_step_loss": first_loss,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": per_token,
        "peak_flops": peak,
        "mfu": {k: v * per_token / peak for k, v in tokens_per_s.items()} if peak else None,
        "ratios": {},
    }
    result["ratios"] = _speed_ratios(tokens_per_s)
    _print_report(result, args, fused, peak)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
