"""bench/bench_modern_step.py (issue 50, item 6): on a tiny config for one step, every batch layout (transformers'
padded rows, its padding-free row through the registered varlen attention function, SesameBert's padded and packed
rows) gives transformers' loss for the same weights (the conversion is exact), in float32 and under bf16 autocast;
the packing and the varlen arguments against hand-made documents; the padding-free attention function against
attention written out per document. Imported by path (bench/ on ``sys.path``, as the script runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_modern_step as bench  # noqa: E402

TINY = ["--config_name", "modernbert-tiny", "--lengths", "64", "--batch_tokens", "192", "--no_memory"]
ONE_STEP = ["--steps", "1", "--warmup", "0", "--threads", "0", "--vocab_size", "500", "--device", "cpu"]


def test_every_layout_gives_the_transformers_loss(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "peak_flops", lambda device, precision: 1e9)  # a device with a known peak
    report = bench.main([*TINY, *ONE_STEP, "--variants", *bench.VARIANTS, "--output_dir", str(tmp_path)])
    full, mixed = report["results"]
    for result in (full, mixed):
        losses = result["first_step_loss"]
        assert set(losses) == set(bench.VARIANTS)
        assert result["loss_spread"] < 1e-5, losses
        assert 5.0 < losses["transformers"] < 7.5  # about ln(500) = 6.2 nats at initialisation
        assert all(rate > 0 for rate in result["tokens_per_s"].values())
        assert result["best_ratio"] == max(result["ratio_to_transformers"].values())
        # MFU: the same model FLOPs for every variant (those of the documents) over each one's median step
        assert result["model_flops_per_step"] > 0
        for variant, seconds in result["median_step_s"].items():
            assert result["mfu"][variant] == pytest.approx(result["model_flops_per_step"] / (seconds * 1e9))
    # full rows: no padding anywhere; mixed: transformers pads every row to the longest, packing fills rows
    assert set(full["slots"].values()) == {full["real_tokens"]} == {3 * 64}
    assert mixed["slots"]["transformers_padding_free"] == mixed["real_tokens"]
    assert mixed["rows"]["transformers"] == mixed["n_documents"]  # a document per row, padded to the longest
    assert mixed["real_tokens"] < mixed["slots"]["sesame_packed"] < mixed["slots"]["transformers"]
    assert (tmp_path / "results.json").exists()
    assert "| mixed | 64 | sesame_packed |" in (tmp_path / "results.md").read_text()


def test_same_loss_under_bf16_autocast():
    variants = ["transformers", "transformers_padding_free", "sesame_packed"]
    bf16 = ["--documents", "mixed", "--mixed_precision", "bf16"]
    report = bench.main([*TINY, *ONE_STEP, *bf16, "--variants", *variants])
    losses = report["results"][0]["first_step_loss"]
    assert max(losses.values()) - min(losses.values()) < 2e-2 * losses["transformers"], losses


def _documents(lengths):
    return [dict(input_ids=torch.arange(10, 10 + n), labels=torch.full((n,), -100)) for n in lengths]


def test_packing_keeps_documents_whole_with_their_varlen_arguments():
    batch = bench.packed_batch(_documents([5, 3, 4]), 8)
    # first-fit decreasing: [5, 3] fill row 0; [4] and 4 padding tokens make row 1
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 0, 1, 2, 3]]
    assert batch["attention_mask"].tolist() == [[1] * 8, [1] * 4 + [0] * 4]
    assert batch["input_ids"][1, 4:].tolist() == [bench.PAD_ID] * 4
    assert batch["cu_seq_lens_q"].tolist() == [0, 5, 8, 12, 16]
    assert batch["max_length_q"] == 5
    free = bench.padding_free_batch(_documents([5, 3, 4]))
    assert free["cu_seq_lens_k"].tolist() == [0, 5, 8, 12] and free["input_ids"].shape == (1, 12)
    padded = bench.padded_batch(_documents([5, 3]), mask_always=False)
    assert padded["attention_mask"].tolist() == [[1] * 5, [1] * 3 + [0] * 2]
    assert "attention_mask" not in bench.padded_batch(_documents([4, 4]), mask_always=False)


@pytest.mark.parametrize("sliding_window", [None, 3])
def test_padding_free_attention_is_attention_per_document(sliding_window):
    """Two documents of 5 and 7 tokens in one row: each token's context is softmax(q k^T / sqrt(D)) v over its own
    document's keys, within ``sliding_window - 1`` positions when given (ModernBertAttention passes the window + 1)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=7, max_length_k=7)
    out, weights = bench.torch_flash_varlen_attention(None, q, k, v, None, sliding_window=sliding_window, **kwargs)
    assert out.shape == (1, 12, 2, 4) and weights is None
    for start, end in ((0, 5), (5, 12)):
        for t in range(start, end):
            keys = [s for s in range(start, end) if sliding_window is None or abs(s - t) <= sliding_window - 1]
            scores = torch.einsum("ad,akd->ak", q[0, :, t], k[0, :, keys]) / 2.0
            expected = torch.einsum("ak,akd->ad", scores.softmax(-1), v[0, :, keys])
            torch.testing.assert_close(out[0, t], expected, atol=1e-5, rtol=1e-5)
