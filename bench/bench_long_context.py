"""Long context: a modernbert-tiny-size encoder at 512 to 8,192 tokens, every layer global against ModernBERT's
alternation of one global layer with local (sliding-window) ones; forward + backward tokens/s and peak memory.

    python bench/bench_long_context.py --output_dir out/long                       # the CPU, sdpa
    python bench/bench_long_context.py --device cuda --mixed_precision bf16 --output_dir out/long-gpu

Each (variant, length) runs in a process of its own (so that the peak is its own): ``SesameBertForMaskedLM`` at the
``--config_name`` preset (modernbert-tiny: 3 layers of 128, rotary positions, GeGLU, window 128, global every 3rd
layer) with ``max_position_embeddings`` 8,192, a batch of ``max(1, --batch_tokens // length)`` rows of random ids (no
padding), 30% of the positions predicted (the loss as ``pretrain`` computes it: ``skip_logits``, the decoder and the
cross-entropy fused at the predicted positions); ``--warmup`` untimed steps, then the median of ``--steps``
forward + backward passes (no optimizer), in tokens/s. Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on
the CPU the process's peak resident set (``VmHWM``, reset before the first step: ``_script_env.start_peak_rss``) minus
the resident set before the first step, i.e. what the
steps added (activations, the attention's scores and masks, gradients). A step that runs out of memory (or past
``--timeout_s``) is reported as such. Writes ``results.json``, ``results.md`` and ``results.png`` (both against the
length) and prints the table, with the machine's load average (``results.json``: ``load_average``).

Local layers run without a (T, T) mask on every path (issue 50): on the CPU "sdpa" runs them in blocks of queries
against the keys within the window (``modeling.bert.attention_sesame_bert.local_sdpa_attention``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _script_env  # (offline, the project root on sys.path; bench/ is the script's folder)

VARIANTS = ("global", "local")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--config_name", default="modernbert-tiny")
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--batch_tokens", type=int, default=8192, help="tokens per batch (rows = this / length, >= 1)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--attn_implementation", default="sdpa")
    p.add_argument("--mixed_precision", default="no", choices=["no", "bf16"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch threads on the CPU")
    p.add_argument("--timeout_s", type=float, default=900.0, help="per (variant, length)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "variant:length": run one case, print JSON
    return p.parse_args(argv)


def run_one(args, variant: str, length: int) -> dict:
    """One case in this process: tokens/s and peak memory (MB)."""
    import torch

    import modeling
    from modeling import SesameBertForMaskedLM

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = modeling.get_preset_config(args.config_name, vocab_size=30000)
    config.max_position_embeddings = max(config.max_position_embeddings, max(args.lengths))
    if variant == "global":
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(config).to(device).train()
    model.set_attn_implementation(args.attn_implementation)
    rows = max(1, args.batch_tokens // length)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (rows, length), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    batch = {"input_ids": ids.to(device), "labels": labels.to(device)}
    dtype = torch.bfloat16 if args.mixed_precision == "bf16" else None

    def step():
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(**batch, skip_logits=True).loss  # pretrain's MLM loss: no (N, V) logits
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _script_env.start_peak_rss()
    times = []
    for i in range(args.warmup + args.steps):
        started = time.perf_counter()
        step()
        if i >= args.warmup:
            times.append(time.perf_counter() - started)
    if device.type == "cuda":
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        peak = _script_env.peak_rss_mb(before)
    return {
        "variant": variant,
        "length": length,
        "rows": rows,
        "layer_types": config.attention_types(),
        "tokens_per_s": rows * length / statistics.median(times),
        "peak_mb": peak,
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.one:
        variant, length = args.one.split(":")
        print(json.dumps(run_one(args, variant, int(length))))
        return {}
    results = []
    for length in args.lengths:
        for variant in args.variants:
            cmd = [
                sys.executable,
                __file__,
                *(argv if argv is not None else sys.argv[1:]),
                "--one",
                f"{variant}:{length}",
            ]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
                if done.returncode == 0:
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                else:
                    last = (done.stderr.strip().splitlines() or ["?"])[-1]
                    result = {"variant": variant, "length": length, "failed": last[:200]}
            except subprocess.TimeoutExpired:
                result = {"variant": variant, "length": length, "failed": f"over {args.timeout_s:.0f} s"}
            results.append(result)
            print(json.dumps(result), flush=True)
    lines = ["| tokens | rows | variant | tokens/s | peak memory (MB) |", "|---:|---:|---|---:|---:|"]
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['length']} | | {r['variant']} | {r['failed']} | |")
        else:
            lines.append(
                f"| {r['length']} | {r['rows']} | {r['variant']} | {r['tokens_per_s']:.0f} | {r['peak_mb']:.0f} |"
            )
    print("\n".join(lines))
    load = os.getloadavg()  # the machine's 1/5/15-minute load at the end (shared machines: read the figures with it)
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    report = {"args": vars(args), "results": results, "load_average": load}
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / "results.md").write_text("\n".join(lines) + "\n")
        plot(results, out / "results.png", args)
    return report


def plot(results: list[dict], path: Path, args) -> None:
    """``results.png``: tokens/s and peak memory against the sequence length, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for variant, style in (("global", "o-"), ("local", "s--")):
        rows = [r for r in results if r["variant"] == variant and "failed" not in r]
        label = "all global" if variant == "global" else "global + local (window 128)"
        axes[0].plot([r["length"] for r in rows], [r["tokens_per_s"] for r in rows], style, label=label)
        axes[1].plot([r["length"] for r in rows], [r["peak_mb"] for r in rows], style, label=label)
    for ax, title in zip(axes, ("forward + backward tokens/s", "peak memory added by the steps (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{args.config_name} on {args.device} ({args.attn_implementation}, {args.mixed_precision})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
