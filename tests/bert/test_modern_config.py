"""The modern-encoder options of SesameBertConfig (issue 41): presets against transformers' ModernBERT defaults, bad
configs refused with one line, and packed documents (document masking) combined with local (sliding-window)
attention on every attention path."""

from __future__ import annotations

import json
import re

import pytest
import torch
import transformers
from _tiny import micro_modern_kwargs
from huggingface_hub.errors import StrictDataclassClassValidationError

import modeling
from core.errors import run_cli
from modeling import SesameBertConfig, SesameBertModel
from modeling.bert import modeling_sesame_bert
from modeling.bert.convert_modern import transformers_config

MODERN = micro_modern_kwargs()


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def test_modernbert_base_preset_has_modernbert_base_sizes():
    """modernbert-base written as a transformers config equals ``ModernBertConfig()`` (ModernBERT-base) in every
    architecture field; the presets are listed by ``pretrain --help``."""
    from pretrain.cli import build_parser

    reference = transformers.ModernBertConfig()
    ours = modeling.get_preset_config("modernbert-base", vocab_size=reference.vocab_size, pad_token_id=50283)
    written = transformers_config(ours, "modernbert")
    fields = (
        "hidden_size intermediate_size num_hidden_layers num_attention_heads hidden_activation max_position_embeddings "
        "norm_eps norm_bias attention_bias mlp_bias decoder_bias classifier_bias classifier_activation layer_types "
        "local_attention rope_parameters tie_word_embeddings"
    ).split()
    assert {f: getattr(written, f) for f in fields} == {f: getattr(reference, f) for f in fields}
    help_text = " ".join(build_parser().format_help().split())
    assert all(name in help_text for name in ("modernbert-tiny", "modernbert-mini", "modernbert-base"))
    for name in ("modernbert-tiny", "modernbert-mini"):
        config = modeling.get_preset_config(name)
        assert "sliding_attention" in config.attention_types() and config.local_attention < 128


def test_defaults_keep_the_bert_layout():
    """The new fields' defaults: every layer global, learned positions, no gating, biases everywhere, BERT heads."""
    config = SesameBertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    assert config.attention_types() == ["full_attention"] * 2
    model = modeling.SesameBertForPreTraining(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["bert.encoder.layer.0.attn.qkv.weight"] == (96, 32) and shapes["bert.encoder.layer.0.attn.qkv.bias"]
    assert shapes["bert.encoder.layer.0.ffn.fc1.weight"] == (64, 32) and "bert.encoder.layer.0.norm1.bias" in shapes
    assert "bert.embeddings.position_embeddings.weight" in shapes and "bert.pooler.norm.weight" not in shapes


BAD = [
    (dict(global_attn_every_n_layers=2, local_attention=5), "local_attention=5"),
    (dict(global_attn_every_n_layers=2, local_attention=128), "max_position_embeddings (64)"),
    (dict(num_key_value_heads=3), "multiple of num_key_value_heads"),
    (dict(head_dim=7, num_key_value_heads=4), "even head dimension"),
    (dict(hidden_act="reglu"), "hidden_act='reglu'"),
    (dict(layer_types=["sliding_attention"]), "expected 2 entries"),
    (dict(layer_types=["full_attention", "global"]), "layer_types="),
    (dict(layer_types=["full_attention"] * 2, global_attn_every_n_layers=2), "both set"),
]


@pytest.mark.parametrize("fields, message", BAD)
def test_bad_configs_are_refused(fields, message):
    with pytest.raises(StrictDataclassClassValidationError, match=re.escape(message)):
        SesameBertConfig(**dict(MODERN, num_hidden_layers=2, **fields))


@pytest.mark.parametrize("fields, message", BAD[:5])
def test_bad_config_files_give_one_error_line_and_exit_2(tmp_path, tokenizer, capsys, fields, message):
    """A config.json with a bad field: ``modeling.bert.convert`` (a ModernBERT folder) and ``pretrain.prepare``-style
    loaders read it through ``from_pretrained``; the CLI reports the validator's reason on one ``error:`` line."""
    from modeling.bert import convert

    good = SesameBertConfig(**dict(MODERN, num_hidden_layers=2)).to_dict()
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**good, **fields, "architectures": ["SesameBertForMaskedLM"]}))
    tokenizer.save_pretrained(folder)
    argv = ["--source", str(folder), "--to", "modernbert", "--output_dir", str(tmp_path / "out")]
    assert run_cli(convert.main, argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-1].startswith("error: --source") and message in lines[-1], lines[-1]
    assert not (tmp_path / "out").exists()


# ---- packed documents and local attention ---------------------------------------------------------------------------
#: The paths of packed documents: the implementations, and the two SDPA takes on CUDA (forced here on the CPU;
#: "document_flex" is FlexAttention's forward on the CPU). transformers' "flex_attention" kernel compiles itself for
#: every new shape (~30 s on 2 CPU cores): marked slow.
PATHS = ["eager", "sdpa", pytest.param("flex_attention", marks=pytest.mark.slow), "document_flex", "document_varlen"]


def _packed_batch(vocab_size):
    """Two rows of 16 tokens: documents of 9 and 7 tokens; of 5 and 6 tokens, then 5 padding tokens."""
    splits = [[9, 7], [5, 6]]
    input_ids = torch.randint(5, vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    position_ids = torch.cat([torch.cat([torch.arange(n) for n in s] + [torch.arange(16 - sum(s))]) for s in splits])
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 11:] = 0
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids.view(2, 16))
    return batch, splits


def _model(path, monkeypatch, layer_types):
    model = SesameBertModel(SesameBertConfig(**MODERN, num_hidden_layers=len(layer_types), layer_types=layer_types))
    model.set_attn_implementation("sdpa" if path.startswith("document_") else path)
    if path.startswith("document_"):
        monkeypatch.setattr(modeling_sesame_bert, "packed_documents_kernel", lambda *args: path)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("path", PATHS)
def test_document_masking_and_sliding_window_combine(path, monkeypatch):
    """With packed documents and local layers: (a) each document of a packed row gets the hidden states of its own
    forward pass (local, global, local layers); (b) in a model of one local layer a changed token changes the
    outputs of exactly the real tokens of its document within ``local_attention // 2`` positions, nothing in another
    document and nothing farther away."""
    from _helpers import assert_documents_alone

    model = _model(path, monkeypatch, ["sliding_attention", "full_attention", "sliding_attention"])
    batch, splits = _packed_batch(model.config.vocab_size)
    with torch.no_grad():
        packed = model(**batch).last_hidden_state
        assert packed.isfinite().all()
        real = batch["attention_mask"].bool()
        assert_documents_alone(model, batch["input_ids"], packed, splits, atol=1e-5)

    local = _model(path, monkeypatch, ["sliding_attention"])
    half = local.config.local_attention // 2
    with torch.no_grad():
        before = local(**batch).last_hidden_state
        for row, column, document in ((0, 4, range(0, 9)), (0, 10, range(9, 16)), (1, 7, range(5, 11))):
            changed = dict(batch, input_ids=batch["input_ids"].clone())
            changed["input_ids"][row, column] = 5 + (changed["input_ids"][row, column] - 4) % (
                local.config.vocab_size - 5
            )
            moved = (local(**changed).last_hidden_state - before).abs().amax(-1)  # (B, T)
            reach = torch.zeros_like(real)
            reach[row, [t for t in document if abs(t - column) <= half]] = True
            assert moved[reach].min() > 1e-4, (row, column)  # the window sees the change ...
            assert moved[~reach & real].max() <= 1e-6, (row, column)  # ... and nothing else does


def _fake_flash_attention(monkeypatch, calls: list) -> None:
    """flash_attention_2 on the CPU: transformers' own flash wrapper (``_flash_attention_forward``: unpadding,
    the varlen arguments, ``sliding_window`` -> ``window_size``) with the flash-attn functions replaced by a reference
    written here (SDPA per sequence, keys within ``window_size``) that records what it is given."""
    from transformers import modeling_flash_attention_utils as fa

    def attend(q, k, v, softmax_scale, window_size):  # one sequence (n, A, D); window_size (left, right), -1: all
        distance = torch.arange(q.shape[0])[:, None] - torch.arange(q.shape[0])[None, :]
        left, right = window_size
        allowed = ((distance <= left) | (left < 0)) & ((-distance <= right) | (right < 0))
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=softmax_scale)
        return out.transpose(0, 1)

    def flash_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                     softmax_scale=None, causal=False, window_size=(-1, -1), deterministic=False):  # fmt: skip
        calls.append(("varlen", tuple(q.shape), cu_seqlens_q.tolist(), tuple(window_size), causal))
        bounds = cu_seqlens_q.tolist()
        pieces = [attend(q[s:e], k[s:e], v[s:e], softmax_scale, window_size) for s, e in zip(bounds, bounds[1:])]
        return torch.cat(pieces)

    def flash(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), deterministic=False):
        calls.append(("flash", tuple(q.shape), None, tuple(window_size), causal))
        return torch.stack([attend(*row, softmax_scale, window_size) for row in zip(q, k, v)])

    functions = (flash, flash_varlen, None, fa._pad_input, fa._unpad_input)
    processing = (fa._lazy_define_process_function(flash_varlen), dict)
    monkeypatch.setattr(fa, "lazy_import_flash_attention", lambda *args, **kwargs: (functions, processing))


@pytest.mark.parametrize("packed, pad", [(False, False), (False, True), (True, True)])
def test_flash_local_layers_get_the_padding_and_the_window(monkeypatch, packed, pad):
    """flash_attention_2 with the flash-attn kernels faked (:func:`_fake_flash_attention`): a local layer's kernel
    gets ``window_size = (local_attention // 2, local_attention // 2)`` (ModernBERT's window; the global layer
    none), the real tokens unpadded (padding) or the documents' varlen arguments (packed), never a (T, T) mask; and
    the model's hidden states at the real tokens equal the sdpa path's (blocked local attention)."""
    calls = []
    _fake_flash_attention(monkeypatch, calls)
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    config = SesameBertConfig(**MODERN, num_hidden_layers=3, layer_types=layer_types)
    model = SesameBertModel(config).eval()
    batch, _ = _packed_batch(config.vocab_size)
    if not packed:
        batch.pop("position_ids")
    if not pad:
        batch.pop("attention_mask")
    keep = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
    with torch.no_grad():
        expected = model(**batch).last_hidden_state
        monkeypatch.setattr(config, "_attn_implementation_internal", "flash_attention_2")
        got = model(**batch).last_hidden_state
    half = config.local_attention // 2
    assert [c[3] for c in calls] == [(half, half), (-1, -1), (half, half)], calls
    assert not any(c[4] for c in calls)  # bidirectional
    kind = "varlen" if pad or packed else "flash"
    real = int(keep.sum())
    shape = (real, 4, 8) if kind == "varlen" and not packed else (2 * 16, 4, 8) if packed else (2, 16, 4, 8)
    assert all(c[0] == kind and c[1] == shape for c in calls), calls
    if packed:  # documents of 9, 7; 5, 6 tokens, then the padding (position ids 0 1 2 3 4: one run)
        assert all(c[2] == [0, 9, 16, 21, 27, 32] for c in calls), calls
    torch.testing.assert_close(got[keep], expected[keep], rtol=0, atol=1e-5)


def test_peft_lora_on_a_modern_config():
    """LoRA on ``qkv`` (grouped-query: A + 2K heads of rows), ``out``, ``fc1`` (a GLU's 2 x intermediate) and ``fc2``
    of a modern classifier: it starts as the base model, trains only the adapters, and merges into the same function."""
    peft = pytest.importorskip("peft", reason="peft is not installed (not a dependency: pip install peft)")
    config = SesameBertConfig(**MODERN, num_hidden_layers=2, global_attn_every_n_layers=2, head_layout="modernbert")
    base = modeling.SesameBertForSequenceClassification(config).eval()
    batch, _ = _packed_batch(config.vocab_size)
    batch.pop("position_ids")
    with torch.no_grad():
        before = base(**batch).logits
    targets = ["qkv", "out", "fc1", "fc2"]
    lora = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=targets, task_type="SEQ_CLS"))
    with torch.no_grad():
        torch.testing.assert_close(lora(**batch).logits, before, rtol=0, atol=0)
    lora.train()
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=5e-2)
    for _ in range(3):
        optimizer.zero_grad()
        lora(**batch, labels=torch.tensor([0, 1])).loss.backward()
        optimizer.step()
    lora.eval()
    with torch.no_grad():
        adapted = lora(**batch).logits
        merged = lora.merge_and_unload()
        torch.testing.assert_close(merged(**batch).logits, adapted, rtol=0, atol=1e-5)
    assert not torch.allclose(adapted, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_equals_transformers_modernbert_bit_for_bit(dtype):
    """:func:`apply_rotary` (the sign folded into the sines, a roll instead of negate + concatenate) gives exactly
    transformers' ModernBERT ``apply_rotary_pos_emb`` (float32 arithmetic, rounded to the input dtype)."""
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    from modeling.bert.attention_sesame_bert import apply_rotary, rotary_cos_sin

    q, k = torch.randn(2, 4, 50, 16).to(dtype), torch.randn(2, 2, 50, 16).to(dtype)
    cos, sin = rotary_cos_sin(torch.arange(50)[None], 16, 10000.0, torch.float32)
    for ours, theirs in zip(apply_rotary(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)):
        assert ours.dtype == dtype and torch.equal(ours, theirs)
