"""SesameElmoTokenizer: ELMo character ids on hand-worked examples, words, pairs, padding, training, loading."""

from __future__ import annotations

import pytest
import torch

from core.errors import InputError
from modeling.elmo.tokenization_elmo import SesameElmoTokenizer, word_to_char_ids


def _row(*head):
    """A 50-long row: the given ids, then the padding character 261."""
    return list(head) + [261] * (50 - len(head))


def test_char_ids_hand_worked():
    # "Hi": bow 259, 'H' = 0x48 = 72 -> 73, 'i' = 105 -> 106, eow 260, padding 261.
    assert word_to_char_ids("Hi") == _row(259, 73, 106, 260)
    # "é" is UTF-8 C3 A9 = 195 169 -> 196 170.
    assert word_to_char_ids("é") == _row(259, 196, 170, 260)
    # sentence markers: [bow, bos 257 | eos 258, eow]
    assert word_to_char_ids("<S>") == _row(259, 257, 260)
    assert word_to_char_ids("</S>") == _row(259, 258, 260)
    # 60 x 'a' (97 -> 98): truncated to 48 bytes, eow in the last slot.
    assert word_to_char_ids("a" * 60) == [259] + [98] * 48 + [260]
    # 25 x 'é' = 50 bytes: truncated to 48 bytes = 24 characters.
    assert word_to_char_ids("é" * 25) == [259] + [196, 170] * 24 + [260]
    # 47 bytes: one padding character left after eow
    assert word_to_char_ids("b" * 47) == [259] + [99] * 47 + [260, 261]


def test_encode_single_and_unknown_word(elmo_tokenizer):
    tok = elmo_tokenizer
    enc = tok("The whale zzzq.")
    words = ["<S>", "The", "whale", "zzzq", ".", "</S>"]
    assert enc["input_ids"] == [tok.vocab.get(w, tok.vocab["<UNK>"]) for w in words]
    assert enc["input_ids"][3] == tok.unk_token_id == 3
    assert enc["char_ids"][3] == _row(259, ord("z") + 1, ord("z") + 1, ord("z") + 1, ord("q") + 1, 260)
    assert enc["attention_mask"] == [1] * 6 and enc["token_type_ids"] == [0] * 6


def test_pair_layout_and_padding(elmo_tokenizer):
    tok = elmo_tokenizer
    batch = tok(["The sea", "A dog near the river"], ["It", "wet"], padding=True, return_tensors="pt")
    assert batch["char_ids"].shape == (2, 10, 50) and batch["char_ids"].dtype == torch.long
    v = tok.vocab
    assert batch["input_ids"][0].tolist() == [1, v["The"], v["sea"], 2, 1, v["It"], 2, 0, 0, 0]
    assert batch["token_type_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert batch["attention_mask"][0].tolist() == [1] * 7 + [0] * 3
    assert batch["token_type_ids"][1].tolist() == [0] * 7 + [1] * 3
    assert batch["attention_mask"][1].tolist() == [1] * 10
    assert (batch["char_ids"][0, 7:] == 0).all() and (batch["char_ids"][0, :7] != 0).all()


def test_pre_split_words_stay_one_token_each(elmo_tokenizer):
    enc = elmo_tokenizer(["The", "whale's", "sea"], is_split_into_words=True)
    assert len(enc["input_ids"]) == 5
    assert enc["char_ids"][2] == word_to_char_ids("whale's")
    assert enc["input_ids"][1] == elmo_tokenizer.vocab["The"] and enc["input_ids"][2] == elmo_tokenizer.unk_token_id


def test_pad_as_collator_and_truncation(elmo_tokenizer):
    tok = elmo_tokenizer
    feats = [tok("The sea"), tok("The whale rose from the sea")]
    batch = tok.pad(feats, return_tensors="pt")
    assert batch["char_ids"].shape == (2, 8, 50)
    assert torch.equal(batch["char_ids"][0, :4], torch.tensor(feats[0]["char_ids"]))
    assert (batch["char_ids"][0, 4:] == 0).all()
    cut = tok("The whale rose from the sea", "It rained in the afternoon", truncation=True, max_length=8)
    assert len(cut["input_ids"]) == 8 and cut["input_ids"].count(1) == 2 and cut["input_ids"].count(2) == 2


def test_train_vocab_frequency_order(tmp_path):
    from tokenizer.elmo_training import train_elmo_tokenizer

    corpus = tmp_path / "c.txt"
    corpus.write_text("b b b a a c\nB a b\n", encoding="utf-8")
    tok = train_elmo_tokenizer([corpus], vocab_size=100)
    assert tok.ids_to_tokens == ["<pad>", "<S>", "</S>", "<UNK>", "b", "a", "B", "c"]
    small = train_elmo_tokenizer([corpus], vocab_size=6, lowercase=True)
    assert small.ids_to_tokens == ["<pad>", "<S>", "</S>", "<UNK>", "b", "a"]
    with pytest.raises(InputError, match="vocab_size"):
        train_elmo_tokenizer([corpus], vocab_size=3)
    with pytest.raises(InputError, match="no such file"):
        train_elmo_tokenizer([tmp_path / "missing.txt"], vocab_size=10)


def test_save_load_with_auto_tokenizer(elmo_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    import modeling  # noqa: F401  (registers the tokenizer with AutoTokenizer)

    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert type(loaded) is SesameElmoTokenizer
    text = ("The sailors shouted, and Elizabeth spoke.", "A dog.")
    assert loaded(*text) == elmo_tokenizer(*text)
    assert (tmp_path / "tok" / "tokenization_elmo.py").exists()


_OLD_FOLDER_REMOTE = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("modeling", "tokenizer", "training"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
enc = tok("The sailors shouted.", "A dog.")
print(json.dumps({"module": type(tok).__module__, "input_ids": enc["input_ids"], "char_ids": enc["char_ids"]}))
"""


def test_a_folder_saved_before_the_move_still_loads(elmo_tokenizer, tmp_path):
    """Folders written while the tokenizer lived in ``tokenizer/elmo_tokenization.py`` carry that file and name it in
    ``auto_map``: they load in-process (the registered class) and as remote code (their own copy)."""
    import json
    import shutil

    from _launch import run_remote_code_script
    from transformers import AutoTokenizer

    import modeling  # noqa: F401  (registers the tokenizer with AutoTokenizer)

    old = tmp_path / "old"
    shutil.copytree(tmp_path / "tok", old)
    (old / "tokenization_elmo.py").rename(old / "elmo_tokenization.py")
    config = json.loads((old / "tokenizer_config.json").read_text())
    assert config["auto_map"]["AutoTokenizer"][0] == "tokenization_elmo.SesameElmoTokenizer"
    config["auto_map"]["AutoTokenizer"][0] = "elmo_tokenization.SesameElmoTokenizer"
    (old / "tokenizer_config.json").write_text(json.dumps(config))

    text = ("The sailors shouted.", "A dog.")
    loaded = AutoTokenizer.from_pretrained(old)
    assert type(loaded) is SesameElmoTokenizer and loaded(*text) == elmo_tokenizer(*text)
    got = run_remote_code_script(_OLD_FOLDER_REMOTE, tmp_path, str(old))
    assert got["module"].endswith("elmo_tokenization") and got["module"].startswith("transformers_modules")
    reference = elmo_tokenizer(*text)
    assert got["input_ids"] == reference["input_ids"] and got["char_ids"] == reference["char_ids"]


@pytest.mark.parametrize(
    "len_a,len_b,strategy,max_length,expected",
    [
        (5, None, "only_first", 6, (4, 0)),  # 6 - 2 markers = 4 words
        (5, 3, "only_first", 10, (3, 3)),  # 10 - 4 markers - 3 (pair kept) = 3
        (5, 3, "only_second", 10, (5, 1)),  # 10 - 4 - 5 = 1
        (5, 3, "longest_first", 10, (3, 3)),  # 5/3 -> 4/3 -> 3/3: ties cut the first
        (5, 3, "longest_first", 9, (2, 3)),  # then the tie 3/3 cuts the first: 2/3
        (2, 2, "only_second", 6, (2, 0)),  # nothing left for the pair
    ],
)
def test_truncated_lengths_by_strategy(len_a, len_b, strategy, max_length, expected):
    from transformers.tokenization_utils_base import TruncationStrategy

    from modeling.elmo.tokenization_elmo import truncated_lengths

    n_special = 2 + (2 if len_b is not None else 0)
    assert truncated_lengths(len_a, len_b, TruncationStrategy(strategy), max_length, n_special) == expected
    with pytest.raises(ValueError, match="no room"):
        truncated_lengths(len_a, len_b, TruncationStrategy(strategy), n_special - 1, n_special)
