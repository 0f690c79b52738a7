"""MLM masking: statistics on 100k tokens, whole-word coverage, determinism of the per-example generators."""

from __future__ import annotations

import torch

from pretrain.collators import MLMCollator, mask_tokens


def _blocks(tokenizer, n_blocks: int, length: int, seed: int = 0, word_len: int = 1):
    """Blocks of random non-special ids; with word_len > 1 every word has word_len pieces."""
    g = torch.Generator().manual_seed(seed)
    special = set(tokenizer.all_special_ids)
    allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    out = []
    for b in range(n_blocks):
        ids = allowed[torch.randint(len(allowed), (length,), generator=g)].tolist()
        ids[0] = tokenizer.cls_token_id
        starts = [1 if (j - 1) % word_len == 0 or j == 0 else 0 for j in range(length)]
        out.append({"input_ids": ids, "word_start": starts, "index": b})
    return out


def test_masking_statistics_on_100k_tokens(bert_tokenizer):
    collator = MLMCollator(bert_tokenizer, mlm_probability=0.15, seed=3)
    examples = _blocks(bert_tokenizer, 800, 126)  # 800 x 125 candidates = 100k tokens
    batch = collator(examples)
    original = torch.tensor([e["input_ids"] for e in examples])
    candidates = original != bert_tokenizer.cls_token_id
    selected = batch["labels"] != -100
    n_cand, n_sel = int(candidates.sum()), int(selected.sum())
    assert n_cand == 100_000
    assert abs(n_sel / n_cand - 0.15) < 0.01
    assert not (selected & ~candidates).any(), "special tokens are never selected"
    assert torch.equal(batch["labels"][selected], original[selected]), "labels are the original ids"
    assert torch.equal(batch["input_ids"][~selected], original[~selected]), "unselected tokens are untouched"
    masked = (batch["input_ids"] == bert_tokenizer.mask_token_id) & selected
    kept = (batch["input_ids"] == original) & selected
    randomised = selected & ~masked & ~kept
    # a random replacement can draw the original id (1/|vocab|): count those with the kept ones, as the reference does
    assert abs(int(masked.sum()) / n_sel - 0.8) < 0.01
    assert abs(int(randomised.sum()) / n_sel - 0.1 * (1 - 1 / len(collator.random_ids))) < 0.01
    assert abs(int(kept.sum()) / n_sel - (0.1 + 0.1 / len(collator.random_ids))) < 0.01
    assert not torch.isin(batch["input_ids"][randomised], collator.special_ids).any(), "random tokens are not special"
    assert "attention_mask" not in batch, "packed blocks have no padding: the collator leaves the mask out"


def test_configurable_replacement_probabilities(bert_tokenizer):
    collator = MLMCollator(bert_tokenizer, mlm_probability=0.3, mask_replace_prob=0.5, random_replace_prob=0.5, seed=1)
    examples = _blocks(bert_tokenizer, 300, 101)
    batch = collator(examples)
    original = torch.tensor([e["input_ids"] for e in examples])
    selected = batch["labels"] != -100
    assert abs(int(selected.sum()) / 30_000 - 0.3) < 0.01
    masked = (batch["input_ids"] == bert_tokenizer.mask_token_id) & selected
    assert abs(int(masked.sum()) / int(selected.sum()) - 0.5) < 0.015
    unchanged = (batch["input_ids"] == original) & selected
    assert int(unchanged.sum()) / int(selected.sum()) < 0.02  # only random draws equal to the original


def test_whole_word_masks_cover_whole_words(bert_tokenizer):
    collator = MLMCollator(bert_tokenizer, whole_word_mask=True, seed=5)
    examples = _blocks(bert_tokenizer, 400, 253, word_len=3)  # 400 x 84 words of 3 pieces = 100,800 tokens
    batch = collator(examples)
    selected = (batch["labels"] != -100)[:, 1:].reshape(400, 84, 3)
    per_word = selected.sum(-1)
    assert set(per_word.unique().tolist()) <= {0, 3}, "a word is selected with all its pieces or not at all"
    assert abs(float(selected.float().mean()) - 0.15) < 0.01  # expected token fraction is still 15%


def test_whole_word_mask_on_real_tokenizer_words(bert_tokenizer):
    from datasets import Dataset, DatasetDict

    from pretrain.data import tokenize_bert

    text = "unbelievable extraordinary representatives the " * 40
    raw = DatasetDict({"train": Dataset.from_dict({"text": [text]}), "validation": Dataset.from_dict({"text": ["a"]})})
    doc = tokenize_bert(raw, bert_tokenizer)["train"][0]
    words = bert_tokenizer(text.split(), is_split_into_words=True, add_special_tokens=False).word_ids()
    assert doc["word_start"] == [1 if i == 0 or w != words[i - 1] else 0 for i, w in enumerate(words)]
    collator = MLMCollator(bert_tokenizer, whole_word_mask=True, mlm_probability=0.4, seed=0)
    ex = [{"input_ids": doc["input_ids"], "word_start": doc["word_start"], "index": i} for i in range(20)]
    selected = collator(ex)["labels"] != -100
    word_ids = torch.tensor(words)
    for row in selected:
        for w in word_ids.unique():
            pieces = row[word_ids == w]
            assert pieces.all() or not pieces.any()


def test_masks_depend_only_on_seed_epoch_and_example_index(bert_tokenizer):
    collator = MLMCollator(bert_tokenizer, seed=7)
    examples = _blocks(bert_tokenizer, 8, 64)
    full = collator(examples)
    halves = [collator(examples[:4]), collator(examples[4:])]  # e.g. two processes with half the batch each
    assert torch.equal(full["input_ids"], torch.cat([h["input_ids"] for h in halves]))
    assert torch.equal(full["labels"], torch.cat([h["labels"] for h in halves]))
    state = torch.get_rng_state()
    collator(examples)
    assert torch.equal(state, torch.get_rng_state()), "the global RNG (dropout's) is not touched"
    collator.set_epoch(1)
    assert not torch.equal(collator(examples)["labels"], full["labels"]), "new masks every epoch"


def test_every_sequence_gets_a_prediction(bert_tokenizer):
    ids = torch.tensor([[2, 10, 11, 3], [2, 12, 13, 3]])
    candidates = torch.tensor([[False, True, True, False]] * 2)
    u = torch.tensor([[0.99, 0.9, 0.95, 0.1], [0.99, 0.7, 0.5, 0.1]])  # no candidate below 0.15
    _, labels = mask_tokens(ids, candidates, u, torch.zeros(2, 4), ids, 4)
    assert (labels != -100).sum(1).tolist() == [1, 1]
    assert labels[0, 1] == 10 and labels[1, 2] == 13, "the candidate with the smallest draw"
