"""The modern encoder's phases of the GPU check (issue 50; run by ``bash bench/gpu_check.sh --modern``): a probe of
the attention kernels of one layer against a dense reference, and the model's training step with the kernel of every
layer type recorded.

    python bench/modern_check.py env --output env.json                      # the machine; the flash op's window
    python bench/modern_check.py probe --output probe.json                  # H12 D64, S1024 B32 and S8192 B4, bf16
    python bench/modern_check.py step --cases a b c d e f --output step.json
    python bench/modern_check.py step --compiled --cases a --output compiled.json
    python bench/modern_check.py probe --device cpu --shapes 128x2 --heads 2 --head_dim 16 --window 32   # smoke

**probe** (one attention layer, queries, keys and values drawn once, documents of a fixed lognormal mix packed into
every row): for global and local (sliding-window) attention within documents, forward + backward of each kernel the
model can run -- FlexAttention on the project's BlockMasks (:func:`document_block_mask`, :func:`local_block_mask`),
FlashAttention-2's varlen kernel through torch's own op (``aten._flash_attention_forward`` with ``window_size``, CUDA
bf16 only), the blocked SDPA path of local layers (:func:`local_sdpa_attention`), and SDPA on the dense (B, 1, T, T)
mask (the path the model leaves) -- against attention written out in float32 on the dense mask (the reference).
**Asserts** (exit status 1 otherwise) that every kernel's output and input gradients are within ``2e-2`` (bf16) /
``1e-5`` (float32) of the reference's, relative to their norms: this proves the kernel honours the window.
Records the median milliseconds of ``--repeats`` forward + backward (CUDA events on CUDA) and the peak memory of
each, and the host milliseconds of building the sliding BlockMask: torch's ``create_block_mask`` (a ``vmap`` over the
dense mask) against :func:`local_block_mask`. FlexAttention has no CPU backward: on the CPU flex is checked forward
only.

**step** (SesameBert at ``--config_name``, sparse prediction, the preset's dropout, fused AdamW on CUDA, the MLM step
under bf16 autocast: forward + backward + optimizer step + ``zero_grad``) on synthetic batches of about
``--batch_tokens`` real tokens (documents of a lognormal length mix, median T / 4, packed first-fit into rows of T
tokens as ``pretrain`` packs them, the collator's varlen arguments computed on the host). The cases
(:data:`CASES`): (a) S1024 document masking on, (b) off, (c) S8192 on, (d) off, (e) S1024 on with attention
dropout 0.1, (f) bert-base S1024 on (the baseline; its recipe's dropout). Each: ``--warmup`` untimed steps, then the
median of ``--steps``: real tokens/s, MFU (:mod:`training.mfu`'s FLOP formula), peak memory (CUDA), the host
milliseconds of a step without synchronisation (a step bound by the host shows it near the step's time). In the
first step a recorder on transformers' ``AttentionInterface`` (the project's registered kernels wrapped, the public
``register``) notes, per layer type, which kernel ran and what metadata it got (``BlockMask``, ``DocumentSequences``,
``LocalSequences`` and whether flash ran, ``LocalBlocks``, a 4-D mask tensor, ``None``); on CUDA one profiled step
classifies the device kernels (flash, memory-efficient, cuDNN, triton/flex, math). **Asserts** that no local layer
gets a 4-D mask tensor (``dense_local_layers`` 0), and on CUDA in bf16 the kernels of :func:`expected_kernels`.
``--compiled``: ``torch.compile`` of the model; ``--regional``: regional compilation (``compile_regions``: the
feed-forward networks, norms and MLM head, module by module; results as ``"<case> regional"``); either way the first
step's seconds (compilation) and dynamo's graph, break and recompilation counters, asserting no recompilation in the
timed steps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import _script_env  # noqa: F401  (offline, the project root on sys.path; bench/ is the script's folder)
import torch
import torch.nn.functional as F
from _script_env import write_report
from bench_modern_step import make_step

#: step cases: name -> (config, row length T, document masking on, attention dropout (None: the preset's))
CASES = {
    "a": (None, 1024, True, None),
    "b": (None, 1024, False, None),
    "c": (None, 8192, True, None),
    "d": (None, 8192, False, None),
    "e": (None, 1024, True, 0.1),
    "f": ("baseline", 1024, True, None),
}
PAD_ID, MASK_ID = 0, 4


# ---- the batches -----------------------------------------------------------------------------------------------------
def document_lengths(length: int, tokens: int, seed: int = 0) -> list[int]:
    """A fixed lognormal mix of document lengths (median ``length`` / 4, sigma 1, clipped to [16, ``length``]) summing
    to at least ``tokens``."""
    g = torch.Generator().manual_seed(seed + length)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        draw = math.exp(math.log(length / 4) + torch.randn((), generator=g).item())
        lengths.append(int(min(length, max(16, round(draw)))))
    return lengths


def pack_rows(lengths: list[int], length: int, rows: int | None = None) -> list[list[int]]:
    """First-fit decreasing packing of documents into rows of ``length`` tokens (none split); with ``rows``, only the
    first ``rows`` rows (whatever did not fit is dropped), each filled to the end by cutting its last document."""
    packed: list[list[int]] = []
    for n in sorted(lengths, reverse=True):
        for row in packed:
            if sum(row) + n <= length:
                row.append(n)
                break
        else:
            packed.append([n])
    if rows is not None:
        packed = packed[:rows]
        for row in packed:
            row[-1] += length - sum(row)
    return packed


def position_ids(rows: list[list[int]], length: int) -> torch.Tensor:
    """(R, T) long positions restarting at 0 per document; a row's tail (padding) continues as a run of its own."""
    out = torch.zeros(len(rows), length, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for n in [*row, length - sum(row)]:
            out[r, at : at + n] = torch.arange(n)
            at += n
    return out


def synthetic_batch(length: int, tokens: int, vocab: int, masking: bool, seed: int = 0) -> dict:
    """An MLM batch of about ``tokens`` real tokens in packed rows of ``length``: ``input_ids``, ``labels`` (30% of the
    real tokens predicted, the rest -100), ``attention_mask`` where a row is padded; with ``masking`` the
    ``position_ids`` restarting per document and the varlen arguments computed on the host
    (:func:`flash_varlen_kwargs`, as ``pretrain``'s collator gives them)."""
    from modeling.bert.attention_sesame_bert import document_ids, flash_varlen_kwargs

    rows = pack_rows(document_lengths(length, tokens, seed), length)
    positions = position_ids(rows, length)
    keep = torch.zeros(len(rows), length, dtype=torch.bool)
    for r, row in enumerate(rows):
        keep[r, : sum(row)] = True
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, keep.shape, generator=g)
    chosen = (torch.rand(keep.shape, generator=g) < 0.3) & keep
    batch = dict(input_ids=ids.masked_fill(chosen, MASK_ID).masked_fill(~keep, PAD_ID))
    batch["labels"] = torch.where(chosen, ids, torch.full_like(ids, -100))
    padded = not bool(keep.all())
    if padded:
        batch["attention_mask"] = keep.long()
    if masking:
        batch["position_ids"] = positions
        batch.update(flash_varlen_kwargs(document_ids(positions), keep if padded else None))
    return batch


# ---- the probe -------------------------------------------------------------------------------------------------------
def reference_attention(q, k, v, allowed, scaling):
    """Attention written out in float32 on a dense (B, 1, T, T) boolean mask: (B, A, T, D) -> (B, T, A, D)."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scaling
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.matmul(weights, v.float()).transpose(1, 2)


def probe_kernels(device: torch.device, dtype: torch.dtype, window: int) -> dict:
    """``name -> (layer type, kernel(q, k, v, meta) -> (B, T, A, D), builds its metadata (documents, groups),
    backward)``: the kernels the probe runs on ``device`` in ``dtype``."""
    from modeling.bert import attention_sesame_bert as asb

    flash = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    cpu_flex = device.type != "cuda"  # the unfused reference: no backward in torch 2.13
    kernels = {}

    def flex(q, k, v, mask, scaling):
        return asb.document_flex_attention(None, q, k, v, mask, scaling)[0]

    def sdpa_dense(q, k, v, mask, scaling):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling).transpose(1, 2)

    def sequences(documents):
        return asb.document_sequences(documents, None, asb.flash_varlen_kwargs(documents))

    kernels["global flex"] = ("full", flex, lambda d, g: asb.document_block_mask(d), not cpu_flex)
    kernels["global sdpa dense"] = ("full", sdpa_dense, lambda d, g: asb.document_dense_mask(d), True)
    kernels["local flex"] = ("local", flex, lambda d, g: asb.local_block_mask(g, window), not cpu_flex)
    kernels["local blocks (sdpa)"] = (
        "local",
        lambda q, k, v, meta, s: asb.local_sdpa_attention(None, q, k, v, meta, s)[0],
        lambda d, g: asb.local_blocks(g, window),
        True,
    )
    kernels["local sdpa dense"] = ("local", sdpa_dense, lambda d, g: dense_mask(d, window), True)
    if flash:
        kernels["global flash varlen"] = (
            "full",
            lambda q, k, v, meta, s: asb.flash_varlen_attention(q, k, v, meta, 0.0, s),
            lambda d, g: sequences(d),
            True,
        )
        kernels["local flash varlen window"] = (
            "local",
            lambda q, k, v, meta, s: asb.flash_varlen_attention(q, k, v, meta, 0.0, s, window),
            lambda d, g: sequences(d),
            True,
        )
    return kernels


def dense_mask(documents: torch.Tensor, window: int | None) -> torch.Tensor:
    """(B, 1, T, T) bool: same document, and with ``window`` ``|q - kv| <= window // 2``."""
    from modeling.bert.attention_sesame_bert import document_dense_mask, sliding_window_band

    allowed = document_dense_mask(documents)
    if window is not None:
        allowed = allowed & sliding_window_band(documents.shape[1], window, documents.device)
    return allowed


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(device, fn, repeats: int) -> tuple[float, float | None]:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after one untimed, and the peak memory (MiB) above the
    memory before (CUDA)."""
    fn()
    _synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - started))
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if device.type == "cuda" else None
    return statistics.median(times), peak


def _relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().float(), ref.detach().float()
    return float((x - ref).norm() / ref.norm().clamp(min=1e-30))


def probe(args) -> dict:
    """The kernel probe (module docstring): ``{"shapes": [...], "ok": bool}``."""
    from torch.nn.attention.flex_attention import create_block_mask

    from modeling.bert.attention_sesame_bert import document_ids, local_block_mask

    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": torch.float32}[args.mixed_precision]
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    scaling = args.head_dim**-0.5
    report: dict = {"device": str(device), "dtype": str(dtype), "tolerance": tolerance, "window": args.window}
    report["shapes"], ok = [], True
    for shape in args.shapes:
        length, batch = (int(x) for x in shape.split("x"))
        rows = pack_rows(document_lengths(length, length * batch), length, rows=batch)
        documents = document_ids(position_ids(rows, length)).to(device)
        groups = documents  # no padding: the groups of the local layers are the documents
        g = torch.Generator(device="cpu").manual_seed(length)
        q, k, v = (torch.randn(batch, args.heads, length, args.head_dim, generator=g).to(device, dtype) for _ in "qkv")
        upstream = torch.randn(batch, length, args.heads, args.head_dim, generator=g).to(device, dtype)
        entry: dict = {"length": length, "batch": batch, "documents": sum(len(r) for r in rows), "kernels": {}}
        references = {}
        for kind, window in (("full", None), ("local", args.window)):
            outs, grads = [], []
            for row in range(batch):  # a row at a time: float32 (T, T) scores of one row (S8192: 3.2 GB a head-set)
                inputs = [x[row : row + 1].detach().float().requires_grad_() for x in (q, k, v)]
                out = reference_attention(*inputs, dense_mask(documents[row : row + 1], window), scaling)
                out.backward(upstream[row : row + 1].float())
                outs.append(out.detach())
                grads.append([x.grad for x in inputs])
            references[kind] = (torch.cat(outs), [torch.cat(g) for g in zip(*grads)])
        for name, (kind, kernel, build, backward) in probe_kernels(device, dtype, args.window).items():
            meta = build(documents, groups)
            inputs = [x.detach().clone().requires_grad_(backward) for x in (q, k, v)]

            def run(kernel=kernel, meta=meta, inputs=inputs, backward=backward, upstream=upstream):
                if not backward:
                    with torch.no_grad():
                        return kernel(*inputs, meta, scaling)
                for x in inputs:
                    x.grad = None
                out = kernel(*inputs, meta, scaling)
                out.backward(upstream)
                return out

            try:
                out = run()
                ref_out, ref_grads = references[kind]
                errors = {"output": _relative(out, ref_out)}
                if backward:
                    errors.update({f"grad_{n}": _relative(x.grad, r) for n, x, r in zip("qkv", inputs, ref_grads)})
                ms, peak = _timed(device, run, args.repeats)
                agrees = max(errors.values()) <= tolerance
                row = {"kind": kind, "ms": ms, "peak_mib": peak, "relative_error": errors, "agrees": agrees}
                row["backward"] = backward
            except Exception as err:  # one kernel's failure is recorded; the others still run
                row, agrees = {"kind": kind, "error": f"{type(err).__name__}: {err}"[:300]}, False
            ok &= agrees
            entry["kernels"][name] = row
            print(f"S{length} B{batch} {name}: {json.dumps(row)}", flush=True)
        entry["block_mask_host_ms"] = block_mask_times(create_block_mask, local_block_mask, groups, args.window)
        report["shapes"].append(entry)
    report["ok"] = ok
    return report


def block_mask_times(create_block_mask, local_block_mask, groups, window: int) -> dict:
    """Host milliseconds of building the sliding + document BlockMask: torch's ``create_block_mask`` and
    :func:`local_block_mask`, each without and with a synchronisation after it (median of 3)."""
    half = window // 2

    def mask_mod(b, h, q, kv):
        return (groups[b, q] == groups[b, kv]) & ((q - kv).abs() <= half)

    batch, length = groups.shape
    builders = {
        "create_block_mask": lambda: create_block_mask(mask_mod, batch, None, length, length, device=groups.device),
        "local_block_mask": lambda: local_block_mask(groups, window),
    }
    out = {}
    for name, build in builders.items():
        for synced in (False, True):
            times = []
            for _ in range(3):
                started = time.perf_counter()
                build()
                if synced:
                    _synchronize(groups.device)
                times.append(1000 * (time.perf_counter() - started))
            out[f"{name}{' + sync' if synced else ''}"] = statistics.median(times)
    return out


# ---- the model step --------------------------------------------------------------------------------------------------
def describe(meta, query) -> str:
    """What an attention kernel got as its mask metadata (module docstring)."""
    from torch.nn.attention.flex_attention import BlockMask

    from modeling.bert.attention_sesame_bert import DocumentSequences, LocalBlocks, LocalSequences, flash_varlen_runs

    if meta is None:
        return "None"
    if isinstance(meta, BlockMask):
        return "BlockMask"
    if isinstance(meta, LocalSequences):
        return f"LocalSequences ({'flash' if flash_varlen_runs(query) else 'blocks'})"
    if isinstance(meta, DocumentSequences):
        return f"DocumentSequences ({'flash' if flash_varlen_runs(query) else 'jagged sdpa'})"
    if isinstance(meta, LocalBlocks):
        return "LocalBlocks"
    if torch.is_tensor(meta):
        return f"{meta.dim()}-D tensor"
    return type(meta).__name__


class KernelRecorder:
    """Records, per layer type, ``"kernel name: metadata"`` of every attention call while active: the kernels of
    transformers' ``AttentionInterface`` that the model can run are replaced by recording wrappers through the public
    ``AttentionInterface.register`` and put back on exit."""

    NAMES = ("sdpa", "eager", "flex_attention", "sesame_document_flex", "sesame_document_varlen")
    NAMES += ("sesame_local_sdpa", "sesame_local_eager", "sesame_local_varlen")

    def __init__(self):
        self.calls: dict[str, dict[str, int]] = {}

    def __enter__(self):
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.saved = {name: ALL_ATTENTION_FUNCTIONS[name] for name in self.NAMES if name in ALL_ATTENTION_FUNCTIONS}
        for name, kernel in self.saved.items():
            AttentionInterface.register(name, self._wrap(name, kernel))
        return self

    def _wrap(self, name, kernel):
        def recording(module, query, key, value, attention_mask, *args, **kwargs):
            kind = "sliding_attention" if getattr(module, "sliding_window", None) else "full_attention"
            key_ = f"{name}: {describe(attention_mask, query)}"
            counts = self.calls.setdefault(kind, {})
            counts[key_] = counts.get(key_, 0) + 1
            return kernel(module, query, key, value, attention_mask, *args, **kwargs)

        return recording

    def __exit__(self, *exc):
        from transformers import AttentionInterface

        for name, kernel in self.saved.items():
            AttentionInterface.register(name, kernel)

    def dense_local_layers(self) -> int:
        """The local-layer calls that got a 4-D mask tensor (a (T, T) mask)."""
        return sum(n for k, n in self.calls.get("sliding_attention", {}).items() if k.endswith("4-D tensor"))


def expected_kernels(case: str, device: torch.device, dtype) -> dict | None:
    """The kernel and metadata every layer type must get in ``case`` on CUDA in bf16 / fp16 (issue 50's design):
    packed documents without attention dropout on FlexAttention (BlockMasks; a, c, and the local layers of e's
    evaluation), with dropout the varlen paths with flash (e, f), unpacked rows' local layers on flash with its
    window (b, d); ``None`` elsewhere (the CPU: only the no-dense-local-layer assertion)."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    flex = "sesame_document_flex: BlockMask"
    return {
        "a": {"full_attention": flex, "sliding_attention": flex},
        "c": {"full_attention": flex, "sliding_attention": flex},
        "b": {"sliding_attention": "sesame_local_varlen: LocalSequences (flash)"},
        "d": {"sliding_attention": "sesame_local_varlen: LocalSequences (flash)"},
        "e": {
            "full_attention": "sesame_document_varlen: DocumentSequences (flash)",
            "sliding_attention": "sesame_local_varlen: LocalSequences (flash)",
        },
        "f": {"full_attention": "sesame_document_varlen: DocumentSequences (flash)"},
    }[case]


#: profiler kernel names -> class (the first match)
KERNEL_CLASSES = (
    ("flash", ("flash_fwd", "flash_bwd", "flash::")),
    ("memory-efficient", ("fmha_cutlass", "efficient_attention", "mem_eff")),
    ("cudnn", ("cudnn",)),
    ("triton (flex)", ("triton_tem_fused", "flex_attention", "triton_")),
)


def classify(names: dict[str, int]) -> dict[str, int]:
    """Device kernel calls by class (:data:`KERNEL_CLASSES`); attention-looking others as ``"other attention"``."""
    out: dict[str, int] = {}
    for name, count in names.items():
        low = name.lower()
        cls = next((c for c, keys in KERNEL_CLASSES if any(k in low for k in keys)), None)
        if cls is None and ("attention" in low or "softmax" in low):
            cls = "other attention"
        if cls:
            out[cls] = out.get(cls, 0) + count
    return out


def build_model(config_name: str, length: int, vocab: int, dropout: float | None, device):
    import modeling
    from modeling import SesameBertForMaskedLM

    config = modeling.get_preset_config(config_name, vocab_size=vocab)
    config.max_position_embeddings = max(config.max_position_embeddings, length)
    if dropout is not None:
        config.attention_probs_dropout_prob = dropout
    config.sparse_prediction = True
    config.pad_token_id = PAD_ID
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(config)
    model.set_attn_implementation("sdpa")
    return model.to(device).train()


def run_case(args, case: str, mode: str = "eager") -> dict:
    """One step case (module docstring); ``mode``: ``"eager"``, ``"whole"`` (``torch.compile`` of the model) or
    ``"regional"`` (the model's ``compile_regions``: feed-forward networks, norms, MLM head)."""
    from training.mfu import FlopCounter, peak_flops

    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": None}[args.mixed_precision]
    config_name, length, masking, dropout = CASES[case]
    config_name = {None: args.config_name, "baseline": args.baseline_config}[config_name]
    length = args.lengths.get(length, length)
    batch = synthetic_batch(length, args.batch_tokens, args.vocab_size, masking)
    real = int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
    model = build_model(config_name, length, args.vocab_size, dropout, device)
    flops = float(FlopCounter(model)(batch, real))
    forward = torch.compile(model) if mode == "whole" else model
    if mode == "regional":
        model.compile_regions()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)
    step = make_step(args, forward, optimizer, batch)  # forward under autocast, backward, AdamW, zero_grad

    result: dict = {"config": config_name, "length": length, "rows": batch["input_ids"].shape[0], "real_tokens": real}
    result.update(masking=masking, attention_dropout=model.config.attention_probs_dropout_prob, compiled=mode)
    from torch._dynamo.utils import counters as dynamo_counters

    counters = dynamo_counters if mode != "eager" else None
    recorder = KernelRecorder()
    started = time.perf_counter()
    if mode != "eager":
        first_loss = step()
    else:
        with recorder:
            first_loss = step()
    result["first_step_loss"] = first_loss.item()
    result["first_step_s"] = time.perf_counter() - started
    for _ in range(max(args.warmup - 1, 0)):
        step()
    _synchronize(device)
    frames = dict(counters["stats"]) if counters is not None else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, host = [], []
    for _ in range(args.steps):
        _synchronize(device)
        started = time.perf_counter()
        step()
        host.append(time.perf_counter() - started)
        _synchronize(device)
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    peak = peak_flops(device, args.mixed_precision)
    result.update(median_step_s=median, host_ms=1000 * statistics.median(host), tokens_per_s=real / median)
    result.update(model_flops_per_step=flops, mfu=flops / (median * peak) if peak else None)
    if device.type == "cuda":
        result["peak_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if counters is not None:
        result["dynamo"] = {
            "stats": dict(counters["stats"]),
            "graph_breaks": sum(counters["graph_break"].values()),
            "recompiled_in_timed_steps": dict(counters["stats"]) != frames,
        }
        result["checks"] = {"no recompilation in the timed steps": dict(counters["stats"]) == frames}
    else:
        result["kernels"] = recorder.calls
        result["dense_local_layers"] = recorder.dense_local_layers()
        checks = {"no local layer on a dense (T, T) mask": result["dense_local_layers"] == 0}
        expected = expected_kernels(case, device, dtype)
        for kind, name in (expected or {}).items():
            if kind in recorder.calls or kind == "full_attention":
                checks[f"{kind} on {name}"] = set(recorder.calls.get(kind, {})) == {name}
        result["checks"] = checks
        if device.type == "cuda" and args.profile:
            result["device_kernels"] = profile_kernels(step)
    return result


def profile_kernels(step) -> dict[str, int]:
    """One profiled step: the device kernels by class (:func:`classify`)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        return classify({e.key: e.count for e in prof.key_averages() if e.device_type.name == "CUDA"})
    except Exception as err:  # a record, not a check: the recorder's kernels are the assertion
        return {"error": f"{type(err).__name__}: {err}"[:300]}


def steps(args) -> dict:
    report: dict = {"device": str(args.device), "mixed_precision": args.mixed_precision, "cases": {}}
    if torch.device(args.device).type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
    ok = True
    modes = ["whole"] * args.compiled + ["regional"] * args.regional or ["eager"]
    for case, mode in ((case, mode) for case in args.cases for mode in modes):
        result = run_case(args, case, mode)
        case = case if mode != "regional" else f"{case} regional"
        if torch.device(args.device).type == "cuda":
            torch.cuda.empty_cache()  # the case's model and optimizer are gone
        report["cases"][case] = result
        ok &= all(result["checks"].values())
        print(f"case {case}: {json.dumps(result)}", flush=True)
        write_report(args.output, {**report, "ok": ok})
    report["ok"] = ok
    return report


def environment(args) -> dict:
    """The machine (module docstring's ``env``): GPU name and capability, torch, transformers, cuDNN, SDPA's enabled
    kernels, the schema of ``aten._flash_attention_forward`` and whether it has ``window_size_left`` / ``right``
    (``window_size``; asserted on CUDA), whether ``flash_attn`` imports. ``ok``: the window is there (or no CUDA)."""
    import importlib.util

    import transformers

    device = torch.device(args.device)
    schema = str(torch.ops.aten._flash_attention_forward.default._schema)
    report = {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(device)}
    report["flash_schema"] = schema
    report["window_size"] = "window_size_left" in schema and "window_size_right" in schema
    report["flash_attn_importable"] = importlib.util.find_spec("flash_attn") is not None
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        report["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        report["cudnn"] = torch.backends.cudnn.version()
        backends = torch.backends.cuda
        report["sdpa"] = {
            "flash": backends.flash_sdp_enabled(),
            "memory_efficient": backends.mem_efficient_sdp_enabled(),
            "cudnn": backends.cudnn_sdp_enabled(),
            "math": backends.math_sdp_enabled(),
        }
    report["ok"] = report["window_size"] or device.type != "cuda"
    print(json.dumps(report, indent=2), flush=True)
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["env", "probe", "step"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--mixed_precision", default=None, choices=["bf16", "fp16", "no"], help="default: bf16 on CUDA")
    p.add_argument("--output", default=None, help="write the results as JSON here")
    p.add_argument("--shapes", nargs="+", default=["1024x32", "8192x4"], help="probe: LENGTHxBATCH")
    p.add_argument("--heads", type=int, default=12, help="probe: attention heads")
    p.add_argument("--head_dim", type=int, default=64, help="probe: head dimension")
    p.add_argument("--window", type=int, default=128, help="probe: local_attention (ModernBERT's 128)")
    p.add_argument("--repeats", type=int, default=10, help="probe: timed forward + backward per kernel")
    p.add_argument("--config_name", default="modernbert-base", help="step: the modern preset")
    p.add_argument("--baseline_config", default="bert-base", help="step: case f's preset (the BERT baseline)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), help="step: the cases (docstring)")
    p.add_argument(
        "--lengths",
        nargs=2,
        type=int,
        default=[1024, 8192],
        metavar=("SHORT", "LONG"),
        help="step: the row lengths the cases call 1024 and 8192 (smaller for a CPU smoke run)",
    )
    p.add_argument("--batch_tokens", type=int, default=32768, help="step: real tokens per step (about)")
    p.add_argument("--vocab_size", type=int, default=30000)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--compiled", action="store_true", help="step: torch.compile the model")
    p.add_argument("--regional", action="store_true", help="step: regional compilation (compile_regions), too")
    p.add_argument("--profile", action="store_true", help="step: one profiled step per case (CUDA kernel classes)")
    p.add_argument(
        "--no_skip_logits",
        dest="skip_logits",
        action="store_false",
        help="step: the MLM head computes its (N, V) logits (default: pretrain's loss, decoder and cross-entropy "
        "fused)",
    )
    args = p.parse_args(argv)
    if args.mixed_precision is None:
        args.mixed_precision = "bf16" if torch.device(args.device).type == "cuda" else "no"
    args.lengths = dict(zip((1024, 8192), args.lengths))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if torch.device(args.device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    report = {"env": environment, "probe": probe, "step": steps}[args.what](args)
    write_report(args.output, report)
    print(json.dumps({"ok": report["ok"]}))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
