"""transformers' ModernBERT / EuroBERT <-> SesameBert: randomly initialised reference models of two sizes each, with
padding and sequences longer than the local window; hidden states and every head's logits equal within 1e-5 (float32)
for eager and sdpa attention, both directions, and a round trip that gives the same tensors."""

from __future__ import annotations

import pytest
import torch
import transformers
from _tiny import padded_batch

from modeling.bert.sources import SOURCES

TOLERANCE = 1e-5
TOKENS = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3)
#: The sizes of both families' configs (ModernBERT's special tokens apart), the wide one with attention biases.
SMALL = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=48, max_position_embeddings=64)
WIDE = dict(vocab_size=70, hidden_size=48, intermediate_size=40, max_position_embeddings=128, attention_bias=True)
MODERN = dict(cls_token_id=2, sep_token_id=3)
MODERN_WIDE = dict(
    hidden_activation="silu", classifier_activation="silu", decoder_bias=False, global_attn_every_n_layers=2
)
#: (family, size) -> the transformers config's keyword arguments; the second size of each family switches on what the
#: first leaves off (biases, another GLU, GQA with a head_dim of its own, layer types every 2 layers).
CONFIGS = {
    ("modernbert", "small"): dict(SMALL, num_hidden_layers=3, local_attention=8, **MODERN),
    ("modernbert", "wide"): dict(WIDE, **MODERN_WIDE, num_hidden_layers=4, num_attention_heads=4, local_attention=12)
    | dict(mlp_bias=True, norm_bias=True, classifier_bias=True, **MODERN),
    ("eurobert", "small"): dict(SMALL, num_hidden_layers=2, num_key_value_heads=2, mask_token_id=4),
    ("eurobert", "wide"): dict(WIDE, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3, head_dim=16)
    | dict(hidden_act="gelu", mlp_bias=True, tie_word_embeddings=True, mask_token_id=4),
}
PREFIX = {"modernbert": "ModernBert", "eurobert": "EuroBert"}
MODERNBERT, EUROBERT = SOURCES["modernbert"].SOURCE, SOURCES["eurobert"].SOURCE
HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]
CASES = [
    (family, size, head, pooling)
    for family, size in CONFIGS
    for head in HEADS
    for pooling in (("cls", "mean", "late") if head == "ForSequenceClassification" else (None,))
    if not (family == "modernbert" and pooling == "late")  # EuroBERT's only
    if not (family == "eurobert" and head == "ForQuestionAnswering")  # EuroBERT has no QA head in transformers
]


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def _perturb(model):
    """Move every parameter off its initial value (norm weights 1, biases 0) so that no term can hide."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def _reference(family, size, head, pooling, implementation):
    kwargs = dict(CONFIGS[family, size], **TOKENS, attn_implementation=implementation)
    if head == "ForQuestionAnswering":
        kwargs["num_labels"] = 2
    elif head not in ("Model", "ForMaskedLM"):
        kwargs["num_labels"] = 3
    if pooling is not None:
        kwargs["classifier_pooling"] = {"modernbert": pooling, "eurobert": {"cls": "bos"}.get(pooling, pooling)}[family]
    config = getattr(transformers, f"{PREFIX[family]}Config")(**kwargs)
    return _perturb(getattr(transformers, f"{PREFIX[family]}{head}")(config))


def _batch(vocab_size):
    """(3, 40) with rows of 40, 23 and 9 real tokens: longer than every local window of :data:`CONFIGS`."""
    return padded_batch(vocab_size, (3, 40), {1: 23, 2: 9}, seed=1)


def _outputs(model, batch):
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    if hasattr(out, "start_logits"):
        logits = [out.start_logits, out.end_logits]
    else:
        logits = [out.logits] if hasattr(out, "logits") else [out.last_hidden_state]
    return out.hidden_states, logits


def _assert_same_function(reference, ours, batch):
    real = batch["attention_mask"].bool()
    ref_hidden, ref_logits = _outputs(reference, batch)
    new_hidden, new_logits = _outputs(ours, batch)
    assert len(ref_hidden) == len(new_hidden)
    for i, (r, n) in enumerate(zip(ref_hidden, new_hidden)):
        assert (r[real] - n[real]).abs().max().item() <= TOLERANCE, f"hidden state {i}"
    for r, n in zip(ref_logits, new_logits):
        if r.dim() > 1 and r.shape[:2] == real.shape:  # per token: the real tokens
            r, n = r[real], n[real]
        assert r.shape == n.shape and (r - n).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("family,size,head,pooling", CASES)
def test_parity_both_directions_and_round_trip(family, size, head, pooling):
    batch = _batch(CONFIGS[family, size]["vocab_size"])
    for implementation in ("eager", "sdpa"):
        # transformers -> SesameBert
        reference = _reference(family, size, head, pooling, implementation)
        ours = SOURCES[family].to_sesame(reference)
        ours.set_attn_implementation(implementation)
        _assert_same_function(reference, ours, batch)
        # SesameBert (its own random weights) -> transformers
        mine = _perturb(type(ours)(ours.config))
        mine.set_attn_implementation(implementation)
        theirs = SOURCES[family].from_sesame(mine)
        theirs.set_attn_implementation(implementation)
        _assert_same_function(theirs, mine, batch)
        # the round trip gives the same tensors
        back = SOURCES[family].to_sesame(theirs).state_dict()
        assert back.keys() == mine.state_dict().keys()
        # (a bare encoder's pooler has no counterpart: the converted one is new)
        assert all(torch.equal(back[k], v) for k, v in mine.state_dict().items() if not k.startswith("pooler."))


def test_converted_config_fields():
    """The converted configs say what the references are (the fields the tests above cannot see)."""
    modern = MODERNBERT.sesame_config(transformers.ModernBertConfig(**CONFIGS["modernbert", "small"], **TOKENS))
    assert modern.attention_types() == ["full_attention", "sliding_attention", "sliding_attention"]
    thetas = {kind: p["rope_theta"] for kind, p in modern.rope_parameters.items()}
    assert (thetas, modern.local_attention) == ({"full_attention": 160_000.0, "sliding_attention": 10_000.0}, 8)
    assert modern.hidden_act == "geglu" and not modern.first_layer_attention_norm and modern.type_vocab_size == 0
    euro = EUROBERT.sesame_config(transformers.EuroBertConfig(**CONFIGS["eurobert", "wide"], **TOKENS), pooled=False)
    assert (euro.key_value_heads, euro.attention_head_dim, euro.hidden_act) == (3, 16, "geglu")
    assert euro.norm_type == "rmsnorm" and not euro.embedding_norm


@pytest.mark.parametrize("family,head", [("modernbert", "ForMaskedLM"), ("eurobert", "ForSequenceClassification")])
def test_cli_converts_both_ways(tmp_path, tokenizer, capsys, family, head):
    """``python -m modeling.bert.convert --source DIR`` reads a transformers folder; ``--to FAMILY`` writes it back."""
    import json

    from core.errors import run_cli
    from modeling.bert import convert

    kwargs = dict(CONFIGS[family, "small"], **TOKENS, vocab_size=len(tokenizer), num_labels=3)
    if family == "eurobert":
        kwargs["classifier_pooling"] = "mean"
    config = getattr(transformers, f"{PREFIX[family]}Config")(**kwargs)
    reference = _perturb(getattr(transformers, f"{PREFIX[family]}{head}")(config))
    reference.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")

    assert run_cli(convert.main, ["--source", str(tmp_path / "source"), "--output_dir", str(tmp_path / "ours")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["converted_to"] == f"SesameBert{head}" and max(report["max_abs_diff"].values()) <= TOLERANCE
    assert (tmp_path / "ours" / "attention_sesame_bert.py").is_file()  # the remote code carries the new module
    argv = ["--source", str(tmp_path / "ours"), "--to", family, "--output_dir", str(tmp_path / "back")]
    assert run_cli(convert.main, argv) == 0
    back = getattr(transformers, f"{PREFIX[family]}{head}").from_pretrained(tmp_path / "back")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in reference.state_dict().items())
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == family

    # a SesameBert folder is not a --source without --to, and a transformers folder is not one with it
    argv = ["--source", str(tmp_path / "source"), "--to", family, "--output_dir", str(tmp_path / "never")]
    assert run_cli(convert.main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --source") and "expected sesame-bert" in err, err


def test_every_source_is_one_module_of_the_same_names(capsys):
    """Issue 53 item 3: each source module declares the same names, its layout is its ``LAYOUTS`` row (not a copy),
    its classes exist on both sides, and the command's help names every source."""
    import modeling
    from modeling.bert import LAYOUTS, convert

    for name, module in SOURCES.items():
        assert {"LAYOUT", "TITLE", "FIELDS", "KEYS", "HEADS", "CLASSES", "SOURCE", "to_sesame", "from_sesame"} <= set(
            vars(module)
        ), name
        assert module.LAYOUT is LAYOUTS[name] and module.SOURCE.name == name
        assert all(hasattr(transformers, theirs) and hasattr(modeling, ours) for theirs, ours in module.CLASSES.items())
    with pytest.raises(SystemExit):
        convert.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(module.TITLE in text and name in text for name, module in SOURCES.items()), text
