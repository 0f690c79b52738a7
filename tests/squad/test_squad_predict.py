"""finetune.squad --do_predict on questions without answers (v1.1 and v2 with the null threshold), the refusal
of such questions for training and evaluation, curves.png and the best model at the end, and 2-process
prediction writing every question once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.errors import InputError, run_cli
from finetune import squad
from finetune.squad_data import load_squad_file
from tests.squad.test_squad_cli import (  # noqa: F401  (fixtures)
    FAST,
    QUESTIONS,
    ROOT,
    WINDOW,
    _json,
    _one_thread,
    _run,
    squad_args,
    squad_document,
    tiny_sesame_bert,
    train_args,
    wordpiece_dir,
    write_json,
)


def _without_answers(document: dict) -> dict:
    """The same questions with the ``answers`` (and ``is_impossible``) keys removed, as a file to predict."""
    stripped = json.loads(json.dumps(document))
    for article in stripped["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa.pop("answers", None)
                qa.pop("is_impossible", None)
    return stripped


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_sesame_bert) -> Path:
    """A SesameBert QA model fine-tuned for a few steps on the six questions (v2 head: same weights either way)."""
    root = tmp_path_factory.mktemp("squad-trained")
    data = write_json(root / "train.json", squad_document(QUESTIONS))
    _run(
        squad_args(
            tiny_sesame_bert,
            root / "model",
            "--train_file",
            str(data),
            "--max_train_steps",
            "4",
            "--learning_rate",
            "1e-3",
        )
    )
    return root / "model"


def test_questions_without_answers_are_read_for_prediction_only(tmp_path):
    path = write_json(tmp_path / "q.json", _without_answers(squad_document(QUESTIONS)))
    ds, report = load_squad_file(path, version_2_with_negative=False, require_answers=False)
    assert ds["id"] == [q[0] for q in QUESTIONS] and all(a["text"] == [] for a in ds["answers"])
    assert report.questions == 6
    with pytest.raises(
        InputError,
        match=r"question id 'q1' has no 'answers'; training and evaluation need them.*--do_predict --test_file",
    ):
        load_squad_file(path, version_2_with_negative=True)


def test_evaluation_only_with_push_to_hub_pushes_nothing_and_succeeds(trained, tmp_path, monkeypatch):
    """--push_to_hub applies to training runs (as in glue): an evaluation-only run ends with exit 0, no hub call."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = write_json(tmp_path / "dev.json", squad_document(QUESTIONS))
    results = _run(
        squad_args(
            trained, tmp_path / "eval", "--validation_file", str(data), "--do_eval", "--push_to_hub", tail=WINDOW
        )
    )
    assert "eval_f1" in results


def test_predict_v1_writes_every_id_and_matches_evaluation(trained, tmp_path):
    document = squad_document(QUESTIONS)
    labelled = write_json(tmp_path / "dev.json", document)
    test = write_json(tmp_path / "test.json", _without_answers(document))
    out = tmp_path / "both"
    results = _run(
        squad_args(
            trained,
            out,
            "--validation_file",
            str(labelled),
            "--test_file",
            str(test),
            "--do_eval",
            "--do_predict",
            tail=WINDOW,
        )
    )
    predictions = _json(out / "predictions.json")
    assert list(predictions) == [q[0] for q in QUESTIONS]
    assert predictions == _json(out / "eval_predictions.json")  # the same questions, evaluated and predicted
    assert "eval_f1" in results and not (out / "null_odds.json").exists()
    only = tmp_path / "only"
    assert squad.main(squad_args(trained, only, "--test_file", str(test), "--do_predict", tail=WINDOW)) == 0
    assert _json(only / "predictions.json") == predictions
    assert set(_json(only / "nbest_predictions.json")) == set(predictions)


def test_predict_v2_applies_the_null_threshold(trained, tmp_path):
    unanswerable = [("u1", "whale", QUESTIONS[0][2], "When did it rain?")]
    test = write_json(tmp_path / "test.json", _without_answers(squad_document(QUESTIONS, unanswerable)))
    runs = {}
    for name, threshold in (("never", "1e6"), ("always", "-1e6"), ("zero", "0")):
        out = tmp_path / name
        assert (
            squad.main(
                squad_args(
                    trained,
                    out,
                    "--test_file",
                    str(test),
                    "--do_predict",
                    "--version_2_with_negative",
                    f"--null_score_diff_threshold={threshold}",
                    tail=WINDOW,
                )
            )
            == 0
        )
        runs[name] = (_json(out / "predictions.json"), _json(out / "null_odds.json"))
    ids = {q[0] for q in QUESTIONS} | {"u1"}
    assert all(set(p) == set(o) == ids for p, o in runs.values())
    assert all(a != "" for a in runs["never"][0].values()) and all(a == "" for a in runs["always"][0].values())
    predictions, odds = runs["zero"]
    assert all((predictions[q] == "") == (odds[q] > 0) for q in ids)


def test_training_or_evaluating_on_questions_without_answers_is_one_error_line(tiny_sesame_bert, tmp_path, capsys):
    test = write_json(tmp_path / "test.json", _without_answers(squad_document(QUESTIONS)))
    for flags in (["--train_file", str(test)], ["--validation_file", str(test), "--do_eval"]):
        out = tmp_path / "refused"
        assert (
            run_cli(
                squad.main, ["--model_name_or_path", str(tiny_sesame_bert), *flags, "--output_dir", str(out), *FAST]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
        assert "question id 'q1' has no 'answers'" in err and not out.exists()
    assert (
        run_cli(
            squad.main,
            [
                "--model_name_or_path",
                str(tiny_sesame_bert),
                "--do_predict",
                "--output_dir",
                str(tmp_path / "x"),
                "--validation_file",
                str(test),
            ],
        )
        == 2
    )
    assert "--do_predict needs --test_file" in capsys.readouterr().err


def test_training_writes_curves_and_keeps_the_best_model(tiny_sesame_bert, tmp_path):
    data = write_json(tmp_path / "train.json", squad_document(QUESTIONS))
    out = tmp_path / "best"
    best = "--max_train_steps 6 --eval_steps 2 --learning_rate 1e-3 --load_best_model_at_end --metric_for_best_model f1"
    results = _run(train_args(tiny_sesame_bert, out, data, *best.split()))
    history = [e for e in _json(out / "eval_history.json") if e["step"] > 0]
    best = max(history, key=lambda e: e["eval_f1"])  # the first of equal maxima, as the loop keeps
    assert results["best_step"] == best["step"] and results["eval_f1"] == best["eval_f1"]
    assert (out / "curves.png").is_file() and _json(out / "trainer_log.json")
    # the saved weights are the best step's checkpoint, not the last step's (equal F1s cannot tell them apart)
    from safetensors.torch import load_file

    saved = load_file(out / "model.safetensors")
    at_best = load_file(out / "checkpoints" / f"step_{best['step']}" / "model.safetensors")
    at_last = load_file(out / "checkpoints" / f"step_{results['global_step']}" / "model.safetensors")
    common = sorted(set(saved) & set(at_best))
    assert common and all(torch.equal(saved[k], at_best[k]) for k in common)
    assert best["step"] == results["global_step"] or any(not torch.equal(saved[k], at_last[k]) for k in common)
    again = tmp_path / "again"
    results2 = _run(squad_args(out, again, "--validation_file", str(data), "--do_eval", tail=WINDOW))
    assert results2["eval_f1"] == pytest.approx(best["eval_f1"])
    assert _json(again / "predictions.json") == _json(out / "predictions.json")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_process_prediction_writes_every_question_once(trained, tmp_path):
    rows = QUESTIONS + [("q7", "whale", QUESTIONS[0][2], "What did the sailors lower?", "the boats")]
    test = write_json(tmp_path / "seven.json", _without_answers(squad_document(rows)))
    one = tmp_path / "one"
    assert (
        squad.main(
            squad_args(
                trained, one, "--test_file", str(test), "--do_predict", "--per_device_eval_batch_size", "2", tail=WINDOW
            )
        )
        == 0
    )
    from tests._launch import launch_two_processes, run_ok, subprocess_env
    from tests.finetune.test_glue_workflows import _free_port

    two = tmp_path / "two"
    launch = launch_two_processes("--main_process_port", str(_free_port()), "-m", "finetune.squad")
    args = squad_args(
        trained, two, "--test_file", str(test), "--do_predict", tail=[*WINDOW, "--per_device_eval_batch_size", "2"]
    )
    run_ok([*launch, *args], ROOT, subprocess_env())
    predictions, reference = _json(two / "predictions.json"), _json(one / "predictions.json")
    assert sorted(predictions) == sorted(r[0] for r in rows) and list(predictions) == list(reference)
    assert predictions == reference


def test_prediction_files_are_readable_by_others_under_umask_022(trained, tmp_path):
    """Issue 32: predictions.json and nbest_predictions.json were written through mkstemp (0600); now 0644 under
    umask 022, as the model the fine-tune saved."""
    import os
    import stat

    test = write_json(tmp_path / "test.json", _without_answers(squad_document(QUESTIONS)))
    before = os.umask(0o022)
    try:
        out = tmp_path / "predicted"
        assert squad.main(squad_args(trained, out, "--test_file", str(test), "--do_predict", tail=WINDOW)) == 0
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_file()}
    assert {"predictions.json", "nbest_predictions.json"} <= set(modes)
    assert {name: oct(mode) for name, mode in modes.items() if mode != 0o644} == {}
    assert stat.S_IMODE((trained / "model.safetensors").stat().st_mode) & stat.S_IROTH
