"""finetune.squad end to end on a handful of SQuAD questions written to tmp_path: SesameBert (v1, overfit to
EM 100, the saved model reloaded by the Auto classes), v2 with the null threshold, transformers' BERT, SesameElmo
(word-level
windows), evaluation only; refused input through the CLI (one line, exit 2, nothing written)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _launch import launch_two_processes, run_ok
from _tiny import tiny_bert_kwargs, tiny_elmo_kwargs

import modeling  # noqa: F401  (registers the Auto classes)
from core.errors import run_cli
from finetune import squad

#: (id, title, context, question, answer) -- the answer occurs once in the context (checked by squad_data).
QUESTIONS = [
    (
        "q1",
        "whale",
        "The whale rose from the sea and the sailors lowered the boats.",
        "What rose from the sea?",
        "whale",
    ),
    (
        "q2",
        "whale",
        "The whale rose from the sea and the sailors lowered the boats.",
        "Who lowered the boats?",
        "the sailors",
    ),
    (
        "q3",
        "city",
        "It rained in the afternoon and the streets of the city were wet.",
        "When did it rain?",
        "afternoon",
    ),
    (
        "q4",
        "city",
        "It rained in the afternoon and the streets of the city were wet.",
        "What were wet?",
        "the streets of the city",
    ),
    ("q5", "senate", "The Senate adjourned after a long debate on the budget.", "Who adjourned?", "The Senate"),
    (
        "q6",
        "senate",
        "The Senate adjourned after a long debate on the budget.",
        "What was the debate on?",
        "the budget",
    ),
]


def squad_document(rows, unanswerable=()) -> dict:
    """Nested SQuAD layout of ``rows``; ``unanswerable``: extra (id, title, context, question) without answer."""
    data: dict[str, dict[str, list]] = {}
    for qid, title, context, question, answer in rows:
        qa = {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": context.index(answer)}]}
        data.setdefault(title, {}).setdefault(context, []).append(qa)
    for qid, title, context, question in unanswerable:
        data.setdefault(title, {}).setdefault(context, []).append(
            {"id": qid, "question": question, "answers": [], "is_impossible": True}
        )
    return {
        "version": "v2.0" if unanswerable else "1.1",
        "data": [
            {"title": t, "paragraphs": [{"context": c, "qas": qas} for c, qas in ps.items()]} for t, ps in data.items()
        ],
    }


def write_json(path: Path, document) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@pytest.fixture
def squad_file(tmp_path) -> Path:
    """The six answerable questions as a SQuAD v1.1 file."""
    return write_json(tmp_path / "train.json", squad_document(QUESTIONS))


@pytest.fixture(scope="session")
def wordpiece_dir(tmp_path_factory) -> Path:
    """A WordPiece tokenizer trained (by the project's trainer) on the questions' text."""
    from tokenizer.wordpiece import train_wordpiece_tokenizer

    root = tmp_path_factory.mktemp("squad-wordpiece")
    corpus = root / "corpus.txt"
    text = [line for q in QUESTIONS for line in q[2:4]] * 3
    corpus.write_text("\n".join(text) + "\n", encoding="utf-8")
    train_wordpiece_tokenizer([corpus], vocab_size=200, output_dir=root / "tok", min_frequency=1)
    return root / "tok"


def _bert_kwargs(vocab_size: int) -> dict:
    return tiny_bert_kwargs(vocab_size, 128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="session")
def tiny_sesame_bert(tmp_path_factory, wordpiece_dir) -> Path:
    """A randomly initialised 2-layer SesameBert (hidden 32) with the trained tokenizer, saved (no QA head)."""
    from transformers import AutoTokenizer

    from modeling import SesameBertConfig, SesameBertModel

    tok = AutoTokenizer.from_pretrained(wordpiece_dir)
    path = tmp_path_factory.mktemp("tiny-sesame-bert")
    torch.manual_seed(0)
    SesameBertModel(SesameBertConfig(**_bert_kwargs(len(tok)))).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_hf_bert(tmp_path_factory, wordpiece_dir) -> Path:
    """The same size of transformers' own BertModel (the baseline backbone), saved with the tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(wordpiece_dir)
    path = tmp_path_factory.mktemp("tiny-hf-bert")
    torch.manual_seed(0)
    BertModel(BertConfig(**_bert_kwargs(len(tok))), add_pooling_layer=False).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_elmo(tmp_path_factory) -> Path:
    """A tiny SesameElmo BiLM with the project's word + character tokenizer trained on the questions' text."""
    from modeling.elmo import SesameElmoConfig, SesameElmoModel
    from tokenizer.elmo_training import train_elmo_tokenizer

    root = tmp_path_factory.mktemp("tiny-elmo")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(line for q in QUESTIONS for line in q[2:4]) + "\n", encoding="utf-8")
    tok = train_elmo_tokenizer([corpus], vocab_size=200, output_dir=root / "tok")
    config = SesameElmoConfig(**tiny_elmo_kwargs(len(tok)))
    torch.manual_seed(0)
    SesameElmoModel(config).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root / "model"


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: the models are tiny and the machine's 2 cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


ROOT = Path(__file__).resolve().parents[2]
WINDOW = ["--max_seq_length", "48", "--doc_stride", "8", "--max_query_length", "12"]
FAST = [*WINDOW, "--per_device_train_batch_size", "6", "--per_device_eval_batch_size", "4", "--logging_steps", "5"]
CONTEXTS = {q[0]: q[2] for q in QUESTIONS}
ANSWERS = {q[0]: q[4] for q in QUESTIONS}


def _run(args: list[str]) -> dict:
    assert squad.main(args) == 0
    out = Path(args[args.index("--output_dir") + 1])
    return json.loads((out / "all_results.json").read_text())


def squad_args(model: Path | str, out: Path | str, *flags: str, tail: list[str] = FAST) -> list[str]:
    """``finetune.squad`` arguments: ``--model_name_or_path model``, ``flags`` and ``--output_dir out``, then ``tail``
    (the small windows and batches of ``FAST``, or ``WINDOW`` alone)."""
    return ["--model_name_or_path", str(model), *flags, "--output_dir", str(out), *tail]


def train_args(model: Path | str, out: Path | str, data: Path, *flags: str) -> list[str]:
    """:func:`squad_args` of a run trained and evaluated on the questions in ``data``, then ``flags``."""
    return squad_args(model, out, "--train_file", str(data), "--validation_file", str(data), *flags)


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_v1_sesame_bert_overfits_to_em_100_and_reloads_with_auto_classes(tiny_sesame_bert, squad_file, tmp_path):
    out = tmp_path / "v1"
    results = _run(
        train_args(
            tiny_sesame_bert,
            out,
            squad_file,
            "--learning_rate",
            "3e-3",
            "--max_train_steps",
            "60",
            "--num_warmup_steps",
            "5",
        )
    )
    for key in ("eval_exact_match", "eval_f1", "train_loss", "train_runtime_s", "train_samples_per_second"):
        assert key in results, key
    assert results["global_step"] == 60 and results["train_samples"] == 6
    predictions = _json(out / "predictions.json")
    assert list(predictions) == [q[0] for q in QUESTIONS]
    assert predictions == ANSWERS  # memorised: every span exactly right
    assert results["eval_exact_match"] == 100.0 and results["eval_f1"] == 100.0
    nbest = _json(out / "nbest_predictions.json")
    for qid, entries in nbest.items():
        assert entries[0]["text"] == predictions[qid]
        assert all(CONTEXTS[qid][e["offsets"][0] : e["offsets"][1]] == e["text"] for e in entries)
        assert abs(sum(e["probability"] for e in entries) - 1.0) < 1e-6
    assert not (out / "null_odds.json").exists()
    assert _json(out / "config.json")["architectures"] == ["SesameBertForQuestionAnswering"]
    # The saved model is a standard question-answering model: loaded by the Auto classes alone, it gives the same
    # answers through the QA features + post-processing (and through pipeline("question-answering") where the
    # installed transformers still has that pipeline; transformers 5 removed it).
    import transformers
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from finetune.qa import postprocess_qa_predictions, prepare_validation_features

    model, tok = AutoModelForQuestionAnswering.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)
    batch = {
        "id": [q[0] for q in QUESTIONS],
        "question": [q[3] for q in QUESTIONS],
        "context": [q[2] for q in QUESTIONS],
    }
    feats = prepare_validation_features(batch, tok, 48, 8, 12)
    inputs = tok.pad({k: feats[k] for k in ("input_ids", "attention_mask", "token_type_ids")}, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs)
    rows = [
        {"example_id": e, "offset_mapping": o, "cls_index": c}
        for e, o, c in zip(feats["example_id"], feats["offset_mapping"], feats["cls_index"])
    ]
    again, _, _ = postprocess_qa_predictions(
        [{"id": q[0], "context": q[2]} for q in QUESTIONS], rows, logits.start_logits.numpy(), logits.end_logits.numpy()
    )
    assert again == predictions
    if "question-answering" in getattr(transformers.pipelines, "SUPPORTED_TASKS", {}):
        qa = transformers.pipeline("question-answering", model=str(out))
        for qid, _, context, question, _ in QUESTIONS:
            answer = qa(question=question, context=context)
            assert answer["answer"] == predictions[qid]


def test_v2_null_threshold_decides_the_empty_answer(tiny_sesame_bert, tmp_path):
    unanswerable = [
        ("u1", "whale", QUESTIONS[0][2], "When did it rain?"),
        ("u2", "senate", QUESTIONS[4][2], "What were wet?"),
    ]
    data = write_json(tmp_path / "v2.json", squad_document(QUESTIONS[:4], unanswerable))
    common = [
        "--model_name_or_path",
        str(tiny_sesame_bert),
        "--train_file",
        str(data),
        "--validation_file",
        str(data),
        "--version_2_with_negative",
        "--max_train_steps",
        "3",
        "--learning_rate",
        "1e-3",
        *FAST,
    ]
    runs = {}
    for name, threshold in (("never", "1e6"), ("always", "-1e6"), ("zero", "0")):
        out = tmp_path / name
        runs[name] = (
            _run([*common, "--output_dir", str(out), f"--null_score_diff_threshold={threshold}"]),
            _json(out / "predictions.json"),
            _json(out / "null_odds.json"),
        )
    ids = {"q1", "q2", "q3", "q4", "u1", "u2"}
    for results, predictions, odds in runs.values():
        assert set(predictions) == set(odds) == ids
        for key in (
            "eval_exact_match",
            "eval_f1",
            "eval_HasAns_exact",
            "eval_HasAns_f1",
            "eval_NoAns_exact",
            "eval_NoAns_f1",
            "eval_best_f1",
            "eval_best_f1_thresh",
            "eval_best_exact",
        ):
            assert key in results, key
        assert results["eval_HasAns_total"] == 4 and results["eval_NoAns_total"] == 2
        assert results["eval_best_f1"] >= results["eval_f1"] - 1e-9
    # Same training (same seed), so the same null odds; only the decision differs.
    assert runs["never"][2] == runs["always"][2] == runs["zero"][2]
    results, predictions, odds = runs["always"]
    assert all(p == "" for p in predictions.values())
    assert results["eval_NoAns_exact"] == 100.0 and results["eval_HasAns_exact"] == 0.0
    assert results["eval_exact_match"] == pytest.approx(100 * 2 / 6)
    results, predictions, odds = runs["never"]
    assert all(p != "" for p in predictions.values()) and results["eval_NoAns_exact"] == 0.0
    _, predictions, odds = runs["zero"]
    assert all((predictions[q] == "") == (odds[q] > 0) for q in ids)
    assert all(predictions[q] in ("", runs["never"][1][q]) for q in ids)


def test_transformers_bert_baseline_and_eval_only(tiny_hf_bert, squad_file, tmp_path):
    out = tmp_path / "hf"
    results = _run(train_args(tiny_hf_bert, out, squad_file, "--max_train_steps", "2", "--learning_rate", "1e-3"))
    assert results["global_step"] == 2 and 0.0 <= results["eval_f1"] <= 100.0
    assert _json(out / "config.json")["architectures"] == ["BertForQuestionAnswering"]
    predictions = _json(out / "predictions.json")
    assert all(predictions[q] in CONTEXTS[q] and predictions[q] for q in ANSWERS)
    # Evaluation only, of the fine-tuned model: the same predictions; no training, no model written.
    again = tmp_path / "eval-only"
    results2 = _run(squad_args(out, again, "--validation_file", str(squad_file), "--do_eval"))
    assert _json(again / "predictions.json") == predictions
    assert results2["eval_f1"] == pytest.approx(results["eval_f1"]) and "train_loss" not in results2
    assert not (again / "model.safetensors").exists()


def test_elmo_word_level_windows_end_to_end(tiny_elmo, squad_file, tmp_path):
    out = tmp_path / "elmo"
    long_context = write_json(tmp_path / "long.json", squad_document(QUESTIONS))
    results = _run(
        [
            "--model_name_or_path",
            str(tiny_elmo),
            "--train_file",
            str(squad_file),
            "--validation_file",
            str(long_context),
            "--output_dir",
            str(out),
            "--max_train_steps",
            "3",
            "--learning_rate",
            "1e-2",
            "--max_seq_length",
            "20",
            "--doc_stride",
            "4",
            "--max_query_length",
            "8",
            "--per_device_train_batch_size",
            "8",
            "--logging_steps",
            "1",
        ]
    )
    assert results["train_features"] > 6  # contexts longer than a window: several windows per question
    assert {"eval_exact_match", "eval_f1", "train_loss"} <= set(results)
    predictions = _json(out / "predictions.json")
    assert set(predictions) == set(ANSWERS)
    # Word spans are mapped back to context characters: every answer is a substring made of whole words.
    for qid, answer in predictions.items():
        assert answer and answer in CONTEXTS[qid]
        start = CONTEXTS[qid].index(answer)
        assert start == 0 or not CONTEXTS[qid][start - 1].isalnum()
    config = _json(out / "config.json")
    assert config["freeze_backbone"] is True and config["architectures"] == ["SesameElmoForQuestionAnswering"]
    from safetensors.torch import load_file

    before, after = load_file(tiny_elmo / "model.safetensors"), load_file(out / "model.safetensors")
    shared = [k for k in after if k.split(".", 1)[-1] in before]
    assert shared and all(torch.equal(after[k], before[k.split(".", 1)[-1]]) for k in shared)


def _bad_file(tmp_path: Path) -> Path:
    document = squad_document(QUESTIONS)
    document["data"][1]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] += 3  # q4
    return write_json(tmp_path / "bad.json", document)


def test_misaligned_answer_refused_by_the_cli_before_anything_is_written(tiny_sesame_bert, tmp_path):
    out = tmp_path / "never"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "finetune" / "squad.py"),
            "--model_name_or_path",
            str(tiny_sesame_bert),
            "--train_file",
            str(_bad_file(tmp_path)),
            "--output_dir",
            str(out),
            *WINDOW,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "'q4'" in lines[0] and "answer_start" in lines[0]
    assert "--skip_misaligned_answers" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "make, extra, message",
    [
        (lambda p: p.write_text('{"data": [', encoding="utf-8"), [], "malformed JSON"),
        (
            lambda p: write_json(
                p, {"data": [{"title": "t", "paragraphs": [{"context": "x y", "qas": [{"id": "k1", "answers": []}]}]}]}
            ),
            [],
            r"question id 'k1': missing key 'question'",
        ),
        (
            lambda p: write_json(
                p,
                {
                    "data": [
                        {
                            "title": "t",
                            "paragraphs": [{"context": "  ", "qas": [{"id": "e1", "question": "why?", "answers": []}]}],
                        }
                    ]
                },
            ),
            [],
            "empty context",
        ),
        (
            lambda p: write_json(p, squad_document([("long1", "t", "a b c", " ".join(["what"] * 30) + "?", "b")])),
            ["--max_query_length", "40"],
            r"--doc_stride 8: must be .*smaller than the context tokens of a window.*--max_query_length 40",
        ),
        (
            lambda p: write_json(p, squad_document(QUESTIONS[:1], [("u9", "t", "x y z", "why?")])),
            [],
            r"question id 'u9' has no answer.*--version_2_with_negative",
        ),
        (lambda p: write_json(p, squad_document(QUESTIONS)), ["--doc_stride", "40"], "--doc_stride 40"),
        (
            lambda p: write_json(p, squad_document(QUESTIONS)),
            ["--max_seq_length", "512"],
            "exceeds the model's max_position_embeddings 128",
        ),
        (lambda p: write_json(p, squad_document(QUESTIONS)), ["--dataset_name", "squad"], "one data source"),
    ],
)
def test_bad_input_is_one_error_line_and_nothing_written(tiny_sesame_bert, tmp_path, capsys, make, extra, message):
    import re

    path = tmp_path / "data.json"
    make(path)
    out = tmp_path / "never"
    args = [
        "--model_name_or_path",
        str(tiny_sesame_bert),
        "--train_file",
        str(path),
        "--output_dir",
        str(out),
        *WINDOW,
        *extra,
    ]
    assert run_cli(squad.main, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not out.exists()


def test_skip_misaligned_answers_and_several_train_files(tiny_sesame_bert, squad_file, tmp_path):
    out = tmp_path / "skip"
    extra = write_json(
        tmp_path / "extra.json",
        squad_document([("x1", "t", "The cat sat on the mat.", "Where did the cat sit?", "the mat")]),
    )
    results = _run(
        squad_args(
            tiny_sesame_bert,
            out,
            "--train_file",
            str(_bad_file(tmp_path)),
            str(extra),
            "--skip_misaligned_answers",
            "--validation_file",
            str(squad_file),
            "--max_train_steps",
            "1",
        )
    )
    assert results["train_samples"] == 6  # 6 - q4 (its only answer misaligned) + x1
    # The same question id in two training files is refused.
    assert (
        run_cli(
            squad.main,
            squad_args(
                tiny_sesame_bert, tmp_path / "dup", "--train_file", str(squad_file), str(squad_file), tail=WINDOW
            ),
        )
        == 2
    )


def test_hub_dataset_offline_is_a_clear_error(tiny_sesame_bert, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = [
        "--model_name_or_path",
        str(tiny_sesame_bert),
        "--dataset_name",
        "squad_v2",
        "--output_dir",
        str(tmp_path / "o"),
    ]
    assert run_cli(squad.main, args) == 2
    err = capsys.readouterr().err
    assert "rajpurkar/squad_v2" in err and "offline" in err and "--train_file" in err


def test_push_to_hub_pushes_the_saved_run_with_a_question_answering_card(
    tiny_sesame_bert, squad_file, tmp_path, monkeypatch
):
    """--push_to_hub: hub arguments validated before training, then one push of the finished output_dir with a
    model card rendered for question answering (the push itself is tested against a test Hub in tests/hub)."""
    import training.hub

    calls = []

    def validate(hub, output_dir=None, check_remote=True):
        calls.append(("validate", (tmp_path / "pushed").exists()))
        return dataclasses.replace(hub, hub_model_id=hub.hub_model_id or "alice/squad-tiny")

    def push(self, output_dir, step=None, model_card=None, final=True, commit_message=None):
        files = sorted(p.name for p in Path(output_dir).iterdir())
        calls.append(("push", self.repo_id, step, files, model_card))
        return "https://hub/commit/0"

    import training.driver

    monkeypatch.setattr(training.driver, "validate_hub_arguments", validate)  # where Run looks it up
    monkeypatch.setattr(training.hub.HubPusher, "push", push)
    out = tmp_path / "pushed"
    _run(
        train_args(
            tiny_sesame_bert,
            out,
            squad_file,
            "--max_train_steps",
            "1",
            "--push_to_hub",
        )
    )
    assert calls[0] == ("validate", False) and len(calls) == 2
    _, repo, step, files, card = calls[1]
    assert repo == "alice/squad-tiny" and step == 1
    assert {"config.json", "model.safetensors", "predictions.json", "all_results.json", "tokenizer.json"} <= set(files)
    assert "question-answering" in card and "eval_f1" in card


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_process_evaluation_gathers_every_window_once(tiny_sesame_bert, tmp_path):
    """``accelerate launch`` (2 CPU processes): the logits gathered with gather_for_metrics give the very
    predictions of one process, with 7 questions (accelerate pads the last batch with repeats; they are dropped)."""
    rows = QUESTIONS + [("q7", "whale", QUESTIONS[0][2], "What did the sailors lower?", "the boats")]
    data = write_json(tmp_path / "seven.json", squad_document(rows))
    model = tmp_path / "model"
    _run(
        squad_args(
            tiny_sesame_bert, model, "--train_file", str(data), "--max_train_steps", "3", "--learning_rate", "1e-3"
        )
    )
    outs = {processes: tmp_path / f"eval{processes}" for processes in (1, 2)}
    evaluate = ["--model_name_or_path", str(model), "--validation_file", str(data), "--do_eval", *WINDOW]
    evaluate += ["--per_device_eval_batch_size", "2"]
    assert squad.main([*evaluate, "--output_dir", str(outs[1])]) == 0  # one process: this one
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run_ok([*launch_two_processes("-m", "finetune.squad"), *evaluate, "--output_dir", str(outs[2])], ROOT, env)
    one, two = (_json(outs[p] / "nbest_predictions.json") for p in (1, 2))
    assert list(one) == list(two) and set(one) == {r[0] for r in rows}
    for qid in one:
        assert [(e["text"], e["offsets"]) for e in one[qid]] == [(e["text"], e["offsets"]) for e in two[qid]]
        assert max(abs(a["start_logit"] - b["start_logit"]) for a, b in zip(one[qid], two[qid])) < 1e-5
    assert _json(outs[1] / "predictions.json") == _json(outs[2] / "predictions.json")


def test_sigterm_checkpoints_exits_143_and_the_run_resumes(tiny_sesame_bert, squad_file, tmp_path, monkeypatch, capsys):
    """A real SIGTERM (raised at the 3rd training forward) finishes the step, writes its checkpoint, exits 143
    with how to resume; the same command with --resume_from_checkpoint latest completes the run."""
    import signal

    from training import loop

    original_init = loop.Trainer.__init__
    forwards = {"n": 0}

    def init_with_signal(self, accelerator, model, *args, **kwargs):
        def pre_hook(module, hook_args, hook_kwargs):
            if module.training:
                forwards["n"] += 1
                if forwards["n"] == 3:
                    signal.raise_signal(signal.SIGTERM)

        model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        original_init(self, accelerator, model, *args, **kwargs)

    monkeypatch.setattr(loop.Trainer, "__init__", init_with_signal)
    out = tmp_path / "preempted"
    args = train_args(
        tiny_sesame_bert,
        out,
        squad_file,
        "--learning_rate",
        "1e-3",
        "--max_train_steps",
        "6",
        "--num_warmup_steps",
        "1",
    )
    assert squad.main(args) == 143
    err = capsys.readouterr().err
    assert "SIGTERM received" in err and "--resume_from_checkpoint latest" in err
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    assert len(checkpoints) == 1 and 1 <= int(checkpoints[0].split("_")[1]) <= 3, checkpoints
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "handlers restored after training"

    monkeypatch.setattr(loop.Trainer, "__init__", original_init)
    results = _run([*args, "--resume_from_checkpoint", "latest"])
    assert results["global_step"] == 6
