"""The ELMo BiLM: directions, padding, losses, softmax kinds, clipping, ScalarMix, parameter count."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from modeling.elmo import ScalarMix, SesameElmoConfig, SesameElmoForBidirectionalLM, SesameElmoModel
from modeling.elmo.lstm_elmo import (
    BiLSTMProjectionFunction,
    fused_lstm_applies,
    inverse_permutation,
    permute_rows,
    recurrence,
    token_slots,
)


def _random_batch(b=2, t=9, vocab=100):
    ids = torch.randint(4, vocab, (b, t))
    chars = torch.randint(1, 262, (b, t, 50))
    return ids, chars


def test_direction_by_perturbation(tiny):
    model = SesameElmoForBidirectionalLM(tiny(dropout=0.3)).eval()
    _, chars = _random_batch(1, 10)
    fwd, bwd = model.log_probs(chars)
    t = 5
    after = chars.clone()
    after[0, t + 1 :] = torch.randint(1, 262, (10 - t - 1, 50))
    fwd2, bwd2 = model.log_probs(after)
    assert torch.equal(fwd[0, : t + 1], fwd2[0, : t + 1])  # forward LM at <= t never sees tokens after t
    assert not torch.allclose(fwd[0, t + 1 :], fwd2[0, t + 1 :])
    assert not torch.allclose(bwd[0, : t + 1], bwd2[0, : t + 1])
    before = chars.clone()
    before[0, :t] = torch.randint(1, 262, (t, 50))
    fwd3, bwd3 = model.log_probs(before)
    assert torch.equal(bwd[0, t:], bwd3[0, t:])  # backward LM at >= t never sees tokens before t
    assert not torch.allclose(bwd[0, :t], bwd3[0, :t])
    assert not torch.allclose(fwd[0, t:], fwd3[0, t:])


def test_padding_does_not_change_outputs(tiny):
    model = SesameElmoModel(tiny()).eval()
    _, chars = _random_batch(1, 6)
    alone = model(chars).hidden_states
    padded = torch.cat([chars, torch.zeros(1, 3, 50, dtype=torch.long)], dim=1)
    other = torch.randint(1, 262, (1, 9, 50))
    batch = model(torch.cat([padded, other]), attention_mask=torch.tensor([[1] * 6 + [0] * 3, [1] * 9])).hidden_states
    assert len(alone) == 3 and batch[0].shape == (2, 9, 32)
    for a, b in zip(alone, batch):
        torch.testing.assert_close(b[0, :6], a[0], rtol=1e-5, atol=1e-6)
        assert (b[0, 6:] == 0).all()
    # layer 0 is the context-free token representation duplicated to the width of [forward; backward]
    torch.testing.assert_close(alone[0][..., :16], alone[0][..., 16:])
    # any layout of the mask (issue 20: the right-padding check, a host read, is gone): left padding and a hole give
    # each kept token the states of the sentence alone, 0 elsewhere
    for keep in ([0, 0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 0, 1, 1, 1, 0]):
        keep = torch.tensor(keep).bool()
        laid_out = torch.zeros(1, 9, 50, dtype=torch.long)
        laid_out[0, keep] = chars[0]
        other_layout = model(laid_out, attention_mask=keep.long().unsqueeze(0)).hidden_states
        for a, b in zip(alone, other_layout):
            torch.testing.assert_close(b[0, keep], a[0], rtol=1e-5, atol=1e-6)
            assert (b[0, ~keep] == 0).all()


def test_char_encoder_unique_tokens_equals_per_token(tiny):
    model = SesameElmoModel(tiny())
    chars = torch.randint(1, 262, (2, 5, 50))
    chars[1, :3] = chars[0, :3]  # repeated words
    chars[1, 4] = 0  # a padding token
    out = model.char_encoder(chars)
    ref = model.char_encoder.encode_words(chars.reshape(10, 50)).reshape(2, 5, -1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    grad = torch.autograd.grad(out.square().sum(), model.char_encoder.projection.weight)[0]
    ref_grad = torch.autograd.grad(ref.square().sum(), model.char_encoder.projection.weight)[0]
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6)


def test_loss_is_half_sum_of_directional_nll_with_counts(tiny):
    model = SesameElmoForBidirectionalLM(tiny()).eval()
    ids, chars = _random_batch(2, 7)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    chars[1, 4:] = 0
    out = model(input_ids=ids, char_ids=chars, attention_mask=mask)
    fwd, bwd = model.log_probs(chars, mask)
    # reference: explicit loops over positions (forward at t -> t+1, backward at t -> t-1)
    f_terms = [-fwd[b, t, ids[b, t + 1]] for b in range(2) for t in range(6) if mask[b, t + 1]]
    b_terms = [-bwd[b, t, ids[b, t - 1]] for b in range(2) for t in range(1, 7) if mask[b, t]]
    assert int(out.forward_num_tokens) == len(f_terms) == 6 + 3
    assert int(out.backward_num_tokens) == len(b_terms) == 9
    torch.testing.assert_close(out.forward_loss, torch.stack(f_terms).mean())
    torch.testing.assert_close(out.backward_loss, torch.stack(b_terms).mean())
    torch.testing.assert_close(out.loss, (out.forward_loss + out.backward_loss) / 2)
    # explicit labels with -100 drop those targets
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, 3] = -100
    out2 = model(input_ids=ids, char_ids=chars, attention_mask=mask, labels=labels)
    assert int(out2.forward_num_tokens) == 8 and int(out2.backward_num_tokens) == 8


def test_adaptive_log_probs_sum_to_one_and_eval_loss_exact(tiny):
    model = SesameElmoForBidirectionalLM(tiny(softmax="adaptive", adaptive_cutoffs=[10, 40])).eval()
    ids, chars = _random_batch(2, 6)
    fwd, bwd = model.log_probs(chars)
    torch.testing.assert_close(fwd.exp().sum(-1), torch.ones(2, 6))
    torch.testing.assert_close(bwd.exp().sum(-1), torch.ones(2, 6))
    out = model(input_ids=ids, char_ids=chars)
    ref = -fwd[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    torch.testing.assert_close(out.forward_loss, ref)


def test_sampled_softmax_is_train_only_and_eval_is_exact(tiny):
    torch.manual_seed(1)
    model = SesameElmoForBidirectionalLM(tiny(softmax="sampled", num_sampled=8))
    ids, chars = _random_batch(2, 6)
    model.eval()
    exact = model(input_ids=ids, char_ids=chars).loss
    fwd, bwd = model.log_probs(chars)
    ref_f = -fwd[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    ref_b = -bwd[:, 1:].gather(-1, ids[:, :-1, None]).mean()
    torch.testing.assert_close(exact, (ref_f + ref_b) / 2)
    model.train()
    sampled = [model(input_ids=ids, char_ids=chars).loss.item() for _ in range(3)]
    assert len(set(sampled)) == 3  # fresh negatives each step
    assert all(s < exact.item() for s in sampled)  # 1 + 8 candidates instead of 100 words


def test_sampled_softmax_loss_matches_a_loop_reference(tiny):
    """Jean et al. (2015) / tf.nn.sampled_softmax_loss: logits corrected by log(S * Q(w)), Q log-uniform,
    negatives equal to the target removed; checked against a plain loop in float64."""
    model = SesameElmoForBidirectionalLM(tiny(vocab_size=50, softmax="sampled"))
    h = torch.randn(4, 16)
    targets = torch.tensor([0, 3, 7, 49])
    samples = torch.tensor([3, 3, 1, 0, 20, 49, 5])  # with repeats and accidental hits
    got = model._nll_sum(h, targets, samples)
    w, b = model.softmax.weight.double(), model.softmax.bias.double()

    def corrected(i, k):
        q = (math.log(k + 2) - math.log(k + 1)) / math.log(51)
        return float(h[i].double() @ w[k] + b[k]) - math.log(len(samples) * q)

    ref = 0.0
    for i, t in enumerate(targets.tolist()):
        logits = [corrected(i, t)] + [corrected(i, k) for k in samples.tolist() if k != t]
        ref += math.log(sum(math.exp(x) for x in logits)) - logits[0]
    assert abs(got.item() - ref) < 1e-4 * max(1.0, abs(ref))


def _train(config, sentences_ids, sentences_chars, mask, steps, lr=0.02, seed=0):
    torch.manual_seed(seed)
    model = SesameElmoForBidirectionalLM(config)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        model.train()
        loss = model(input_ids=sentences_ids, char_ids=sentences_chars, attention_mask=mask).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return model(input_ids=sentences_ids, char_ids=sentences_chars, attention_mask=mask)


def test_tiny_model_overfits_and_sampled_adaptive_track_full(tiny, elmo_tokenizer, elmo_sentences):
    batch = elmo_tokenizer(elmo_sentences, padding=True, return_tensors="pt")
    ids, chars, mask = batch["input_ids"], batch["char_ids"], batch["attention_mask"]
    v = len(elmo_tokenizer)
    results = {}
    for kind in ("full", "sampled", "adaptive"):
        cfg = tiny(
            vocab_size=v, softmax=kind, num_sampled=20, adaptive_cutoffs=[12, 30], projection_dim=32, cell_size=64
        )
        results[kind] = _train(cfg, ids, chars, mask, steps=120)
    start = math.log(v)
    full = results["full"]
    # training perplexity -> near 1. The forward LM cannot know which of the 6 sentences follows <S>
    # (5 distinct first words), so the floor is exp(log(6) / n_predicted) ~ 1.07 rather than 1.
    assert math.exp(full.forward_loss) < 1.3 and math.exp(full.backward_loss) < 1.3
    for kind in ("sampled", "adaptive"):  # exact eval NLL after training with the cheaper softmax
        assert results[kind].loss < 0.25 * start, (kind, results[kind].loss, start)
        assert abs(results[kind].loss - full.loss) < 0.5, (kind, results[kind].loss, full.loss)


def test_clipped_lstm_equals_nn_lstm_without_clipping_and_clips():
    lstm = torch.nn.LSTM(6, 10, batch_first=True, proj_size=4)
    with torch.no_grad():
        for p in lstm.parameters():
            p.mul_(3.0)
    x = torch.randn(3, 5, 6) * 3
    torch.testing.assert_close(recurrence(lstm, x), lstm(x)[0], rtol=1e-5, atol=1e-5)
    clipped = recurrence(lstm, x, cell_clip=0.5, proj_clip=0.2)
    assert clipped.abs().max() <= 0.2 + 1e-6
    assert not torch.allclose(clipped, lstm(x)[0])


def test_clipping_config_uses_clipped_loop(tiny):
    cfg = tiny(cell_clip=1e6, proj_clip=1e6)
    clip_model = SesameElmoModel(cfg).eval()
    plain = SesameElmoModel(tiny()).eval()
    plain.load_state_dict(clip_model.state_dict())
    _, chars = _random_batch(2, 5)
    torch.testing.assert_close(
        clip_model(chars).last_hidden_state, plain(chars).last_hidden_state, rtol=1e-4, atol=1e-5
    )


def _stacked(lstms):
    return (
        torch.stack([m.weight_ih_l0 for m in lstms]),
        torch.stack([m.weight_hh_l0 for m in lstms]),
        torch.stack([m.bias_ih_l0 + m.bias_hh_l0 for m in lstms]),
        torch.stack([m.weight_hr_l0 for m in lstms]),
    )


def test_fused_bilstm_equals_two_nn_lstms_values_and_gradients():
    """Reference: two independent ``nn.LSTM(proj_size=...)`` (PyTorch's own kernel), float64."""
    lstms = [torch.nn.LSTM(6, 10, batch_first=True, proj_size=4).double() for _ in range(2)]
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
    ref = torch.stack([lstm(x[d])[0] for d, lstm in enumerate(lstms)])
    weight = torch.randn_like(ref)
    params = [x, *lstms[0].parameters(), *lstms[1].parameters()]
    ref_grads = torch.autograd.grad((ref * weight).sum(), params)
    out = BiLSTMProjectionFunction.apply(x, *_stacked(lstms))
    grads = torch.autograd.grad((out * weight).sum(), params)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)


def test_fused_bilstm_gradcheck():
    torch.manual_seed(1)
    lstms = [torch.nn.LSTM(3, 5, batch_first=True, proj_size=2).double() for _ in range(2)]
    inputs = [torch.randn(2, 2, 4, 3, dtype=torch.float64)] + [w.detach() for w in _stacked(lstms)]
    assert torch.autograd.gradcheck(BiLSTMProjectionFunction.apply, [t.requires_grad_() for t in inputs])


def test_fused_cpu_lstm_model_equals_native_path_with_padding_and_residuals(tiny):
    cfg = tiny()
    assert cfg.fused_cpu_lstm
    model = SesameElmoModel(cfg).double()
    chars = torch.randint(1, 262, (3, 7, 50))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    chars[mask == 0] = 0
    assert fused_lstm_applies(cfg, torch.zeros(1, dtype=torch.float64))
    assert not fused_lstm_applies(tiny(cell_clip=3.0), torch.zeros(1))
    assert not fused_lstm_applies(tiny(fused_cpu_lstm=False), torch.zeros(1))

    def run(fused: bool):
        model.config.fused_cpu_lstm = fused
        model.zero_grad()
        hidden = torch.stack(model(chars, mask).hidden_states)
        (hidden * torch.linspace(-1, 1, hidden.numel(), dtype=hidden.dtype).view_as(hidden)).sum().backward()
        return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    native, native_grads = run(False)
    fused, fused_grads = run(True)
    torch.testing.assert_close(fused, native, rtol=0, atol=1e-12)
    for name, grad in native_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=0, atol=1e-11, msg=name)


def test_gru_cell_type_runs_and_is_causal(tiny):
    model = SesameElmoForBidirectionalLM(tiny(cell_type="gru")).eval()
    _, chars = _random_batch(1, 6)
    fwd, _ = model.log_probs(chars)
    changed = chars.clone()
    changed[0, 4:] = 7
    torch.testing.assert_close(model.log_probs(changed)[0][0, :4], fwd[0, :4])


def test_token_slots_pack_the_kept_tokens_in_order():
    """Hand-computed slots: right padding is the identity forwards and the reversal within the length backwards; left
    padding and a hole pack the kept tokens first, the masked positions after them, in order."""
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 1, 1, 0, 1]])
    forward, backward = token_slots(mask)
    assert forward.tolist() == [[0, 1, 2, 3, 4, 5], [4, 5, 0, 1, 2, 3], [0, 4, 1, 2, 5, 3]]
    assert backward.tolist() == [[3, 2, 1, 0, 4, 5], [4, 5, 3, 2, 1, 0], [3, 4, 2, 1, 5, 0]]
    order = inverse_permutation(forward)
    assert order.tolist() == [[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 0, 1], [0, 2, 3, 5, 1, 4]]
    x = torch.arange(18).reshape(3, 6, 1)
    assert torch.equal(permute_rows(permute_rows(x, order), forward), x)  # packing, then back


def test_scalar_mix_equals_formula():
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.scalar_parameters.copy_(torch.log(torch.tensor([1.0, 2.0, 3.0])))  # softmax -> 1/6, 2/6, 3/6
        mix.gamma.fill_(2.0)
    layers = [torch.full((2, 4, 5), float(k)) for k in (1, 2, 3)]
    # hand: 2 * (1 * 1/6 + 2 * 2/6 + 3 * 3/6) = 2 * 14 / 6 = 14 / 3
    torch.testing.assert_close(mix(layers), torch.full((2, 4, 5), 14 / 3))
    norm_mix = ScalarMix(2, layer_norm=True)
    h = [torch.tensor([[1.0, 2.0, 3.0, 6.0]]), torch.tensor([[0.0, 0.0, 4.0, 4.0]])]
    # layer norm by hand: (x - mean) / sqrt(var + 1e-5), equal weights 1/2
    n0 = (h[0] - 3.0) / math.sqrt(3.5 + 1e-5)
    n1 = (h[1] - 2.0) / math.sqrt(4.0 + 1e-5)
    torch.testing.assert_close(norm_mix(h), (n0 + n1) / 2)
    with pytest.raises(ValueError):
        mix(layers[:2])


def test_presets_and_original_parameter_count():
    import modeling

    small = modeling.get_preset_config("elmo-small", vocab_size=8000)
    original = modeling.get_preset_config("elmo-original", vocab_size=8000)
    assert isinstance(original, SesameElmoConfig) and original.cell_size == 4096 and original.projection_dim == 512
    assert small.cell_size <= 512 and small.projection_dim <= 128
    with torch.device("meta"):
        model = SesameElmoModel(original)
    total = sum(p.numel() for p in model.parameters())
    redundant = sum(p.numel() for n, p in model.named_parameters() if "bias_hh" in n)
    # bilm-tf counts one LSTM bias: 93.6M parameters without the softmax (Peters et al. 2018)
    assert total - redundant == 93_600_864
    assert redundant == 4 * 4 * 4096


def test_config_validation():
    with pytest.raises(ValueError, match="softmax"):
        SesameElmoConfig(softmax="hierarchical")
    with pytest.raises(ValueError, match="clip"):
        SesameElmoConfig(cell_type="gru", cell_clip=3.0)
    assert F is not None
