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
from modeling.bert.sources import modernbert

MODERN = micro_modern_kwargs()


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def test_literal_annotations_equal_the_validators_choices():
    """Every string field with a ``Literal`` annotation names exactly the values ``validate_architecture`` accepts
    (``CHOICES``; issue 53: ``position_embedding_type``'s omitted ``"rope"``), and ``head_layout``'s are ``LAYOUTS``."""
    import dataclasses
    import typing

    from modeling.bert import configuration_sesame_bert as module

    literals = {
        f.name: typing.get_args(eval(f.type, vars(module)))  # noqa: S307  (the module's own annotation strings)
        for f in dataclasses.fields(SesameBertConfig)
        if f.name in module.CHOICES and str(f.type).startswith("Literal")
    }
    assert set(literals) == {
        "position_embedding_type",
        "norm_position",
        "norm_type",
        "classifier_pooling",
        "head_layout",
    }
    assert all(literals[name] == tuple(module.CHOICES[name]) for name in literals), literals
    assert literals["head_layout"] == tuple(module.LAYOUTS)
    for name, values in literals.items():  # each accepted, and a value outside refused with the field named
        for value in values:
            SesameBertConfig(**{**MODERN, name: value, "embedding_size": None})
        with pytest.raises(StrictDataclassClassValidationError, match=f"{name}='other'"):
            SesameBertConfig(**{**MODERN, name: "other"})


def test_modernbert_base_preset_has_modernbert_base_sizes():
    """modernbert-base written as a transformers config equals ``ModernBertConfig()`` (ModernBERT-base) in every
    architecture field; the presets are listed by ``pretrain --help``."""
    from pretrain.cli import build_parser

    reference = transformers.ModernBertConfig()
    ours = modeling.get_preset_config("modernbert-base", vocab_size=reference.vocab_size, pad_token_id=50283)
    written = modernbert.SOURCE.transformers_config(ours)
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
    with pytest.raises((StrictDataclassClassValidationError, ValueError), match=re.escape(message)):
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
    frozen = {n: p.detach().clone() for n, p in lora.named_parameters() if not _trained_by_lora(n)}
    adapters = {n: p.detach().clone() for n, p in lora.named_parameters() if _trained_by_lora(n)}
    assert frozen and adapters
    optimizer = torch.optim.AdamW(lora.parameters(), lr=5e-2)  # all of them: what is frozen must stay so
    for _ in range(3):
        optimizer.zero_grad()
        lora(**batch, labels=torch.tensor([0, 1])).loss.backward()
        optimizer.step()
    lora.eval()
    trained = dict(lora.named_parameters())
    for name, before_training in frozen.items():  # the base model's weights: bitwise unchanged
        assert torch.equal(trained[name], before_training), name
    for name in ("lora_B", "classifier"):  # the adapters (B starts at 0) and the task head: trained
        assert any(not torch.equal(trained[n], p) for n, p in adapters.items() if name in n), name
    with torch.no_grad():
        adapted = lora(**batch).logits
        merged = lora.merge_and_unload()
        torch.testing.assert_close(merged(**batch).logits, adapted, rtol=0, atol=1e-5)
    assert not torch.allclose(adapted, before)


def test_rotary_equals_transformers_modernbert_bit_for_bit():
    """:func:`apply_rotary` (the sign folded into the sines, a roll instead of negate + concatenate) gives exactly
    transformers' ModernBERT ``apply_rotary_pos_emb`` in float32."""
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    from modeling.bert.attention_sesame_bert import apply_rotary, rotary_cos_sin

    q, k = torch.randn(2, 4, 50, 16), torch.randn(2, 2, 50, 16)
    cos, sin = rotary_cos_sin(torch.arange(50)[None], 16, 10000.0, torch.float32)
    for ours, theirs in zip(apply_rotary(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)):
        assert ours.dtype == torch.float32 and torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_rotary_in_its_own_dtype_within_its_rounding(dtype):
    """bf16 / fp16 queries and keys are rotated in their own dtype (no float32 round trip): the values and the
    gradients stay in the dtype and within a few of its roundings of the rotation computed in float64 (transformers'
    ModernBERT, the float32 round trip, is within one): relative error below 2 epsilon and below 2x the round
    trip's."""
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    from modeling.bert.attention_sesame_bert import apply_rotary, rotary_cos_sin

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 300, 32, generator=g).to(dtype), torch.randn(2, 2, 300, 32, generator=g).to(dtype)
    cos, sin = rotary_cos_sin(torch.arange(300)[None], 32, 10000.0, torch.float32)
    upstream = torch.randn(2, 4, 300, 32, generator=g)
    eps = torch.finfo(dtype).eps

    def rotated(fn, x_dtype, q=q, k=k):
        q, k = (x.to(x_dtype).clone().requires_grad_() for x in (q, k))  # fresh leaves: no shared .grad
        out_q, out_k = fn(q, k, cos.to(torch.float64) if x_dtype == torch.float64 else cos, sin.to(cos.dtype))
        (out_q * upstream.to(x_dtype)).sum().backward()
        return out_q, out_k, q.grad

    exact = rotated(lambda q, k, c, s: apply_rotary_pos_emb(q, k, c.to(q.dtype), s.to(q.dtype)), torch.float64)
    ours = rotated(apply_rotary, dtype)
    theirs = rotated(apply_rotary_pos_emb, dtype)
    for mine, reference, round_trip in zip(ours, exact, theirs):
        assert mine.dtype == dtype
        error = float((mine.double() - reference).norm() / reference.norm())
        assert error < 2 * eps and error < 2 * float((round_trip.double() - reference).norm() / reference.norm())


def _trained_by_lora(name: str) -> bool:
    """peft's trainable parameters of a ``SEQ_CLS`` LoRA model: the adapters and the task head it saves whole."""
    return "lora_" in name or "modules_to_save" in name


def test_regional_compilation_keeps_the_weights_names_and_the_results():
    """``compile_regions`` (``--regional_compile``) compiles every feed-forward network, norm and the MLM head in place:
    the state dict's names are unchanged, and a training step gives the eager model's loss and gradients bit for bit
    (dynamo's ``eager`` backend here: the graphs traced and run without inductor, which would compile for minutes on
    the CPU). The flag: refused with ``--torch_compile`` and for a model without regions, in one line each."""
    from core.errors import InputError
    from training.accelerator import compile_regions
    from training.config import TrainingConfig

    torch.manual_seed(0)
    config = SesameBertConfig(**micro_modern_kwargs(num_hidden_layers=2, layer_types=["full_attention"] * 2))
    model = modeling.SesameBertForMaskedLM(config).train()
    reference = modeling.SesameBertForMaskedLM(config).train()
    reference.load_state_dict(model.state_dict())
    keys = list(model.state_dict())
    names = model.compile_regions(backend="eager")
    assert names == [  # the first layer's attention norm is an identity (ModernBERT), the head's norm in the head
        "bert.embeddings.norm",
        "bert.encoder.layer.0.ffn",
        "bert.encoder.layer.0.norm2",
        "bert.encoder.layer.1.norm1",
        "bert.encoder.layer.1.ffn",
        "bert.encoder.layer.1.norm2",
        "bert.encoder.final_norm",
        "cls",
    ]
    assert list(model.state_dict()) == keys
    ids = torch.randint(5, config.vocab_size, (2, 24))
    for skip_logits in (False, True):  # the head's logits, and pretrain's fused loss (the head without its decoder)
        losses = []
        for m in (model, reference):
            m.zero_grad()
            loss = m(input_ids=ids, labels=ids, skip_logits=skip_logits).loss
            loss.backward()
            losses.append(loss)
        assert torch.equal(*losses)
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p.grad, q.grad), name
    with pytest.raises(InputError, match="--regional_compile with --torch_compile"):
        TrainingConfig(output_dir="", regional_compile=True, torch_compile=True)
    with pytest.raises(InputError, match="--regional_compile: Linear has no compile_regions"):
        compile_regions(torch.nn.Linear(2, 2))
