"""SQuAD-format loading: v1 / v2 flattening, every refused input (naming the question id), unanswerable pairs."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from core.errors import InputError
from finetune.squad_data import load_squad_data, load_squad_file, make_unanswerable, write_squad_json

CTX1 = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in France."
CTX2 = "Computational complexity theory classifies computational problems according to their inherent difficulty."
CTX3 = "The Amazon rainforest covers much of the Amazon basin of South America."

SQUAD_V1 = {
    "version": "1.1",
    "data": [
        {
            "title": "Normans",
            "paragraphs": [
                {
                    "context": CTX1,
                    "qas": [
                        {
                            "id": "n1",
                            "question": "In what country is Normandy located?",
                            "answers": [
                                {"text": "France", "answer_start": CTX1.index("France")},
                                {"text": "France", "answer_start": CTX1.index("France")},
                            ],
                        },
                        {
                            "id": "n2",
                            "question": "When were the Normans in Normandy?",
                            "answers": [{"text": "10th and 11th centuries", "answer_start": CTX1.index("10th")}],
                        },
                    ],
                }
            ],
        },
        {
            "title": "Complexity",
            "paragraphs": [
                {
                    "context": CTX2,
                    "qas": [
                        {
                            "id": "c1",
                            "question": "What does the theory classify?",
                            "answers": [
                                {"text": "computational problems", "answer_start": CTX2.index("computational problems")}
                            ],
                        }
                    ],
                },
                {
                    "context": CTX3,
                    "qas": [
                        {
                            "id": "c2",
                            "question": "Which basin?",
                            "answers": [{"text": "Amazon basin", "answer_start": CTX3.index("Amazon basin")}],
                        }
                    ],
                },
            ],
        },
    ],
}


def _write(tmp_path: Path, document, name: str = "data.json") -> Path:
    path = tmp_path / name
    text = json.dumps(document)
    if name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _doc_with(change) -> dict:
    document = copy.deepcopy(SQUAD_V1)
    change(document)
    return document


@pytest.mark.parametrize("name", ["train.json", "train.json.gz"])
def test_v1_file_flattened(tmp_path, name):
    ds, report = load_squad_file(_write(tmp_path, SQUAD_V1, name), version_2_with_negative=False)
    assert ds.num_rows == 4 and (report.articles, report.paragraphs, report.questions) == (2, 3, 4)
    first = ds[0]
    assert first["id"] == "n1" and first["title"] == "Normans" and first["context"] == CTX1
    assert first["answers"] == {"text": ["France", "France"], "answer_start": [CTX1.index("France")] * 2}
    assert ds[3]["title"] == "Complexity" and ds[3]["context"] == CTX3


def test_v2_unanswerable_questions(tmp_path):
    def add(document):
        qas = document["data"][0]["paragraphs"][0]["qas"]
        qas.append(
            {
                "id": "n3",
                "question": "Who ruled Mars?",
                "answers": [],
                "is_impossible": True,
                "plausible_answers": [{"text": "Normans", "answer_start": 4}],
            }
        )
        qas.append({"id": "n4", "question": "Who ruled Venus?", "answers": []})

    path = _write(tmp_path, _doc_with(add))
    ds, report = load_squad_file(path, version_2_with_negative=True)
    assert report.unanswerable == 2 and ds.num_rows == 6
    assert ds[2]["answers"] == {"text": [], "answer_start": []}
    with pytest.raises(InputError, match=r"question id 'n3' has no answer.*--version_2_with_negative"):
        load_squad_file(path, version_2_with_negative=False)
    dd, reports = load_squad_data(path, path, version_2_with_negative=True)
    assert set(dd) == {"train", "validation"} and reports["validation"].unanswerable == 2


def test_misaligned_answer_refused_or_skipped(tmp_path):
    def shift(document):
        document["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] += 2
        document["data"][1]["paragraphs"][0]["qas"][0]["answers"].append({"text": "theory", "answer_start": 0})

    path = _write(tmp_path, _doc_with(shift))
    with pytest.raises(
        InputError,
        match=r"question id 'n2': answer_start \d+ does not point at the answer "
        r"'10th and 11th centuries'.*--skip_misaligned_answers",
    ):
        load_squad_file(path)
    ds, report = load_squad_file(path, skip_misaligned_answers=True)
    # n2 lost its only answer (question dropped); c1 keeps its aligned answer.
    assert report.misaligned_answers == 2 and report.dropped_questions == ["n2"]
    assert ds["id"] == ["n1", "c1", "c2"] and ds[1]["answers"]["text"] == ["computational problems"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("data"), r"missing key 'data'"),
        (lambda d: d["data"][0].pop("paragraphs"), r"article 0: missing key 'paragraphs'"),
        (lambda d: d["data"][0]["paragraphs"][0].pop("context"), r"paragraph 0: missing key 'context'"),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][1].pop("question"),
            r"question id 'n2': missing key 'question'",
        ),
        (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].pop("id"), r"question 0: missing key 'id'"),
        (
            lambda d: d["data"][1]["paragraphs"][1]["qas"][0]["answers"][0].pop("answer_start"),
            r"question id 'c2' answer: missing key 'answer_start'",
        ),
        (
            lambda d: d["data"][1]["paragraphs"][1]["qas"][0]["answers"][0].update(answer_start="7"),
            r"question id 'c2' answer: 'answer_start' is str '7'; expected int",
        ),
        (lambda d: d["data"][1]["paragraphs"][0].update(context="  "), r"empty context \(question ids \['c1'\]\)"),
        (lambda d: d["data"][1]["paragraphs"][1]["qas"][0].update(id="n1"), r"duplicate question id 'n1'"),
        (lambda d: d["data"][1]["paragraphs"][1]["qas"][0].update(question=" "), r"question id 'c2': empty question"),
        (lambda d: d.update(data=[]), r"no questions \(empty split\)"),
    ],
)
def test_refused_input_names_the_place(tmp_path, change, message):
    with pytest.raises(InputError, match=message):
        load_squad_file(_write(tmp_path, _doc_with(change)))


def test_malformed_and_undecodable_files(tmp_path):
    (tmp_path / "bad.json").write_text('{"data": [{"title": "x", "paragraphs": [}')
    with pytest.raises(InputError, match=r"bad.json: malformed JSON: .* line 1 column"):
        load_squad_file(tmp_path / "bad.json")
    (tmp_path / "latin.json").write_bytes('{"data": "caf\xe9"}'.encode("latin-1"))
    with pytest.raises(InputError, match="latin.json: not valid UTF-8"):
        load_squad_file(tmp_path / "latin.json")
    (tmp_path / "fake.json.gz").write_text("not gzip")
    with pytest.raises(InputError, match="fake.json.gz: cannot read the file"):
        load_squad_file(tmp_path / "fake.json.gz")
    with pytest.raises(InputError, match="missing.json: file not found"):
        load_squad_file(tmp_path / "missing.json")


def test_hub_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(InputError, match=r"rajpurkar/squad_v2 is offline.*--train_file"):
        load_squad_data(dataset_name="squad_v2", cache_dir=str(tmp_path / "cache"))


def test_make_unanswerable_pairs_with_other_article_and_round_trips(tmp_path):
    ds, _ = load_squad_file(_write(tmp_path, SQUAD_V1))
    examples = ds.to_list()
    out = make_unanswerable(examples, fraction=1.0, seed=3)
    assert out[:4] == examples and len(out) == 8
    by_id = {ex["id"]: ex for ex in examples}
    for ex in out[4:]:
        original = by_id[ex["id"].removesuffix("-unanswerable")]
        assert ex["answers"] == {"text": [], "answer_start": []} and ex["question"] == original["question"]
        assert ex["title"] != original["title"]
        assert not any(g.lower() in ex["context"].lower() for g in original["answers"]["text"])
    assert make_unanswerable(examples, 0.5, seed=3) == make_unanswerable(examples, 0.5, seed=3)  # deterministic
    assert len(make_unanswerable(examples, 0.5, seed=3)) == 6
    # Written back in the nested layout (is_impossible), it loads as v2 data with the same examples.
    path = write_squad_json(out, tmp_path / "v2" / "dev.json.gz")
    ds2, report = load_squad_file(path, version_2_with_negative=True)
    assert report.unanswerable == 4 and sorted(ds2.to_list(), key=lambda e: e["id"]) == sorted(
        out, key=lambda e: e["id"]
    )
    assert [p.name for p in path.parent.iterdir()] == ["dev.json.gz"]  # no temporary file left
    with pytest.raises(InputError, match="fraction"):
        make_unanswerable(examples, 1.5)
