"""Replaced-token detection (ELECTRA, issue 21) at the model level: sampling, labels against the original tokens, the
discriminator's loss over every real token, where the gradients go under each embedding sharing, the combined loss,
the saved layout (discriminator + generator/) in process and as remote code, and bf16 autocast."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from _launch import BLOCK_PROJECT_IMPORTS, run_remote_code_script
from _tiny import modern_layout

from modeling import (
    SesameBertConfig,
    SesameBertDiscriminator,
    SesameBertForReplacedTokenDetection,
    SesameBertRTDConfig,
    sample_tokens,
)

SHARINGS = ("tied", "gdes", "none")


def _config(tiny_kwargs, **fields) -> SesameBertRTDConfig:
    return SesameBertRTDConfig(
        **{**tiny_kwargs, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **fields}
    )


def _model(tiny_kwargs, seed: int = 0, **fields) -> SesameBertForReplacedTokenDetection:
    torch.manual_seed(seed)
    return SesameBertForReplacedTokenDetection(_config(tiny_kwargs, **fields))


def _masked(batch, every: int = 3, mask_id: int = 4, seed: int = 0):
    """``batch`` with every ``every``-th real token masked ([MASK]), its MLM labels and sampling uniforms."""
    ids, keep = batch["input_ids"], batch["attention_mask"].bool()
    selected = torch.zeros_like(keep)
    selected[:, 1::every] = True
    selected &= keep
    labels = torch.where(selected, ids, torch.full_like(ids, -100))
    g = torch.Generator().manual_seed(seed)
    return {
        **batch,
        "input_ids": torch.where(selected, torch.full_like(ids, mask_id), ids),
        "labels": labels,
        "sampling_uniforms": torch.rand(ids.shape, generator=g),
    }


def test_generator_shape_follows_generator_size_and_bad_sizes_are_refused(tiny_kwargs):
    config = _config(tiny_kwargs)  # H 32, A 4, I 64 -> a quarter: 8, 1, 16; the shared embeddings stay 32 wide
    gen = config.generator_config()
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size, gen.embedding_size) == (8, 1, 16, 32)
    assert gen.num_hidden_layers == config.num_hidden_layers and gen.vocab_size == config.vocab_size
    disc = config.discriminator_config().to_dict()
    recorded = {k: disc.pop(k) for k in ("generator_size", "discriminator_weight", "embedding_sharing")}
    assert recorded == {"generator_size": 0.25, "discriminator_weight": 50.0, "embedding_sharing": "tied"}
    assert disc == SesameBertConfig(**tiny_kwargs, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).to_dict()
    third = _config(tiny_kwargs, generator_size=0.5, embedding_sharing="none").generator_config()
    assert (third.hidden_size, third.num_attention_heads, third.embedding_size) == (16, 2, None)
    for bad in (0.0, 1.5, 0.6):  # 0.6: hidden 19 with 2 heads
        with pytest.raises(Exception, match="generator_size"):
            _config(tiny_kwargs, generator_size=bad)


def test_sample_tokens_draws_from_the_softmax_by_its_inverse_cdf():
    probs = torch.tensor([0.5, 0.25, 0.25, 0.0])
    logits = probs.clamp_min(1e-30).log().expand(7, 4)
    u = torch.tensor([0.0, 0.1, 0.49, 0.5, 0.74, 0.75, 0.9999])
    assert sample_tokens(logits, u).tolist() == [0, 0, 0, 1, 1, 2, 2]  # token 3 (probability 0) never
    g = torch.Generator().manual_seed(0)
    many = sample_tokens(torch.randn(1, 6, generator=g).expand(200_000, 6) * 2, torch.rand(200_000, generator=g))
    expected = (torch.randn(1, 6, generator=torch.Generator().manual_seed(0)) * 2).softmax(-1)[0]
    observed = torch.bincount(many, minlength=6).double() / len(many)
    assert torch.allclose(observed, expected.double(), atol=4e-3), (observed, expected)  # ~ 4 standard errors


def test_labels_are_computed_against_the_original_tokens(tiny_kwargs, make_batch):
    """A generator that always samples token t: masked positions whose original token is t get the label 0 (not
    replaced), the others 1; unmasked tokens keep their ids and label 0; the discriminator's input at a masked
    position is the sample, whatever the collator put there ([MASK], a random or the kept token)."""
    model = _model(tiny_kwargs).eval()
    t = 7
    with torch.no_grad():
        model.generator.cls.decoder.bias[t] = 1e4  # softmax ~ one-hot on t
    batch = _masked(make_batch(tiny_kwargs["vocab_size"]))
    original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
    masked = batch["labels"] != -100
    rows = masked.nonzero()[::2]  # half of the masked positions hold t originally
    original[rows[:, 0], rows[:, 1]] = t
    batch["labels"] = torch.where(masked, original, batch["labels"])
    kept = rows[::2]  # of those, half kept by the collator (its 10% "keep"), half [MASK]ed: label 0 for all
    batch["input_ids"][kept[:, 0], kept[:, 1]] = t
    with torch.no_grad():
        out = model(**batch)
    assert torch.equal(out.corrupted_input_ids, torch.where(masked, torch.full_like(original, t), original))
    expected = (masked & (original != t)).long()
    assert torch.equal(out.replaced_labels, expected)
    assert 0 < int(expected.sum()) < int(masked.sum())  # both kinds occur


def test_discriminator_loss_covers_every_real_token_and_only_those(tiny_kwargs, make_batch):
    model = _model(tiny_kwargs)
    batch = _masked(make_batch(tiny_kwargs["vocab_size"]))
    out = model(**batch)
    keep = batch["attention_mask"].bool()
    reference = F.binary_cross_entropy_with_logits(out.logits[keep].float(), out.replaced_labels[keep].float())
    torch.testing.assert_close(out.discriminator_loss, reference)
    (grad,) = torch.autograd.grad(out.discriminator_loss, out.logits)
    assert bool((grad[keep] != 0).all()), "every real token (specials and unmasked ones included) is scored"
    assert bool((grad[~keep] == 0).all()), "padding is not"
    assert int(keep.sum()) > int((batch["labels"] != -100).sum())  # more than the masked tokens


#: the ModernBERT-class layout (issue 41): GeGLU (the discriminator head then takes the gate's GELU), rotary positions,
#: pre-norm without biases, a local layer in a 4-token window, ModernBERT's heads; segment embeddings kept for the batch
MODERN = modern_layout(global_attn_every_n_layers=2, local_attention=4, type_vocab_size=2)


@pytest.mark.parametrize("lam, fields", [(50.0, {}), (7.0, {}), (7.0, MODERN)], ids=["50", "7", "7-modern"])
def test_loss_is_the_generator_mlm_loss_plus_lambda_times_the_discriminator_loss(tiny_kwargs, make_batch, lam, fields):
    """Both terms recomputed independently: the generator's cross-entropy at the masked positions from its full
    logits, the discriminator's BCE over the real tokens from its own forward on the corrupted input. For the
    ModernBERT-class layout also the discriminator head by hand: ``dense_prediction(gelu(dense(h)))``."""
    model = _model(tiny_kwargs, discriminator_weight=lam, **fields).eval()
    batch = _masked(make_batch(tiny_kwargs["vocab_size"]))
    with torch.no_grad():
        out = model(**batch)
        masked = batch["labels"] != -100
        gen_logits = model.generator(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
        gen = F.cross_entropy(gen_logits[masked], batch["labels"][masked])
        disc_logits = model.discriminator(
            out.corrupted_input_ids, batch["attention_mask"], batch["token_type_ids"]
        ).logits
        keep = batch["attention_mask"].bool()
        disc = F.binary_cross_entropy_with_logits(disc_logits[keep], out.replaced_labels[keep].float())
    torch.testing.assert_close(out.generator_loss, gen)
    torch.testing.assert_close(out.discriminator_loss, disc)
    torch.testing.assert_close(out.losses, torch.stack([gen, lam * disc]))
    torch.testing.assert_close(out.loss, gen + lam * disc)
    if fields:
        head = model.discriminator.discriminator_predictions
        h = torch.randn(2, 3, tiny_kwargs["hidden_size"])
        by_hand = F.linear(F.gelu(F.linear(h, head.dense.weight, head.dense.bias)), head.dense_prediction.weight)
        torch.testing.assert_close(head(h), (by_hand + head.dense_prediction.bias).squeeze(-1))


def _grads(model, loss) -> dict[str, torch.Tensor | None]:
    named = [(n, p) for n, p in model.named_parameters()]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True, retain_graph=True)
    return {n: g for (n, _), g in zip(named, grads)}


def _nonzero(g) -> bool:
    return g is not None and bool(g.abs().sum() > 0)


@pytest.mark.parametrize("sharing", SHARINGS)
def test_the_discriminator_loss_reaches_the_generator_only_through_shared_embeddings(tiny_kwargs, make_batch, sharing):
    model = _model(tiny_kwargs, embedding_sharing=sharing)
    out = model(**_masked(make_batch(tiny_kwargs["vocab_size"])))
    disc = _grads(model, out.discriminator_loss)
    gen = _grads(model, out.generator_loss)
    shared = "generator.bert.embeddings."
    for name, g in disc.items():
        if name.startswith("generator.") and not (sharing == "tied" and name.startswith(shared)):
            assert not _nonzero(g), f"{sharing}: the discriminator's loss reached {name}"
    if sharing == "tied":  # ELECTRA: the shared tables learn from both losses
        assert _nonzero(disc[shared + "word_embeddings.weight"]) and _nonzero(gen[shared + "word_embeddings.weight"])
    if sharing == "gdes":  # DeBERTa-v3: E_G from the generator only, E_delta from the discriminator only
        delta = "discriminator.bert.embeddings.word_embeddings_delta"
        assert _nonzero(disc[delta]) and not _nonzero(gen[delta])
        assert _nonzero(gen[shared + "word_embeddings.weight"])
    # the discriminator's own encoder learns from its loss only
    layer = "discriminator.bert.encoder.layer.0.attn.qkv.weight"
    assert _nonzero(disc[layer]) and not _nonzero(gen[layer])
    assert _nonzero(gen["generator.bert.encoder.layer.0.attn.qkv.weight"])


def test_gdes_starts_from_the_generator_embeddings_and_adds_its_delta(tiny_kwargs, make_batch):
    model = _model(tiny_kwargs, embedding_sharing="gdes").eval()
    emb = model.discriminator.bert.embeddings
    assert all(float(p.abs().max()) == 0.0 for n, p in emb.named_parameters() if n.endswith("_delta"))
    ids = make_batch(tiny_kwargs["vocab_size"])["input_ids"]
    shared = model.generator.bert.embeddings
    with torch.no_grad():
        emb.word_embeddings_delta.normal_()
        expected = shared.word_embeddings.weight[ids] + emb.word_embeddings_delta[ids]
        expected = emb.norm(
            expected + shared.position_embeddings.weight[: ids.shape[1]] + shared.token_type_embeddings.weight[0]
        )
        torch.testing.assert_close(emb(ids), expected)


@pytest.mark.parametrize("sharing", SHARINGS)
def test_save_writes_the_discriminator_and_the_generator_for_the_auto_classes(
    tiny_kwargs, make_batch, tokenizer, tmp_path, sharing
):
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining, pipeline

    model = _model(tiny_kwargs, embedding_sharing=sharing).eval()
    with torch.no_grad():  # a trained-looking GDES delta, so that the merged tables differ from E_G
        for name, p in model.named_parameters():
            if name.endswith("_delta"):
                p.normal_(std=0.1)
    folder = tmp_path / "rtd"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tokenizer.save_pretrained(folder / "generator")
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "sesame-bert" and config["architectures"] == ["SesameBertDiscriminator"]
    assert config["auto_map"]["AutoModel"] == "modeling_sesame_bert.SesameBertModel"
    assert {"modeling_sesame_bert.py", "configuration_sesame_bert.py"} <= {p.name for p in folder.iterdir()}
    batch = make_batch(tiny_kwargs["vocab_size"])
    encoder, generator = (
        AutoModel.from_pretrained(folder).eval(),
        AutoModelForMaskedLM.from_pretrained(folder / "generator").eval(),
    )
    assert type(encoder).__name__ == "SesameBertModel" and type(generator).__name__ == "SesameBertForMaskedLM"
    discriminator = SesameBertDiscriminator.from_pretrained(folder).eval()
    with torch.no_grad():
        assert torch.equal(encoder(**batch).last_hidden_state, model.discriminator.bert(**batch).last_hidden_state)
        assert torch.equal(generator(**batch).logits, model.generator(**batch).logits)
        assert torch.equal(discriminator(**batch).logits, model.discriminator(**batch).logits)
    assert generator.cls.decoder.weight is generator.bert.embeddings.word_embeddings.weight
    fill = pipeline("fill-mask", model=str(folder / "generator"))
    assert len(fill("the cat [MASK] on the mat .")) == 5
    # and back: the layout loads as the pretraining model (the RTD fields from config=)
    again = AutoModelForPreTraining.from_pretrained(folder, config=model.config)
    assert type(again) is SesameBertForReplacedTokenDetection
    for name, value in model.state_dict().items():  # GDES: E_delta = saved (E_G + E_delta) - E_G, rounded once
        torch.testing.assert_close(again.state_dict()[name], value, rtol=0, atol=1e-6 if sharing == "gdes" else 0)


_REMOTE = BLOCK_PROJECT_IMPORTS + textwrap.dedent(
    """
    import torch
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification
    d, ids = sys.argv[1], torch.tensor(json.loads(sys.argv[2]))
    encoder = AutoModel.from_pretrained(d, trust_remote_code=True).eval()
    generator = AutoModelForMaskedLM.from_pretrained(d + "/generator", trust_remote_code=True).eval()
    clf = AutoModelForSequenceClassification.from_pretrained(d, trust_remote_code=True, num_labels=2)
    with torch.no_grad():
        hidden, logits = encoder(ids).last_hidden_state, generator(ids).logits
    print(json.dumps({"hidden": hidden.tolist(), "logits": logits.tolist(),
                      "modules": [type(m).__module__ for m in (encoder, generator, clf)],
                      "project": sorted(m for m in sys.modules if m.split(".")[0] in ("modeling", "training"))}))
    """
)


def test_saved_rtd_model_loads_as_remote_code_without_the_package(tiny_kwargs, make_batch, tmp_path):
    model = _model(tiny_kwargs).eval()
    model.save_pretrained(tmp_path / "rtd")
    ids = make_batch(tiny_kwargs["vocab_size"])["input_ids"]
    got = run_remote_code_script(_REMOTE, tmp_path, str(tmp_path / "rtd"), json.dumps(ids.tolist()))
    assert got["project"] == [] and all(m.startswith("transformers_modules") for m in got["modules"])
    with torch.no_grad():
        torch.testing.assert_close(
            torch.tensor(got["hidden"]), model.discriminator.bert(ids).last_hidden_state, rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(torch.tensor(got["logits"]), model.generator(ids).logits, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_gives_float32_losses_close_to_float32(tiny_kwargs, make_batch):
    model = _model(tiny_kwargs).eval()
    batch = _masked(make_batch(tiny_kwargs["vocab_size"]))
    with torch.no_grad():
        ref = model(**batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(**batch)
    assert out.losses.dtype == torch.float32 and bool(torch.isfinite(out.losses).all())
    assert out.logits.dtype == torch.bfloat16
    # the same samples (float32 softmax of bf16 logits) except where a uniform falls on a moved boundary
    assert float((out.corrupted_input_ids == ref.corrupted_input_ids).float().mean()) > 0.9
    torch.testing.assert_close(out.generator_loss, ref.generator_loss, rtol=2e-2, atol=0)
    torch.testing.assert_close(out.discriminator_loss, ref.discriminator_loss, rtol=5e-2, atol=0)


@pytest.mark.parametrize("sharing", SHARINGS)
def test_a_saved_rtd_model_records_its_rtd_fields_and_loads_back_without_config(tiny_kwargs, tmp_path, sharing):
    """The saved discriminator's config.json records lambda, the sharing mode and the generator size; loading the
    folder without ``config=`` (and pretrain's ``--model_name_or_path`` path: the folder's config wrapped by
    ``from_discriminator``) gives the pair as it was trained -- not ELECTRA's defaults, which under GDES or no
    sharing would drop the discriminator's own embedding tables."""
    from transformers import AutoConfig

    fields = dict(embedding_sharing=sharing, discriminator_weight=10.0, generator_size=0.5)
    model = _model(tiny_kwargs, **fields).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_delta"):
                p.normal_(std=0.1)
    model.save_pretrained(tmp_path / "rtd")
    saved = json.loads((tmp_path / "rtd" / "config.json").read_text())
    assert {k: saved[k] for k in fields} == fields
    again = SesameBertForReplacedTokenDetection.from_pretrained(tmp_path / "rtd")
    assert {k: getattr(again.config, k) for k in fields} == fields
    wrapped = SesameBertRTDConfig.from_discriminator(AutoConfig.from_pretrained(tmp_path / "rtd"))
    assert {k: getattr(wrapped, k) for k in fields} == fields
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    assert {k: getattr(wrapped, k) for k in shape} == {k: getattr(model.config, k) for k in shape}
    for name, value in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], value, rtol=0, atol=1e-6 if sharing == "gdes" else 0)
    # an explicit field still wins over the recorded one
    assert (
        SesameBertRTDConfig.from_discriminator(
            model.discriminator.config, discriminator_weight=3.0
        ).discriminator_weight
        == 3.0
    )
