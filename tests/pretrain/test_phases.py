"""Issue 52, items 1-3 through ``pretrain``: the masking-rate schedule (the batch masked at the step's rate is the
batch masked at that rate directly; the evaluation keeps its rate; the rate is logged), and a run with StableAdamW,
decoupled weight decay, a batch-size warmup and a masking-rate schedule resumed in the middle of both schedules,
bitwise equal to the uninterrupted run."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from _launch import checkpoint_args, corpus_args

from core.errors import InputError, run_cli
from pretrain.cli import main, parse
from pretrain.collators import MaskingRateSchedule, MLMCollator, keep_selection_draws, select_at_rate


def _examples(tokenizer, n=6, length=40):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, len(tokenizer), (n, length), generator=g).tolist()
    examples = []
    for i, row in enumerate(ids):
        row = [tokenizer.cls_token_id, *row[: length - 2 - i], tokenizer.sep_token_id]  # other lengths: padding
        examples.append({"input_ids": row, "word_start": [1] * len(row), "index": 100 + i})
    return examples


@pytest.mark.parametrize("whole_word_mask", [False, True])
def test_masking_at_a_lower_rate_from_the_kept_draws_is_masking_at_that_rate(bert_tokenizer, whole_word_mask):
    """select_at_rate(batch masked at 0.4 with its draws, r) == the batch masked at r with the same seeds, for
    rates down to one so low that only the one forced prediction per sequence is left."""
    examples = _examples(bert_tokenizer)
    if whole_word_mask:
        for e in examples:
            e["word_start"] = [1 if j % 3 == 0 else 0 for j in range(len(e["input_ids"]))]
    high = MLMCollator(bert_tokenizer, 0.4, whole_word_mask=whole_word_mask, seed=7)
    keep_selection_draws(high)
    masked_high = high(examples)
    for rate in (0.4, 0.3, 0.15, 0.05, 1e-4):
        direct = MLMCollator(bert_tokenizer, rate, whole_word_mask=whole_word_mask, seed=7)(examples)
        lowered = select_at_rate(masked_high, rate)
        assert set(lowered) == set(direct)
        for key in direct:
            assert torch.equal(lowered[key], direct[key]), (rate, key)
    counts = [(select_at_rate(masked_high, r)["labels"] != -100).sum().item() for r in (0.4, 0.15, 1e-4)]
    assert counts[0] > counts[1] > counts[2], "the check can fail: fewer predictions at lower rates"
    per_word = 3 if whole_word_mask else 1  # words of 3 pieces: one forced word per sequence
    assert len(examples) <= counts[2] <= per_word * len(examples)


def test_masking_rate_schedule_is_linear_over_the_run():
    schedule = MaskingRateSchedule(0.3, 0.15, 11)
    assert [schedule.rate(s) for s in (1, 6, 11)] == pytest.approx([0.3, 0.225, 0.15])
    assert schedule.ceiling == 0.3 and schedule.logged(11) == {"mlm_probability": pytest.approx(0.15)}
    assert MaskingRateSchedule(0.1, 0.2, 1).rate(1) == 0.1


def test_masking_rate_schedule_is_refused_for_the_bilm(corpus_dir, tmp_path):
    with pytest.raises(InputError, match="--mlm_probability_end 0.1: .*bilm objective masks no token"):
        parse(
            corpus_args(corpus_dir, tmp_path / "o", "--model_type", "elmo", "--mlm_probability_end", "0.1", config=None)
        )
    with pytest.raises(InputError, match="expected a number in \\(0, 1\\)"):
        parse(corpus_args(corpus_dir, tmp_path / "o", "--mlm_probability_end", "1.5"))


def _tokenizer_args(tokenizer, tmp_path) -> list[str]:
    """``--tokenizer_name`` of ``tokenizer`` saved into ``tmp_path/tok``."""
    tokenizer.save_pretrained(tmp_path / "tok")
    return ["--tokenizer_name", str(tmp_path / "tok")]


def test_phases_resume_mid_schedules_is_bitwise(corpus_dir, bert_tokenizer, tmp_path, fresh_state):
    """StableAdamW with decoupled weight decay, a batch-size warmup (micro-batches of 8 x 32 = 256 tokens, G = 3,
    1024 warmup tokens: steps of 1, 1, 2, then 3 micro-batches) and a masking rate 0.3 -> 0.1 over 6 steps: the run
    resumed from its step-2 checkpoint (inside both schedules) ends with bitwise the uninterrupted run's weights and
    log; the evaluation's rate stays fixed (the same eval_loss for the same weights), and the rate is logged."""
    common = [
        *_tokenizer_args(bert_tokenizer, tmp_path),
        *checkpoint_args(6, 2),
        "--learning_rate",
        "2e-3",
        "--optim",
        "stable_adamw",
        "--decoupled_weight_decay",
        "--weight_decay",
        "1e-5",
        "--gradient_accumulation_steps",
        "3",
        "--batch_size_warmup_tokens",
        "1024",
        "--mlm_probability",
        "0.3",
        "--mlm_probability_end",
        "0.1",
        "--eval_steps",
        "2",
    ]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert run_cli(main, corpus_args(corpus_dir, full, *common)) == 0
    log = json.loads((full / "trainer_log.json").read_text())
    assert [r["mlm_probability"] for r in log] == pytest.approx([0.3 - 0.04 * s for s in range(6)])
    state = json.loads((full / "checkpoints" / "step_6" / "trainer_state.json").read_text())
    assert (state["epoch"], state["batches_in_epoch"]) == (0, 1 + 1 + 2 + 3 + 3 + 3)
    settings = json.loads((full / "run_config.json").read_text())
    assert settings["batch_size_warmup_steps"] == 3 and settings["optim"] == "stable_adamw"
    resumed.mkdir()
    shutil.copytree(full / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    assert run_cli(main, corpus_args(corpus_dir, resumed, *common, "--resume_from_checkpoint", "latest")) == 0
    assert (resumed / "model.safetensors").read_bytes() == (full / "model.safetensors").read_bytes()
    log_r = json.loads((resumed / "trainer_log.json").read_text())
    assert [r["train_loss"] for r in log_r] == [r["train_loss"] for r in log]
    evals = [json.loads((d / "eval_history.json").read_text()) for d in (full, resumed)]
    assert evals[0] == evals[1]


def test_stable_then_decay_phase_is_one_warmup_stable_decay_run(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, capsys
):
    """Acceptance (issue 52): a stable run of 4 steps (linear warmup of 2, then constant) followed by a decay phase
    of 2 steps from its step-4 checkpoint (--continue_from_checkpoint: weights, optimizer, random states, data
    position) gives bitwise the model.safetensors of one run of 6 steps with the same warmup-stable-decay schedule
    (1 - sqrt decay over the last 2 steps), and the same learning rates and losses step by step."""
    tok = tmp_path / "tok"
    bert_tokenizer.save_pretrained(tok)
    common = [
        "--tokenizer_name",
        str(tok),
        "--learning_rate",
        "2e-3",
        "--num_warmup_steps",
        "2",
        "--logging_steps",
        "1",
    ]
    common += ["--eval_steps", "4"]  # one evaluation at step 4 in each (it draws a loader seed from the global RNG)
    wsd = ["--lr_scheduler_type", "warmup_stable_decay_1sqrt", "--num_decay_steps", "2"]
    single, stable, decay = tmp_path / "single", tmp_path / "stable", tmp_path / "decay"
    assert run_cli(main, corpus_args(corpus_dir, single, *common, *wsd, "--max_train_steps", "6")) == 0
    stable_args = ["--lr_scheduler_type", "constant_with_warmup", "--max_train_steps", "4"]
    assert run_cli(main, corpus_args(corpus_dir, stable, *common, *stable_args)) == 0
    phase = [*wsd, "--num_warmup_steps", "0", "--max_train_steps", "2"]
    phase += ["--continue_from_checkpoint", str(stable / "checkpoints" / "step_4")]
    assert run_cli(main, corpus_args(corpus_dir, decay, *common, *phase)) == 0
    assert (decay / "model.safetensors").read_bytes() == (single / "model.safetensors").read_bytes()
    logs = {d.name: json.loads((d / "trainer_log.json").read_text()) for d in (single, stable, decay)}
    assert [r["learning_rate"] for r in logs["stable"] + logs["decay"]] == [r["learning_rate"] for r in logs["single"]]
    assert [r["train_loss"] for r in logs["stable"] + logs["decay"]] == [r["train_loss"] for r in logs["single"]]
    assert logs["decay"][0]["learning_rate"] < 2e-3, "the check can fail: the phase decays"
    assert (stable / "model.safetensors").read_bytes() != (single / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert run_cli(main, corpus_args(corpus_dir, tmp_path / "other", *common, *phase, "--learning_rate", "1e-3")) == 2
    error = capsys.readouterr().err
    assert "--continue_from_checkpoint" in error and "optimizer settings differ" in error and "learning_rate" in error


def test_context_extension_phase_carries_weights_optimizer_and_position(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, monkeypatch, caplog
):
    """A context-extension phase (ModernBERT: 1,024 -> 8,192 tokens, global rotary base 10k -> 160k): a 3-step
    modernbert-tiny run at 32 tokens with global base 10,000, continued at 64 tokens with 160,000. At the phase's start
    the model holds bitwise the checkpoint's weights, the optimizer its state (Adam's moments and step count), and the
    data position is the same share of the epoch in the blocks of 64 (e examples of N consumed -> floor(e x N' / N / 4)
    micro-batches of 4: the phase halves the sequences per step, keeping the tokens); the plan line says the new length
    and base; config.json has the new global base and the old local one. Another change (the layer count) is still
    refused, so is a resume with another base."""
    from safetensors.torch import load_file

    from training.checkpointer import Checkpointer

    seen = {}
    original = Checkpointer.start_phase

    def spy(self, state, scheduler, per_device_train_batch_size):
        path = original(self, state, scheduler, per_device_train_batch_size)
        if path is not None:
            model, optimizer = self.accelerator._models[0], self.accelerator._optimizers[0]
            seen.update(
                weights={k: v.detach().clone() for k, v in model.state_dict().items()},
                optimizer=copy.deepcopy(optimizer.state_dict()),
                position=(state.epoch, state.batches_in_epoch, state.num_train_examples),
            )
        return path

    monkeypatch.setattr(Checkpointer, "start_phase", spy)
    common = [*_tokenizer_args(bert_tokenizer, tmp_path), "--learning_rate", "2e-3", "--num_warmup_steps", "1"]
    stable, ext = tmp_path / "stable", tmp_path / "ext"
    stable_args = corpus_args(corpus_dir, stable, *common, *checkpoint_args(3, 3), config="modernbert-tiny")
    assert run_cli(main, [*stable_args, "--rope_theta", "10000"]) == 0
    ckpt = stable / "checkpoints" / "step_3"
    phase = ["--continue_from_checkpoint", str(ckpt), "--max_seq_length", "64", "--rope_theta", "160000"]
    phase += ["--per_device_train_batch_size", "4"]  # the same tokens per step as 8 x 32
    ext_args = corpus_args(corpus_dir, ext, *common, "--max_train_steps", "1", *phase, config="modernbert-tiny")
    with caplog.at_level("INFO"):
        assert run_cli(main, ext_args) == 0
    saved_weights = load_file(ckpt / "model.safetensors")
    assert saved_weights and set(saved_weights) <= set(seen["weights"])
    for name, tensor in saved_weights.items():
        assert torch.equal(seen["weights"][name], tensor), name
    saved_opt = torch.load(ckpt / "optimizer.bin", weights_only=True)
    assert saved_opt["state"].keys() == seen["optimizer"]["state"].keys()
    for key, tensors in saved_opt["state"].items():
        for name, value in tensors.items():
            assert torch.equal(torch.as_tensor(seen["optimizer"]["state"][key][name]), torch.as_tensor(value))
    assert int(torch.as_tensor(next(iter(saved_opt["state"].values()))["step"])) == 3
    saved_state = json.loads((ckpt / "trainer_state.json").read_text())
    epoch, batches, n_now = seen["position"]
    consumed = saved_state["batches_in_epoch"] * 8
    assert n_now < saved_state["num_train_examples"], "the check can fail: longer blocks, fewer of them"
    assert (epoch, batches) == (saved_state["epoch"], consumed * n_now // saved_state["num_train_examples"] // 4)
    assert batches >= 1
    configs = {d.name: json.loads((d / "config.json").read_text()) for d in (stable, ext)}
    rope = {name: {k: p["rope_theta"] for k, p in c["rope_parameters"].items()} for name, c in configs.items()}
    assert rope == {
        "stable": {"full_attention": 10000, "sliding_attention": 10000},
        "ext": {"full_attention": 160000, "sliding_attention": 10000},
    }
    assert "blocks of 64 tokens (were 32), global rotary base 160000 (was 10000)" in caplog.text

    other = tmp_path / "deeper.json"
    layers = [*configs["stable"]["layer_types"], "full_attention"]
    other.write_text(json.dumps(dict(configs["stable"], num_hidden_layers=4, layer_types=layers)))
    refused = corpus_args(corpus_dir, tmp_path / "x", *common, "--max_train_steps", "1", *phase, config=str(other))
    with pytest.raises(
        InputError,
        match="num_hidden_layers 3 -> 4.*a new phase may change only rope_parameters.full_attention.rope_theta",
    ):
        main(refused)
    with pytest.raises(
        InputError, match="--resume_from_checkpoint .*rope_parameters.full_attention.rope_theta 10000.0 -> 160000.0"
    ):
        main([*stable_args, "--rope_theta", "160000", "--resume_from_checkpoint", "latest"])
