"""``--objective rtd`` (ELECTRA replaced-token detection, issue 21) through ``pretrain``: the saved layout and its
metrics, the loop's per-term normalisation with the real model by hand, the collator's sampling numbers, bitwise
resume, prepared datasets and bf16."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from _helpers import one_step_config
from _launch import checkpoint_args, corpus_args, prepare_args

from core.errors import run_cli
from pretrain.cli import main


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _args(corpus_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--objective", "rtd", *corpus_args(corpus_dir, out, "--learning_rate", "1e-3", *extra)]


@pytest.fixture(scope="module")
def tok_dir(bert_tokenizer, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tok") / "wp"
    bert_tokenizer.save_pretrained(path)
    return str(path)


def test_rtd_run_saves_the_discriminator_and_the_generator_with_their_metrics(
    corpus_dir, tok_dir, tmp_path, fresh_state
):
    from transformers import AutoModel, AutoModelForMaskedLM, pipeline

    from training.plot import _panels, load_run

    out = tmp_path / "rtd"
    assert (
        run_cli(
            main, _args(corpus_dir, out, "--tokenizer_name", tok_dir, "--max_train_steps", "6", "--eval_steps", "3")
        )
        == 0
    )
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "sesame-bert" and config["architectures"] == ["SesameBertDiscriminator"]
    assert config["hidden_size"] == 128  # bert-tiny: the discriminator has the preset's shape
    generator = json.loads((out / "generator" / "config.json").read_text())
    assert (generator["hidden_size"], generator["embedding_size"]) == (32, 128)
    assert type(AutoModel.from_pretrained(out)).__name__ == "SesameBertModel"
    assert type(AutoModelForMaskedLM.from_pretrained(out / "generator")).__name__ == "SesameBertForMaskedLM"
    assert len(pipeline("fill-mask", model=str(out / "generator"))("the whale [MASK] from the sea .")) == 5
    results = json.loads((out / "all_results.json").read_text())
    for key in (
        "eval_generator_loss",
        "perplexity",
        "eval_discriminator_loss",
        "eval_discriminator_accuracy",
        "eval_replaced_precision",
        "eval_replaced_recall",
        "eval_replaced_fraction",
    ):
        assert key in results and math.isfinite(results[key]), key
    assert results["eval_loss"] == pytest.approx(
        results["eval_generator_loss"] + 50 * results["eval_discriminator_loss"], rel=1e-6
    )
    assert results["perplexity"] == pytest.approx(math.exp(results["eval_generator_loss"]))
    assert 0 < results["eval_replaced_fraction"] < 0.15 + 1e-9  # at most the masked share of the real tokens
    panels = {title: keys for title, _, keys, _ in _panels([load_run(out)])}  # what curves.png draws
    assert {"eval_loss", "eval_generator_loss", "eval_discriminator_loss"} <= set(panels["evaluation loss"])
    assert panels["perplexity"] == ["perplexity"]
    assert {
        "eval_discriminator_accuracy",
        "eval_replaced_precision",
        "eval_replaced_recall",
        "eval_replaced_fraction",
    } <= set(panels["evaluation metrics"])
    assert (out / "curves.png").stat().st_size > 0
    assert "Replaced-token detection" in (out / "README.md").read_text()


def test_rtd_resumes_bitwise(corpus_dir, tok_dir, tmp_path, fresh_state):
    """Stopped at step 3 and resumed: the same batches, masks, samples and dropout, so bitwise the same weights
    (same command -> same weights: tests/pretrain/test_real_runs.py, parametrised over the objective)."""
    common = ["--tokenizer_name", tok_dir, *checkpoint_args(6, 3)]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert run_cli(main, _args(corpus_dir, full, *common)) == 0
    resumed.mkdir()
    shutil.copytree(full / "checkpoints" / "step_3", resumed / "checkpoints" / "step_3")
    assert run_cli(main, _args(corpus_dir, resumed, *common, "--resume_from_checkpoint", "latest")) == 0
    for name in ("model.safetensors", "generator/model.safetensors"):
        assert _sha(resumed / name) == _sha(full / name), name
    log_full, log_resumed = (json.loads((d / "trainer_log.json").read_text()) for d in (full, resumed))
    assert [r["train_loss"] for r in log_resumed] == [r["train_loss"] for r in log_full]  # the whole log is kept


def test_rtd_trains_on_a_dataset_prepared_for_mlm_as_on_the_text(corpus_dir, tok_dir, tmp_path, fresh_state):
    from pretrain.prepare import main as prepare_main

    prepared = tmp_path / "prepared"
    assert run_cli(prepare_main, prepare_args(corpus_dir, tok_dir, prepared)) == 0
    assert json.loads((prepared / "manifest.json").read_text())["objective"] == "mlm"
    steps = ["--max_train_steps", "3", "--logging_steps", "1"]
    from_text, from_prepared = tmp_path / "text", tmp_path / "prep"
    assert run_cli(main, _args(corpus_dir, from_text, "--tokenizer_name", tok_dir, *steps)) == 0
    args = _args(corpus_dir, from_prepared, *steps)
    args = [
        a
        for i, a in enumerate(args)
        if a not in ("--train_file", "--validation_file") and args[i - 1] not in ("--train_file", "--validation_file")
    ]
    assert run_cli(main, [*args, "--prepared_dataset", str(prepared)]) == 0
    for name in ("model.safetensors", "generator/model.safetensors"):
        assert _sha(from_prepared / name) == _sha(from_text / name)


def test_rtd_under_bf16_autocast_trains_with_finite_metrics(corpus_dir, tok_dir, tmp_path, fresh_state):
    out = tmp_path / "bf16"
    assert (
        run_cli(
            main,
            _args(corpus_dir, out, "--tokenizer_name", tok_dir, "--max_train_steps", "4", "--mixed_precision", "bf16"),
        )
        == 0
    )
    results = json.loads((out / "all_results.json").read_text())
    assert all(math.isfinite(v) for k, v in results.items() if k.startswith("eval_"))
    assert math.isfinite(results["train_loss"]) and results["train_loss"] > 0
    from safetensors.torch import load_file

    weights = load_file(out / "model.safetensors")
    assert all(v.dtype == torch.float32 for v in weights.values())  # autocast: float32 master weights


def test_rtd_collator_draws_per_example_numbers_that_do_not_depend_on_the_batch(bert_tokenizer):
    from pretrain.collators import MLMCollator, RTDCollator

    collator = RTDCollator(MLMCollator(bert_tokenizer, seed=3))
    examples = [
        {"input_ids": [2, 10 + i, 11, 12, 13, 14, 3][: 4 + i], "word_start": [1] * (4 + i), "index": 100 + i}
        for i in range(4)
    ]
    together = collator(examples)
    alone = collator(examples[1:2])
    u = together["sampling_uniforms"]
    assert u.shape == together["input_ids"].shape and u.dtype == torch.float32
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert torch.equal(u[1, :5], alone["sampling_uniforms"][0, :5])  # the same example, another batch
    assert not torch.equal(u[0], u[1])
    collator.set_epoch(1)
    assert not torch.equal(collator(examples)["sampling_uniforms"], u)  # new numbers each epoch
    evaluation = RTDCollator(MLMCollator(bert_tokenizer, seed=3, salt=1))
    assert not torch.equal(evaluation(examples)["sampling_uniforms"], u)


def _micro_batches(vocab_size: int):
    """Two micro-batches with different numbers of masked and of real tokens (padding in the second)."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for rows, length, pad, every in ((3, 12, 0, 3), (2, 12, 5, 2)):
        ids = torch.randint(5, vocab_size, (rows, length), generator=g)
        keep = torch.ones_like(ids)
        keep[-1, length - pad :] = 0
        ids[keep == 0] = 0
        selected = torch.zeros_like(ids, dtype=torch.bool)
        selected[:, 1::every] = True
        selected &= keep.bool()
        batches.append(
            {
                "input_ids": torch.where(selected, torch.full_like(ids, 4), ids),
                "attention_mask": keep,
                "labels": torch.where(selected, ids, torch.full_like(ids, -100)),
                "sampling_uniforms": torch.rand(ids.shape, generator=g),
            }
        )
    return batches


def test_rtd_step_normalises_each_term_by_its_items_over_the_micro_batches(tmp_path, fresh_state):
    """One optimizer step over 2 micro-batches equals SGD on (sum of generator NLL) / (masked tokens of both) +
    lambda (sum of discriminator BCE) / (real tokens of both), computed by hand from the model's two terms."""
    from modeling import SesameBertForReplacedTokenDetection, SesameBertRTDConfig
    from pretrain.objectives import rtd_loss, rtd_weight
    from training.accelerator import make_accelerator
    from training.loop import Trainer

    torch.manual_seed(0)
    model = SesameBertForReplacedTokenDetection(
        SesameBertRTDConfig(
            vocab_size=40,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=16,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    )
    batches = _micro_batches(40)
    counts = [rtd_weight(b) for b in batches]
    assert counts[0].tolist() == [12, 36] and counts[1].tolist() == [9, 19]  # masked, real
    reference = copy.deepcopy(model)
    total = sum(counts)
    loss = sum(
        out.generator_loss * n[0] / total[0] + 50.0 * out.discriminator_loss * n[1] / total[1]
        for out, n in ((reference(**b), n) for b, n in zip(batches, counts))
    )
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    expected = {name: p.detach() - 0.5 * g for (name, p), g in zip(reference.named_parameters(), grads)}

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return i

    config = one_step_config(tmp_path / "run", lr=0.5, accumulation=2)
    loader = torch.utils.data.DataLoader(Batches(), batch_size=1, collate_fn=lambda i: batches[i[0]])
    trainer = Trainer(
        make_accelerator(config),
        model,
        loader,
        config,
        loss_fn=rtd_loss,
        weight_fn=rtd_weight,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
    )
    result = trainer.train()
    for name, p in trainer.unwrapped_model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert result["train_loss"] == pytest.approx(float(loss.detach()), rel=1e-5)


def test_rtd_generator_size_sharing_and_lambda_come_from_an_rtd_config(corpus_dir, tok_dir, tmp_path, fresh_state):
    """``--config_name`` of a saved :class:`SesameBertRTDConfig` sets the RTD fields: generator_size 0.5 of bert-tiny
    (hidden 128, 2 heads, intermediate 512) gives a generator of hidden 64, 1 head, intermediate 256; no sharing
    leaves it its own embeddings (no ``embedding_size``); lambda 7 weights the run's evaluation loss."""
    import modeling

    config_dir = tmp_path / "rtd-config"
    base = modeling.get_preset_config("bert-tiny").to_dict()
    base = {k: v for k, v in base.items() if k not in ("model_type", "architectures", "transformers_version")}
    modeling.SesameBertRTDConfig(
        **base, generator_size=0.5, embedding_sharing="none", discriminator_weight=7.0
    ).save_pretrained(config_dir)
    out = tmp_path / "half"
    args = [a if a != "bert-tiny" else str(config_dir) for a in _args(corpus_dir, out)]
    assert run_cli(main, [*args, "--tokenizer_name", tok_dir, "--max_train_steps", "2"]) == 0
    generator = json.loads((out / "generator" / "config.json").read_text())
    assert (generator["hidden_size"], generator["num_attention_heads"], generator["intermediate_size"]) == (64, 1, 256)
    assert generator.get("embedding_size") is None
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 128
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_loss"] == pytest.approx(
        results["eval_generator_loss"] + 7.0 * results["eval_discriminator_loss"], rel=1e-6
    )


def test_rtd_refuses_another_family_with_one_error_line(corpus_dir, tmp_path, capsys, fresh_state):
    status = run_cli(main, _args(corpus_dir, tmp_path / "elmo", "--model_type", "elmo"))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("error:") and "rtd" in err[0], err


def test_rtd_with_a_time_budget_times_its_two_term_loss(corpus_dir, tok_dir, tmp_path, fresh_state):
    """``--time_budget`` probes optimizer steps with the objective's loss: for rtd a (2,) loss with (2,) item counts
    (the probe once took ``float()`` of the counts and failed). The budget becomes a positive step count, recorded."""
    out = tmp_path / "budget"
    assert run_cli(main, _args(corpus_dir, out, "--tokenizer_name", tok_dir, "--time_budget", "0.05")) == 0
    steps = json.loads((out / "run_config.json").read_text())["max_train_steps"]
    assert isinstance(steps, int) and steps >= 1
