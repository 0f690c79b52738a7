"""fastText vectors (gensim) for the word tokenizer, embeddings initialised from them, and finetune.glue /
finetune.baselines runs with baseline backbones on a miniature GLUE folder."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("gensim")

#: fastText vectors of 8 dimensions and 211 n-gram buckets, 2 epochs over the words seen twice or more, seed 1.
TINY_VECTORS = dict(vector_size=8, epochs=2, min_count=2, bucket=211, seed=1)


@pytest.fixture
def vectors(tiny_corpus, word_tokenizer, tmp_path):
    from tokenizer.vectors import train_word_vectors

    train_word_vectors([tiny_corpus], tmp_path / "wordtok", tmp_path / "vectors", **TINY_VECTORS)
    return tmp_path / "vectors"


def test_vectors_are_deterministic_and_cover_the_tokenizer(vectors, tiny_corpus, tmp_path):
    from safetensors.torch import load_file

    from tokenizer.vectors import train_word_vectors

    info = train_word_vectors([tiny_corpus], tmp_path / "wordtok", tmp_path / "again", **TINY_VECTORS)
    a, b = load_file(vectors / "word_vectors.safetensors"), load_file(tmp_path / "again" / "word_vectors.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    words = (vectors / "vocab.txt").read_text().splitlines()
    assert a["vectors"].shape == (len(words), 8) and a["vectors_ngrams"].shape == (211, 8)
    assert torch.all(a["vectors"][:4] == 0)  # <pad> <S> </S> <UNK>
    assert torch.all(a["vectors"][4:].abs().sum(-1) > 0)  # every word has a vector (OOV: from its n-grams)
    assert info["tokenizer_words_in_gensim_vocab"] > 0 and info["workers"] == 1


@pytest.mark.parametrize("encoder_type", ["fasttext", "cbow", "cnn"])
def test_embeddings_from_vectors_give_gensims_word_vectors(vectors, tiny, encoder_type):
    """The model's word vector of each tokenizer word equals gensim's ``wv[word]`` (stored as ``vectors``): for
    fastText computed from the word row + hashed n-gram rows, i.e. the hashing matches gensim's."""
    from safetensors.torch import load_file

    from modeling.baselines import SesameBaselineModel, load_word_vectors
    from modeling.elmo.tokenization_elmo import SesameElmoTokenizer

    tok = SesameElmoTokenizer.from_pretrained(str(vectors))
    extra = {"embedding_mode": "multichannel"} if encoder_type == "cnn" else {}
    model = SesameBaselineModel(tiny(encoder_type, vocab_size=len(tok), ngram_buckets=211, **extra)).eval()
    load_word_vectors(model, vectors, vocab=[tok.convert_ids_to_tokens(i) for i in range(len(tok))])
    ref = load_file(vectors / "word_vectors.safetensors")["vectors"]
    ids = torch.arange(4, len(tok))
    chars = torch.tensor([tok.char_ids_for_tokens([tok.convert_ids_to_tokens(i)])[0] for i in ids.tolist()])
    if encoder_type == "fasttext":
        got = model.embeddings.fasttext_vectors(ids, chars)
    else:
        got = model.embeddings.word_embeddings(ids)
        if encoder_type == "cnn":
            torch.testing.assert_close(model.embeddings.static_embeddings(ids), ref[4:])
    torch.testing.assert_close(got, ref[4:], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="vocabulary"):
        load_word_vectors(model, vectors, vocab=["<pad>"])


def test_vectors_cli_refuses_a_wordpiece_tokenizer(tiny_corpus, tmp_path, capsys):
    from core.errors import run_cli
    from tokenizer.__main__ import main
    from tokenizer.wordpiece import train_wordpiece_tokenizer

    train_wordpiece_tokenizer([tiny_corpus], vocab_size=120, output_dir=tmp_path / "wp")
    status = run_cli(
        main,
        [
            "vectors",
            "--train_file",
            str(tiny_corpus),
            "--tokenizer_name",
            str(tmp_path / "wp"),
            "--output_dir",
            str(tmp_path / "out"),
        ],
    )
    assert status == 2 and "error: --tokenizer_name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_finetune_glue_trains_a_baseline_unchanged(vectors, tmp_path, fresh_state, make_glue_dir):
    """finetune.glue on a pair task (MRPC) with a fresh baseline folder: trains, evaluates, saves a loadable head."""
    from transformers import AutoModelForSequenceClassification

    from core.errors import run_cli
    from finetune.baselines import init_baseline_model
    from finetune.glue import main
    from modeling.baselines import SesameBaselineForSequenceClassification

    model_dir = init_baseline_model("rnn", tmp_path / "rnn", embeddings=str(vectors), rnn_hidden_size=8)
    out = tmp_path / "run"
    status = run_cli(
        main,
        [
            "--model_name_or_path",
            str(model_dir),
            "--task_name",
            "mrpc",
            "--glue_dir",
            str(make_glue_dir(tmp_path / "glue")),
            "--output_dir",
            str(out),
            "--num_train_epochs",
            "2",
            "--learning_rate",
            "1e-2",
            "--per_device_train_batch_size",
            "2",
            "--report_to",
            "none",
        ],
    )
    assert status == 0
    results = json.loads((out / "all_results.json").read_text())
    assert 0.0 <= results["eval_f1"] <= 1.0 and results["train_loss"] > 0
    head = AutoModelForSequenceClassification.from_pretrained(out)
    assert isinstance(head, SesameBaselineForSequenceClassification) and head.config.encoder_type == "rnn"
    assert head.config.id2label == {0: "not_equivalent", 1: "equivalent"} or len(head.config.id2label) == 2


@pytest.mark.slow
def test_baselines_table_cli(word_tokenizer, tmp_path, make_glue_dir):
    """python -m finetune.baselines on a miniature GLUE folder: results.json / .md / .png with one cell per run (STS-B,
    a regression, for two rows; SST-2 cells are the ELMo rows test's)."""
    from finetune.baselines import main

    out = tmp_path / "table"
    assert (
        main(
            [
                "--glue_dir",
                str(make_glue_dir(tmp_path / "glue")),
                "--tasks",
                "stsb",
                "--backbones",
                "cbow",
                "treelstm",
                "--tokenizer_name",
                str(tmp_path / "wordtok"),
                "--embedding_dim",
                "8",
                "--output_dir",
                str(out),
                "--num_train_epochs",
                "1",
            ]
        )
        == 0
    )
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {(r["task"], r["backbone"]) for r in runs} == {("stsb", "cbow"), ("stsb", "treelstm")}
    assert all("error" not in r and r["value"] is not None for r in runs), runs
    assert [r["tree_source"] for r in runs if r["backbone"] == "treelstm"][0].startswith("latent")
    table = (out / "results.md").read_text()
    assert "| cbow |" in table and "stsb pearson" in table
    assert (out / "results.png").stat().st_size > 1000


def test_baselines_cli_refuses_an_unknown_backbone_and_a_missing_tokenizer(tmp_path, capsys, make_glue_dir):
    from core.errors import run_cli
    from finetune.baselines import main

    glue = make_glue_dir(tmp_path / "glue")
    common = ["--glue_dir", str(glue), "--tasks", "sst2", "--output_dir", str(tmp_path / "t")]
    assert run_cli(main, [*common, "--backbones", "lstm-please"]) == 2
    assert "error: --backbones lstm-please" in capsys.readouterr().err
    assert run_cli(main, [*common, "--backbones", "cbow"]) == 2
    assert "--embeddings" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
