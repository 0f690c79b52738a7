"""Issue 52, items 1-2 in the shared loop: ``--optim stable_adamw`` against torch-optimi's StableAdamW stepped by
hand, decoupled weight decay against its formula, and the batch-size warmup (its step sizes against the formula,
the plan's token counts, and an exact resume in the middle of it)."""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch

from core.errors import InputError
from training import checkpoint_files as ckpt
from training.config import TrainingConfig
from training.optim import create_optimizer, no_decay_parameter_names, optimizer_from_config
from training.plan import BatchWarmup, make_plan


def _config(tmp_path, **kw) -> TrainingConfig:
    return TrainingConfig(output_dir=str(tmp_path / kw.pop("out", "run")), **kw)


def _split(model):
    """The decayed and the not-decayed parameters, as create_optimizer groups them."""
    no_decay = no_decay_parameter_names(model)
    named = list(model.named_parameters())
    return [p for n, p in named if n not in no_decay], [p for n, p in named if n in no_decay]


@pytest.mark.parametrize("decoupled", [False, True])
def test_stable_adamw_matches_optimi_stepped_by_hand(toy, tmp_path, decoupled):
    """--optim stable_adamw is torch-optimi's StableAdamW over the two groups (no decay on biases and norms), with
    the run's rate, betas, epsilon and decay: bitwise the same weights after steps on the same gradients, with a
    learning rate changed between steps as a schedule changes it."""
    from optimi import StableAdamW

    model = toy.model()
    twin = copy.deepcopy(model)
    config = _config(
        tmp_path,
        learning_rate=3e-2,
        weight_decay=0.1,
        adam_beta1=0.8,
        adam_beta2=0.95,
        adam_epsilon=1e-6,
        optim="stable_adamw",
        decoupled_weight_decay=decoupled,
    )
    ours = optimizer_from_config(model, config)
    assert isinstance(ours, StableAdamW)
    decay, other = _split(twin)
    by_hand = StableAdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
        lr=3e-2,
        betas=(0.8, 0.95),
        eps=1e-6,
        decouple_lr=decoupled,
        max_lr=3e-2 if decoupled else None,
    )
    g = torch.Generator().manual_seed(0)
    for step, factor in enumerate((1.0, 0.5, 0.25)):
        for a, b in zip(model.parameters(), twin.parameters()):
            grad = torch.randn(a.shape, generator=g) * (10.0 if step == 1 else 1.0)  # step 2: update clipping
            a.grad, b.grad = grad.clone(), grad.clone()
        for opt in (ours, by_hand):
            for group in opt.param_groups:
                group["lr"] = 3e-2 * factor
            opt.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name
    assert torch.equal(model.norm.bias, twin.norm.bias)


@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_torch_fused", "stable_adamw"])
def test_decoupled_weight_decay_follows_its_formula(toy, tmp_path, optim):
    """With zero gradients the Adam update is 0 and a step only decays: decayed weights x (1 - (lr_t / peak lr) x
    wd) with --decoupled_weight_decay, x (1 - lr_t x wd) without; biases and norms unchanged."""
    peak, wd = 2e-2, 0.3
    for decoupled in (True, False):
        model = toy.model()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        config = _config(tmp_path, learning_rate=peak, weight_decay=wd, optim=optim, decoupled_weight_decay=decoupled)
        opt = optimizer_from_config(model, config)
        lr_t = peak * 0.25  # a scheduled rate below the peak
        for group in opt.param_groups:
            group["lr"] = lr_t
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        factor = 1 - (lr_t / peak) * wd if decoupled else 1 - lr_t * wd
        no_decay = no_decay_parameter_names(model)
        for name, p in model.named_parameters():
            expected = before[name] if name in no_decay else before[name] * factor
            torch.testing.assert_close(p.detach(), expected, rtol=2e-7, atol=0, msg=f"{optim} {name} {decoupled}")
        assert not torch.equal(model.hidden.weight, before["hidden.weight"]), "the check can fail"


def test_decoupled_weight_decay_does_not_scale_with_the_peak_rate(toy):
    """Two peak rates, the same scheduled fraction of them: the decay of a step is the same (lr-independent)."""
    shrink = []
    for peak in (1e-3, 1e-1):
        model = toy.model()
        w0 = model.hidden.weight.detach().clone()
        opt = create_optimizer(model, peak, weight_decay=0.05, decoupled_weight_decay=True, fused=False)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        shrink.append((model.hidden.weight.detach() / w0).mean().item())
    assert shrink == pytest.approx([0.95, 0.95], rel=1e-6)


def _steps_by_formula(W: int, u: int, G: int, steps: int) -> list[int]:
    """Micro-batches of each step from k(t) = min(G, 1 + floor((G - 1) t / W)), t the tokens before the step."""
    out, t = [], 0
    for _ in range(steps):
        k = min(G, 1 + (G - 1) * t // W)
        out.append(k)
        t += k * u
    return out


@pytest.mark.parametrize("W, u, G", [(40, 4, 3), (1000, 7, 8), (5, 4, 4), (10_000, 256, 2)])
def test_batch_warmup_steps_follow_the_formula(W, u, G):
    warm = BatchWarmup.make(W, u, G)
    n = warm.steps + 5
    expected = _steps_by_formula(W, u, G, n)
    assert [warm.micro_batches(s) for s in range(1, n + 1)] == expected
    assert expected[warm.steps - 1] < G and expected[warm.steps] == G
    for steps in range(n + 1):
        assert warm.micro_batches_in(steps) == sum(expected[:steps])
    for m in range(1, sum(expected) + 1):  # the fewest steps that take m micro-batches
        assert warm.steps_for(m) == next(s for s in range(1, n + 1) if sum(expected[:s]) >= m)
    with pytest.raises(InputError, match="--gradient_accumulation_steps >= 2"):
        BatchWarmup.make(W, u, 1)


def test_plan_counts_the_tokens_of_the_warmup(tmp_path):
    """A token budget with a batch-size warmup: the steps that train those tokens, the smaller ones included."""
    config = _config(
        tmp_path, gradient_accumulation_steps=4, per_device_train_batch_size=2, batch_size_warmup_tokens=640
    )
    plan = make_plan(config, train_examples=1000, num_processes=2, max_seq_length=32, max_train_tokens=10_000)
    u = 2 * 2 * 32  # tokens of one micro-batch on every process
    ks = _steps_by_formula(640, u, 4, plan.max_train_steps)
    assert sum(ks) * u >= 10_000 > sum(ks[:-1]) * u
    assert plan.total_tokens == sum(ks) * u
    assert plan.max_train_steps > -(-10_000 // (u * 4)), "the warmup's steps are smaller: more of them"
    line = plan.summary("data", 1e-3, "x")
    assert "batch-size warmup over the first 640 tokens: 4 -> 16 sequences" in line
    assert f"{sum(ks) * u:.4g} tokens in all" in line
    timed = make_plan(
        config, train_examples=1000, num_processes=2, max_seq_length=32, max_train_steps=10, seconds_per_step=1.0
    )
    # a time budget's 10 full steps: the fewest steps that take their 40 micro-batches
    assert timed.micro_batches_in(timed.max_train_steps - 1) < 40 <= timed.micro_batches_in(timed.max_train_steps)
    plain = make_plan(config.resolved(batch_size_warmup_tokens=None), train_examples=1000, num_processes=2)
    assert plain.batch_warmup is None and plain.micro_batches(1) == 4
    with pytest.raises(InputError, match="fixed-length blocks"):
        make_plan(config, train_examples=1000, num_processes=1)


def _run(toy, tmp_path, *, out, resume=None, warmup=40, optim="adamw_torch_fused", steps=9, mixed_precision=None):
    config = toy.config(
        tmp_path / out,
        max_train_steps=steps,
        gradient_accumulation_steps=3,
        batch_size_warmup_tokens=warmup,
        num_warmup_steps=2,
        checkpointing_steps=3,
        checkpoints_total_limit=0,
        resume_from_checkpoint=resume,
        optim=optim,
        decoupled_weight_decay=optim == "stable_adamw",
        mixed_precision=mixed_precision,
    )
    # one "token" per example: micro-batches of 4 tokens
    plan = make_plan(config, train_examples=40, num_processes=1, max_seq_length=1, per_device_train_batch_size=4)
    trainer = toy.trainer(config, plan=plan)
    return trainer, trainer.train()


def _consumed(trainer) -> int:
    return trainer.state.epoch * 10 + trainer.state.batches_in_epoch


@pytest.mark.parametrize("optim, mixed_precision", [("adamw_torch_fused", None), ("stable_adamw", "bf16")])
def test_resume_in_the_middle_of_batch_size_warmup_is_bitwise(toy, tmp_path, optim, mixed_precision):
    """40 warmup tokens, micro-batches of 4, G = 3: steps of 1, 1, 1, 1, 1, 2, 2, 2, 3 micro-batches; a run
    resumed from step 3 (mid-warmup) ends with bitwise the weights and losses of the uninterrupted run. StableAdamW
    with decoupled weight decay (its state through accelerate's save_state) under bf16 autocast too."""
    full_trainer, full = _run(toy, tmp_path, out="full", optim=optim, mixed_precision=mixed_precision)
    assert [full_trainer.plan.micro_batches(s) for s in range(1, 10)] == [1, 1, 1, 1, 1, 2, 2, 2, 3]
    assert _consumed(full_trainer) == 13  # 14 but for step 7, whose second micro-batch the epoch's end cut off
    weights = {k: v.detach().cpu().clone() for k, v in full_trainer.unwrapped_model.state_dict().items()}
    os.makedirs(tmp_path / "part" / "checkpoints")
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_3", tmp_path / "part" / "checkpoints" / "step_3")
    trainer, resumed = _run(toy, tmp_path, out="part", resume="latest", optim=optim, mixed_precision=mixed_precision)
    for k, v in trainer.unwrapped_model.state_dict().items():
        assert torch.equal(v.cpu(), weights[k]), k
    assert [r["train_loss"] for r in resumed["log_history"]] == [r["train_loss"] for r in full["log_history"]]
    _, other = _run(toy, tmp_path, out="other", warmup=8, optim=optim, mixed_precision=mixed_precision)
    assert other["train_loss"] != full["train_loss"], "the check can fail: another warmup trains otherwise"


def test_resume_refuses_another_batch_size_warmup(toy, tmp_path):
    _run(toy, tmp_path, out="a", steps=3)
    with pytest.raises(InputError, match="batch_size_warmup_tokens 40 -> 8"):
        _run(
            toy,
            tmp_path,
            out="a",
            steps=3,
            warmup=8,
            resume=str(ckpt.checkpoint_dirs(tmp_path / "a" / "checkpoints")[-1][1]),
        )


def _phase_run(toy, tmp_path, out, steps, schedule, **kw):
    config = toy.config(
        tmp_path / out, max_train_steps=steps, lr_scheduler_type=schedule, checkpoints_total_limit=0, **kw
    )
    trainer = toy.trainer(config)
    return trainer, trainer.train()


def test_decay_phase_resumed_inside_is_one_warmup_stable_decay_run(toy, tmp_path):
    """Stable 6 steps (warmup 2, then constant) + a decay phase of 6 steps from its last checkpoint, the phase
    stopped after its step 2 and resumed (--resume_from_checkpoint latest): bitwise the weights and learning rates of
    one warmup-stable-decay run of 12 steps (1 - sqrt over the last 6; dropout on, epochs of 10 micro-batches)."""
    wsd = "warmup_stable_decay_1sqrt"
    single, one = _phase_run(toy, tmp_path, "single", 12, wsd, num_warmup_steps=2, num_decay_steps=6)
    _, stable = _phase_run(toy, tmp_path, "stable", 6, "constant_with_warmup", num_warmup_steps=2)
    start = str(tmp_path / "stable" / "checkpoints" / "step_6")
    phase = dict(num_warmup_steps=0, num_decay_steps=6, continue_from_checkpoint=start, checkpointing_steps=2)
    _phase_run(toy, tmp_path, "decay", 6, wsd, **phase)
    for name in os.listdir(tmp_path / "decay" / "checkpoints"):  # keep step_2 only: as if stopped there
        if name != "step_2":
            shutil.rmtree(tmp_path / "decay" / "checkpoints" / name)
    decay_trainer, decay = _phase_run(toy, tmp_path, "decay", 6, wsd, resume_from_checkpoint="latest", **phase)
    for k, v in decay_trainer.unwrapped_model.state_dict().items():
        assert torch.equal(v, single.unwrapped_model.state_dict()[k]), k
    lrs = [r["learning_rate"] for r in stable["log_history"] + decay["log_history"]]
    assert lrs == [r["learning_rate"] for r in one["log_history"]] and lrs[-1] == 0.0
    _, fresh = _phase_run(toy, tmp_path, "fresh", 6, wsd, num_warmup_steps=0, num_decay_steps=6)
    assert fresh["train_loss"] != decay["train_loss"], "the check can fail: the phase starts from the checkpoint"


def test_continue_from_checkpoint_is_checked_before_any_work(tmp_path):
    with pytest.raises(InputError, match="^--continue_from_checkpoint .*nope: no such folder; expected a checkpoint"):
        _config(tmp_path, continue_from_checkpoint=str(tmp_path / "nope"))
    (tmp_path / "half").mkdir()
    with pytest.raises(InputError, match="--continue_from_checkpoint .*half: not a complete checkpoint"):
        _config(tmp_path, continue_from_checkpoint=str(tmp_path / "half"))
