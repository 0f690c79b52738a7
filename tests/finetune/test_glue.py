"""finetune.glue end to end on tiny fixture tasks (single sentence, pair, regression, 3-class custom, ELMo)
and its refusals of bad input before training."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from _tiny import tiny_elmo_kwargs

import modeling  # noqa: F401  (registers the Auto classes)
from core.errors import InputError, run_cli
from finetune import glue
from training.data import LengthGroupedSampler

COMMON = [
    "--max_seq_length",
    "32",
    "--per_device_train_batch_size",
    "2",
    "--per_device_eval_batch_size",
    "4",
    "--learning_rate",
    "1e-3",
    "--logging_steps",
    "1",
]


def glue_args(model: Path | str, out: Path | str, *flags: str, tail: list[str] = COMMON) -> list[str]:
    """``finetune.glue`` arguments: ``--model_name_or_path model``, ``flags`` and ``--output_dir out``, then ``tail``
    (``COMMON``'s short sequences, small batches and learning rate, unless given)."""
    return ["--model_name_or_path", str(model), *flags, "--output_dir", str(out), *tail]


#: Train, evaluate and predict.
ALL_SPLITS = ["--do_train", "--do_eval", "--do_predict"]


def task_args(model: Path | str, out: Path | str, glue_dir: Path, task: str, *flags: str) -> list[str]:
    """:func:`glue_args` of GLUE task ``task`` read from ``glue_dir``, then ``flags``."""
    return glue_args(model, out, "--task_name", task, "--glue_dir", str(glue_dir), *flags)


def _run(args: list[str]) -> dict:
    assert glue.main(args) == 0
    out = Path(args[args.index("--output_dir") + 1])
    return json.loads((out / "all_results.json").read_text())


def _config(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


def test_single_sentence_task_from_glue_dir(tiny_bert, glue_dir, tmp_path):
    out = tmp_path / "sst2"
    results = _run(task_args(tiny_bert, out, glue_dir, "sst2", "--max_train_steps", "3", *ALL_SPLITS))
    assert results["global_step"] == 3 and results["train_loss"] > 0
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and results["eval_loss"] > 0
    config = _config(out)
    assert (
        config["id2label"] == {"0": "negative", "1": "positive"}
        and config["problem_type"] == "single_label_classification"
    )
    lines = (out / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and [line.split("\t")[0] for line in lines[1:]] == ["0", "1"]
    assert all(line.split("\t")[1] in ("0", "1") for line in lines[1:])
    # The fine-tuned model loads with the Auto class and predicts with the task's label names.
    from transformers import pipeline

    clf = pipeline("text-classification", model=str(out))
    assert clf("a charming film")[0]["label"] in ("negative", "positive")


def test_pair_task_and_3_class_task_mnli(tiny_bert, glue_dir, tmp_path):
    out = tmp_path / "mnli"
    results = _run(task_args(tiny_bert, out, glue_dir, "mnli", "--max_train_steps", "2", *ALL_SPLITS))
    for key in ("eval_accuracy", "eval_matched_accuracy", "eval_mismatched_accuracy", "eval_mismatched_loss"):
        assert key in results
    assert results["eval_accuracy"] == results["eval_matched_accuracy"]
    assert sorted(p.name for p in out.glob("*.tsv")) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    names = {line.split("\t")[1] for line in (out / "MNLI-mm.tsv").read_text().splitlines()[1:]}
    assert names <= {"entailment", "neutral", "contradiction"}


def test_regression_task(tiny_bert, glue_dir, tmp_path):
    out = tmp_path / "stsb"
    results = _run(task_args(tiny_bert, out, glue_dir, "stsb", "--max_train_steps", "2", *ALL_SPLITS))
    assert {"eval_pearson", "eval_spearmanr", "eval_loss"} <= set(results)
    config = _config(out)
    assert config["num_labels"] == 1 if "num_labels" in config else len(config["id2label"]) == 1
    assert config["problem_type"] == "regression"
    scores = [float(line.split("\t")[1]) for line in (out / "STS-B.tsv").read_text().splitlines()[1:]]
    assert len(scores) == 2 and all(0.0 <= s <= 5.0 for s in scores)


def _write_nli(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text(
        "index\tpremise\thypothesis\tlabel\n" + "".join(f"{i}\t{p}\t{h}\t{y}\n" for i, (p, h, y) in enumerate(rows))
    )
    return path


NLI = [
    ("the cat sat on the mat .", "a cat sat .", "entailment"),
    ("the dog is bad .", "the dog is good .", "contradiction"),
    ("he said yes .", "he is warm .", "neutral"),
    ("a man is playing .", "a man is playing a flute .", "neutral"),
    ("the plane is taking off .", "the plane is on the mat .", "contradiction"),
    ("the film was good .", "it was good .", "entailment"),
]


def test_custom_three_class_pair_files_and_pretrained_head_check(tiny_bert, tmp_path):
    train, dev, test = (_write_nli(tmp_path / f"{s}.tsv", NLI) for s in ("train", "dev", "test"))
    out = tmp_path / "custom"
    results = _run(
        glue_args(
            tiny_bert,
            out,
            "--train_file",
            str(train),
            "--validation_file",
            str(dev),
            "--test_file",
            str(test),
            "--sentence1_key",
            "premise",
            "--sentence2_key",
            "hypothesis",
            "--num_train_epochs",
            "2",
            "--do_train",
            "--do_eval",
            "--do_predict",
        )
    )
    assert {"eval_accuracy", "eval_macro_f1"} <= set(results) and results["global_step"] == 6  # 2 epochs x 3 batches
    assert _config(out)["id2label"] == {"0": "contradiction", "1": "entailment", "2": "neutral"}
    assert len((out / "predictions_test.tsv").read_text().splitlines()) == 7
    # Continue from the fine-tuned model with the MNLI label order: the head's labels are the same set, so the
    # task labels are mapped onto the head's ids (predictions keep their meaning), and the head is kept.
    again = tmp_path / "again"
    _run(
        glue_args(
            out,
            again,
            "--task_name",
            "mnli",
            "--train_file",
            str(train),
            "--validation_file",
            str(dev),
            "--max_train_steps",
            "1",
        )
    )
    assert _config(again)["id2label"] == {"0": "contradiction", "1": "entailment", "2": "neutral"}
    # A head with other labels is refused (before training) unless --ignore_mismatched_sizes.
    cola = tmp_path / "cola.tsv"
    cola.write_text("sentence\tlabel\nthe cat sat .\t1\ncat the sat .\t0\n")
    with pytest.raises(
        InputError,
        match=r"head predicts \['contradiction', 'entailment', 'neutral'\].*"
        r"\['unacceptable', 'acceptable'\].*--ignore_mismatched_sizes",
    ):
        glue.main(glue_args(out, tmp_path / "x", "--task_name", "cola", "--train_file", str(cola)))
    assert not (tmp_path / "x").exists()


def test_elmo_backbone_frozen_by_default(tmp_path, tiny_corpus):
    from modeling.elmo import SesameElmoConfig, SesameElmoModel
    from tokenizer.elmo_training import train_elmo_tokenizer

    model_dir = tmp_path / "tiny-elmo"
    tok = train_elmo_tokenizer([tiny_corpus], vocab_size=200, output_dir=tmp_path / "tok")
    config = SesameElmoConfig(**tiny_elmo_kwargs(len(tok), cnn_filters=[[1, 8], [2, 8]], task_hidden_size=8))
    torch.manual_seed(0)
    backbone = SesameElmoModel(config)
    backbone.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    train = _write_nli(tmp_path / "train.tsv", NLI)
    out = tmp_path / "elmo-out"
    results = _run(
        glue_args(model_dir, out, "--train_file", str(train), "--validation_file", str(train), "--max_train_steps", "2")
    )
    assert "eval_accuracy" in results and _config(out)["freeze_backbone"] is True
    # Frozen: the BiLM weights are unchanged by fine-tuning.
    from safetensors.torch import load_file

    before, after = load_file(model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    shared = [k for k in after if k in before or k.split(".", 1)[-1] in before]
    assert shared
    for key in shared:
        ref = before[key] if key in before else before[key.split(".", 1)[-1]]
        assert torch.equal(after[key], ref), key


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task_name", "sst5"], "unknown GLUE task"),
        (
            ["--task_name", "sst2", "--train_file", "{train}", "--sentence1_key", "sentence"],
            r"missing column\(s\) 'sentence' \(sentence1_key\); columns found",
        ),
        (["--task_name", "sst2", "--glue_dir", "{glue}", "--train_file", "{train}"], "give one data source"),
        (["--train_file", "{train}", "--per_device_train_batch_size", "0"], "--per_device_train_batch_size 0"),
    ],
)
def test_bad_input_is_refused_before_training(tiny_bert, glue_dir, tmp_path, capsys, args, message):
    train = _write_nli(tmp_path / "train.tsv", NLI)
    out = tmp_path / "refused"
    argv = ["--model_name_or_path", str(tiny_bert), "--output_dir", str(out)] + [
        a.format(train=train, glue=glue_dir) for a in args
    ]
    assert run_cli(glue.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    import re

    assert re.search(message, err)
    assert not out.exists()  # nothing written


def test_length_grouped_sampler_is_a_permutation_grouped_by_length():
    lengths = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10, 11, 12]
    sampler = LengthGroupedSampler(lengths, batch_size=2, seed=0, mega_batch_factor=2)
    order = list(sampler)
    assert sorted(order) == list(range(len(lengths)))
    assert lengths[order[0]] == max(lengths)  # the longest example comes first
    for start in range(0, len(order), 4):  # each mega-batch of 2 x 2 is sorted by decreasing length
        chunk = [lengths[i] for i in order[start : start + 4]]
        assert chunk == sorted(chunk, reverse=True)
    assert list(sampler) == order  # same (seed, epoch) -> same order
    sampler.set_epoch(1)
    assert list(sampler) != order


def test_every_output_file_is_readable_by_others_under_umask_022(tiny_bert, glue_dir, tmp_path):
    """Issue 32: model.safetensors (safetensors writes it through a 0600 temporary file) and the GLUE submission
    file (written through mkstemp) get the umask's 0644 like every other output."""
    import os
    import stat

    before = os.umask(0o022)
    try:
        out = tmp_path / "sst2"
        _run(
            ["--model_name_or_path", str(tiny_bert), "--task_name", "sst2", "--glue_dir", str(glue_dir)]
            + ["--output_dir", str(out), "--max_train_steps", "2", "--do_train", "--do_eval", "--do_predict", *COMMON]
        )
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_file()}
    assert {"model.safetensors", "SST-2.tsv", "all_results.json"} <= set(modes)
    assert {name: oct(mode) for name, mode in modes.items() if mode != 0o644} == {}


def test_learning_rate_rule_by_backbone_width_and_family():
    """Issue 32: without --learning_rate, narrow BERT-like backbones get 1e-4 (2e-5 left a bert-mini at the
    majority class), BERT-base-wide ones BERT's own rates (GLUE 2e-5, SQuAD 3e-5), a frozen ELMo BiLM 3e-3."""
    import modeling
    from finetune.arguments import default_learning_rate

    for preset, glue_rate, squad_rate in [
        ("bert-tiny", 1e-4, 1e-4),
        ("bert-mini", 1e-4, 1e-4),
        ("bert-base", 2e-5, 3e-5),
    ]:
        config = modeling.get_preset_config(preset)
        assert default_learning_rate(config, "glue")[0] == glue_rate, preset
        assert default_learning_rate(config, "squad")[0] == squad_rate, preset
        assert str(config.hidden_size) in default_learning_rate(config, "glue")[1]
    elmo = modeling.get_preset_config("elmo-small")
    assert default_learning_rate(elmo, "glue")[0] == 3e-3
    assert default_learning_rate(elmo, "glue", unfreeze_backbone=True)[0] == 1e-4
    with pytest.raises(ValueError):
        default_learning_rate(elmo, "pos")


def test_default_learning_rate_is_used_and_logged_with_its_source(tiny_bert, glue_dir, tmp_path, caplog):
    import logging

    flags = [f for f in COMMON if f not in ("--learning_rate", "1e-3")]
    base = ["--model_name_or_path", str(tiny_bert), "--task_name", "sst2", "--glue_dir", str(glue_dir)]
    with caplog.at_level(logging.INFO):
        _run([*base, "--output_dir", str(tmp_path / "a"), "--max_train_steps", "1", *flags])
    plan = [r.getMessage() for r in caplog.records if "optimizer steps; learning rate" in r.getMessage()]
    assert len(plan) == 1 and "learning rate 0.0001 (hidden size 32 < 768: 1e-4" in plan[0], plan
    recorded = json.loads((tmp_path / "a" / "run_config.json").read_text())
    assert recorded["learning_rate"] == 1e-4
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _run([*base, "--output_dir", str(tmp_path / "b"), "--max_train_steps", "1", *COMMON])
    plan = [r.getMessage() for r in caplog.records if "optimizer steps; learning rate" in r.getMessage()]
    assert len(plan) == 1 and "learning rate 0.001 (--learning_rate)" in plan[0], plan


def test_evaluation_at_one_class_warns_with_the_class_and_its_share(caplog):
    import logging

    from finetune.glue import warn_if_one_class

    names = ["negative", "positive"].__getitem__
    with caplog.at_level(logging.WARNING, logger="finetune.glue"):
        assert warn_if_one_class("validation", torch.tensor([1, 1, 1]), torch.tensor([1, 0, 1]), names, 2e-5)
    (message,) = [r.getMessage() for r in caplog.records]
    assert "every one of the 3 predictions is class positive (the majority class, 66.7% of the labels)" in message
    assert "higher --learning_rate than 2e-05" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="finetune.glue"):
        assert warn_if_one_class("validation", torch.tensor([0, 0, 0, 0]), torch.tensor([1, 0, 1, 1]), names, 1e-4)
        assert not warn_if_one_class("validation", torch.tensor([0, 1, 0]), torch.tensor([1, 0, 1]), names, 1e-4)
        assert not warn_if_one_class("validation", torch.tensor([1, 1]), torch.tensor([1, 1]), names, 1e-4)
    assert (
        len(caplog.records) == 1
        and "negative (a minority class, 25.0% of the labels)" in caplog.records[0].getMessage()
    )


def test_load_report_is_one_line_and_predict_only_ends_with_the_files_not_braces(tiny_bert, glue_dir, tmp_path, caplog):
    """Issue 32: transformers' LOAD REPORT table (it reads like an error) becomes one line naming the new head; a
    --do_predict run's last line names the prediction file (it ended with `{}`)."""
    import logging

    base = ["--task_name", "sst2", "--glue_dir", str(glue_dir)]
    with caplog.at_level(logging.INFO):
        _run(
            ["--model_name_or_path", str(tiny_bert), *base, "--output_dir", str(tmp_path / "ft")]
            + ["--max_train_steps", "1", *COMMON]
        )
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "LOAD REPORT" in m]
    (loaded,) = [m for m in messages if "newly initialised" in m]
    assert loaded.startswith(f"{tiny_bert}: newly initialised, to be trained: classifier")
    assert messages[-1].startswith(
        f"next: predict with it: python -m finetune.glue --model_name_or_path {tmp_path / 'ft'}"
    )
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _run(
            [
                "--model_name_or_path",
                str(tmp_path / "ft"),
                *base,
                "--do_predict",
                "--output_dir",
                str(tmp_path / "p"),
                *COMMON,
            ]
        )
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "newly initialised" in m]  # the fine-tuned head loads whole: nothing to say
    wrote = [m for m in messages if m.startswith(f"wrote {tmp_path / 'p'}:")]
    assert wrote == [f"wrote {tmp_path / 'p'}: no evaluation; files: SST-2.tsv, all_results.json, run_config.json"]
    assert not messages[-1].endswith("{}")


def test_the_one_class_warning_is_not_given_at_the_step_0_evaluation(
    tiny_bert, glue_dir, tmp_path, monkeypatch, caplog
):
    """Issue 43: the evaluation before training (the start of the validation curve) has had no update, so "learned
    nothing; try a higher --learning_rate" would be wrong there; the evaluations after updates keep the check."""
    from training import threads

    steps, threads_used = [], []

    def record(split, predictions, labels, label_of, learning_rate):
        steps.append(split)
        threads_used.append(torch.get_num_threads())
        return False

    monkeypatch.setattr(glue, "warn_if_one_class", record)
    # issue 43 item 1: make_accelerator applies the thread choice (a user's OMP_NUM_THREADS=1 over the 3 threads the
    # process had) and the plan line reports that choice (issue 49: a fresh one, not one left by an earlier test)
    for name in ("OMP_NUM_THREADS", *threads.LAUNCHER_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(threads, "_CHOSEN", None)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    out = tmp_path / "sst2"
    try:
        with caplog.at_level(logging.INFO):
            _run(task_args(tiny_bert, out, glue_dir, "sst2", "--max_train_steps", "2", "--eval_steps", "1"))
    finally:
        torch.set_num_threads(before)
    assert threads_used == [1, 1], threads_used  # during the evaluations after steps 1 and 2
    (plan,) = [r.getMessage() for r in caplog.records if "optimizer steps; learning rate" in r.getMessage()]
    assert plan.endswith("; 1 CPU thread per process (OMP_NUM_THREADS=1, yours)"), plan
    # evaluations at steps 0 (before any update), 1 and 2: the check runs at the last two only (three before)
    assert steps == ["validation", "validation"], steps
