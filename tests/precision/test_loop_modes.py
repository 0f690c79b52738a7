"""The shared loop with SesameBert: a micro-batch with nothing to predict contributes 0 (no NaN, the run goes
on), bf16 autocast follows the float32 run, and ``--torch_compile`` gives the eager losses."""

from __future__ import annotations

import pytest
import torch

from modeling import SesameBertForMaskedLM, SesameBertForPreTraining

CLS, SEP = 2, 3


def _examples(n: int, empty_at: tuple[int, ...] = ()):
    """``n`` examples of 10 tokens with 3 MLM labels each; those at ``empty_at`` are a ``[CLS] [SEP]`` block with
    no label (what packing leaves at the end of a document)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        if i in empty_at:
            ids = torch.tensor([CLS, SEP])
            labels = torch.full_like(ids, -100)
        else:
            ids = torch.cat([torch.tensor([CLS]), torch.randint(5, 60, (8,), generator=g), torch.tensor([SEP])])
            labels = torch.full_like(ids, -100)
            labels[[2, 5, 7]] = ids[[2, 5, 7]]
        out.append({"input_ids": ids, "labels": labels})
    return out


def _collate(examples):
    width = max(len(e["input_ids"]) for e in examples)
    pad = lambda t, v: torch.cat([t, torch.full((width - len(t),), v, dtype=t.dtype)])  # noqa: E731
    return {
        "input_ids": torch.stack([pad(e["input_ids"], 0) for e in examples]),
        "attention_mask": torch.stack([pad(torch.ones_like(e["input_ids"]), 0) for e in examples]),
        "labels": torch.stack([pad(e["labels"], -100) for e in examples]),
    }


def _train(make_bert, tmp_path, name, data, steps, G=1, batch_size=1, mixed_precision=None, **config):
    from accelerate.state import AcceleratorState, GradientState

    from training.accelerator import make_accelerator
    from training.config import TrainingConfig
    from training.data import make_train_dataloader
    from training.loop import Trainer

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    cfg = TrainingConfig(
        output_dir=str(tmp_path / name),
        learning_rate=1e-3,
        max_train_steps=steps,
        gradient_accumulation_steps=G,
        logging_steps=1,
        seed=0,
        **config,
    )
    acc = make_accelerator(cfg, mixed_precision=mixed_precision)
    model = make_bert(SesameBertForMaskedLM, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    loader = make_train_dataloader(data, batch_size, _collate, seed=0, shuffle=False)
    trainer = Trainer(acc, model, loader, cfg)
    result = trainer.train()
    weights = {k: v.detach().cpu().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return trainer, result, weights


@pytest.mark.parametrize("cls", [SesameBertForMaskedLM, SesameBertForPreTraining])
@pytest.mark.parametrize("sparse", [True, False])
def test_a_batch_with_no_predicted_token_gives_loss_zero(cls, sparse, make_bert, device):
    model = make_bert(cls, sparse_prediction=sparse).to(device)
    batch = {k: v.to(device) for k, v in _collate(_examples(1, empty_at=(0,))).items()}
    out = model(**batch)
    assert out.loss is not None and float(out.loss.detach()) == 0.0
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() and not p.grad.any() for p in model.parameters() if p.grad is not None)
    if cls is SesameBertForPreTraining:  # the NSP term is still there: loss = 0 + mean NSP NLL over the pairs
        model.zero_grad()
        out = model(**batch, next_sentence_label=torch.tensor([1], device=device))
        expected = -out.seq_relationship_logits.float().log_softmax(-1)[0, 1]
        torch.testing.assert_close(out.loss, expected)


def test_the_loop_carries_on_past_an_empty_micro_batch(make_bert, tmp_path):
    """G = 2 micro-batches of 1 example, the second a ``[CLS] [SEP]`` block: the run does not stop as non-finite
    and its updates equal those of the run without the empty micro-batches (they contribute nothing)."""
    with_empty = _examples(8, empty_at=(1, 3, 5, 7))
    without = with_empty[0::2]
    _, result, w_empty = _train(make_bert, tmp_path, "empty", with_empty, steps=4, G=2)
    _, reference, w_ref = _train(make_bert, tmp_path, "ref", without, steps=4, G=1)
    assert result["global_step"] == 4
    assert result["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-6)
    for k, v in w_ref.items():
        torch.testing.assert_close(w_empty[k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_bf16_autocast_run_follows_the_float32_run(make_bert, tmp_path):
    data = _examples(12)
    _, fp32, _ = _train(make_bert, tmp_path, "fp32", data, steps=3, batch_size=4)
    _, bf16, _ = _train(make_bert, tmp_path, "bf16", data, steps=3, batch_size=4, mixed_precision="bf16")
    losses = [r["train_loss"] for r in fp32["log_history"]], [r["train_loss"] for r in bf16["log_history"]]
    assert losses[0] != losses[1], "autocast was on: the bf16 losses are rounded differently"
    assert all(abs(b - a) <= 2e-2 * a for a, b in zip(*losses)), losses  # the tolerance of test_autocast.py


@pytest.mark.slow  # ~50 s of inductor compilation on 2 CPU cores
def test_torch_compile_gives_the_eager_losses(make_bert, tmp_path):
    """``torch_compile=True``: same losses as eager (inductor fuses differently: float32 tolerance), and the
    unwrapped model, its state dict and the checkpoints have the eager parameter names."""
    from safetensors.torch import load_file

    data = _examples(8)
    _, eager, w_eager = _train(make_bert, tmp_path, "eager", data, steps=3, batch_size=4)
    trainer, compiled, w_compiled = _train(
        make_bert, tmp_path, "compiled", data, steps=3, batch_size=4, torch_compile=True
    )
    assert trainer.model is not trainer.unwrapped_model and type(trainer.unwrapped_model) is SesameBertForMaskedLM
    assert [r["train_loss"] for r in compiled["log_history"]] == pytest.approx(
        [r["train_loss"] for r in eager["log_history"]], rel=1e-4
    )
    assert w_compiled.keys() == w_eager.keys()
    saved = load_file(tmp_path / "compiled" / "checkpoints" / "step_3" / "model.safetensors")
    assert set(saved) <= set(w_eager) and not any("_orig_mod" in k for k in saved)
    for k, v in w_eager.items():
        torch.testing.assert_close(w_compiled[k], v, rtol=1e-3, atol=1e-4, msg=k)
    trainer.unwrapped_model.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "model.safetensors").is_file()
