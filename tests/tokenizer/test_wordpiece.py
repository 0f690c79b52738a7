"""WordPiece training: the saved tokenizer's pipeline, pairs, decoding, offsets, word_ids, unknown characters."""

from __future__ import annotations

import json
import types
import unicodedata

import pytest

from core.errors import InputError
from tokenizer.wordpiece import SPECIAL_TOKENS, train_wordpiece_tokenizer


def uncased(text: str) -> str:
    """What BERT's uncased normalizer does to ordinary text: lowercase, then drop combining accents (NFD)."""
    return "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")


def test_auto_tokenizer_loads_a_fast_bert_tokenizer(trained_dir, tok):
    from transformers import BertTokenizer

    assert sorted(p.name for p in trained_dir.iterdir()) == ["tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    config = json.loads((trained_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizer" and config["do_lower_case"] is True
    assert isinstance(tok, BertTokenizer) and tok.is_fast
    assert tok.model_max_length == 512 and len(tok) == 200
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    # vocab.txt: line number = id, as BERT's vocabulary files
    assert (trained_dir / "vocab.txt").read_text(encoding="utf-8").splitlines() == tok.convert_ids_to_tokens(
        list(range(len(tok)))
    )
    # the backend pipeline is BERT's
    spec = json.loads((trained_dir / "tokenizer.json").read_text())
    assert spec["normalizer"]["type"] == "BertNormalizer" and spec["normalizer"]["lowercase"] is True
    assert spec["pre_tokenizer"]["type"] == "BertPreTokenizer"
    assert spec["model"]["type"] == "WordPiece" and spec["model"]["continuing_subword_prefix"] == "##"
    assert spec["decoder"]["type"] == "WordPiece" and spec["decoder"]["prefix"] == "##"
    assert spec["post_processor"]["type"] == "TemplateProcessing"


def test_in_memory_and_reloaded_tokenizers_agree(trained, tok):
    again = trained[0]  # the object train_wordpiece_tokenizer returned along with saving
    texts = ["The Senate adjourned.", "Unbelievable negotiations, she didn't! 😀 東京", "Café au lait"]
    for text in texts:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.get_vocab() == tok.get_vocab()


def test_single_and_pair_templates_and_token_type_ids(tok):
    a, b = "The Senate adjourned.", "It rained."
    single = tok(a)
    assert single.tokens()[0] == "[CLS]" and single.tokens()[-1] == "[SEP]" and "[SEP]" not in single.tokens()[1:-1]
    assert single["token_type_ids"] == [0] * len(single["input_ids"])
    assert single["attention_mask"] == [1] * len(single["input_ids"])

    pair = tok(a, b)
    toks = pair.tokens()
    n_a = len(tok.tokenize(a))
    n_b = len(tok.tokenize(b))
    assert len(toks) == n_a + n_b + 3
    assert toks[0] == "[CLS]" and toks[n_a + 1] == "[SEP]" and toks[-1] == "[SEP]"
    assert toks[1 : n_a + 1] == tok.tokenize(a) and toks[n_a + 2 : -1] == tok.tokenize(b)
    assert pair["token_type_ids"] == [0] * (n_a + 2) + [1] * (n_b + 1)
    assert pair.sequence_ids() == [None] + [0] * n_a + [None] + [1] * n_b + [None]


@pytest.mark.parametrize(
    "text",
    [
        "The Senate adjourned.",
        "It rained in the afternoon, and the streets were wet! Yes!",
        "Is the treaty ratified?",
        'Unbelievable negotiations, she didn\'t know whether "Nothing" (said the captain) was certain.',
        "Café society; naïve travellers -- agriculture & navigation: 1803.",
    ],
)
def test_decode_round_trips_modulo_case_accents_and_spaces(tok, text):
    """Guaranteed: the decoded text equals the normalized text up to whitespace (the decoder joins
    ``##`` pieces, puts one space between words and removes the one before . , ? !)."""
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id not in ids  # every character of these texts is in the corpus alphabet
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert decoded.split() == decoded.split(" ")  # single spaces only
    assert "".join(decoded.split()) == "".join(uncased(text).split())
    # words separated by spaces with . , ? ! attached: decoding gives the lowercased text exactly
    if all(c.isalnum() or c in " .,?!" for c in text):
        assert decoded == text.lower()


def test_decode_of_a_pair_and_with_special_tokens(tok):
    enc = tok("The Senate adjourned.", "It rained.")
    assert tok.decode(enc["input_ids"], skip_special_tokens=True) == "the senate adjourned. it rained."
    assert tok.decode(enc["input_ids"]) == "[CLS] the senate adjourned. [SEP] it rained. [SEP]"


def test_unknown_characters_become_unk_with_offsets(tok):
    text = "the 😀 ship 東京 sailed ❤"
    enc = tok(text, return_offsets_mapping=True)
    pieces = [(t, text[s:e]) for t, (s, e) in zip(enc.tokens(), enc["offset_mapping"]) if t not in ("[CLS]", "[SEP]")]
    unk = [original for t, original in pieces if t == "[UNK]"]
    assert unk == ["😀", "東", "京", "❤"]  # CJK ideographs are words of their own (BERT's CJK handling)
    assert tok.decode(enc["input_ids"], skip_special_tokens=True).split()[0] == "the"
    # a word with one unknown character is one [UNK] (WordPiece), a batch with padding still works
    batch = tok(["sea€sea", "the sea"], padding=True, return_tensors=None)
    assert batch.tokens(1) == ["[CLS]", "the", "sea", "[SEP]"]
    assert batch["input_ids"][0] == [2, 1, 3] + [0] * (len(batch["input_ids"][1]) - 3)


def test_offsets_map_tokens_back_to_the_original_text(tok):
    a = "Café owners adjourned Negotiations; the Whale rose."
    b = "She DIDN'T know."
    enc = tok(a, b, return_offsets_mapping=True)
    for token, (start, end), seq in zip(enc.tokens(), enc["offset_mapping"], enc.sequence_ids()):
        if seq is None:
            assert (start, end) == (0, 0)
            continue
        original = (a, b)[seq][start:end]
        assert token == "[UNK]" or uncased(original) == token.removeprefix("##"), (token, original)
    # offsets of a word's pieces are contiguous and cover the word
    word_spans = {}
    for w, (start, end), seq in zip(enc.word_ids(), enc["offset_mapping"], enc.sequence_ids()):
        if seq == 0:
            word_spans.setdefault(w, []).append((start, end))
    for spans in word_spans.values():
        assert all(prev[1] == nxt[0] for prev, nxt in zip(spans, spans[1:]))
    assert [a[s[0][0] : s[-1][1]] for s in word_spans.values()] == [
        "Café", "owners", "adjourned", "Negotiations", ";", "the", "Whale", "rose", ".",
    ]  # fmt: skip


def test_word_ids_group_the_pieces_of_a_word(tok):
    text = "unbelievable ratification adjourned negotiations"
    enc = tok(text)
    tokens, word_ids = enc.tokens()[1:-1], enc.word_ids()[1:-1]
    assert any(t.startswith("##") for t in tokens)  # some words are split into pieces
    assert word_ids == sorted(word_ids) and sorted(set(word_ids)) == [0, 1, 2, 3]
    for i, (token, w) in enumerate(zip(tokens, word_ids)):
        starts_word = i == 0 or word_ids[i - 1] != w
        assert token.startswith("##") != starts_word, (token, i)
    words = ["".join(t.removeprefix("##") for t, w2 in zip(tokens, word_ids) if w2 == w) for w in range(4)]
    assert words == text.split()
    assert enc.word_ids()[0] is None and enc.word_ids()[-1] is None


def test_truncation_to_model_max_length(tok):
    enc = tok(" ".join(["the senate adjourned"] * 400), truncation=True)
    assert len(enc["input_ids"]) == 512 and enc.tokens()[-1] == "[SEP]"


def test_gz_and_several_files(tmp_path, write_lines, corpus_lines):
    plain = write_lines(tmp_path / "a.txt", corpus_lines(4))
    gz = write_lines(tmp_path / "b.txt.gz", ["Zeppelins hovered over Quixotic harbours."] * 30)
    tok = train_wordpiece_tokenizer([plain, gz], vocab_size=300)
    only_a = train_wordpiece_tokenizer([plain], vocab_size=300)
    vocab = tok.get_vocab()
    assert {"zeppelins", "quixotic", "harbours", "adjourned"} <= set(vocab)  # words of both files
    assert "zeppelins" not in only_a.get_vocab()
    assert tok.tokenize("Zeppelins adjourned") == ["zeppelins", "adjourned"]


def test_lowercase_and_no_lowercase(tmp_path, corpus_file):
    cased = train_wordpiece_tokenizer([corpus_file], vocab_size=200, lowercase=False, output_dir=tmp_path / "c")
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(tmp_path / "c")
    assert json.loads((tmp_path / "c" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    for t in (cased, reloaded):
        assert "The" in t.get_vocab() and "the" in t.get_vocab()
        assert t.tokenize("The Senate")[0] == "The"
        text = "The Senate adjourned, Congress rose."
        assert t.decode(t(text)["input_ids"], skip_special_tokens=True) == text  # exact, case included
        assert "é" in t.decode(t("café")["input_ids"], skip_special_tokens=True)  # accents kept
    uncased_tok = train_wordpiece_tokenizer([corpus_file], vocab_size=200, lowercase=True)
    assert not any(c.isupper() for token in uncased_tok.get_vocab() for c in token if token not in SPECIAL_TOKENS)
    assert uncased_tok.tokenize("THE Café") == uncased_tok.tokenize("the cafe")


def test_vocab_size_and_min_frequency(corpus_file):
    small = train_wordpiece_tokenizer([corpus_file], vocab_size=120)
    assert len(small) == 120
    # min_frequency: a piece must occur that often; a huge threshold leaves only specials + alphabet
    rare = train_wordpiece_tokenizer([corpus_file], vocab_size=200, min_frequency=10**6)
    assert all(len(t.removeprefix("##")) == 1 for t in rare.get_vocab() if t not in SPECIAL_TOKENS)


def test_training_pulls_the_corpus_lazily_in_batches(monkeypatch, corpus_file):
    """The trainer gets a generator of batches of at most ``batch_size`` lines, not a list of the corpus."""
    import tokenizer.wordpiece as wordpiece

    seen = []
    original = wordpiece.iter_text_batches

    def spy(*args, **kwargs):
        gen = original(*args, **kwargs)
        seen.append(gen)
        return gen

    monkeypatch.setattr(wordpiece, "iter_text_batches", spy)
    train_wordpiece_tokenizer([corpus_file], vocab_size=150, batch_size=7)
    # two trainer passes (the alphabet, then the vocabulary: see the reproducibility note in wordpiece.py)
    assert len(seen) == 2 and all(isinstance(g, types.GeneratorType) for g in seen)
    assert all(g.gi_frame is None for g in seen)  # fully consumed by the trainer
    assert max(len(batch) for batch in original([corpus_file], batch_size=7)) == 7


def test_vocab_size_too_small_for_specials_or_alphabet(tmp_path, corpus_file):
    with pytest.raises(InputError, match=r"--vocab_size 5\b.*special tokens"):
        train_wordpiece_tokenizer([corpus_file], vocab_size=5, output_dir=tmp_path / "out")
    with pytest.raises(InputError, match=r"--vocab_size 40: too small for this corpus.*expected --vocab_size >= (\d+)"):
        train_wordpiece_tokenizer([corpus_file], vocab_size=40, output_dir=tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left
