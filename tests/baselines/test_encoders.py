"""Each encoder against an independent reference: hand-computed means, loops, perturbations, recursive trees."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modeling.baselines import SesameBaselineForSequenceClassification, SesameBaselineModel, parse_binary_tree
from modeling.baselines.encoders_baseline import BinaryTreeLSTMCell
from modeling.baselines.modeling_baseline import chars_to_word, fnv1a_32, ngram_bucket_ids
from modeling.elmo.tokenization_elmo import word_to_char_ids


def _batch(rows: list[list[int]], words: list[list[str]] | None = None):
    """input_ids with <S> ... </S> around each row, right-padded; char ids from ``words`` (or a dummy word)."""
    width = max(len(r) for r in rows) + 2
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    chars = torch.zeros(len(rows), width, 50, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r) + 2] = torch.tensor([1, *r, 2])
        ws = words[b] if words else [f"w{i}" for i in r]
        for t, w in enumerate(["<S>", *ws, "</S>"]):
            chars[b, t] = torch.tensor(word_to_char_ids(w))
    return ids, chars, (ids != 0).long()


def test_cbow_is_the_mean_of_the_word_embeddings(tiny):
    model = SesameBaselineModel(tiny("cbow")).eval()
    ids, chars, mask = _batch([[5, 7, 9], [11, 12]])
    out = model(input_ids=ids, char_ids=chars, attention_mask=mask).pooler_output
    e = model.embeddings.word_embeddings.weight
    torch.testing.assert_close(out[0], (e[5] + e[7] + e[9]) / 3)
    torch.testing.assert_close(out[1], (e[11] + e[12]) / 2)


def test_fnv1a_by_hand_and_gensim_ngram_buckets():
    # FNV-1a of b"a" by hand: (2166136261 ^ 97) * 16777619 mod 2**32
    assert fnv1a_32(b"a") == ((2166136261 ^ 97) * 16777619) % 2**32
    # a byte >= 0x80 is sign-extended (fastText reads bytes as int8)
    assert fnv1a_32(b"\xc3") == ((2166136261 ^ 0xFFFFFFC3) * 16777619) % 2**32
    # n-grams of <the> for n = 3..4 by hand
    expected = ["<th", "the", "he>", "<the", "the>"]
    assert ngram_bucket_ids("the", 3, 4, 1000) == [fnv1a_32(g.encode()) % 1000 for g in expected]
    gensim_fasttext = pytest.importorskip("gensim.models.fasttext")
    for word in ("the", "café", "naïveté", "x"):
        assert sorted(ngram_bucket_ids(word, 3, 6, 100_000)) == sorted(
            gensim_fasttext.ft_ngram_hashes(word, 3, 6, 100_000)
        )


def test_fasttext_word_vector_is_the_mean_of_word_and_ngram_vectors(tiny):
    config = tiny("fasttext", ngram_min_n=3, ngram_max_n=4)
    model = SesameBaselineModel(config).eval()
    ids, chars, mask = _batch([[5, 3]], [["cat", "dogs"]])  # 3 = <UNK>: n-grams only
    out = model(input_ids=ids, char_ids=chars, attention_mask=mask)
    e, g = model.embeddings.word_embeddings.weight, model.embeddings.ngram_embeddings.weight
    cat = ngram_bucket_ids("cat", 3, 4, 97)
    dogs = ngram_bucket_ids("dogs", 3, 4, 97)
    v_cat = (e[5] + g[cat].sum(0)) / (1 + len(cat))
    v_dogs = g[dogs].sum(0) / len(dogs)
    # the word vectors at the words' input positions (<S> is position 0), 0 at <S>, </S>
    torch.testing.assert_close(out.last_hidden_state[0, 1:3], torch.stack([v_cat, v_dogs]))
    assert out.last_hidden_state[0, [0, 3]].abs().max() == 0
    torch.testing.assert_close(out.pooler_output[0], (v_cat + v_dogs) / 2)
    assert chars_to_word(chars[0, 2].tolist()) == "dogs"


@pytest.mark.parametrize("mode", ["non-static", "multichannel"])
def test_kim_cnn_max_over_time_equals_a_loop(tiny, mode):
    config = tiny("cnn", cnn_filter_sizes=[2, 3, 5], embedding_mode=mode)
    model = SesameBaselineModel(config).eval()
    ids, chars, mask = _batch([[5, 6, 7, 8], [9, 10], [11]])
    out = model(input_ids=ids, char_ids=chars, attention_mask=mask).pooler_output
    enc = model.encoder
    for b, words in enumerate([[5, 6, 7, 8], [9, 10], [11]]):
        feats = []
        for w, conv in zip([2, 3, 5], enc.convs):
            chans = [model.embeddings.word_embeddings.weight[words]]
            if mode == "multichannel":
                chans.append(model.embeddings.static_embeddings.weight[words])
            best = None
            for start in range(-(w - 1), len(words)):  # every window holding >= 1 word, zero-padded
                s = conv.bias.clone()
                for x in chans:
                    padded = torch.cat([torch.zeros(w - 1, 8), x, torch.zeros(w - 1, 8)])
                    window = padded[start + w - 1 : start + 2 * w - 1]  # (w, E)
                    s = s + torch.einsum("fek,ke->f", conv.weight, window)
                s = torch.relu(s)
                best = s if best is None else torch.maximum(best, s)
            feats.append(best)
        torch.testing.assert_close(out[b], torch.cat(feats), rtol=1e-5, atol=1e-6)


def test_static_and_multichannel_freeze_the_right_embeddings(tiny):
    static = SesameBaselineForSequenceClassification(tiny("cnn", embedding_mode="static"))
    assert not static.baseline.embeddings.word_embeddings.weight.requires_grad
    multi = SesameBaselineForSequenceClassification(tiny("cnn", embedding_mode="multichannel"))
    assert multi.baseline.embeddings.word_embeddings.weight.requires_grad
    assert not multi.baseline.embeddings.static_embeddings.weight.requires_grad
    with pytest.raises(ValueError, match="multichannel"):
        tiny("rnn", embedding_mode="multichannel")


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
def test_rnn_directions_by_perturbation(tiny, rnn_type):
    """Unidirectional (2 layers): the state at t depends on words <= t only; bidirectional (1 layer: above it each
    direction reads both halves below): the backward half at t on words >= t only. Padding never changes a state."""
    uni = SesameBaselineModel(tiny("rnn", rnn_type=rnn_type, rnn_bidirectional=False)).eval()
    bi = SesameBaselineModel(tiny("rnn", rnn_type=rnn_type, rnn_bidirectional=True, rnn_num_layers=1)).eval()
    ids, chars, mask = _batch([[5, 6, 7, 8, 9]])
    changed = ids.clone()
    changed[0, 3] = 20  # word 2 of the sentence (position 3 with <S>)
    h0 = uni(input_ids=ids, attention_mask=mask).last_hidden_state
    h1 = uni(input_ids=changed, attention_mask=mask).last_hidden_state
    diff = (h0 - h1).abs().amax(-1)[0, 1:6]  # the states of the 5 words (input positions 1..5)
    assert torch.all(diff[:2] == 0) and torch.all(diff[2:] > 0)
    b0 = bi(input_ids=ids, attention_mask=mask).last_hidden_state
    b1 = bi(input_ids=changed, attention_mask=mask).last_hidden_state
    fwd, bwd = (b0 - b1)[0, 1:6, :6].abs().amax(-1), (b0 - b1)[0, 1:6, 6:].abs().amax(-1)
    assert torch.all(fwd[:2] == 0) and torch.all(fwd[2:] > 0)
    assert torch.all(bwd[3:] == 0) and torch.all(bwd[:3] > 0)
    # the same sentence padded in a longer batch gives the same states
    padded_ids, _, padded_mask = _batch([[5, 6, 7, 8, 9], [5, 6, 7, 8, 9, 10, 11, 12]])
    torch.testing.assert_close(bi(input_ids=padded_ids, attention_mask=padded_mask).last_hidden_state[0, :7], b0[0])


@pytest.mark.parametrize("pooling", ["max", "mean", "attention"])
def test_rnn_pooling_over_the_words_only(tiny, pooling):
    model = SesameBaselineModel(tiny("rnn", pooling=pooling)).eval()
    ids, chars, mask = _batch([[5, 6, 7], [5, 6, 7, 8, 9, 10]])
    out = model(input_ids=ids, attention_mask=mask)
    h = out.last_hidden_state[0, 1:4]
    if pooling == "max":
        ref = h.amax(0)
    elif pooling == "mean":
        ref = h.mean(0)
    else:
        w = torch.softmax(model.encoder.scorer(h).squeeze(-1), dim=0)
        ref = (w.unsqueeze(-1) * h).sum(0)
    torch.testing.assert_close(out.pooler_output[0], ref)


def _compose(cell: BinaryTreeLSTMCell, leaves, node):
    """Recursive Tree-LSTM over a nested tuple of leaf indices (the reference)."""
    if isinstance(node, int):
        return leaves[node]
    (hl, cl), (hr, cr) = _compose(cell, leaves, node[0]), _compose(cell, leaves, node[1])
    return cell(hl, cl, hr, cr)


def test_treelstm_over_a_given_tree_composes_in_that_order_and_ignores_node_numbering(tiny):
    model = SesameBaselineModel(tiny("treelstm", tree_source="given")).eval()
    ids, chars, mask = _batch([[5, 6, 7, 8, 9]])
    # ((0 1) ((2 3) 4)) written with two different node numberings (internal nodes in another order)
    words, merges = parse_binary_tree("((a b) ((c d) e))")
    assert words == ["a", "b", "c", "d", "e"] and merges == [(0, 1), (2, 3), (6, 4), (5, 7)]
    other = [(2, 3), (5, 4), (0, 1), (7, 6)]
    r1 = model(input_ids=ids, attention_mask=mask, tree_merges=torch.tensor([merges])).pooler_output
    r2 = model(input_ids=ids, attention_mask=mask, tree_merges=torch.tensor([other])).pooler_output
    torch.testing.assert_close(r1, r2)
    x = model.embeddings.word_embeddings.weight[[5, 6, 7, 8, 9]]
    h, c = model.encoder.leaves(x)
    leaves = [(h[i], c[i]) for i in range(5)]
    ref, _ = _compose(model.encoder.cell, leaves, ((0, 1), ((2, 3), 4)))
    torch.testing.assert_close(r1[0], ref)
    wrong, _ = _compose(model.encoder.cell, leaves, (((0, 1), (2, 3)), 4))  # another bracketing differs
    assert not torch.allclose(r1[0], wrong)
    # the cell itself: Tai et al. (2015) eq. 9-14 by hand
    cell = model.encoder.cell
    z = cell.linear(torch.cat([h[0], h[1]]))
    i, fl, fr, o, u = z.chunk(5)
    c_ref = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * c[0] + torch.sigmoid(fr) * c[1]
    h_ref = torch.sigmoid(o) * torch.tanh(c_ref)
    torch.testing.assert_close(cell(h[0], c[0], h[1], c[1])[0], h_ref)


def test_parse_labelled_sst_tree():
    words, merges = parse_binary_tree("(3 (2 it) (4 (2 is) (4 good)))")
    assert words == ["it", "is", "good"] and merges == [(1, 2), (0, 3)]
    with pytest.raises(ValueError):
        parse_binary_tree("((a b c))")
    with pytest.raises(ValueError):
        parse_binary_tree("((a b)")


def test_latent_tree_in_eval_merges_the_best_scoring_pair(tiny):
    """Eval (argmax): the root equals a greedy reference that merges the adjacent pair with the highest q.h."""
    model = SesameBaselineModel(tiny("treelstm")).eval()
    ids, chars, mask = _batch([[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    out = model(input_ids=ids, attention_mask=mask).pooler_output
    enc = model.encoder
    for b, words in enumerate([[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]):
        h, c = enc.leaves(model.embeddings.word_embeddings.weight[words])
        nodes = [(h[i], c[i]) for i in range(len(words))]
        while len(nodes) > 1:
            cands = [enc.cell(*nodes[i], *nodes[i + 1]) for i in range(len(nodes) - 1)]
            best = max(range(len(cands)), key=lambda i: float(cands[i][0] @ enc.query))
            nodes = nodes[:best] + [cands[best]] + nodes[best + 2 :]
        torch.testing.assert_close(out[b], nodes[0][0])


def test_latent_tree_straight_through_gradients_reach_the_query(tiny):
    model = SesameBaselineForSequenceClassification(tiny("treelstm")).train()
    ids, chars, mask = _batch([[5, 6, 7, 8], [9, 10]])
    out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    out.loss.backward()
    assert model.baseline.encoder.query.grad.abs().sum() > 0


@pytest.mark.parametrize("encoder_type", ["cbow", "fasttext", "cnn", "rnn", "treelstm"])
def test_pairs_use_u_v_features_and_regression(tiny, encoder_type):
    model = SesameBaselineForSequenceClassification(tiny(encoder_type, num_labels=1)).eval()
    a, b = [5, 6, 7], [8, 9]
    ids = torch.tensor([[1, *a, 2, 1, *b, 2]])
    tt = torch.tensor([[0] * 5 + [1] * 4])
    chars = torch.stack(
        [torch.tensor(word_to_char_ids(w)) for w in ["<S>", "x", "yy", "zzz", "</S>", "<S>", "p", "qq", "</S>"]]
    ).unsqueeze(0)
    out = model(
        input_ids=ids,
        char_ids=chars,
        attention_mask=torch.ones_like(ids),
        token_type_ids=tt,
        labels=torch.tensor([0.7]),
    )
    base = model.baseline
    u = base(input_ids=ids[:, :5], char_ids=chars[:, :5]).pooler_output
    v = base(input_ids=ids[:, 5:], char_ids=chars[:, 5:]).pooler_output
    ref = model.pair_classifier(torch.cat([u, v, (u - v).abs(), u * v], -1))
    torch.testing.assert_close(out.logits, ref)
    assert model.config.problem_type == "regression"
    torch.testing.assert_close(out.loss, F.mse_loss(ref.squeeze(-1), torch.tensor([0.7])))


@pytest.mark.parametrize("encoder_type", ["cbow", "fasttext", "cnn", "rnn", "treelstm"])
def test_bf16_autocast_forward_backward_finite(tiny, encoder_type):
    model = SesameBaselineForSequenceClassification(tiny(encoder_type)).train()
    ids, chars, mask = _batch([[5, 6, 7, 8], [9, 10]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, char_ids=chars, attention_mask=mask, labels=torch.tensor([0, 2]))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_gate_biases_start_as_their_sources_say_and_survive_loading(tiny, tmp_path):
    """Tree-LSTM forget gates f_l, f_r start at 1 (Tai et al. 2015, as LSTMs' forget bias), ELMo's highway
    transform gate at -2 (bilm-tf); a saved model's trained values are loaded, not re-initialised."""
    from elmo.conftest import tiny_config  # tests/ is on sys.path (pyproject's pythonpath)

    from modeling.elmo import SesameElmoModel

    cell = SesameBaselineModel(tiny("treelstm")).encoder.cell
    h = cell.hidden_size
    expected = torch.cat([torch.zeros(h), torch.ones(2 * h), torch.zeros(2 * h)])
    assert torch.equal(cell.linear.bias.detach(), expected)
    elmo = SesameElmoModel(tiny_config())
    for layer in elmo.char_encoder.highway.layers:
        d = layer.in_features
        assert torch.equal(layer.bias.detach(), torch.cat([torch.zeros(d), torch.full((d,), -2.0)]))
    with torch.no_grad():
        elmo.char_encoder.highway.layers[0].bias.fill_(0.5)
    elmo.save_pretrained(tmp_path / "elmo")
    loaded = SesameElmoModel.from_pretrained(tmp_path / "elmo")
    assert torch.equal(loaded.char_encoder.highway.layers[0].bias, torch.full((2 * d,), 0.5))


def test_tree_lstm_leaf_states_are_zero_at_padding(tiny):
    """With trained (non-zero) leaf biases a padding position's leaf would be sigmoid(b_o) tanh(b_c) != 0; the
    encoder's per-word output is 0 there, as the other encoders', and the root is unchanged."""
    model = SesameBaselineModel(tiny("treelstm")).eval()
    with torch.no_grad():
        model.encoder.leaf.bias.fill_(0.5)
    ids, chars, mask = _batch([[5, 6, 7, 8], [5, 6]])
    out = model(input_ids=ids, char_ids=chars, attention_mask=mask)
    last = out.last_hidden_state[1]  # <S> 5 6 </S> <pad> <pad>: the leaves at positions 1, 2
    assert last[[0, 3, 4, 5]].abs().max() == 0 and last[1:3].abs().min() > 0
    ids, chars, mask = _batch([[5, 6]])
    alone = model(input_ids=ids, char_ids=chars, attention_mask=mask)
    torch.testing.assert_close(out.pooler_output[1], alone.pooler_output[0])
