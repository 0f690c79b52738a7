"""Packed documents on the GPU without the loop: a proof that the varlen path runs the kernel it should, and the model
step with document masking on against off.

    python bench/bench_document_step.py --prepared_dataset P --prove --output proof.json        # the kernel proof
    python bench/bench_document_step.py --prepared_dataset P --time eager --output step.json    # the model step
    python bench/bench_document_step.py --prepared_dataset P --device cpu --config_name bert-tiny --batch_size 8 \\
        --mixed_precision no --prove --time eager                                                # a CPU smoke run

The batch is the first ``--batch_size`` training blocks of a prepared dataset (``python -m pretrain.prepare
--document_masking true``), masked by ``pretrain``'s collator (``--mlm_probability``, the recipe's 30%) and given
the packed documents' sequences on the host (:class:`pretrain.collators.PackedSequences`), as ``pretrain`` feeds
them; "off" is the same batch without ``position_ids`` (attention across the block).

``--prove`` (SesameBert at ``--config_name``, training mode):

1. ``kernel``: a forward and backward of the encoder on the varlen path (``document_varlen_attention``; attention
   dropout 0 here, so that it can be compared) records the attention operators that ran: on CUDA in bf16 / fp16
   FlashAttention's varlen kernel forward and backward once per layer (``aten._flash_attention_forward`` /
   ``_flash_attention_backward``); its loss and gradients agree with SDPA's dense-mask path (bf16: within 2% of each
   gradient's norm).
2. ``no_device_read``: the same forward and backward with the recipe's attention dropout 0.1 under
   ``torch.cuda.set_sync_debug_mode("error")`` (any read of a device value back to the host raises): the packed
   documents' path waits for the device nowhere.
3. ``compiled``: ``torch.compile`` of the encoder runs the varlen path forward and backward with dropout 0 and gives
   the dense path's gradients (same tolerance).

The proof's model has :data:`PROOF_LAYERS` layers of ``--config_name``'s width (the kernel sees the run's shapes;
compilation takes less time).

``--time eager|compiled|both``: the MLM step (forward under autocast, backward, fused AdamW step, ``zero_grad``;
sparse prediction) for masking off and on, interleaved rounds, ``--warmup`` untimed (compilation happens there), the
median of ``--steps``: tokens/s and on / off. The attention dropout is ``--attention_dropout``, by default the
preset's (BERT's recipe 0.1: packed documents run the varlen path; the modern presets' 0: FlexAttention); it picks
the kernel that is timed (:func:`modeling.bert.attention_sesame_bert.packed_documents_kernel`).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import _script_env  # noqa: F401  (offline, the project root on sys.path; bench/ is the script's folder)
import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Layers of the proof's model (the run's width, heads and sequences; fewer layers compile sooner).
PROOF_LAYERS = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prepared_dataset", required=True, help="a folder of `python -m pretrain.prepare` (masking true)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--config_name", default="bert-base")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--mlm_probability", type=float, default=0.3)
    p.add_argument("--mixed_precision", default="bf16", choices=["bf16", "fp16", "no"])
    p.add_argument("--prove", action="store_true", help="run the kernel proof")
    p.add_argument("--time", default="none", choices=["none", "eager", "compiled", "both"])
    p.add_argument("--masking", nargs="+", default=["off", "on"], choices=["off", "on"], help="what --time times")
    p.add_argument(
        "--attention_dropout",
        type=float,
        default=None,
        help="attention dropout of the timed model (--time); default: the preset's. It picks the packed documents' "
        "kernel on CUDA: > 0 the varlen path, 0 FlexAttention",
    )
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--output", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


class OperatorLog(TorchDispatchMode):
    """The names of the operators that ran (``aten._flash_attention_forward`` ...), counted."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def load_batch(args, device):
    """``(on, off)``: the collated batch with ``position_ids`` and its sequences, and the same without them."""
    from transformers import AutoTokenizer

    from pretrain.collators import MLMCollator, PackedSequences
    from pretrain.prepare import load_prepared

    prepared = load_prepared(args.prepared_dataset)
    blocks = prepared["train"].select(range(args.batch_size))
    if "position_ids" not in blocks.column_names:
        raise SystemExit(f"--prepared_dataset {args.prepared_dataset}: no position_ids; prepare it with masking on")
    tokenizer = AutoTokenizer.from_pretrained(Path(args.prepared_dataset) / "tokenizer")
    collator = PackedSequences(MLMCollator(tokenizer, mlm_probability=args.mlm_probability, seed=0))
    examples = [dict(blocks[i], index=i) for i in range(len(blocks))]
    on = {k: v.to(device) if torch.is_tensor(v) else v for k, v in collator(examples).items()}
    off = {k: v for k, v in on.items() if k in ("input_ids", "labels", "attention_mask", "token_type_ids")}
    return on, off, len(tokenizer)


def make_model(args, vocab_size, device, attention_dropout: float | None, head: bool, layers: int | None = None):
    """SesameBert at ``--config_name`` (``layers`` layers where given) with sparse prediction, in training mode, with
    ``attention_dropout`` (``None``: the preset's; 0: no dropout anywhere, for the comparisons)."""
    import modeling
    from modeling import SesameBertForMaskedLM, SesameBertModel

    config = modeling.get_preset_config(args.config_name, vocab_size=vocab_size)
    if layers is not None:
        config.num_hidden_layers = layers
    if attention_dropout is not None:
        config.attention_probs_dropout_prob = attention_dropout
    if attention_dropout == 0.0:  # the comparisons: no dropout anywhere (each call would draw other masks)
        config.hidden_dropout_prob = 0.0
    config.sparse_prediction = True
    torch.manual_seed(0)
    model = (SesameBertForMaskedLM if head else SesameBertModel)(config)
    return model.to(device).train()


def autocast(args, device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": None}[args.mixed_precision]
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def encoder_loss(model, batch, args, device):
    """The real tokens' hidden states projected on fixed random directions (float32; the same for every call): a
    loss whose gradient reaches every layer and that reads nothing back (no sparse head)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with autocast(args, device):
        hidden = model(**inputs).last_hidden_state
    directions = torch.randn(  # made on the device: a copy from the host would wait for it
        hidden.shape, generator=torch.Generator(device).manual_seed(0), device=device
    )
    if "attention_mask" in batch:  # the real tokens only (padding's outputs are meaningless, and differ by path)
        directions = directions * batch["attention_mask"][..., None]
    return (hidden.float() * directions).mean()


def gradient_agreement(model, reference) -> float:
    """The largest ``|g - g_ref| / |g_ref|`` over parameters (norms), 0 where both are 0."""
    worst = 0.0
    for p, q in zip(model.parameters(), reference.parameters()):
        if p.grad is None or q.grad is None:
            continue
        ref = q.grad.float().norm()
        if ref > 0:
            worst = max(worst, float((p.grad.float() - q.grad.float()).norm() / ref))
    return worst


def prove(args, device) -> dict:
    from modeling.bert import modeling_sesame_bert as msb

    on, _, vocab = load_batch(args, device)
    low = args.mixed_precision != "no"
    result: dict = {"device": str(device), "dtype": args.mixed_precision}
    chooser = msb.packed_documents_kernel
    varlen = make_model(args, vocab, device, 0.0, head=False, layers=PROOF_LAYERS)
    dense = copy.deepcopy(varlen)
    try:
        msb.packed_documents_kernel = lambda *a, **k: "sdpa"  # the dense (B, 1, T, T) mask
        dense_loss = encoder_loss(dense, on, args, device)
        dense_loss.backward()
        msb.packed_documents_kernel = lambda *a, **k: "document_varlen"
        with OperatorLog() as log:
            loss = encoder_loss(varlen, on, args, device)
            loss.backward()
        layers = varlen.config.num_hidden_layers
        flash = {k: v for k, v in log.counts.items() if "flash" in k or "efficient" in k or "scaled_dot" in k}
        result["kernel"] = {
            "operators": flash,
            "loss": loss.item(),
            "dense_loss": dense_loss.item(),
            "worst_relative_gradient_difference": gradient_agreement(varlen, dense),
        }
        if device.type == "cuda" and low:
            ok = flash.get("_flash_attention_forward") == layers and flash.get("_flash_attention_backward") == layers
            result["kernel"]["flash_varlen_forward_and_backward_per_layer"] = ok
        result["kernel"]["agrees"] = result["kernel"]["worst_relative_gradient_difference"] < (2e-2 if low else 1e-4)
        print("kernel:", json.dumps(result["kernel"]), flush=True)

        dropping = make_model(args, vocab, device, 0.1, head=False, layers=PROOF_LAYERS)
        msb.packed_documents_kernel = chooser  # the real choice: varlen on CUDA in training with dropout
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            encoder_loss(dropping, on, args, device).backward()
            result["no_device_read"] = True if device.type == "cuda" else "not checked (no device on the CPU)"
        except RuntimeError as err:
            import traceback

            where = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_tb(err.__traceback__)[-4:]]
            result["no_device_read"] = f"failed: {err} at {' <- '.join(reversed(where))}"
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        print("no_device_read:", result["no_device_read"], flush=True)

        msb.packed_documents_kernel = lambda *a, **k: "document_varlen"
        compiled_model = copy.deepcopy(dense)
        compiled_model.zero_grad()
        started = time.perf_counter()
        compiled = torch.compile(compiled_model)
        encoder_loss(compiled, on, args, device).backward()
        worst = gradient_agreement(compiled_model, dense)
        result["compiled"] = {
            "worst_relative_gradient_difference": worst,
            "agrees": worst < (2e-2 if low else 1e-4),
            "seconds": time.perf_counter() - started,
        }
        print("compiled:", json.dumps(result["compiled"]), flush=True)
    finally:
        msb.packed_documents_kernel = chooser
    return result


def time_steps(args, device) -> dict:
    from training.optim import create_optimizer

    on, off, vocab = load_batch(args, device)
    model = make_model(args, vocab, device, args.attention_dropout, head=True)
    kinds = {"eager": ["eager"], "compiled": ["compiled"], "both": ["eager", "compiled"]}[args.time]
    variants = {}
    for kind in kinds:
        for masking in args.masking:
            batch = {"off": off, "on": on}[masking]
            copy_ = copy.deepcopy(model)
            forward = torch.compile(copy_) if kind == "compiled" else copy_
            fused = device.type == "cuda"
            variants[f"{kind} {masking}"] = (forward, create_optimizer(copy_, 1e-4, fused=fused or None), batch)

    def step(name):
        forward, optimizer, batch = variants[name]
        with autocast(args, device):
            loss = forward(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.warmup + args.steps):
        for name in variants:
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            step(name)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if round_ >= args.warmup:
                times[name].append(time.perf_counter() - started)
    tokens = args.batch_size * on["input_ids"].shape[1]
    rates = {name: tokens / statistics.median(t) for name, t in times.items()}
    result = {"tokens_per_s": rates, "median_step_s": {n: statistics.median(t) for n, t in times.items()}}
    for kind in kinds:
        if f"{kind} on" in rates and f"{kind} off" in rates:
            result[f"{kind} on / off"] = rates[f"{kind} on"] / rates[f"{kind} off"]
    print(json.dumps(result, indent=2), flush=True)
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    report: dict = {"args": vars(args), "torch": torch.__version__}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    if args.prove:
        report["proof"] = prove(args, device)
    if args.time != "none":
        report["step"] = time_steps(args, device)
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
