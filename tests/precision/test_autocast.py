"""Every head of both families under bf16 autocast (CPU autocast in CI; CUDA autocast where there is a GPU):
forward and backward finite, the loss within a stated tolerance of the float32 loss with the same weights; masks
in the scores' own dtype; the ELMo LSTMs and the adaptive softmax in float32 inside autocast."""

from __future__ import annotations

import pytest
import torch
from precision.cases import BERT_CASES, ELMO_CASES, NO_DROPOUT  # tests/ is on sys.path (pyproject's pythonpath)
from torch import nn

from modeling import SesameBertForSequenceClassification
from modeling.elmo import SesameElmoForBidirectionalLM, SesameElmoForQuestionAnswering

#: |loss_bf16 - loss_fp32| <= REL * |loss_fp32| + ABS. bfloat16 keeps 8 significant bits (relative rounding error
#: 2^-9 ~ 0.2% per operation); through two tiny layers the measured difference is ~0.01-0.1%, so 2% leaves room
#: for other CPUs / GPUs without letting a broken precision path (a loss off by a factor, NaN) pass.
REL, ABS = 2e-2, 1e-3


def _fp32_and_bf16(model, batch, device):
    """(float32 loss, bf16-autocast loss) of ``model`` on ``batch`` (same RNG state for both), after checking that
    the autocast forward and backward are finite."""
    model.to(device)
    batch = {k: v.to(device) for k, v in batch.items()}
    torch.manual_seed(1)
    reference = model(**batch).loss.detach()
    torch.manual_seed(1)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = model(**batch)
    out.loss.backward()
    assert out.loss.dtype == torch.float32, "losses are computed in float32"
    assert torch.isfinite(out.loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    return reference, out.loss.detach()


@pytest.mark.parametrize("case", list(BERT_CASES))
def test_bert_heads_under_bf16_autocast(case, make_bert, batches, device):
    cls, overrides, extra = BERT_CASES[case]
    batch = batches["bert"]()
    model = make_bert(cls, **NO_DROPOUT, **overrides)
    fp32, bf16 = _fp32_and_bf16(model, {**batch, **extra(batch)}, device)
    assert abs(bf16 - fp32) <= REL * abs(fp32) + ABS, (float(fp32), float(bf16))


@pytest.mark.parametrize("case", list(ELMO_CASES))
def test_elmo_heads_under_bf16_autocast(case, make_elmo, batches, device):
    cls, overrides, extra = ELMO_CASES[case]
    batch = batches["elmo"]()
    model = make_elmo(cls, **overrides)
    fp32, bf16 = _fp32_and_bf16(model, {**batch, **extra(batch)}, device)
    assert abs(bf16 - fp32) <= REL * abs(fp32) + ABS, (float(fp32), float(bf16))


@pytest.mark.parametrize("pooling", ["max", "attention"])
def test_pooling_masks_use_the_minimum_of_the_scores_dtype(pooling, make_bert, batches, device):
    """Masked positions get no weight under autocast: the pooled output of a padded row equals that of the same
    row alone (bf16 tolerance), and no float32 minimum overflows a bf16 score."""
    model = make_bert(SesameBertForSequenceClassification, **NO_DROPOUT, classifier_pooling=pooling).eval().to(device)
    batch = {k: v.to(device) for k, v in batches["bert"]().items()}
    alone = {k: v[2:, :4] for k, v in batch.items()}  # row 2 has 4 tokens
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        padded = model.bert(**batch).pooler_output[2]
        single = model.bert(**alone).pooler_output[0]
    torch.testing.assert_close(padded.float(), single.float(), rtol=2e-2, atol=2e-2)


def test_elmo_lstms_run_in_float32_inside_autocast(make_elmo, batches, device):
    """Every nn.LSTM (the BiLM's two stacks and the heads' task BiLSTMs) sees a float32 input with autocast off,
    so cuDNN never runs it in fp16; the rest of the model does run in bf16."""
    model = make_elmo(SesameElmoForQuestionAnswering, freeze_backbone=False, fused_cpu_lstm=False).to(device)
    seen = []

    def record(module, args):
        x = args[0].data if isinstance(args[0], nn.utils.rnn.PackedSequence) else args[0]
        seen.append((x.dtype, torch.is_autocast_enabled(device.type)))

    lstms = [m for m in model.modules() if isinstance(m, nn.LSTM)]
    handles = [m.register_forward_pre_hook(record) for m in lstms]
    linear_dtypes = []
    handles.append(
        model.elmo.char_encoder.projection.register_forward_hook(lambda m, a, out: linear_dtypes.append(out.dtype))
    )
    batch = {k: v.to(device) for k, v in batches["elmo"]().items()}
    with torch.autocast(device.type, dtype=torch.bfloat16):
        model(
            **batch,
            start_positions=torch.tensor([4, 3, 2], device=device),
            end_positions=torch.tensor([5, 4, 2], device=device),
        ).loss.backward()
    for h in handles:
        h.remove()
    assert len(seen) >= len(lstms) and set(seen) == {(torch.float32, False)}, seen
    assert linear_dtypes == [torch.bfloat16]


def test_fused_cpu_lstm_runs_inside_autocast(make_elmo, batches):
    """On the CPU the fused BiLSTM kernel (float32) is used under autocast too, with the same result as float32."""
    from modeling.elmo import lstm_elmo

    model = make_elmo(SesameElmoForBidirectionalLM)
    batch = batches["elmo"]()
    calls = []
    real = lstm_elmo.BiLSTMProjectionFunction.apply
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lstm_elmo.BiLSTMProjectionFunction, "apply", lambda *a: calls.append(a[0].dtype) or real(*a))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(**batch)
    assert calls == [torch.float32] * model.config.num_layers


@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_adaptive_softmax_under_autocast_with_a_bf16_input(input_dtype, make_elmo, device):
    """The adaptive softmax gives float32 NLLs under autocast whatever the dtype of its input (CUDA bf16 autocast
    with a bf16 input used to fail in index_copy_), equal to the float32 computation on the same (rounded) input."""
    model = make_elmo(SesameElmoForBidirectionalLM, softmax="adaptive", adaptive_cutoffs=[20, 40]).to(device)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(40, model.config.projection_dim, generator=g).to(device, input_dtype)
    targets = torch.arange(40, device=device) % model.config.vocab_size
    reference = model._nll_sum(h.float(), targets, None)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        nll = model._nll_sum(h, targets, None)
        log_probs = model._exact_log_probs(h)
    assert nll.dtype == torch.float32 and log_probs.dtype == torch.float32
    torch.testing.assert_close(nll, reference, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(40, device=device), rtol=1e-5, atol=1e-5)
