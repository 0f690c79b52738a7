"""Packing (no token lost, no padding), NSP sentence pairs, BiLM batches."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset, DatasetDict

from core.errors import InputError
from pretrain import data
from pretrain.collators import BiLMCollator, MLMCollator


def _tokenized(bert_tokenizer, docs):
    texts = ["\n".join(d) for d in docs]
    raw = DatasetDict(
        {"train": Dataset.from_dict({"text": texts}), "validation": Dataset.from_dict({"text": texts[:2]})}
    )
    return data.tokenize_bert(raw, bert_tokenizer)


def test_load_raw_datasets_reads_documents_from_txt_and_gz(tmp_path, corpus_tools):
    docs = corpus_tools.random_documents(7, seed=3)
    train = corpus_tools.write_corpus(tmp_path / "a.txt.gz", docs)
    valid = corpus_tools.write_corpus(tmp_path / "b.txt", docs[:2])
    raw = data.load_raw_datasets([str(train)], str(valid))
    assert [t.strip() for t in raw["train"]["text"]] == ["\n".join(d) for d in docs]
    assert len(raw["validation"]) == 2
    split = data.load_raw_datasets([str(train)], None, validation_split_percentage=30)
    assert len(split["train"]) + len(split["validation"]) == 7 and len(split["validation"]) >= 1


def test_load_raw_datasets_refuses_missing_and_empty_files(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        data.load_raw_datasets([str(tmp_path / "missing.txt")], None)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(InputError, match="empty"):
        data.load_raw_datasets([str(tmp_path / "empty.txt")], None)


def test_packing_loses_no_token_and_has_no_padding(bert_tokenizer, corpus_tools):
    docs = corpus_tools.random_documents(40, seed=4)
    tok = _tokenized(bert_tokenizer, docs)
    L = 32
    packed = data.pack_blocks(tok, L, bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id, batch_size=1000)[
        "train"
    ]
    # every block but the last is exactly L tokens, and starts with [CLS]
    lengths = [len(x) for x in packed["input_ids"]]
    assert all(n == L for n in lengths[:-1]) and 2 <= lengths[-1] <= L
    assert all(x[0] == bert_tokenizer.cls_token_id for x in packed["input_ids"])
    # the blocks without their [CLS] are the documents joined by [SEP], in order, nothing lost
    stream = [t for x in packed["input_ids"] for t in x[1:]]
    expected = [t for d in tok["train"]["input_ids"] for t in d + [bert_tokenizer.sep_token_id]]
    assert stream == expected
    # word-start flags travel with their tokens (forced to 1 at each block's first body token)
    ws_stream = [w for x in packed["word_start"] for w in x[1:]]
    ws_expected = [w for d in tok["train"]["word_start"] for w in d + [1]]
    starts = set(range(0, len(ws_stream), L - 1))
    assert all(a == b or i in starts for i, (a, b) in enumerate(zip(ws_stream, ws_expected)))
    # a batch of full blocks has no padding
    collator = MLMCollator(bert_tokenizer)
    batch = collator(data.IndexedDataset(packed).__getitems__(list(range(8))))
    assert batch["input_ids"].shape == (8, L) and "attention_mask" not in batch, "full blocks need no mask"


def test_packing_map_batches_keep_their_remainders(bert_tokenizer, corpus_tools):
    tok = _tokenized(bert_tokenizer, corpus_tools.random_documents(25, seed=5))
    packed = data.pack_blocks(tok, 16, bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id, batch_size=10)["train"]
    n_tokens = sum(len(d) + 1 for d in tok["train"]["input_ids"])
    assert sum(len(x) - 1 for x in packed["input_ids"]) == n_tokens
    assert sum(len(x) < 16 for x in packed["input_ids"]) <= 3  # at most one short block per map batch


def test_nsp_pairs(bert_tokenizer, corpus_tools):
    docs = corpus_tools.random_documents(120, seed=6, lines=(4, 10), words=(3, 12))
    tok = _tokenized(bert_tokenizer, docs)
    L = 48
    pairs = data.make_nsp_pairs(tok, L, bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id, seed=0)["train"]
    labels = pairs["next_sentence_label"]
    assert abs(sum(labels) / len(labels) - 0.5) < 0.08, f"{sum(labels)} NotNext of {len(labels)}"
    doc_streams = [" ".join(map(str, d)) for d in tok["train"]["input_ids"]]
    cls, sep = bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id
    continuing_not_next = 0
    for ids, types, ws, label in zip(pairs["input_ids"], pairs["token_type_ids"], pairs["word_start"], labels):
        assert len(ids) <= L and len(types) == len(ids) == len(ws)
        assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2
        cut = ids.index(sep)
        a, b = ids[1:cut], ids[cut + 1 : -1]
        assert a and b
        assert types == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        joined = " ".join(map(str, a + b))
        contiguous = any(f" {joined} " in f" {s} " for s in doc_streams)
        if label == 0:
            assert contiguous, "IsNext: A followed by B is a contiguous span of one document"
        else:
            continuing_not_next += contiguous
    # NotNext pairs take B from another document: (almost) never the continuation of A
    assert continuing_not_next <= 0.02 * sum(labels)


def test_nsp_batch_for_the_pretraining_model(bert_tokenizer, corpus_tools):
    tok = _tokenized(bert_tokenizer, corpus_tools.random_documents(20, seed=7))
    pairs = data.make_nsp_pairs(tok, 40, bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id, seed=0)["train"]
    batch = MLMCollator(bert_tokenizer, seed=0)(data.IndexedDataset(pairs).__getitems__(list(range(6))))
    assert set(batch) == {"input_ids", "attention_mask", "labels", "token_type_ids", "next_sentence_label"}
    assert batch["next_sentence_label"].shape == (6,)
    pad = batch["attention_mask"] == 0
    assert (batch["labels"][pad] == -100).all() and (batch["token_type_ids"][pad] == 0).all()


def test_bilm_batches_keep_characters_of_unknown_words(tmp_path, corpus_tools):
    from modeling.elmo.tokenization_elmo import word_to_char_ids
    from tokenizer.elmo_training import train_elmo_tokenizer

    docs = corpus_tools.random_documents(10, seed=8)
    corpus = corpus_tools.write_corpus(tmp_path / "c.txt", docs)
    tokenizer = train_elmo_tokenizer([corpus], 30, tmp_path / "elmo")  # small: many words are <UNK>
    raw = DatasetDict(
        {
            "train": Dataset.from_dict({"text": ["\n".join(d) for d in docs]}),
            "validation": Dataset.from_dict({"text": ["a b"]}),
        }
    )
    tok = data.tokenize_elmo(raw, tokenizer)
    packed = data.pack_blocks(tok, 16, None, None)["train"]
    stream = [w for x in packed["words"] for w in x]
    assert stream == [w for d in tok["train"]["words"] for w in d], "no word lost"
    first = tok["train"]["words"][0]
    assert first[0] == "<S>" and first.count("<S>") == first.count("</S>") == len(docs[0])
    examples = data.IndexedDataset(packed).__getitems__([0, len(packed) - 1])
    batch = BiLMCollator(tokenizer)(examples)
    T = max(len(e["input_ids"]) for e in examples)
    assert batch["char_ids"].shape == (2, T, 50)
    assert torch.equal(batch["labels"][batch["attention_mask"] == 1], batch["input_ids"][batch["attention_mask"] == 1])
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()
    unk = tokenizer.unk_token_id
    words = examples[0]["words"]
    for t, w in enumerate(words):
        assert batch["char_ids"][0, t].tolist() == word_to_char_ids(w), "characters of the real word, <UNK> or not"
    assert any(i == unk for i in examples[0]["input_ids"]), "the fixture has unknown words"


def test_bilm_targets_with_the_model(tmp_path, corpus_tools):
    """The collator's labels are what the BiLM needs: its forward loss predicts labels[t+1], backward labels[t-1]."""
    import modeling
    from tokenizer.elmo_training import train_elmo_tokenizer

    docs = corpus_tools.random_documents(6, seed=9)
    tokenizer = train_elmo_tokenizer([corpus_tools.write_corpus(tmp_path / "c.txt", docs)], 40, tmp_path / "elmo")
    raw = DatasetDict(
        {
            "train": Dataset.from_dict({"text": ["\n".join(d) for d in docs]}),
            "validation": Dataset.from_dict({"text": ["a b"]}),
        }
    )
    packed = data.pack_blocks(data.tokenize_elmo(raw, tokenizer), 12, None, None)["train"]
    batch = BiLMCollator(tokenizer)(data.IndexedDataset(packed).__getitems__([0, 1, len(packed) - 1]))
    config = modeling.get_preset_config(
        "elmo-small",
        vocab_size=len(tokenizer),
        cnn_filters=[[1, 8], [2, 8]],
        projection_dim=16,
        cell_size=32,
        num_layers=1,
        dropout=0.0,
    )
    model = modeling.SesameElmoForBidirectionalLM(config).eval()
    out = model(**batch)
    n_rows_real = batch["attention_mask"].sum(1)
    assert int(out.forward_num_tokens) == int((n_rows_real - 1).sum()) == int(out.backward_num_tokens)
    from pretrain.objectives import bilm_weight

    assert bilm_weight(batch) == int(out.forward_num_tokens)
