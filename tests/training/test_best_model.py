"""Best model selection, early stopping and gradient checkpointing in the shared loop."""

from __future__ import annotations

import pytest
import torch
from _tiny import tiny_bert_kwargs

from core.errors import InputError, TrainingStopped
from training import checkpoint_files as ckpt
from training.config import TrainingConfig, greater_is_better
from training.data import make_train_dataloader
from training.loop import Trainer

#: A validation curve the test controls: eval_accuracy by optimizer step; it peaks at step 4.
CURVE = {2: 0.50, 4: 0.90, 6: 0.60, 8: 0.70, 10: 0.65, 12: 0.80}


def _curve_trainer(
    toy,
    tmp_path,
    out="run",
    *,
    steps=12,
    load_best=True,
    patience=None,
    limit=1,
    resume=None,
    loss_fn=None,
    metric="accuracy",
    **extra,
):
    config = toy.config(
        tmp_path / out,
        max_train_steps=steps,
        eval_steps=2,
        checkpoints_total_limit=limit,
        metric_for_best_model=metric,
        load_best_model_at_end=load_best,
        early_stopping_patience=patience,
        resume_from_checkpoint=resume,
        **extra,
    )
    seen: dict[int, dict[str, torch.Tensor]] = {}

    def eval_fn(trainer):
        step = trainer.state.global_step
        seen[step] = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
        return {"eval_accuracy": CURVE.get(step, 0.0), "eval_loss": 1.0 - CURVE.get(step, 0.0)}

    kwargs = {"loss_fn": loss_fn} if loss_fn else {}
    return toy.trainer(config, eval_fn=eval_fn, **kwargs), seen


def _equal_weights(model, reference: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, reference[k]) for k, v in model.state_dict().items())


def test_load_best_model_at_end_keeps_the_peak_weights(toy, tmp_path):
    trainer, seen = _curve_trainer(toy, tmp_path)
    result = trainer.train()
    assert result["global_step"] == 12 and result["best_step"] == 4 and result["best_metric"] == 0.90
    assert result["eval_accuracy"] == 0.90  # the metrics recorded for the weights kept
    assert _equal_weights(trainer.unwrapped_model, seen[4])
    assert not _equal_weights(trainer.unwrapped_model, seen[12])
    # checkpoints_total_limit 1: the last checkpoint plus the best one, which rotation never removed
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path / "run" / "checkpoints")] == [4, 12]


def test_without_load_best_the_last_weights_are_kept_but_the_best_step_is_reported(toy, tmp_path):
    trainer, seen = _curve_trainer(toy, tmp_path, load_best=False, limit=2)
    result = trainer.train()
    assert result["best_step"] == 4 and result["eval_accuracy"] == CURVE[12]
    assert _equal_weights(trainer.unwrapped_model, seen[12])
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path / "run" / "checkpoints")] == [12]


def test_early_stopping_stops_where_the_patience_says(toy, tmp_path):
    # best at 4; no improvement at 6 and 8 -> patience 2 stops at step 8
    trainer, seen = _curve_trainer(toy, tmp_path, patience=2)
    result = trainer.train()
    assert result["global_step"] == 8 and result["stopped_early"] is True
    assert [e["step"] for e in result["eval_history"]] == [0, 2, 4, 6, 8]  # no second evaluation of step 8
    assert result["best_step"] == 4 and _equal_weights(trainer.unwrapped_model, seen[4])
    # patience 3 goes on to step 10 (6, 8, 10 without improvement)
    trainer, _ = _curve_trainer(toy, tmp_path, "p3", patience=3)
    assert trainer.train()["global_step"] == 10


def test_lower_is_better_for_losses():
    assert greater_is_better(TrainingConfig(output_dir="", metric_for_best_model="eval_loss")) is False
    assert greater_is_better(TrainingConfig(output_dir="", metric_for_best_model="perplexity")) is False
    assert greater_is_better(TrainingConfig(output_dir="", metric_for_best_model="f1")) is True
    assert greater_is_better(TrainingConfig(output_dir="")) is False  # default eval_loss
    assert (
        greater_is_better(TrainingConfig(output_dir="", metric_for_best_model="loss", greater_is_better=True)) is True
    )


def test_best_by_loss(toy, tmp_path):
    trainer, seen = _curve_trainer(toy, tmp_path, "loss", metric="eval_loss")
    result = trainer.train()
    assert result["best_step"] == 4 and result["best_metric"] == pytest.approx(0.10)
    assert _equal_weights(trainer.unwrapped_model, seen[4])


def test_resume_keeps_the_best_model_bookkeeping(toy, tmp_path):
    full, full_seen = _curve_trainer(toy, tmp_path, "full", patience=2)
    full_result = full.train()
    holder = {"calls": 0}

    def loss_fn(model, batch):
        holder["calls"] += 1
        if holder["calls"] == 7:  # during step 7: after the best (4) and one evaluation without improvement (6)
            holder["trainer"].request_stop()
        return model(**batch).loss

    stopped, _ = _curve_trainer(toy, tmp_path, "stop", patience=2, loss_fn=loss_fn)
    holder["trainer"] = stopped
    with pytest.raises(TrainingStopped):
        stopped.train()
    state = ckpt.read_state(tmp_path / "stop" / "checkpoints" / "step_7")
    assert state["best_step"] == 4 and state["evals_without_improvement"] == 1
    resumed, _ = _curve_trainer(toy, tmp_path, "stop", patience=2, resume="latest")
    result = resumed.train()
    assert result["global_step"] == full_result["global_step"] == 8 and result["best_step"] == 4
    assert _equal_weights(resumed.unwrapped_model, full_seen[4])


def test_bad_best_model_settings_are_refused(toy, tmp_path):
    with pytest.raises(InputError, match="--early_stopping_patience 0"):
        TrainingConfig(output_dir=str(tmp_path), early_stopping_patience=0, eval_steps=1)
    with pytest.raises(InputError, match="--early_stopping_patience 2: needs --eval_steps"):
        TrainingConfig(output_dir=str(tmp_path), early_stopping_patience=2)
    trainer, _ = _curve_trainer(toy, tmp_path, metric="matthews_correlation")
    with pytest.raises(
        InputError,
        match=r"--metric_for_best_model matthews_correlation: not among the evaluation metrics "
        r"\['eval_accuracy', 'eval_loss'\]",
    ):
        trainer.train()


def test_gradient_checkpointing_gives_the_same_gradients_with_sesame_bert(tmp_path):
    from modeling import SesameBertConfig, SesameBertForSequenceClassification

    config = SesameBertConfig(
        **tiny_bert_kwargs(50, 32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2)
    )
    torch.manual_seed(0)
    ids = torch.randint(5, 50, (3, 12))
    labels = torch.tensor([0, 1, 1])
    grads, layer_calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(1)
        model = SesameBertForSequenceClassification(config)
        if checkpointing:
            from training.accelerator import enable_gradient_checkpointing

            enable_gradient_checkpointing(model)
        calls = []
        layer = next(m for m in model.modules() if type(m).__name__ == "SesameBertLayer")
        inner = next(m for m in layer.modules() if isinstance(m, torch.nn.Linear))  # runs again when recomputed
        inner.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        model.train()
        model(input_ids=ids, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        layer_calls.append(len(calls))
    assert layer_calls == [1, 2]  # with checkpointing the layer runs again in the backward pass
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_gradient_checkpointing_is_refused_for_models_without_it(toy, tmp_path):
    config = TrainingConfig(output_dir=str(tmp_path / "gc"), max_train_steps=1, gradient_checkpointing=True)
    acc = toy.accelerator(config)
    with pytest.raises(
        InputError, match="--gradient_checkpointing: ToyRegressor does not support gradient checkpointing"
    ):
        Trainer(acc, toy.model(), make_train_dataloader(toy.data(8), 4, toy.collate, seed=0), config)
