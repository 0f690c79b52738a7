"""finetune.glue's train / evaluate / predict switches, best model at the end, curves.png, and prediction with 2
processes writing each example once."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import CPU_2PROC, ROOT, subprocess_env

from core.errors import run_cli
from finetune import glue
from tests.finetune.test_glue import COMMON, NLI, _write_nli, glue_args, task_args

#: The NLI files' columns, then ``COMMON``.
NLI_TAIL = ["--sentence1_key", "premise", "--sentence2_key", "hypothesis", *COMMON]


def _nli_args(model: Path | str, out: Path, train: Path, *flags: str) -> list[str]:
    """:func:`glue_args` of a run on the NLI rows in ``train`` (also its validation file), then ``flags``."""
    return glue_args(model, out, "--train_file", str(train), "--validation_file", str(train), *flags, tail=NLI_TAIL)


def _results(out: Path) -> dict:
    return json.loads((out / "all_results.json").read_text())


def _predictions(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()]


def test_eval_alone_reproduces_the_training_runs_metrics_and_predict_alone_writes_the_submission(
    tiny_bert, glue_dir, tmp_path
):
    data = ["--task_name", "sst2", "--glue_dir", str(glue_dir), *COMMON]
    trained = tmp_path / "trained"
    assert (
        glue.main(
            [
                "--model_name_or_path",
                str(tiny_bert),
                "--output_dir",
                str(trained),
                "--max_train_steps",
                "4",
                "--do_train",
                "--do_eval",
                "--do_predict",
                *data,
            ]
        )
        == 0
    )
    train_results = _results(trained)
    assert (trained / "curves.png").is_file() and json.loads((trained / "trainer_log.json").read_text())
    evaluated = tmp_path / "evaluated"
    assert glue.main(["--model_name_or_path", str(trained), "--output_dir", str(evaluated), "--do_eval", *data]) == 0
    eval_results = _results(evaluated)
    assert eval_results["eval_accuracy"] == train_results["eval_accuracy"]
    assert eval_results["eval_loss"] == pytest.approx(train_results["eval_loss"], rel=1e-6)
    assert "train_loss" not in eval_results and not (evaluated / "model.safetensors").exists()
    predicted = tmp_path / "predicted"
    assert glue.main(["--model_name_or_path", str(trained), "--output_dir", str(predicted), "--do_predict", *data]) == 0
    assert _predictions(predicted / "SST-2.tsv") == _predictions(trained / "SST-2.tsv")
    assert not (predicted / "all_results.json").exists() or "eval_accuracy" not in _results(predicted)


def test_custom_files_eval_and_predict_use_the_fine_tuned_heads_labels(tiny_bert, tmp_path, capsys):
    train = _write_nli(tmp_path / "train.tsv", NLI)
    dev = _write_nli(tmp_path / "dev.tsv", NLI[:3])  # only 3 of the labels' rows: label set must come from the model
    test = tmp_path / "test.tsv"
    test.write_text("index\tpremise\thypothesis\n7\tthe cat sat .\ta cat sat .\n9\tthe dog .\tit was bad .\n")
    out = tmp_path / "trained"
    assert glue.main(_nli_args(tiny_bert, out, train, "--max_train_steps", "3")) == 0
    again = tmp_path / "again"
    assert (
        glue.main(
            glue_args(
                out,
                again,
                "--validation_file",
                str(train),
                "--test_file",
                str(test),
                "--do_eval",
                "--do_predict",
                tail=NLI_TAIL,
            )
        )
        == 0
    )
    assert _results(again)["eval_accuracy"] == _results(out)["eval_accuracy"]
    rows = _predictions(again / "predictions_test.tsv")
    assert rows[0] == ["index", "prediction"] and [r[0] for r in rows[1:]] == ["7", "9"]
    assert {r[1] for r in rows[1:]} <= {"contradiction", "entailment", "neutral"}
    assert glue.main(glue_args(out, tmp_path / "dev3", "--validation_file", str(dev), "--do_eval", tail=NLI_TAIL)) == 0
    # switches that ask for a split that is not there
    for name, flags, message in [
        ("x", ["--validation_file", str(train), "--do_predict"], "--do_predict"),
        ("y", ["--test_file", str(test), "--do_train"], "training a custom task needs --train_file"),
    ]:
        assert run_cli(glue.main, glue_args(out, tmp_path / name, *flags, tail=NLI_TAIL)) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_load_best_model_at_end_through_the_command_line(tiny_bert, glue_dir, tmp_path):
    out = tmp_path / "best"
    assert (
        glue.main(
            task_args(
                tiny_bert,
                out,
                glue_dir,
                "sst2",
                "--max_train_steps",
                "4",
                "--eval_steps",
                "1",
                "--load_best_model_at_end",
                "--metric_for_best_model",
                "loss",
            )
        )
        == 0
    )
    results = _results(out)
    history = json.loads((out / "eval_history.json").read_text())
    best = min((e for e in history if e["step"] > 0), key=lambda e: e["eval_loss"])
    assert results["best_step"] == best["step"] and results["best_metric"] == best["eval_loss"]
    assert results["eval_loss"] == best["eval_loss"]
    # the saved model is the best step's: evaluating it again gives the best step's loss
    again = tmp_path / "again"
    assert glue.main(task_args(out, again, glue_dir, "sst2", "--do_eval")) == 0
    assert _results(again)["eval_loss"] == pytest.approx(best["eval_loss"], rel=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_predict_each_example_once(tiny_bert, tmp_path):
    train = _write_nli(tmp_path / "train.tsv", NLI)
    test = tmp_path / "test.tsv"  # 5 rows: with 2 processes and batches of 2 the last batch is padded by duplicates
    test.write_text(
        "index\tpremise\thypothesis\n" + "".join(f"{10 + i}\t{p}\t{h}\n" for i, (p, h, _) in enumerate(NLI[:5]))
    )
    out = tmp_path / "trained"
    flags = ["--test_file", str(test), "--max_train_steps", "3", "--do_train", "--do_predict"]
    assert glue.main(_nli_args(tiny_bert, out, train, *flags)) == 0
    two = tmp_path / "two"
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CPU_2PROC),
        "--main_process_port",
        str(_free_port()),
        "-m",
        "finetune.glue",
        "--model_name_or_path",
        str(out),
        "--test_file",
        str(test),
        "--validation_file",
        str(train),
        "--output_dir",
        str(two),
        "--do_predict",
        "--do_eval",
        "--per_device_eval_batch_size",
        "2",
        *NLI_TAIL,
    ]
    proc = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _predictions(two / "predictions_test.tsv")
    assert [r[0] for r in rows[1:]] == ["10", "11", "12", "13", "14"]  # each example once, in order
    assert rows == _predictions(out / "predictions_test.tsv")
    one = tmp_path / "one"
    assert glue.main(glue_args(out, one, "--validation_file", str(train), "--do_eval", tail=NLI_TAIL)) == 0
    assert _results(two)["eval_accuracy"] == _results(one)["eval_accuracy"]
