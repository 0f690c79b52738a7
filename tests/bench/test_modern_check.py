"""bench/modern_check.py (issue 50, the modern phases of the GPU check) on the CPU at tiny sizes: the synthetic batches
against hand-made packing; the kernel probe agrees with its float32 dense reference and fails for a kernel given the
wrong window; the step's recorder names each layer type's kernel and metadata, and counts a local layer that gets a
dense (T, T) mask (forced through a user-registered path) as a failed check. Imported by path (bench/ on
``sys.path``, as the script runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import modern_check  # noqa: E402

from modeling.bert import modeling_sesame_bert as msb  # noqa: E402

PROBE = ["probe", "--device", "cpu", "--shapes", "64x2", "--heads", "2", "--head_dim", "16", "--window", "16"]
STEP = ["step", "--device", "cpu", "--config_name", "modernbert-tiny", "--baseline_config", "bert-tiny"]
STEP += ["--lengths", "64", "128", "--batch_tokens", "200", "--vocab_size", "300", "--warmup", "1", "--steps", "1"]


def test_packing_and_batches_against_hand_made_documents():
    assert modern_check.pack_rows([5, 3, 4, 2], 8) == [[5, 3], [4, 2]]
    assert modern_check.pack_rows([5, 3, 4, 2], 8, rows=1) == [[5, 3]]
    assert modern_check.pack_rows([4, 2], 8, rows=1) == [[4, 4]]  # the last document fills the row
    assert modern_check.position_ids([[5, 3], [4, 2]], 8).tolist() == [
        [0, 1, 2, 3, 4, 0, 1, 2],
        [0, 1, 2, 3] + [0, 1] * 2,
    ]
    on = modern_check.synthetic_batch(64, 200, 300, masking=True)
    off = modern_check.synthetic_batch(64, 200, 300, masking=False)
    assert torch.equal(on["input_ids"], off["input_ids"]) and "position_ids" not in off
    keep = on["attention_mask"].bool()  # the last row is padded
    assert int(keep.sum()) >= 200 and not bool(keep.all())
    assert bool((on["labels"][~keep] == -100).all()) and bool((on["input_ids"][~keep] == modern_check.PAD_ID).all())
    predicted = (on["labels"] != -100).sum() / keep.sum()
    assert 0.2 < float(predicted) < 0.4  # 30% of the real tokens
    # a sequence per document and per padding run, starting where the positions restart or the padding starts
    cu = on["cu_seq_lens_q"].tolist()
    flat_positions, flat_keep = on["position_ids"].reshape(-1), keep.reshape(-1)
    starts = [
        t for t in range(len(flat_positions)) if t == 0 or flat_positions[t] == 0 or flat_keep[t] != flat_keep[t - 1]
    ]
    assert cu == [*starts, len(flat_positions)]


def test_probe_agrees_with_the_dense_reference_and_catches_a_wrong_window(monkeypatch, tmp_path):
    assert modern_check.main([*PROBE, "--repeats", "1", "--output", str(tmp_path / "p.json")]) == 0
    report = modern_check.probe(modern_check.parse_args([*PROBE, "--repeats", "1"]))
    (shape,) = report["shapes"]
    kernels = shape["kernels"]
    assert {"global flex", "global sdpa dense", "local flex", "local blocks (sdpa)", "local sdpa dense"} == set(kernels)
    assert all(k["agrees"] and max(k["relative_error"].values()) < 1e-5 for k in kernels.values())
    assert kernels["local blocks (sdpa)"]["backward"] and not kernels["local flex"]["backward"]  # no CPU flex backward
    assert set(shape["block_mask_host_ms"]) == {"create_block_mask", "create_block_mask + sync", "local_block_mask",
                                                "local_block_mask + sync"}  # fmt: skip
    real = modern_check.probe_kernels
    from modeling.bert.attention_sesame_bert import local_blocks

    def wrong_window(device, dtype, window):
        kernels = real(device, dtype, window)
        kind, kernel, _, backward = kernels["local blocks (sdpa)"]
        kernels["local blocks (sdpa)"] = (kind, kernel, lambda d, g: local_blocks(g, window // 2), backward)
        return kernels

    monkeypatch.setattr(modern_check, "probe_kernels", wrong_window)
    report = modern_check.probe(modern_check.parse_args([*PROBE, "--repeats", "1"]))
    assert not report["ok"] and not report["shapes"][0]["kernels"]["local blocks (sdpa)"]["agrees"]


def test_step_records_the_kernel_of_every_layer_type(monkeypatch):
    args = modern_check.parse_args([*STEP, "--cases", "a"])
    result = modern_check.run_case(args, "a")
    # modernbert-tiny: 1 global and 2 local layers; on the CPU the local layers run the blocks, the global one SDPA
    # on the dense document mask
    assert result["kernels"] == {
        "full_attention": {"sdpa: 4-D tensor": 1},
        "sliding_attention": {"sesame_local_sdpa: LocalBlocks": 2},
    }
    assert result["dense_local_layers"] == 0 and all(result["checks"].values())
    assert result["tokens_per_s"] == pytest.approx(result["real_tokens"] / result["median_step_s"])
    assert 5.0 < result["first_step_loss"] < 7.0  # about ln(300) = 5.7 nats at initialisation
    # a local layer forced onto a user-registered path gets the dense window mask: counted, and the check fails
    monkeypatch.setattr(msb, "local_attention_kernel", lambda full, device: "sdpa")
    result = modern_check.run_case(args, "a")
    assert result["kernels"]["sliding_attention"] == {"sdpa: 4-D tensor": 2}
    assert result["dense_local_layers"] == 2 and not result["checks"]["no local layer on a dense (T, T) mask"]


def test_expected_kernels_on_cuda_only():
    cuda = torch.device("cuda")
    assert modern_check.expected_kernels("a", torch.device("cpu"), torch.bfloat16) is None
    assert modern_check.expected_kernels("a", cuda, None) is None  # float32: the blocks, no flash
    assert modern_check.expected_kernels("e", cuda, torch.bfloat16)["sliding_attention"].endswith("(flash)")
    counts = {"flash_fwd_kernel": 2, "fmha_cutlassF_bf16": 1, "triton_tem_fused_flex": 3, "cudnn_sdpa": 1, "gemm": 9}
    assert modern_check.classify(counts) == {"flash": 2, "memory-efficient": 1, "triton (flex)": 3, "cudnn": 1}
