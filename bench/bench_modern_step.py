"""The modern encoder's MLM training step against transformers' ModernBertForMaskedLM with the same weights.

    python bench/bench_modern_step.py --config_name modernbert-mini --lengths 1024 --threads 1 --output_dir out/ms
    python bench/bench_modern_step.py --device cuda --config_name modernbert-base --lengths 1024 8192 \\
        --batch_tokens 32768 --mixed_precision bf16 --output_dir out/ms-gpu
    python bench/bench_modern_step.py --config_name modernbert-mini --lengths 1024 --profile --output_dir out/prof

``SesameBertForMaskedLM`` at ``--config_name`` (a ModernBERT-class preset; dropout 0, sparse prediction) is built
once; transformers' ``ModernBertForMaskedLM`` gets its weights in-process
(``modeling.bert.sources.modernbert.from_sesame``), so both compute the same function. A step is forward (under
autocast with ``--mixed_precision``) + backward + AdamW step + ``zero_grad``. Each step's batch holds about
``--batch_tokens`` real tokens of random ids in documents (``--documents``):

* ``full``: every document is ``length`` tokens (run_mlm's ``group_texts`` blocks: no padding anywhere);
* ``mixed``: lengths drawn from a lognormal (median ``length`` / 4, sigma 1, clipped to [16, ``length``]), as a
  corpus of short and long documents.

``--mlm_probability`` of the positions are replaced by ``[MASK]`` (id 4) and predicted; padding is id 0. The
variants (``--variants``), each with its own copy of the weights and its own AdamW:

* ``transformers``: ModernBertForMaskedLM (``attn_implementation`` sdpa) on padded rows, one document per row padded
  to the batch's longest with ``attention_mask`` (``DataCollatorForLanguageModeling``'s dynamic padding), sparse
  prediction as converted (``config.sparse_prediction`` true, ModernBERT's training recipe);
* ``transformers_dense``: the same with ``sparse_prediction=False`` (transformers' default; the MLM head on every
  position, as ``run_mlm``);
* ``transformers_padding_free``: ModernBertForMaskedLM on one (1, N) row of all the documents, ``position_ids``
  restarting per document and FlashAttention's varlen arguments (``cu_seq_lens_q`` ...), through the attention
  function :func:`torch_flash_varlen_attention` registered with transformers' ``AttentionInterface`` as
  :data:`PADDING_FREE`: torch's own FlashAttention-2 varlen op (``aten._flash_attention_forward``, ``window_size``
  of the local layers), as ``flash_attention_2`` would run it, since the flash-attn wheel cannot be installed on a
  bare machine. CUDA and bf16 / fp16 only for speed; elsewhere (the CPU tests) the kernel is
  :func:`reference_varlen_kernel`, a loop over the documents;
* ``sesame_padded``: SesameBert on the transformers variant's padded rows (no ``attention_mask`` where no row is
  padded: ``pretrain``'s collator leaves it out of full blocks);
* ``sesame_packed``: SesameBert on the documents packed into rows of ``length`` (first-fit decreasing, no document
  split; the last rows padded), ``position_ids`` restarting per document (document masking, as ``pretrain``), the
  collator's varlen arguments (:class:`pretrain.collators.PackedSequences`).

The SesameBert variants compute their loss as ``pretrain`` does (``skip_logits=True``: the decoder and the
cross-entropy fused in chunks, no logits returned; ``--no_skip_logits`` computes the logits as transformers does).

Every variant sees the same documents and predicts the same positions, and the models start from the same weights:
the first round's losses are the same (``first_step_loss``, ``loss_spread``: the largest difference from the
transformers variant's, nats). Rounds are interleaved (one step of each variant per round), ``--warmup`` untimed,
then the median of ``--steps``: real tokens / s (padding not counted), the ratio of each SesameBert variant to
``transformers`` (> 1: ours is faster) and ``best_ratio`` (the faster SesameBert variant). Peak memory: on CUDA
``max_memory_allocated`` over the timed steps minus the memory before them; MFU (``mfu``; CUDA GPUs of
:data:`training.mfu.PEAK_TFLOPS` only) from the model FLOPs of the documents (:func:`model_flops`, the same for every
variant) over the median step time; on the CPU (unless ``--no_memory``)
each variant runs again in a process of its own (``--warmup`` + 2 steps), the peak resident set minus the resident
set before its first step. ``--profile`` profiles one step per variant (``torch.profiler``) and writes the top
operators by self time to ``profile_<case>.txt``. Writes ``results.json`` and ``results.md`` to ``--output_dir``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _script_env  # (offline, the project root on sys.path; bench/ is the script's folder)
import torch

from training.mfu import peak_flops

VARIANTS = ("transformers", "transformers_dense", "transformers_padding_free", "sesame_padded", "sesame_packed")
SESAME = ("sesame_padded", "sesame_packed")
#: The name of :func:`torch_flash_varlen_attention` in transformers' ``AttentionInterface``.
PADDING_FREE = "sesame_bench_torch_varlen"  # no "flash" in it: transformers would look for a flash-attn package
PAD_ID, MASK_ID = 0, 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config_name", default="modernbert-mini", help="a ModernBERT-class preset (modernbert-*)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024], help="row lengths (tokens); e.g. 8192")
    p.add_argument("--batch_tokens", type=int, default=2048, help="real tokens per step (about, for mixed)")
    p.add_argument("--documents", nargs="+", default=["full", "mixed"], choices=["full", "mixed"])
    p.add_argument("--variants", nargs="+", default=None, choices=VARIANTS, help="default: all but padding_free on CPU")
    p.add_argument("--vocab_size", type=int, default=30000)
    p.add_argument("--mlm_probability", type=float, default=0.3, help="ModernBERT's 30%%")
    p.add_argument(
        "--no_skip_logits",
        dest="skip_logits",
        action="store_false",
        help="SesameBert computes its (N, V) logits as transformers does (default: pretrain's loss, "
        "skip_logits: the decoder and cross-entropy fused)",
    )
    p.add_argument("--mixed_precision", default=None, choices=["no", "bf16", "fp16"], help="default: bf16 on CUDA")
    p.add_argument("--steps", type=int, default=5, help="timed rounds (median over them)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads on the CPU (the issue measured 1)")
    p.add_argument("--no_memory", action="store_true", help="CPU: skip the peak-memory processes")
    p.add_argument("--profile", action="store_true", help="profile one step per variant; tables in --output_dir")
    p.add_argument("--output_dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "documents:variant:length": peak memory of one
    args = p.parse_args(argv)
    if args.variants is None:
        args.variants = [v for v in VARIANTS if v != "transformers_dense"]
        if torch.device(args.device).type != "cuda":
            args.variants.remove("transformers_padding_free")
    if args.mixed_precision is None:
        args.mixed_precision = "bf16" if torch.device(args.device).type == "cuda" else "no"
    return args


# ---- the padding-free transformers reference ------------------------------------------------------------------------
def flash_varlen_kernel(query, key, value, cu_q, cu_k, max_q, max_k, dropout, scale, window):
    """FlashAttention-2's varlen forward (Dao 2023) through torch's own op, differentiable (aten's derivative is
    ``_flash_attention_backward``). query, key, value: (N, A, D) bf16 / fp16 on CUDA; ``cu_q`` / ``cu_k``: (S + 1,)
    int32 sequence starts; ``window``: keys within ``window`` positions on each side, or -1 (no window: the op's
    ``None``). Returns the (N, A, D) context."""
    side = window if window >= 0 else None
    return torch.ops.aten._flash_attention_forward(
        query,
        key,
        value,
        cu_q,
        cu_k,
        max_q,
        max_k,
        dropout,
        False,
        False,
        scale=scale,
        window_size_left=side,
        window_size_right=side,
    )[0]


def reference_varlen_kernel(query, key, value, cu_q, cu_k, max_q, max_k, dropout, scale, window):
    """:func:`flash_varlen_kernel`'s function, one sequence at a time through SDPA with a dense band mask (|q - k| <=
    ``window`` unless -1): the CPU stand-in (tests, smoke runs; not a speed reference). ``cu_q`` must equal
    ``cu_k`` (self-attention)."""
    out = torch.empty_like(query)
    bounds = cu_q.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        q, k, v = (x[start:end].transpose(0, 1) for x in (query, key, value))  # (A, n, D)
        mask = None
        if window >= 0:
            position = torch.arange(end - start, device=query.device)
            mask = (position[:, None] - position[None, :]).abs() <= window
        context = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, dropout, scale=scale)
        out[start:end] = context.transpose(0, 1)
    return out


#: The kernel :func:`torch_flash_varlen_attention` calls (the CPU stand-in off CUDA).
VARLEN_KERNELS = {"cuda": flash_varlen_kernel, "cpu": reference_varlen_kernel}


def torch_flash_varlen_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kwargs
):
    """transformers' attention-function signature for padding-free batches: query, key, value (1, A, N, D) of the
    flattened documents; ``kwargs`` carry ``cu_seq_lens_q`` / ``cu_seq_lens_k`` ((S + 1,) int32) and
    ``max_length_q`` / ``max_length_k`` (int), as ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` gives
    them; ``attention_mask`` is ignored (no mask function is registered, so transformers passes ``None``).
    ``sliding_window`` is ModernBertAttention's (``config.sliding_window + 1``, flash's inclusive bounds): keys within
    ``sliding_window - 1`` positions on each side. Returns ``(context (1, N, A, D), None)``."""
    if query.shape[0] != 1:
        raise ValueError(f"padding-free attention takes one row of flattened documents, got {query.shape[0]} rows")
    kernel = VARLEN_KERNELS["cuda" if query.is_cuda else "cpu"]
    window = -1 if sliding_window is None else sliding_window - 1
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (N, A, D)
    context = kernel(
        q,
        k,
        v,
        kwargs["cu_seq_lens_q"],
        kwargs["cu_seq_lens_k"],
        int(kwargs["max_length_q"]),
        int(kwargs["max_length_k"]),
        dropout,
        scaling if scaling is not None else query.shape[-1] ** -0.5,
        window,
    )
    return context.unsqueeze(0), None


def register_padding_free() -> str:
    """Register :func:`torch_flash_varlen_attention` with transformers' ``AttentionInterface`` as
    :data:`PADDING_FREE` (no mask function: transformers then passes no mask); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(PADDING_FREE, torch_flash_varlen_attention)
    return PADDING_FREE


# ---- the batches -----------------------------------------------------------------------------------------------------
def document_lengths(kind: str, length: int, batch_tokens: int, generator: torch.Generator) -> list[int]:
    """The documents of one step: ``full``: ``max(1, batch_tokens // length)`` of ``length`` tokens; ``mixed``:
    lognormal lengths (median ``length`` / 4, sigma 1, clipped to [16, ``length``]) until ``batch_tokens`` is
    reached."""
    if kind == "full":
        return [length] * max(1, batch_tokens // length)
    lengths: list[int] = []
    while sum(lengths) < batch_tokens:
        draw = math.exp(math.log(length / 4) + torch.randn((), generator=generator).item())
        lengths.append(int(min(length, max(16, round(draw)))))
    return lengths


def make_documents(args, kind: str, length: int) -> list[dict[str, torch.Tensor]]:
    """The step's documents: ``{"input_ids": (n,) long, "labels": (n,) long (-100 = not predicted)}`` each, with
    ``--mlm_probability`` of the positions replaced by ``[MASK]`` (at least one per document)."""
    g = torch.Generator().manual_seed(args.seed + length)
    documents = []
    for n in document_lengths(kind, length, args.batch_tokens, g):
        ids = torch.randint(5, args.vocab_size, (n,), generator=g)
        chosen = torch.rand(n, generator=g) < args.mlm_probability
        chosen[torch.randint(0, n, (1,), generator=g)] = True
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        documents.append(dict(input_ids=ids.masked_fill(chosen, MASK_ID), labels=labels))
    return documents


def padded_batch(documents: list[dict], mask_always: bool) -> dict[str, torch.Tensor]:
    """One document per row, padded to the longest: ``input_ids``, ``labels`` (B, T) and ``attention_mask`` (B, T)
    (left out when no row is padded, unless ``mask_always``: transformers' collators always send it)."""
    width = max(len(d["input_ids"]) for d in documents)
    ids = torch.full((len(documents), width), PAD_ID)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for row, d in enumerate(documents):
        n = len(d["input_ids"])
        ids[row, :n], labels[row, :n], mask[row, :n] = d["input_ids"], d["labels"], 1
    batch = dict(input_ids=ids, labels=labels)
    if mask_always or not bool(mask.all()):
        batch["attention_mask"] = mask
    return batch


def packed_batch(documents: list[dict], length: int) -> dict:
    """The documents packed into rows of ``length`` tokens (first-fit decreasing, none split), ``position_ids``
    restarting at 0 per document (padding continues the last document's run and is masked), ``attention_mask`` where
    a row is padded, and FlashAttention's varlen arguments (:class:`pretrain.collators.PackedSequences`)."""
    from modeling.bert.attention_sesame_bert import document_ids, flash_varlen_kwargs

    rows: list[list[dict]] = []
    for d in sorted(documents, key=lambda d: -len(d["input_ids"])):
        for row in rows:
            if sum(len(x["input_ids"]) for x in row) + len(d["input_ids"]) <= length:
                row.append(d)
                break
        else:
            rows.append([d])
    ids = torch.full((len(rows), length), PAD_ID)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    positions = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        at = 0
        for d in row:
            n = len(d["input_ids"])
            ids[r, at : at + n], labels[r, at : at + n], mask[r, at : at + n] = d["input_ids"], d["labels"], 1
            positions[r, at : at + n] = torch.arange(n)
            at += n
        positions[r, at:] = torch.arange(length - at)  # the padding: a run of its own
    batch = dict(input_ids=ids, labels=labels, position_ids=positions)
    keep = None
    if not bool(mask.all()):
        batch["attention_mask"] = mask
        keep = mask.bool()
    batch.update(flash_varlen_kwargs(document_ids(positions), keep))
    return batch


def padding_free_batch(documents: list[dict]) -> dict:
    """All documents in one (1, N) row with ``position_ids`` restarting per document and FlashAttention's varlen
    arguments (``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``'s layout)."""
    ids = torch.cat([d["input_ids"] for d in documents])[None]
    labels = torch.cat([d["labels"] for d in documents])[None]
    positions = torch.cat([torch.arange(len(d["input_ids"])) for d in documents])[None]
    lengths = torch.tensor([len(d["input_ids"]) for d in documents])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32)
    longest = int(lengths.max())
    return dict(
        input_ids=ids,
        labels=labels,
        position_ids=positions,
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=longest,
        max_length_k=longest,
    )


def batch_for(variant: str, documents: list[dict], length: int) -> dict:
    """The batch of ``variant`` (module docstring) from the step's ``documents``."""
    if variant in ("transformers", "transformers_dense"):
        return padded_batch(documents, mask_always=True)
    if variant == "sesame_padded":
        return padded_batch(documents, mask_always=False)
    if variant == "sesame_packed":
        return packed_batch(documents, length)
    return padding_free_batch(documents)


def slots(batch: dict) -> int:
    """The token slots of a batch (rows x length)."""
    return batch["input_ids"].numel()


# ---- the models ------------------------------------------------------------------------------------------------------
def build_models(args, length: int, variants) -> dict:
    """``variant -> model`` (training mode, on ``--device``): SesameBert at ``--config_name`` (seed 0) and its
    transformers conversions, each a copy of its own."""
    import modeling
    from modeling import SesameBertForMaskedLM
    from modeling.bert.sources.modernbert import from_sesame

    config = modeling.get_preset_config(args.config_name, vocab_size=args.vocab_size)
    if config.head_layout != "modernbert":
        raise SystemExit(f"--config_name {args.config_name}: not a ModernBERT-class preset (modernbert-*)")
    config.max_position_embeddings = max(config.max_position_embeddings, length)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    config.sparse_prediction = True
    # the batches' special ids (else the converted config keeps ModernBERT's, outside this vocabulary)
    config.pad_token_id, config.cls_token_id, config.sep_token_id, config.mask_token_id = PAD_ID, 2, 3, MASK_ID
    config.bos_token_id, config.eos_token_id = 2, 3
    torch.manual_seed(0)
    ours = SesameBertForMaskedLM(config)
    models = {}
    for variant in variants:
        if variant in SESAME:
            model = copy.deepcopy(ours)
            model.set_attn_implementation("sdpa")
        else:
            model = from_sesame(ours)
            model.set_attn_implementation(register_padding_free() if variant.endswith("padding_free") else "sdpa")
            if variant == "transformers_dense":
                model.config.sparse_prediction = model.sparse_prediction = False
        models[variant] = model.to(args.device).train()
    return models


def optimizer_for(model) -> torch.optim.Optimizer:
    """AdamW (lr 1e-4, weight decay 0.01) with torch's fused kernel, the same for every variant: the optimizer both
    sides train with by default (``pretrain``'s ``--optim adamw_torch_fused``, and transformers' ``Trainer`` default
    ``adamw_torch_fused`` with torch >= 2.8), on the CPU as on CUDA."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)


def model_flops(models: dict, documents: list[dict]) -> float:
    """The model FLOPs of a training step on the documents (:class:`training.mfu.FlopCounter` of the SesameBert
    model, each document counted as a row of its own length: the attention within documents that every variant
    computes at least), the same for every variant."""
    from training.mfu import FlopCounter

    model = next((m for v, m in models.items() if v in SESAME), None) or next(iter(models.values()))
    counter = FlopCounter(model)
    total = 0.0
    for d in documents:
        total += counter({"input_ids": d["input_ids"][None], "labels": d["labels"][None]}, len(d["input_ids"])).item()
    return total


def make_step(args, model, optimizer, batch):
    """The variant's training step: returns the loss tensor (detached). The loss is ``pretrain``'s
    (:func:`pretrain.objectives.mlm_loss`: SesameBert without logits, ``skip_logits``; transformers as it is) unless
    ``--no_skip_logits``."""
    from pretrain.objectives import mlm_loss

    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": None}[args.mixed_precision]
    on_device = {k: v.to(device) if torch.is_tensor(v) and not k.startswith("cu_") else v for k, v in batch.items()}
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):  # the varlen kernels' offsets live on the device
        if key in batch:
            on_device[key] = batch[key].to(device)

    def step():
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = mlm_loss(model, on_device) if args.skip_logits else model(**on_device).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_case(args, kind: str, length: int) -> dict:
    """Time every variant on one (documents, length) case, interleaved; see the module docstring."""
    device = torch.device(args.device)
    documents = make_documents(args, kind, length)
    real = sum(len(d["input_ids"]) for d in documents)
    models = build_models(args, length, args.variants)
    batches = {v: batch_for(v, documents, length) for v in args.variants}
    steps = {v: make_step(args, m, optimizer_for(m), batches[v]) for v, m in models.items()}
    times: dict[str, list[float]] = {v: [] for v in steps}
    peaks: dict[str, float] = {}
    losses: dict[str, float] = {}
    for round_ in range(args.warmup + args.steps):
        for variant, step in steps.items():
            if device.type == "cuda":
                sync(device)
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            started = time.perf_counter()
            loss = step()
            sync(device)
            elapsed = time.perf_counter() - started
            if round_ == 0:
                losses[variant] = loss.item()
            if round_ >= args.warmup:
                times[variant].append(elapsed)
                if device.type == "cuda":
                    peak = (torch.cuda.max_memory_allocated() - before) / 2**20
                    peaks[variant] = max(peaks.get(variant, 0.0), peak)
    medians = {v: statistics.median(t) for v, t in times.items()}
    rates = {v: real / s for v, s in medians.items()}
    flops = model_flops(models, documents)
    peak = peak_flops(device, args.mixed_precision)
    result = {
        "documents": kind,
        "length": length,
        "real_tokens": real,
        "n_documents": len(documents),
        "slots": {v: slots(b) for v, b in batches.items()},
        "rows": {v: b["input_ids"].shape[0] for v, b in batches.items()},
        "median_step_s": medians,
        "tokens_per_s": rates,
        "model_flops_per_step": flops,
        "mfu": {v: flops / (s * peak) for v, s in medians.items()} if peak else None,
        "first_step_loss": losses,
    }
    if "transformers" in losses:
        result["loss_spread"] = max(abs(x - losses["transformers"]) for x in losses.values())
    if "transformers" in rates:
        ours = {v: rates[v] / rates["transformers"] for v in SESAME if v in rates}
        result["ratio_to_transformers"] = ours
        if ours:
            result["best_ratio"] = max(ours.values())
    if peaks:
        result["peak_mb"] = peaks
    if args.profile:
        result["profile"] = profile_case(args, steps, f"{kind}-{length}")
    return result


def profile_case(args, steps: dict, case: str) -> dict:
    """One profiled step per variant: the top operators by self CPU time (and CUDA time on CUDA) written to
    ``--output_dir/profile_<case>_<variant>.txt``; returns ``variant -> total self CPU ms``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.device(args.device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    totals = {}
    out = Path(args.output_dir) if args.output_dir else None
    for variant, step in steps.items():
        with profile(activities=activities) as prof:
            step()
            sync(args.device)
        averages = prof.key_averages()
        totals[variant] = sum(e.self_cpu_time_total for e in averages) / 1000
        sort = "self_cuda_time_total" if len(activities) > 1 else "self_cpu_time_total"
        table = averages.table(sort_by=sort, row_limit=30)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"profile_{case}_{variant}.txt").write_text(table + "\n")
    return totals


def memory_one(args, kind: str, variant: str, length: int) -> dict:
    """Peak memory of one variant in this process (CPU): the peak resident set over ``--warmup`` + 2 steps minus the
    resident set before the first (MB; ``_script_env.start_peak_rss`` / ``peak_rss_mb``)."""
    documents = make_documents(args, kind, length)
    model = build_models(args, length, [variant])[variant]
    step = make_step(args, model, optimizer_for(model), batch_for(variant, documents, length))
    before = _script_env.start_peak_rss()
    for _ in range(args.warmup + 2):
        step()
    return {"documents": kind, "variant": variant, "length": length, "peak_mb": _script_env.peak_rss_mb(before)}


def cpu_memory(args, argv, kind: str, length: int) -> dict:
    """``variant -> peak MB`` from a process per variant (:func:`memory_one`); a failure is its error's last line."""
    peaks = {}
    for variant in args.variants:
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--one"]
        done = subprocess.run([*cmd, f"{kind}:{variant}:{length}"], capture_output=True, text=True)
        if done.returncode == 0:
            peaks[variant] = json.loads(done.stdout.strip().splitlines()[-1])["peak_mb"]
        else:
            peaks[variant] = (done.stderr.strip().splitlines() or ["failed"])[-1][:200]
    return peaks


def markdown(report: dict) -> str:
    """The results as a markdown table (one line per case and variant)."""
    lines = [
        f"{report['config_name']} on {report['device']} ({report['mixed_precision']}, {report['threads']} threads), "
        f"MLM step (forward + backward + AdamW), medians of {report['steps']} interleaved rounds",
        "",
        "| documents | length | variant | rows x length | real tokens | tokens/s | vs transformers | peak MB | loss |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        base = r["tokens_per_s"].get("transformers")
        for v, rate in r["tokens_per_s"].items():
            peak = r.get("peak_mb", {}).get(v, "")
            peak = f"{peak:.0f}" if isinstance(peak, float) else str(peak)
            ratio = f"{rate / base:.2f}x" if base else ""
            shape = f"{r['rows'][v]} x {r['slots'][v] // r['rows'][v]}"
            lines.append(
                f"| {r['documents']} | {r['length']} | {v} | {shape} | {r['real_tokens']} | {rate:.0f} | {ratio} | "
                f"{peak} | {r['first_step_loss'][v]:.4f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.one:
        kind, variant, length = args.one.split(":")
        print(json.dumps(memory_one(args, kind, variant, int(length))))
        return {}
    import transformers

    report = {
        "config_name": args.config_name,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "mixed_precision": args.mixed_precision,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch_tokens": args.batch_tokens,
        "mlm_probability": args.mlm_probability,
        "skip_logits": args.skip_logits,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "results": [],
    }
    for length in args.lengths:
        for kind in args.documents:
            result = run_case(args, kind, length)
            if device.type == "cpu" and not args.no_memory:
                result["peak_mb"] = cpu_memory(args, argv, kind, length)
            report["results"].append(result)
            print(json.dumps(result), flush=True)
    table = markdown(report)
    print(table)
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / "results.md").write_text(table)
    return report


if __name__ == "__main__":
    main()
