"""``finetune.glue --torch_compile`` (issue 30): batches of varying length (padding to the longest, length-grouped),
gradient accumulation, checkpoints and resume, bitwise against the compiled run itself."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _helpers import assert_saved_as_trained, compile_without_inductor
from _launch import checkpoint_args

import modeling  # noqa: F401  (registers the Auto classes)
from finetune import glue


def _args(tiny_bert, glue_dir, out, *extra):
    return [
        "--model_name_or_path",
        str(tiny_bert),
        "--task_name",
        "sst2",
        "--glue_dir",
        str(glue_dir),
        "--output_dir",
        str(out),
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "2",
        "--gradient_accumulation_steps",
        "2",
        "--learning_rate",
        "1e-3",
        *checkpoint_args(4, 2),
        "--torch_compile",
        "true",
        *extra,
    ]


def test_compiled_glue_run_saves_the_trained_model(tiny_bert, glue_dir, tmp_path, monkeypatch):
    """``finetune.glue --torch_compile``: the saved classifier has the model's own keys and loads with the trained
    weights, which differ from the initial ones."""
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    compile_without_inductor(monkeypatch)
    out = tmp_path / "compiled"
    assert glue.main(_args(tiny_bert, glue_dir, out)) == 0
    assert_saved_as_trained(out, out / "checkpoints" / "step_4", AutoModelForSequenceClassification)
    initial, trained = load_file(tiny_bert / "model.safetensors"), load_file(out / "model.safetensors")
    shared = [k for k in trained if k.split(".", 1)[-1] in initial]  # the encoder's weights (base prefix removed)
    assert shared and any(not torch.equal(initial[k.split(".", 1)[-1]], trained[k]) for k in shared)


@pytest.mark.slow
def test_compiled_glue_run_resumes_bitwise_against_itself(tiny_bert, glue_dir, tmp_path):
    run, resumed = tmp_path / "compiled", tmp_path / "resumed"
    assert glue.main(_args(tiny_bert, glue_dir, run)) == 0
    results = json.loads((run / "all_results.json").read_text())
    assert results["global_step"] == 4 and 0.0 <= results["eval_accuracy"] <= 1.0
    assert json.loads((run / "run_config.json").read_text())["torch_compile"] is True
    resumed.mkdir()
    shutil.copytree(run / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    assert glue.main(_args(tiny_bert, glue_dir, resumed, "--resume_from_checkpoint", "latest")) == 0
    assert (resumed / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()
    logs = [json.loads((d / "trainer_log.json").read_text()) for d in (run, resumed)]
    assert [r["train_loss"] for r in logs[1]] == [r["train_loss"] for r in logs[0]]
    assert len(logs[0]) == 4
