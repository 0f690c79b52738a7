"""ELMo features in the classic encoders (Peters et al. 2018, section 3.3): a frozen BiLM's layers, mixed by a task
ScalarMix and concatenated to the word vectors."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from _launch import BLOCK_PROJECT_IMPORTS, run_remote_code_script
from _tiny import micro_bilm_kwargs

from modeling.baselines import SesameBaselineForSequenceClassification, SesameBaselineModel

ENCODERS = ["cbow", "fasttext", "cnn", "rnn", "treelstm"]
SINGLES = ["The whale rose from the sea.", "It rained."]
PAIRS = (["The whale rose from the sea.", "It rained."], ["A dog near the river bank.", "The city was wet."])

#: A tiny SesameElmo BiLM (projection 6: ELMo features of width 12).
TINY_BILM = micro_bilm_kwargs(cnn_filters=[[1, 4], [2, 8]], projection_dim=6, cell_size=10, softmax="full")


@pytest.fixture
def bilm(word_tokenizer):
    """A tiny, randomly initialised SesameElmoModel (the ELMo family's own initialisation)."""
    from modeling.elmo import SesameElmoConfig, SesameElmoModel

    torch.manual_seed(11)
    return SesameElmoModel(SesameElmoConfig(vocab_size=len(word_tokenizer), **TINY_BILM)).eval()


def _elmo_model(tiny, tokenizer, bilm, encoder_type, head=True, **overrides):
    """A baseline with the tiny BiLM's features; the BiLM's weights copied in (as ``init_baseline_model`` does)."""
    overrides.setdefault("elmo_dropout", 0.0)
    config = tiny(encoder_type, vocab_size=len(tokenizer), elmo_config=bilm.config.to_dict(), **overrides)
    model = (SesameBaselineForSequenceClassification if head else SesameBaselineModel)(config)
    base = model.baseline if head else model
    base.elmo.bilm.load_state_dict(bilm.state_dict())
    return model


def test_the_scalar_mix_is_a_softmax_over_the_layers_times_gamma(tiny, word_tokenizer, bilm):
    model = _elmo_model(tiny, word_tokenizer, bilm, "cbow", head=False)
    elmo = model.elmo
    with torch.no_grad():
        elmo.input_mix.scalar_parameters.copy_(torch.log(torch.tensor([1.0, 2.0, 1.0])))  # softmax: 1/4, 1/2, 1/4
        elmo.input_mix.gamma.fill_(3.0)
    layers = (torch.full((1, 2, 12), 4.0), torch.full((1, 2, 12), 8.0), torch.full((1, 2, 12), -4.0))
    mask = torch.tensor([[True, False]])
    mixed = elmo.eval().mix(layers, mask)
    # 3 * (4/4 + 8/2 - 4/4) = 12 at the kept token, 0 at the masked one
    assert torch.equal(mixed[0, 0], torch.full((12,), 12.0))
    assert torch.equal(mixed[0, 1], torch.zeros(12))
    # the paper's L2 on s: lambda * sum(s_j^2)
    model.elmo.l2_coef = 0.5
    s = elmo.input_mix.scalar_parameters.detach()
    assert torch.allclose(elmo.l2_penalty(), 0.5 * (s**2).sum())


def test_each_sentence_is_run_through_the_bilm_alone(tiny, word_tokenizer, bilm):
    """The layers of a pair's tokens equal the BiLM's layers of each sentence encoded on its own."""
    model = _elmo_model(tiny, word_tokenizer, bilm, "cbow", head=False).eval()
    pair = word_tokenizer(*PAIRS, padding=True, return_tensors="pt")
    layers = model.elmo_layers(pair["char_ids"], pair["attention_mask"], pair["token_type_ids"], (0, 1))
    for i, texts in enumerate(PAIRS):
        alone = word_tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            ref = bilm(alone["char_ids"], alone["attention_mask"]).hidden_states
        for row in range(2):
            where = (pair["token_type_ids"][row] == i) & pair["attention_mask"][row].bool()
            n = int(alone["attention_mask"][row].sum())
            for got, want in zip(layers, ref):
                torch.testing.assert_close(got[row][where], want[row, :n], rtol=1e-5, atol=1e-6)


def _plain_copy(elmo_model, tiny, tokenizer, encoder_type):
    """The plain baseline with the +elmo model's weights, the encoder's first layer cut to the word-vector columns."""
    plain = SesameBaselineForSequenceClassification(tiny(encoder_type, vocab_size=len(tokenizer)))
    state = {k: v for k, v in elmo_model.state_dict().items() if ".elmo." not in k}
    e = plain.config.embedding_dim
    for name, value in plain.state_dict().items():
        if value.shape == state[name].shape:
            continue
        if name.startswith("pair_classifier"):  # cbow / fastText: [u; v; |u - v|; u * v] of (E + 2P) columns each
            state[name] = state[name].unflatten(1, (4, -1))[:, :, :e].flatten(1)
        else:  # the encoder's first layer (or a bag of words' classifier): (out, E + 2P[, w]) -> (out, E[, w])
            state[name] = state[name][:, :e]
    plain.load_state_dict(state)
    return plain.eval()


@pytest.mark.parametrize("encoder_type", ENCODERS)
def test_with_the_elmo_columns_masked_the_output_is_the_plain_backbones(tiny, word_tokenizer, bilm, encoder_type):
    model = _elmo_model(tiny, word_tokenizer, bilm, encoder_type).eval()
    plain = _plain_copy(model, tiny, word_tokenizer, encoder_type)
    batch = word_tokenizer(*PAIRS, padding=True, return_tensors="pt")
    singles = word_tokenizer(SINGLES, padding=True, return_tensors="pt")
    with torch.no_grad():
        assert not torch.allclose(model(**batch).logits, plain(**batch).logits)  # the features do change the output
        model.baseline.elmo.input_mix.gamma.zero_()  # masks the ELMo columns: the encoder reads zeros there
        for b in (batch, singles):
            torch.testing.assert_close(model(**b).logits, plain(**b).logits, rtol=1e-5, atol=1e-6)


def test_the_features_are_also_concatenated_at_the_output_when_asked(tiny, word_tokenizer, bilm):
    """``elmo_at_output``: max-pooled RNN states and the pooled second mixture, side by side (the paper's
    ``[h_k; ELMo_k]`` for a max-pooled encoder)."""
    model = _elmo_model(tiny, word_tokenizer, bilm, "rnn", head=False, elmo_at_output=True).eval()
    batch = word_tokenizer(SINGLES, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
        layers = model.elmo_layers(batch["char_ids"], batch["attention_mask"])
        mixed = model.elmo.mix(layers, model.sentence_mask(batch["input_ids"], batch["attention_mask"]), output=True)
    h = model.encoder.output_size
    assert out.pooler_output.shape == (2, h + 12)
    words = model.sentence_mask(batch["input_ids"], batch["attention_mask"])
    for row in range(2):
        torch.testing.assert_close(out.pooler_output[row, h:], mixed[row][words[row]].amax(0))
        torch.testing.assert_close(out.pooler_output[row, :h], out.hidden_states[-1][row][words[row]].amax(0))


def test_training_leaves_the_bilm_bitwise_unchanged(tiny, word_tokenizer, bilm):
    """AdamW with weight decay over every parameter, dropout on, 5 steps: the mix and the encoder move, the BiLM
    does not (and stays in eval mode)."""
    model = _elmo_model(tiny, word_tokenizer, bilm, "rnn", elmo_dropout=0.5, elmo_l2_coef=0.1)
    before = {k: v.clone() for k, v in model.baseline.elmo.bilm.state_dict().items()}
    mix_before = model.baseline.elmo.input_mix.scalar_parameters.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    batch = word_tokenizer(*PAIRS, padding=True, return_tensors="pt")
    model.train()
    assert not model.baseline.elmo.bilm.training
    for _ in range(5):
        loss = model(**batch, labels=torch.tensor([0, 2])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    after = model.baseline.elmo.bilm.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not torch.equal(model.baseline.elmo.input_mix.scalar_parameters, mix_before)


def test_the_l2_on_the_mix_weights_is_added_to_the_loss(tiny, word_tokenizer, bilm):
    model = _elmo_model(tiny, word_tokenizer, bilm, "cnn", elmo_l2_coef=0.25).eval()
    with torch.no_grad():
        model.baseline.elmo.input_mix.scalar_parameters.copy_(torch.tensor([1.0, -2.0, 0.5]))
        batch = word_tokenizer(SINGLES, padding=True, return_tensors="pt")
        labels = torch.tensor([0, 1])
        with_l2 = model(**batch, labels=labels).loss
        model.baseline.elmo.l2_coef = 0.0
        without = model(**batch, labels=labels).loss
    torch.testing.assert_close(with_l2 - without, torch.tensor(0.25 * (1 + 4 + 0.25)))


@pytest.mark.parametrize("encoder_type", ["cnn", "rnn"])
def test_save_load_gives_the_same_logits_and_the_bilm_inside(tmp_path, tiny, word_tokenizer, bilm, encoder_type):
    from transformers import AutoModelForSequenceClassification

    model = _elmo_model(tiny, word_tokenizer, bilm, encoder_type, elmo_name_or_path="some/elmo").eval()
    model.save_pretrained(tmp_path / "m")
    word_tokenizer.save_pretrained(tmp_path / "m")
    assert {"modeling_elmo.py", "configuration_elmo.py", "lstm_elmo.py"} <= {p.name for p in (tmp_path / "m").iterdir()}
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    assert loaded.config.elmo_name_or_path == "some/elmo"
    for name, value in bilm.state_dict().items():
        assert torch.equal(loaded.baseline.elmo.bilm.state_dict()[name], value)
    assert not any(p.requires_grad for p in loaded.baseline.elmo.bilm.parameters())
    for b in (
        word_tokenizer(*PAIRS, padding=True, return_tensors="pt"),
        word_tokenizer(SINGLES, return_tensors="pt", padding=True),
    ):
        with torch.no_grad():
            assert torch.equal(model(**b).logits, loaded(**b).logits)


_REMOTE = BLOCK_PROJECT_IMPORTS + textwrap.dedent(
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
    d, texts = sys.argv[1], json.loads(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(d, trust_remote_code=True)
    clf = AutoModelForSequenceClassification.from_pretrained(d, trust_remote_code=True).eval()
    batch = tok(*texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = clf(**batch).logits
    pipe = pipeline("text-classification", model=clf, tokenizer=tok)
    print(json.dumps({"logits": logits.tolist(), "module": type(clf).__module__,
                      "bilm": type(clf.baseline.elmo.bilm).__module__, "pipe": pipe(texts[0])}))
    """
)


def test_remote_code_and_pipeline_without_the_package(tmp_path, tiny, word_tokenizer, bilm):
    from transformers import pipeline

    model = _elmo_model(tiny, word_tokenizer, bilm, "cnn").eval()
    model.save_pretrained(tmp_path / "m")
    word_tokenizer.save_pretrained(tmp_path / "m")
    with torch.no_grad():
        ref = model(**word_tokenizer(*PAIRS, padding=True, return_tensors="pt")).logits
    got = run_remote_code_script(_REMOTE, tmp_path, str(tmp_path / "m"), json.dumps(PAIRS))
    assert got["module"].startswith("transformers_modules") and got["bilm"].startswith("transformers_modules")
    torch.testing.assert_close(torch.tensor(got["logits"]), ref, rtol=1e-5, atol=1e-6)
    local = pipeline("text-classification", model=model, tokenizer=word_tokenizer)(PAIRS[0])
    assert [r["label"] for r in got["pipe"]] == [r["label"] for r in local]
    for a, b in zip(got["pipe"], local):
        assert a["score"] == pytest.approx(b["score"], rel=1e-5)


@pytest.mark.parametrize("encoder_type", ENCODERS)
def test_bf16_autocast_trains(tiny, word_tokenizer, bilm, encoder_type):
    model = _elmo_model(tiny, word_tokenizer, bilm, encoder_type, elmo_dropout=0.5, elmo_at_output=True)
    batch = word_tokenizer(*PAIRS, padding=True, return_tensors="pt")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch, labels=torch.tensor([1, 2])).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert model.baseline.elmo.input_mix.gamma.grad is not None
    assert torch.isfinite(model.baseline.elmo.input_mix.scalar_parameters.grad).all()


def test_elmo_features_need_char_ids_and_a_bilm_config(tiny, word_tokenizer, bilm):
    model = _elmo_model(tiny, word_tokenizer, bilm, "cbow")
    batch = word_tokenizer(SINGLES, padding=True, return_tensors="pt")
    with pytest.raises(ValueError, match="need char_ids"):
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    with pytest.raises(ValueError, match="elmo_config"):
        tiny("cbow", elmo_config={"model_type": "sesame-bert", "projection_dim": 4, "num_layers": 2})


@pytest.mark.slow
def test_baselines_cli_adds_elmo_and_random_bilm_rows_over_seeds(
    tmp_path, word_tokenizer, bilm, make_glue_dir, monkeypatch
):
    """``--elmo FOLDER random:FOLDER --seeds 1 2``: a ``cbow+elmo`` row whose folder holds the pretrained BiLM weights,
    a ``cbow+elmo-random`` row with a fresh one of the same shape, every cell once per seed, medians in the table.
    With ``--elmo_rows_only`` (the plain ``cbow`` row is the baselines table test's): 4 cells, one process each."""
    import statistics

    from transformers import AutoModel

    from finetune.baselines import main

    word_tokenizer.save_pretrained(tmp_path / "wordtok")
    bilm.save_pretrained(tmp_path / "elmo")
    word_tokenizer.save_pretrained(tmp_path / "elmo")  # lower-casing, like the word tokenizer: accepted
    out = tmp_path / "table"
    args = ["--glue_dir", str(make_glue_dir(tmp_path / "glue")), "--tasks", "sst2", "--backbones", "cbow"]
    args += ["--tokenizer_name", str(tmp_path / "wordtok"), "--embedding_dim", "8", "--output_dir", str(out)]
    args += ["--num_train_epochs", "1", "--elmo", str(tmp_path / "elmo"), f"random:{tmp_path / 'elmo'}"]
    args += ["--elmo_rows_only"]
    assert main([*args, "--seeds", "1", "2"]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sorted((r["backbone"], r["seed"]) for r in runs) == [
        (b, s) for b in ("cbow+elmo", "cbow+elmo-random") for s in (1, 2)
    ]
    assert all("error" not in r for r in runs), runs
    for seed in (1, 2):
        pretrained = AutoModel.from_pretrained(out / f"seed-{seed}" / "models" / "cbow+elmo")
        random = AutoModel.from_pretrained(out / f"seed-{seed}" / "models" / "cbow+elmo-random")
        for name, value in bilm.state_dict().items():
            assert torch.equal(pretrained.elmo.bilm.state_dict()[name], value)
        assert not torch.equal(random.elmo.bilm.char_encoder.projection.weight, bilm.char_encoder.projection.weight)
        assert random.config.elmo_name_or_path.startswith("random:")
    table = (out / "results.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| cbow+elmo |"))
    values = [r["value"] for r in runs if r["backbone"] == "cbow+elmo"]
    assert f"{100 * statistics.median(values):.2f}" in row and " / " in row
    # --resume: every cell is in results.json with the same command, so nothing runs again
    from finetune import cells

    def no_run(*a, **k):
        raise AssertionError(f"a cell ran again: {a}")

    monkeypatch.setattr(cells.subprocess, "Popen", no_run)
    assert main([*args, "--seeds", "1", "2", "--resume"]) == 0
    assert json.loads((out / "results.json").read_text())["runs"] == runs


def test_a_bilm_cased_otherwise_than_the_word_tokenizer_is_refused(tmp_path, word_tokenizer, bilm, tiny_corpus):
    from core.errors import InputError
    from finetune.baselines import init_baseline_model
    from tokenizer.elmo_training import train_elmo_tokenizer

    word_tokenizer.save_pretrained(tmp_path / "wordtok")
    bilm.save_pretrained(tmp_path / "elmo")
    train_elmo_tokenizer([tiny_corpus], vocab_size=60, output_dir=tmp_path / "cased", lowercase=False).save_pretrained(
        tmp_path / "elmo"
    )
    with pytest.raises(InputError, match="cased text, but the baselines' word tokenizer lower-cases"):
        init_baseline_model(
            "cnn", tmp_path / "m", tokenizer_name=str(tmp_path / "wordtok"), elmo=str(tmp_path / "elmo")
        )
    assert not (tmp_path / "m").exists()
    with pytest.raises(InputError, match="expected a SesameElmo"):
        init_baseline_model("cnn", tmp_path / "m", tokenizer_name=str(tmp_path / "wordtok"), elmo="random:bert-tiny")


def test_the_layer_cache_gives_the_same_features_and_skips_the_bilm_for_known_sentences(tiny, word_tokenizer, bilm):
    cached = _elmo_model(tiny, word_tokenizer, bilm, "rnn", elmo_cache_mb=1).eval()
    plain = _elmo_model(tiny, word_tokenizer, bilm, "rnn").eval()
    plain.load_state_dict(cached.state_dict())
    calls = []
    cached.baseline.elmo.bilm.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    pairs = word_tokenizer(*PAIRS, padding=True, return_tensors="pt")
    mixed = word_tokenizer([PAIRS[0][0], "A new sentence here."], padding=True, return_tensors="pt")
    with torch.no_grad():
        for batch in (pairs, pairs, mixed):
            torch.testing.assert_close(cached(**batch).logits, plain(**batch).logits, rtol=1e-5, atol=1e-6)
    assert calls == [4, 1]  # 4 sentences, then none (all cached), then only the new one
    assert cached.baseline.elmo._cached_bytes == sum(v.numel() * 4 for v in cached.baseline.elmo._cache.values())
    tight = _elmo_model(tiny, word_tokenizer, bilm, "rnn", elmo_cache_mb=1).eval()
    tight.load_state_dict(cached.state_dict())
    tight.baseline.elmo.cache_bytes = 1  # no room: every sentence computed, none kept
    with torch.no_grad():
        torch.testing.assert_close(tight(**pairs).logits, plain(**pairs).logits, rtol=1e-5, atol=1e-6)
    assert not tight.baseline.elmo._cache
