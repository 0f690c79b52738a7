"""finetune.explain: on a task where one word decides the label, a tiny trained classifier's attributions rank
that word first; integrated gradients are complete (sum = f(x) - f(baseline)); both families; the CLI's files."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch
from _tiny import modern_layout, tiny_bert_kwargs, tiny_elmo_kwargs

from core.errors import InputError, run_cli
from finetune import explain as ex

FILLERS = (
    "the a cat dog sat on mat it was warm film movie story he said man is playing flute plane and of to in".split()
)
DECIDERS = {"good": 1, "bad": 0}


def synthetic(n: int, seed: int) -> list[tuple[str, int]]:
    """Sentences of 4-8 filler words with "good" (label 1) or "bad" (label 0) at a random place."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(FILLERS) for _ in range(rng.randint(4, 8))]
        decider = rng.choice(sorted(DECIDERS))
        words.insert(rng.randrange(len(words) + 1), decider)
        rows.append((" ".join(words), DECIDERS[decider]))
    return rows


def _train(model, tokenizer, rows, steps: int = 120, lr: float = 3e-3) -> None:
    torch.manual_seed(0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for step in range(steps):
        batch = rows[(step * 16) % len(rows) :][:16]
        enc = tokenizer([t for t, _ in batch], padding=True, return_tensors="pt")
        loss = model(**enc, labels=torch.tensor([y for _, y in batch])).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module")
def bert_classifier(tmp_path_factory):
    from transformers import BertTokenizer

    from modeling import SesameBertConfig, SesameBertForSequenceClassification

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(specials + FILLERS + sorted(DECIDERS))})
    config = SesameBertConfig(
        **tiny_bert_kwargs(
            len(tok), 32, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
        )
    )
    torch.manual_seed(0)
    model = SesameBertForSequenceClassification(config)
    _train(model, tok, synthetic(480, seed=0))
    path = tmp_path_factory.mktemp("explain-bert")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok, path


@pytest.fixture(scope="module")
def elmo_classifier(tmp_path_factory):
    from modeling.elmo import SesameElmoConfig, SesameElmoForSequenceClassification
    from tokenizer.elmo_training import train_elmo_tokenizer

    root = tmp_path_factory.mktemp("explain-elmo")
    (root / "corpus.txt").write_text(" ".join(FILLERS + sorted(DECIDERS)) + "\n")
    tok = train_elmo_tokenizer([root / "corpus.txt"], vocab_size=100, output_dir=root / "tok")
    config = SesameElmoConfig(
        **tiny_elmo_kwargs(
            len(tok), num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
        )
    )
    torch.manual_seed(0)
    model = SesameElmoForSequenceClassification(config)  # frozen random BiLM, trained ScalarMix + head
    _train(model, tok, synthetic(320, seed=1), steps=200, lr=5e-3)
    return model, tok


def _decider_first_rate(model, tok, method: str, rows) -> float:
    hits = 0
    for text, _ in rows:
        top = ex.top_words(ex.explain(model, tok, text, method=method, n_steps=24, max_steps=24), k=1)[0][0]
        hits += top in DECIDERS
    return hits / len(rows)


@pytest.mark.parametrize("method", ex.METHODS)
def test_the_deciding_word_ranks_first(bert_classifier, method):
    model, tok, _ = bert_classifier
    rows = synthetic(40, seed=123)
    with torch.no_grad():
        enc = tok([t for t, _ in rows], padding=True, return_tensors="pt")
        accuracy = (model(**enc).logits.argmax(-1) == torch.tensor([y for _, y in rows])).float().mean()
    assert accuracy == 1.0  # the model learned the task, so the deciding word is the explanation
    assert _decider_first_rate(model, tok, method, rows) >= 0.9


def test_elmo_attributions_on_layer_0_rank_the_deciding_word_first(elmo_classifier):
    model, tok = elmo_classifier
    rows = synthetic(30, seed=7)
    for method in ("input_x_gradient", "integrated_gradients"):
        assert _decider_first_rate(model, tok, method, rows) >= 0.9, method
    assert model.config.freeze_backbone is True  # restored after explaining


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_elmo_explanation_on_cuda_matches_the_cpu(elmo_classifier):
    """Gradients through SesameElmo's LSTMs in eval mode on CUDA (cuDNN alone refuses that backward pass): the
    same word scores as on the CPU."""
    import copy

    model, tok = elmo_classifier
    text = "he said the film was bad"
    on_cpu = ex.explain(model, tok, text, method="input_x_gradient")
    on_gpu = ex.explain(copy.deepcopy(model).to("cuda"), tok, text, method="input_x_gradient")
    assert [w["word"] for w in on_gpu["words"]] == [w["word"] for w in on_cpu["words"]]
    for g, c in zip(on_gpu["words"], on_cpu["words"]):
        assert g["score"] == pytest.approx(c["score"], rel=1e-3, abs=1e-4)


@pytest.mark.parametrize("family", ["bert", "elmo"])
def test_integrated_gradients_are_complete(brief_bert, elmo_classifier, family):
    model, tok = brief_bert if family == "bert" else elmo_classifier
    for text, pair in (("the cat is good and warm", None), ("he said the film was bad", "a man is playing")):
        e = ex.explain(model, tok, text, pair, method="integrated_gradients", n_steps=64)
        gap = e["score"] - e["baseline_score"]
        total = sum(t["score"] for t in e["tokens"])
        assert abs(total - gap) <= 0.05 * abs(gap), (total, gap)
        assert sum(w["score"] for w in e["words"]) == pytest.approx(
            sum(t["score"] for t, special in zip(e["tokens"], _special(tok, text, pair)) if not special), abs=1e-6
        )
        if pair is not None:
            assert {w["segment"] for w in e["words"]} == {0, 1}
            assert [w["word"] for w in e["words"] if w["segment"] == 1] == pair.split()


def _briefly_trained(modern: bool):
    """A classifier of bert-tiny's layout (2 layers) or modernbert-tiny's (``_tiny.modern_layout``: rotary positions,
    so no position embedding is added before the embedding norm; GeGLU, pre-norm, local layers in a 16-token window;
    3 layers), width 32, trained briefly on the one-word task (60 steps at 1e-3: p(label) about 0.8-0.9; the
    :func:`bert_classifier` trained to p > 0.998 switches within 0.6% of the path from [MASK] and needs 3200 points,
    100 s on a shared CPU). Returns ``(model, tokenizer)``."""
    from transformers import BertTokenizer

    from modeling import SesameBertConfig, SesameBertForSequenceClassification

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(specials + FILLERS + sorted(DECIDERS))})
    labels = dict(num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    kwargs = tiny_bert_kwargs(len(tok), 64, layers=3 if modern else 2, **labels)
    kwargs.update(modern_layout(local_attention=16) if modern else {})
    torch.manual_seed(0)
    model = SesameBertForSequenceClassification(SesameBertConfig(**kwargs))
    _train(model, tok, synthetic(480, seed=0), steps=60, lr=1e-3)
    return model, tok


@pytest.fixture(scope="module")
def brief_bert():
    return _briefly_trained(modern=False)


@pytest.fixture(scope="module")
def brief_modern():
    return _briefly_trained(modern=True)


@pytest.fixture(params=["bert", "modern"])
def layout_classifier(request, brief_bert, brief_modern):
    """:func:`_briefly_trained` of either layout."""
    return brief_bert if request.param == "bert" else brief_modern


def test_integrated_gradients_are_complete_on_every_layout_at_the_default_steps(layout_classifier, caplog):
    """Issue 49: from a zero baseline the embedding norm of the ModernBERT layout (no position embedding added before
    it) maps every point of the path to the same vector except next to α = 0, and integrated gradients missed
    completeness by 270-600%. From the [MASK] baseline the scores sum to f(x) - f(x') within 5% at the defaults
    (no warning), on gaps of more than a nat (the deciding word flips the baseline's prediction), on bert-tiny's and
    modernbert-tiny's layouts, with 0 for the special tokens (kept in the baseline) and the deciding word first."""
    model, tok = layout_classifier
    for text, pair in (("he said the film was bad", None), ("the movie was bad", None), ("a cat is good", "he sat")):
        e = ex.explain(model, tok, text, pair, method="integrated_gradients")
        gap, total = e["score"] - e["baseline_score"], sum(t["score"] for t in e["tokens"])
        assert abs(total - gap) <= max(0.05 * abs(gap), 1e-4), (total, gap, e["n_steps"])
        assert e["baseline"] == ex.BASELINES["mask"]
        assert all(t["score"] == 0.0 for t, s in zip(e["tokens"], _special(tok, text, pair)) if s)
        assert not caplog.records  # complete within 3200 points
        if pair is None:  # "bad" flips the prediction of the [MASK] baseline: the completeness is about > 1 nat
            assert abs(gap) > 1.0 and ex.top_words(e, k=1)[0][0] == "bad", gap


def test_a_gap_that_more_points_cannot_close_says_why(layout_classifier, caplog):
    """Where the score jumps next to the baseline the warning says that more points cannot close the gap, and where
    it jumps, instead of advising --max_steps: the modern layout from the zero baseline with word embeddings 100 times
    larger (the model's function barely changes, the embedding norm maps them to the same vectors; the path's jump
    moves to α < 0.01, as in the saturated models of issue 49). bert-tiny's smooth path from the [MASK] baseline
    stopped early (4 points) is told to raise --max_steps."""
    import copy

    model, tok = layout_classifier
    modern = model.config.position_embedding_type == "rope"
    if modern:
        model = copy.deepcopy(model)
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(100.0)
    inputs, meta = ex._encode(tok, "he said the film was bad", None, 64)
    layer0 = ex.Layer0(model)
    f, x, extra = ex._score_fn(layer0, False, list(inputs)), layer0.representations(inputs), tuple(inputs.values())
    with torch.no_grad():
        out = f(x, *extra)[0]
    label = int(out.argmax())
    mask, _ = layer0.baseline(inputs, torch.tensor(meta["special"], dtype=torch.bool), tok)
    baseline, kind = (torch.zeros_like(x), "zero") if modern else (mask, "mask")
    with caplog.at_level(logging.WARNING, logger="finetune.explain"):
        ex._integrated_gradients(f, x.requires_grad_(), baseline, kind, extra, label, float(out[label]), 4, 16, 0.05)
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("integrated gradients: the scores miss f(x) - f(baseline) = ")
    if modern:
        assert "more points cannot close it: the score changes by " in message and "--max_steps" not in message
    else:
        assert message.endswith("more points may close it: raise --max_steps")


def test_the_incompleteness_warning_names_the_reason():
    smooth = [0.0, 0.0, 0.0, 0.0, 0.01, 0.1]  # f near the baseline: no jump
    assert _reason(6.0, [(50, 3.0), (200, 2.0), (800, 1.5)], smooth) == "more points do not shrink it"
    assert _reason(6.0, [(50, 3.0), (200, 1.0), (800, 0.9)], smooth) == "raise --max_steps"
    assert _reason(6.0, [(50, 3.0)], smooth) == "raise --max_steps"
    jump = [0.0, 0.0, 0.0, 0.1, 3.5, 3.6]
    assert _reason(6.0, [(50, 3.0), (200, 1.0)], jump) == "more points cannot close it"


def _reason(gap, deltas, near) -> str:
    message = ex._incompleteness(gap, deltas, near)
    reasons = ("more points cannot close it", "more points do not shrink it", "raise --max_steps")
    (found,) = [r for r in reasons if r in message]
    return found


def _special(tok, text, pair):
    return tok(text, pair, return_special_tokens_mask=True)["special_tokens_mask"]


def test_word_pieces_are_merged_into_words():
    # "goodness" = good ##ness (touching spans) -> one word; [CLS]/[SEP] -> no word; the pair's words -> segment 1
    offsets = [(0, 0), (0, 3), (4, 8), (8, 12), (13, 16), (0, 0), (0, 3), (0, 0)]
    special = [1, 0, 0, 0, 0, 1, 0, 1]
    segments = [0, 0, 0, 0, 0, 0, 1, 1]
    assert ex.merge_word_pieces(offsets, special, segments) == [[1], [2, 3], [4], [6]]


def test_bf16_autocast_gives_the_same_top_word(bert_classifier):
    model, tok, _ = bert_classifier
    for text, _ in synthetic(5, seed=9):
        reference = ex.top_words(ex.explain(model, tok, text, method="input_x_gradient"), k=1)[0][0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = ex.explain(model, tok, text, method="input_x_gradient")
        assert ex.top_words(low, k=1)[0][0] == reference


def test_cli_writes_json_html_and_png(bert_classifier, tmp_path, capsys):
    import matplotlib.image

    _, _, path = bert_classifier
    out = tmp_path / "explain"
    texts = ["the cat is good", "he said the movie was bad", "a man is playing the flute"]
    argv = [
        "--model_name_or_path",
        str(path),
        "--method",
        "integrated_gradients",
        "--max_steps",
        "200",
        "--target",
        "positive",
        "--output_dir",
        str(out),
    ]
    for t in texts:
        argv += ["--text", t]
    assert run_cli(ex.main, argv) == 0
    data = json.loads((out / "explanations.json").read_text())
    assert [e["text"] for e in data] == texts and all(e["label"] == "positive" for e in data)
    assert [w["word"] for w in data[0]["words"]] == ["the", "cat", "is", "good"]
    page = (out / "explanations.html").read_text()
    assert page.count('class="w"') == sum(len(t.split()) for t in texts) and "positive" in page
    assert matplotlib.image.imread(out / "explanations.png").shape[0] == 3 * 280
    assert "top words" in capsys.readouterr().out
    # bad input: one error line, nothing written
    bad = tmp_path / "bad"
    assert (
        run_cli(
            ex.main, ["--model_name_or_path", str(path), "--text", "x", "--target", "neutral", "--output_dir", str(bad)]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the weights' loading bar
    assert err.startswith(
        "error: --target 'neutral': not a label of the model; expected one of ['negative', 'positive']"
    )
    assert not bad.exists()
    with pytest.raises(InputError, match="--text_pair given 2 time"):
        ex.main(
            [
                "--model_name_or_path",
                str(path),
                "--text",
                "x",
                "--text_pair",
                "a",
                "--text_pair",
                "b",
                "--output_dir",
                str(bad),
            ]
        )
