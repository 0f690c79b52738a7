"""Weight decay (training.optim): no decay on any bias -- nn.LSTM's bias_ih_l0 / bias_hh_l0 (and _reverse)
included -- nor on normalisation weights; decay on every weight matrix and embedding."""

from __future__ import annotations

import torch
from torch import nn

from modeling.elmo import SesameElmoForSequenceClassification
from training.optim import create_optimizer, no_decay_parameter_names


def test_lstm_biases_and_norm_weights_get_no_weight_decay(tiny):
    model = SesameElmoForSequenceClassification(tiny(vocab_size=50, num_labels=2, freeze_backbone=False))
    model.extra_norm = nn.LayerNorm(4)  # a norm layer's weight is exempt although its name is "weight"
    names = dict(model.named_parameters())
    lstm_biases = {n for n in names if n.rsplit(".", 1)[-1].startswith(("bias_ih", "bias_hh"))}
    # the BiLM's stacks (one direction each) and the task BiLSTM (with _reverse)
    assert any(n.endswith("_reverse") for n in lstm_biases) and any(n.startswith("elmo.") for n in lstm_biases)
    # built from the module types, independently of the name rule of no_decay_parameter_names
    linear_biases = {
        f"{m}.bias"
        for m, mod in model.named_modules()
        if getattr(mod, "bias", None) is not None and not isinstance(mod, nn.LayerNorm) and not isinstance(mod, nn.LSTM)
    }
    norm_params = {
        f"{m}.{p}"
        for m, mod in model.named_modules()
        if isinstance(mod, nn.LayerNorm)
        for p, _ in mod.named_parameters(recurse=False)
    }
    expected = lstm_biases | linear_biases | norm_params
    assert "extra_norm.weight" in expected
    assert no_decay_parameter_names(model) == expected
    optimizer = create_optimizer(model, 1e-3, weight_decay=0.1)
    decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, p in names.items():
        assert (id(p) in decay) == (name not in expected), name


def test_an_exempt_parameter_is_not_decayed_by_a_step(tiny):
    """Behaviour, not bookkeeping: with a zero gradient, AdamW leaves an LSTM bias as it is and shrinks a weight
    matrix by lr * weight_decay."""
    lstm = nn.LSTM(3, 4, bidirectional=True)
    optimizer = create_optimizer(lstm, learning_rate=0.1, weight_decay=0.5)
    before = {n: p.detach().clone() for n, p in lstm.named_parameters()}
    for p in lstm.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in lstm.named_parameters():
        if "bias" in name:
            assert torch.equal(p, before[name]), name
        else:
            torch.testing.assert_close(p, before[name] * (1 - 0.1 * 0.5), msg=name)


def test_fused_adamw_makes_the_same_update(tiny):
    """``fused=True`` (the default on CUDA) takes the same steps as the default AdamW, weight-decay groups kept."""
    torch.manual_seed(0)
    model = SesameElmoForSequenceClassification(tiny(vocab_size=50, num_labels=2, freeze_backbone=False))
    twin = SesameElmoForSequenceClassification(model.config)
    twin.load_state_dict(model.state_dict())
    optimizers = [create_optimizer(m, 1e-2, weight_decay=0.1, fused=f) for m, f in ((model, False), (twin, True))]
    assert optimizers[1].defaults["fused"] and not optimizers[0].defaults["fused"]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
        for m, opt in zip((model, twin), optimizers):
            for n, p in m.named_parameters():
                p.grad = grads[n].clone()
            opt.step()
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=n)
