"""The fused decoder + cross-entropy (``linear_cross_entropy``) and the MLM heads' ``skip_logits``, against the
two-step ``F.linear`` + ``F.cross_entropy`` computed in float64 (an independent reference), and ``pretrain``'s loss
function that passes ``skip_logits`` only to models that take it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers

import modeling
from modeling import SesameBertConfig, SesameBertForMaskedLM, SesameBertForPreTraining
from modeling.bert.loss_sesame_bert import linear_cross_entropy
from pretrain.objectives import mlm_loss, mlm_outputs

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _problem(n=37, e=16, v=101, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, e, generator=g)
    weight = torch.randn(v, e, generator=g) * 0.3
    b = torch.randn(v, generator=g) * 0.1 if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, b, targets


def _grads(fn, hidden, weight, bias, targets, dtype=torch.float32):
    """(loss, grad hidden, grad weight, grad bias) of ``fn`` on float copies of the inputs in ``dtype``."""
    leaves = [t.detach().to(dtype).requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    loss = fn(*leaves, targets)
    loss.backward()
    return (loss.detach(), *(t.grad if t is not None else None for t in leaves))


def _two_step(hidden, weight, bias, targets):
    return F.cross_entropy(F.linear(hidden, weight, bias), targets, reduction="sum")


@pytest.mark.parametrize("chunk_rows", [1, 5, 37, 100])  # a ragged last chunk, one chunk, more rows than N
@pytest.mark.parametrize("bias", [True, False])
def test_loss_and_gradients_equal_float64_two_step(chunk_rows, bias):
    problem = _problem(bias=bias)
    expected = _grads(_two_step, *problem, dtype=torch.float64)
    fused = _grads(lambda h, w, b, y: linear_cross_entropy(h, w, b, y, chunk_elements=chunk_rows * 101), *problem)
    assert fused[0].dtype == torch.float32
    for got, want in zip(fused, expected):
        if want is None:
            assert got is None
            continue
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_hand_computed_value():
    # E = 1, V = 2, h = 1: logits (0, ln 3), p(target 0) = 1 / 4; d(logits) = softmax - one-hot = (-3/4, 3/4)
    hidden = torch.ones(1, 1, requires_grad=True)
    weight = torch.tensor([[0.0], [1.0]], requires_grad=True)
    bias = torch.tensor([0.0, torch.tensor(3.0).log().item() - 1], requires_grad=True)
    loss = linear_cross_entropy(hidden, weight, bias, torch.zeros(1, dtype=torch.long))
    loss.backward()
    assert loss.item() == pytest.approx(torch.tensor(4.0).log().item(), abs=1e-6)
    torch.testing.assert_close(hidden.grad, torch.tensor([[0.75]]))
    torch.testing.assert_close(weight.grad, torch.tensor([[-0.75], [0.75]]))
    torch.testing.assert_close(bias.grad, torch.tensor([-0.75, 0.75]))


@pytest.mark.parametrize("grad", [True, False])
def test_a_target_whose_probability_underflows_float32_keeps_its_exact_loss(grad):
    # E = 2, V = 4, no bias. Row 0, h = (1, 0): logits (0, -200, -1, 0), target 1: p = e^-200 / (2 + e^-1), 0 in
    # float32, NLL 200 + ln(2 + e^-1). Row 1, h = (1000, 1): logits (0.5, -199999.5, -999.5, 0.5), target 2: NLL
    # 1000 + ln 2. Both rows tie at their largest logit.
    hidden = torch.tensor([[1.0, 0.0], [1000.0, 1.0]])
    weight = torch.tensor([[0.0, 0.5], [-200.0, 0.5], [-1.0, 0.5], [0.0, 0.5]])
    targets = torch.tensor([1, 2])
    by_hand = 200 + math.log(2 + math.exp(-1)) + 1000 + math.log(2)
    expected = _grads(_two_step, hidden, weight, None, targets, dtype=torch.float64)
    assert expected[0].item() == pytest.approx(by_hand, rel=1e-12)
    if grad:
        fused = _grads(linear_cross_entropy, hidden, weight, None, targets)[:3]
    else:
        fused = (linear_cross_entropy(hidden, weight, None, targets),)
    assert torch.isfinite(fused[0])
    for got, want in zip(fused, expected):
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-5)


def test_frozen_weight_and_no_grad():
    hidden, weight, bias, targets = _problem()
    h = hidden.clone().requires_grad_()
    loss = linear_cross_entropy(h, weight, bias, targets, chunk_elements=7 * 101)  # weight, bias without grad
    loss.backward()
    reference = hidden.clone().requires_grad_()
    _two_step(reference, weight, bias, targets).backward()
    torch.testing.assert_close(h.grad, reference.grad, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        plain = linear_cross_entropy(hidden.requires_grad_(), weight, bias, targets)
    assert not plain.requires_grad
    torch.testing.assert_close(plain, _two_step(hidden, weight, bias, targets).detach(), rtol=1e-6, atol=1e-5)


def test_no_rows_gives_zero_loss_and_zero_gradients():
    hidden, weight, bias, _ = _problem()
    h, w = hidden[:0].clone().requires_grad_(), weight.clone().requires_grad_()
    loss = linear_cross_entropy(h, w, bias, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0
    assert h.grad.shape == (0, 16)
    assert torch.count_nonzero(w.grad) == 0


def test_scales_by_the_incoming_gradient():
    problem = _problem()
    fused = _grads(lambda h, w, b, y: 0.25 * linear_cross_entropy(h, w, b, y, chunk_elements=404), *problem)
    plain = _grads(lambda h, w, b, y: 0.25 * _two_step(h, w, b, y), *problem)
    for got, want in zip(fused, plain):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_within_bf16_tolerance_of_float64():
    problem = _problem(n=64, e=32, v=257, seed=3)
    expected = _grads(_two_step, *problem, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = _grads(lambda h, w, b, y: linear_cross_entropy(h, w, b, y, chunk_elements=9 * 257), *problem)
        plain = _grads(_two_step, *problem)  # autocast's own two-step computation, for the error it has
    assert fused[1].dtype == fused[2].dtype == torch.float32  # the leaves' dtypes
    for got, autocast, want in zip(fused, plain, expected):
        error = (got.double() - want).abs().max().item()
        # no worse than autocast's two-step result (plus a bf16 rounding of the largest value)
        bound = (autocast.double() - want).abs().max().item() + want.abs().max().item() * 2**-8
        assert error <= bound


def test_fp16_autocast_keeps_small_probabilities_in_the_gradient():
    # one row whose softmax puts ~1e-9 on most words: float16 (smallest subnormal 6e-8) would flush their gradient
    # (softmax - one-hot) to 0 before any loss scaling; the gradients' products run in float32 under float16
    hidden = torch.tensor([[1.0]], requires_grad=True)
    weight = torch.zeros(50, 1)
    weight[0] = 21.0  # logit 21 for word 0, 0 for the others: p(other) = 1 / (e^21 + 49) ~ 7.6e-10
    weight.requires_grad_()
    with torch.autocast("cpu", dtype=torch.float16):
        linear_cross_entropy(hidden, weight, None, torch.zeros(1, dtype=torch.long)).backward()
    p_other = 1 / (torch.tensor(21.0, dtype=torch.float64).exp() + 49)
    torch.testing.assert_close(weight.grad[1:].double(), torch.full((49, 1), p_other.item(), dtype=torch.float64),
                               rtol=1e-2, atol=0)  # fmt: skip


def test_a_second_backward_is_refused():
    hidden, weight, bias, targets = _problem()
    loss = linear_cross_entropy(hidden.requires_grad_(), weight, bias, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second backward through the same loss"):
        loss.backward()


def test_refuses_mismatched_shapes():
    hidden, weight, bias, targets = _problem()
    with pytest.raises(ValueError, match=r"hidden \(N, E\) and weight \(V, E\)"):
        linear_cross_entropy(hidden, weight[:, :5], bias, targets)
    with pytest.raises(ValueError, match=r"expected targets \(37,\)"):
        linear_cross_entropy(hidden, weight, bias, targets[:3])


def _labelled(model, make_batch):
    batch = make_batch(model.config.vocab_size)
    g = torch.Generator().manual_seed(1)
    chosen = (torch.rand(batch["input_ids"].shape, generator=g) < 0.3) & batch["attention_mask"].bool()
    chosen.view(-1)[0] = True
    batch["labels"] = torch.where(chosen, batch["input_ids"], -100)
    return batch


def _step(model, batch, **kwargs):
    model.zero_grad()
    out = model(**batch, **kwargs)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_class", [SesameBertForMaskedLM, SesameBertForPreTraining])
@pytest.mark.parametrize("preset", ["tiny", "modernbert"])
@pytest.mark.parametrize("autocast", [False, True])
def test_skip_logits_gives_the_loss_and_gradients_without_logits(tiny_kwargs, make_batch, model_class, preset,
                                                                 autocast):  # fmt: skip
    torch.manual_seed(0)
    if preset == "modernbert":
        config = modeling.get_preset_config("modernbert-tiny", vocab_size=tiny_kwargs["vocab_size"], **NO_DROPOUT)
    else:
        config = SesameBertConfig(**tiny_kwargs, **NO_DROPOUT)
    model = model_class(config).train()
    batch = _labelled(model, make_batch)
    if model_class is SesameBertForPreTraining:
        batch["next_sentence_label"] = torch.tensor([0, 1, 1])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits, grads = _step(model, batch)
        skipped, skipped_grads = _step(model, batch, skip_logits=True)
    assert (skipped.logits if model_class is SesameBertForMaskedLM else skipped.prediction_logits) is None
    assert skipped_grads.keys() == grads.keys()
    if not autocast:
        torch.testing.assert_close(skipped.loss, logits.loss, rtol=1e-5, atol=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(skipped_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    else:  # against float32: within twice the error of autocast's two-step head plus a bf16 rounding of the largest
        # value (the encoder's own bf16 rounding is the same on both paths; the head's reaches it through the backward)
        reference, reference_grads = _step(model, batch)
        assert abs(skipped.loss - reference.loss) <= abs(logits.loss - reference.loss) + 2**-8 * reference.loss
        for name, want in reference_grads.items():
            error = (skipped_grads[name] - want).abs().max()
            assert error <= 2 * (grads[name] - want).abs().max() + 2**-8 * want.abs().max(), name
    model.eval()  # evaluation: the loss over the predicted positions, the same as with the (B, T, V) logits
    with torch.no_grad():
        full, fused = model(**batch), model(**batch, skip_logits=True)
    torch.testing.assert_close(fused.loss, full.loss, rtol=1e-6, atol=1e-6)


def test_pretrain_loss_passes_skip_logits_only_where_taken(tiny_kwargs, make_batch):
    torch.manual_seed(0)
    ours = SesameBertForMaskedLM(SesameBertConfig(**tiny_kwargs, **NO_DROPOUT)).train()
    batch = _labelled(ours, make_batch)

    # bare, in a data-parallel wrapper (``module``), compiled (``_orig_mod``; the traced loss takes the two-step form)
    for model in (ours, torch.nn.DataParallel(ours), torch.compile(ours, backend="eager")):
        out = mlm_outputs(model, batch)
        assert out.logits is None
        torch.testing.assert_close(mlm_loss(model, batch), ours(**batch).loss, rtol=1e-6, atol=1e-6)
    theirs = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=ours.config.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).train()  # fmt: skip
    out = mlm_outputs(theirs, batch)  # its forward takes no skip_logits: called as it is
    assert out.logits.shape == (*batch["labels"].shape, ours.config.vocab_size)
    assert mlm_loss(theirs, batch).item() == pytest.approx(out.loss.item(), abs=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("autocast", [False, True])
def test_on_cuda_against_float64(autocast):
    problem = _problem(n=300, e=64, v=5000, seed=4)
    expected = _grads(_two_step, *problem, dtype=torch.float64)
    on_cuda = [t.cuda() if t is not None else None for t in problem]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        fused = _grads(lambda h, w, b, y: linear_cross_entropy(h, w, b, y, chunk_elements=64 * 5000), *on_cuda)
        plain = _grads(_two_step, *on_cuda)
    for got, two_step, want in zip(fused, plain, expected):
        error = (got.double().cpu() - want).abs().max().item()
        assert error <= 2 * (two_step.double().cpu() - want).abs().max().item() + 1e-5 * want.abs().max().item()
