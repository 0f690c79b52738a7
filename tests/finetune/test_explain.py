"""finetune.explain: on a task where one word decides the label, a tiny trained classifier's attributions rank
that word first; integrated gradients are complete (sum = f(x) - f(baseline)); both families; the CLI's files."""

from __future__ import annotations

import json
import random

import pytest
import torch
from _tiny import tiny_bert_kwargs, tiny_elmo_kwargs

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
def test_integrated_gradients_are_complete(bert_classifier, elmo_classifier, family):
    model, tok = bert_classifier[:2] if family == "bert" else elmo_classifier
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
