"""The shared loop in one process: optimizer groups, schedules, step counting with accumulation, exact
resume, non-finite loss handling, checkpoint bookkeeping."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from core.errors import InputError, NonFiniteLossError, TrainingStopped
from training import checkpoint_files as ckpt
from training.config import TrainingConfig
from training.data import make_train_dataloader
from training.loop import Trainer
from training.optim import create_optimizer, create_scheduler, no_decay_parameter_names, optimizer_from_config


def test_no_weight_decay_on_biases_and_norms(toy):
    model = toy.model()
    assert no_decay_parameter_names(model) == {"norm.weight", "norm.bias", "hidden.bias", "out.bias"}
    opt = create_optimizer(model, 1e-3, weight_decay=0.1)
    decay, other = opt.param_groups
    assert decay["weight_decay"] == 0.1 and {id(p) for p in decay["params"]} == {
        id(model.hidden.weight),
        id(model.out.weight),
    }
    assert other["weight_decay"] == 0.0 and len(other["params"]) == 4
    with pytest.raises(InputError, match="--learning_rate"):
        create_optimizer(model, -1.0)


@pytest.mark.parametrize("optim, fused", [("adamw_torch", None), ("adamw_torch_fused", True)])
def test_optimizer_from_config_reads_every_setting(toy, tmp_path, optim, fused):
    """The loop's and the time-budget probe's optimizer: the run's rate, decay, betas, epsilon and --optim."""
    model = toy.model()
    config = TrainingConfig(
        output_dir=str(tmp_path),
        learning_rate=3e-3,
        weight_decay=0.2,
        adam_beta1=0.8,
        adam_beta2=0.95,
        adam_epsilon=1e-6,
        optim=optim,
    )
    opt = optimizer_from_config(model, config)
    decay, other = opt.param_groups
    assert (decay["lr"], decay["weight_decay"], other["weight_decay"]) == (3e-3, 0.2, 0.0)
    assert decay["betas"] == (0.8, 0.95) and decay["eps"] == 1e-6
    assert decay["fused"] is fused  # adamw_torch: torch's default (foreach) AdamW, fused left unset
    assert [len(g["params"]) for g in opt.param_groups] == [2, 4]


@pytest.mark.parametrize(
    "name", ["linear", "cosine", "constant_with_warmup", "warmup_stable_decay", "warmup_stable_decay_1sqrt"]
)
def test_schedules_follow_their_formulas(name):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1.0)
    W, N, D = 4, 20, 5
    sched = create_scheduler(name, opt, W, N, num_decay_steps=D)

    def expected(s):
        if s < W:
            return s / W
        if name == "linear":
            return max(0.0, (N - s) / (N - W))
        if name == "cosine":
            return 0.5 * (1 + math.cos(math.pi * (s - W) / (N - W)))
        if name == "constant_with_warmup":
            return 1.0
        if s < N - D:  # warmup_stable_decay: stable, then cosine (or 1 - sqrt) decay over D steps
            return 1.0
        if name == "warmup_stable_decay_1sqrt":  # Hägele et al. 2024: 1 - sqrt(progress)
            return 1.0 - math.sqrt((s - (N - D)) / D)
        return 0.5 * (1 + math.cos(math.pi * (s - (N - D)) / D))

    for s in range(N + 1):
        assert sched.get_last_lr()[0] == pytest.approx(expected(s), abs=1e-9), f"step {s}"
        opt.step()
        sched.step()


@pytest.mark.parametrize("W", [0, 3])
def test_decay_1sqrt_decays_over_the_whole_run_after_warmup(W):
    """``decay_1sqrt`` (a decay phase): linear warmup over W steps, then lr factor 1 - sqrt((s - W) / (N - W)) down
    to 0 at step N, with no stable part."""
    param = torch.nn.Parameter(torch.zeros(1))
    N = 12
    sched = create_scheduler("decay_1sqrt", torch.optim.AdamW([param], lr=1.0), W, N)
    for s in range(N + 1):
        expected = s / W if s < W else 1.0 - math.sqrt((s - W) / (N - W))
        assert sched.get_last_lr()[0] == pytest.approx(expected, abs=1e-9), f"step {s}"
        sched.optimizer.step()
        sched.step()


def test_warmup_stable_decay_default_decay_steps():
    param = torch.nn.Parameter(torch.zeros(1))
    for name, decay in (("warmup_stable_decay", 10), ("warmup_stable_decay_1sqrt", 20)):  # 10% / 20% of 100 steps
        sched = create_scheduler(name, torch.optim.AdamW([param], lr=1.0), 0, 100)
        lrs = []
        for _ in range(100):
            lrs.append(sched.get_last_lr()[0])
            sched.optimizer.step()
            sched.step()
        assert lrs[100 - decay] == 1.0 and lrs[101 - decay] < 1.0, name


@pytest.mark.parametrize(
    "steps,warmup,expected",
    [
        (1, 1, [0.0]),  # warmup only: no room for the default decay, and no refusal
        (2, 1, [0.0, 1.0]),  # 20% of 2 rounds to 0 -> at least 1 decay step, whose first value is the peak
        (10, 1, [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0 - math.sqrt(0.5)]),  # 2 decay steps
    ],
)
def test_default_decay_fits_within_a_short_run(steps, warmup, expected):
    """The default decay length of warmup_stable_decay_1sqrt (pretraining's default schedule) is cut to the steps
    warmup leaves, so a run of a few steps is not refused; a given --num_decay_steps that does not fit still is."""
    param = torch.nn.Parameter(torch.zeros(1))
    sched = create_scheduler("warmup_stable_decay_1sqrt", torch.optim.AdamW([param], lr=1.0), warmup, steps)
    lrs = []
    for _ in range(steps):
        lrs.append(sched.get_last_lr()[0])
        sched.optimizer.step()
        sched.step()
    assert lrs == pytest.approx(expected, abs=1e-12)
    with pytest.raises(InputError, match="warmup \\+ decay must not exceed"):
        create_scheduler(
            "warmup_stable_decay_1sqrt", torch.optim.AdamW([param], lr=1.0), warmup, steps, num_decay_steps=steps
        )


def _run(toy, tmp_path, *, steps, G=1, bs=4, resume=None, ckpt_steps=None, loss_fn=None, seed=0, out="run"):
    config = toy.config(
        tmp_path / out,
        max_train_steps=steps,
        gradient_accumulation_steps=G,
        num_warmup_steps=2,
        checkpointing_steps=ckpt_steps,
        checkpoints_total_limit=0,
        resume_from_checkpoint=resume,
        seed=seed,
    )
    trainer = toy.trainer(config, bs, seed, **({"loss_fn": loss_fn} if loss_fn else {}))
    return trainer, trainer.train()


def test_scheduler_takes_one_step_per_optimizer_step_with_accumulation(toy, tmp_path):
    # 40 examples / batch 4 = 10 micro-batches per epoch; G = 3 -> 4 optimizer steps per epoch (3+3+3+1)
    trainer, result = _run(toy, tmp_path, steps=7, G=3)
    assert trainer.plan.steps_per_epoch == 4
    assert result["global_step"] == 7 and trainer.scheduler.last_epoch == 7
    adam_steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
    assert adam_steps == {7}, "the optimizer stepped 7 times"
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(0.05 * (7 - 7) / (7 - 2))  # linear, end of run
    assert trainer.state.epoch == 1 and trainer.state.batches_in_epoch == 9  # 10 + 9 micro-batches
    lrs = [r["learning_rate"] for r in trainer.log_history]
    assert lrs == pytest.approx([0.05 * min(s / 2, (7 - s) / 5) for s in range(1, 8)])


def test_accumulation_gives_the_gradient_of_the_whole_batch(toy, tmp_path):
    """G micro-batches of B/G examples follow the same trajectory as one batch of B (no dropout)."""

    def run(G, bs, out):
        config = toy.config(tmp_path / out, max_train_steps=4, gradient_accumulation_steps=G)
        trainer = toy.trainer(config, bs, p_drop=0.0)
        trainer.train()
        return trainer.log_history, trainer.unwrapped_model.state_dict()

    log1, w1 = run(1, 8, "a")
    log4, w4 = run(4, 2, "b")
    assert [r["train_loss"] for r in log4] == pytest.approx([r["train_loss"] for r in log1], rel=1e-5)
    for k in w1:
        torch.testing.assert_close(w4[k], w1[k], rtol=1e-5, atol=1e-6)


def test_resume_continues_bitwise(toy, tmp_path):
    _, full = _run(toy, tmp_path, steps=9, G=2, ckpt_steps=3, out="full")
    trainer_full_weights = {k: v.clone() for k, v in _last_weights(tmp_path / "full").items()}
    # a second run that stops after step 3 (as if killed there), then a resumed run to the end
    import shutil

    os.makedirs(tmp_path / "part" / "checkpoints")
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_3", tmp_path / "part" / "checkpoints" / "step_3")
    trainer, resumed = _run(toy, tmp_path, steps=9, G=2, ckpt_steps=3, resume="latest", out="part")
    for k, v in trainer.unwrapped_model.state_dict().items():
        assert torch.equal(v.cpu(), trainer_full_weights[k]), k  # compare on the CPU, where the file was read
    assert resumed["train_loss"] == pytest.approx(full["train_loss"], rel=1e-12)
    assert trainer.scheduler.last_epoch == 9


def _last_weights(run_dir):
    from safetensors.torch import load_file

    step = ckpt.checkpoint_dirs(run_dir / "checkpoints")[-1][1]
    return load_file(step / "model.safetensors")


def test_nonfinite_loss_stops_and_keeps_the_last_checkpoint(toy, tmp_path):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss = model(**batch).loss
        return loss * float("nan") if calls["n"] == 5 else loss

    with pytest.raises(NonFiniteLossError, match=r"optimizer step 5 \(epoch 0, micro-batches 5-5.*step_4"):
        _run(toy, tmp_path, steps=8, ckpt_steps=2, loss_fn=loss_fn, out="nan")
    saved = ckpt.checkpoint_dirs(tmp_path / "nan" / "checkpoints")
    assert [s for s, _ in saved] == [2, 4]
    assert ckpt.read_state(saved[-1][1])["global_step"] == 4
    w = _last_weights(tmp_path / "nan")
    assert all(torch.isfinite(v).all() for v in w.values())


def test_checkpoint_bookkeeping(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 10, 4):  # complete: a manifest (here of no file) and the RNG file of its one process
        (root / f"step_{step}").mkdir(parents=True)
        (root / f"step_{step}" / ckpt.RNG_FILE.format(0)).write_bytes(b"")
        (root / f"step_{step}" / ckpt.STATE_FILE).write_text(json.dumps({"global_step": step, "files": {}}))
    (root / "step_12").mkdir()  # incomplete: no trainer_state.json
    (root / ".tmp-step_14").mkdir()  # a save that was interrupted
    assert [s for s, _ in ckpt.checkpoint_dirs(root)] == [2, 4, 10]
    assert ckpt.resolve_checkpoint("latest", root).name == "step_10"
    assert ckpt.resolve_checkpoint(None, root) is None
    assert ckpt.resolve_checkpoint("latest", tmp_path / "none") is None
    with pytest.raises(InputError, match="not a complete checkpoint"):
        ckpt.resolve_checkpoint(str(root / "step_12"), root)
    with pytest.raises(InputError, match="no such folder"):
        ckpt.resolve_checkpoint(str(root / "step_99"), root)


def test_keep_last_k_checkpoints(toy, tmp_path):
    config = TrainingConfig(
        output_dir=str(tmp_path / "k"), max_train_steps=6, checkpointing_steps=1, checkpoints_total_limit=2
    )
    acc = toy.accelerator(config)
    trainer = Trainer(acc, toy.model(), make_train_dataloader(toy.data(40), 4, toy.collate, seed=0), config)
    trainer.train()
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path / "k" / "checkpoints")] == [5, 6]
    assert not list((tmp_path / "k" / "checkpoints").glob(".tmp-*"))


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(InputError, match="--gradient_accumulation_steps 0"):
        TrainingConfig(output_dir=str(tmp_path), gradient_accumulation_steps=0)
    with pytest.raises(InputError, match="--report_to"):
        TrainingConfig(output_dir=str(tmp_path), report_to="mlflow")
    with pytest.raises(InputError, match="--per_device_train_batch_size 0"):
        make_train_dataloader(list(range(3)), 0, None, seed=0)


def test_requested_stop_writes_a_checkpoint_and_resumes_exactly(toy, tmp_path):
    _, full = _run(toy, tmp_path, steps=6, out="full")
    holder = {}

    def loss_fn(model, batch):
        holder["calls"] = holder.get("calls", 0) + 1
        if holder["calls"] == 3:
            holder["trainer"].request_stop()  # e.g. a SIGTERM handler, during step 3
        return model(**batch).loss

    config = toy.config(tmp_path / "stop", max_train_steps=6, num_warmup_steps=2, checkpoints_total_limit=0)
    trainer = toy.trainer(config, loss_fn=loss_fn)
    holder["trainer"] = trainer
    with pytest.raises(TrainingStopped, match="after optimizer step 3.*--resume_from_checkpoint latest"):
        trainer.train()
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path / "stop" / "checkpoints")] == [3]
    resumed_trainer, resumed = _run(toy, tmp_path, steps=6, resume="latest", out="stop")
    for k, v in _last_weights(tmp_path / "full").items():
        assert torch.equal(resumed_trainer.unwrapped_model.state_dict()[k].cpu(), v), k
