"""GLUE data loading: official directory layout, custom files, hub offline, and every refused input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from core.errors import InputError
from finetune.glue_data import label_names_of, load_glue_data, write_submission
from finetune.tasks import GLUE_TASKS, TASK_NAMES, get_task

#: Rows (without header) of each file of the fixture GLUE directory (tests/finetune/conftest.py).
FIXTURE_ROWS = {
    "cola": {"train": 4, "validation": 3, "test": 2},
    "sst2": {"train": 3, "validation": 2, "test": 2},
    "mrpc": {"train": 3, "validation": 2, "test": 2},
    "qqp": {"train": 2, "validation": 2, "test": 1},
    "stsb": {"train": 3, "validation": 2, "test": 2},
    "mnli": {
        "train": 3,
        "validation_matched": 2,
        "validation_mismatched": 2,
        "test_matched": 1,
        "test_mismatched": 2,
        "test_ax": 2,
    },
    "qnli": {"train": 2, "validation": 2, "test": 1},
    "rte": {"train": 2, "validation": 2, "test": 2},
    "wnli": {"train": 2, "validation": 1, "test": 1},
}


@pytest.mark.parametrize("task_name", TASK_NAMES)
def test_glue_dir_row_counts_and_columns(glue_dir, task_name):
    task = get_task(task_name)
    ds = load_glue_data(task_name, glue_dir=glue_dir)
    assert {split: d.num_rows for split, d in ds.items()} == FIXTURE_ROWS[task_name]
    expected_columns = ["sentence1", "sentence2", "label", "idx"] if task.is_pair else ["sentence1", "label", "idx"]
    for split, d in ds.items():
        assert d.column_names == expected_columns
        assert label_names_of(d) == list(task.label_names)
        if split.startswith("test"):
            assert set(d["label"]) == {-1}
        else:
            assert -1 not in d["label"]


def test_glue_dir_values(glue_dir):
    cola = load_glue_data("cola", glue_dir=glue_dir)
    # No header row: the first sentence is data, not column names.
    assert cola["train"][0]["sentence1"].startswith("Our friends won't buy")
    assert cola["train"]["label"] == [1, 0, 1, 0]
    assert cola["test"]["idx"] == [0, 1]
    mrpc = load_glue_data("mrpc", glue_dir=glue_dir)
    # BOM skipped (the "Quality" column is found), quotes are literal text and do not join lines.
    assert mrpc["train"]["label"] == [1, 0, 1]
    assert mrpc["train"][1]["sentence2"] == "\" Yucaipa bought Dominick 's in 1995 for $ 693 million ."
    stsb = load_glue_data("stsb", glue_dir=glue_dir)
    assert stsb["train"]["label"] == pytest.approx([5.0, 0.75, 3.8])
    assert stsb["train"][1]["sentence1"] == 'He said " yes " .'
    mnli = load_glue_data("mnli", glue_dir=glue_dir)
    # String gold labels -> hub class ids (entailment 0, neutral 1, contradiction 2).
    assert mnli["train"]["label"] == [1, 0, 2]
    assert mnli["validation_mismatched"]["label"] == [1, 2]
    assert mnli["test_mismatched"]["idx"] == [0, 7]
    assert load_glue_data("rte", glue_dir=glue_dir)["train"]["label"] == [1, 0]  # not_entailment = 1
    assert load_glue_data("wnli", glue_dir=glue_dir)["train"]["label"] == [0, 1]  # file 1 = entailment = id 1
    assert load_glue_data("qnli", glue_dir=glue_dir)["validation"]["sentence1"][1] == "Why?"


def test_glue_dir_optional_and_missing_files(glue_dir):
    (glue_dir / "diagnostic/diagnostic.tsv").unlink()
    (glue_dir / "MNLI/test_matched.tsv").unlink()
    assert set(load_glue_data("mnli", glue_dir=glue_dir)) == {
        "train",
        "validation_matched",
        "validation_mismatched",
        "test_mismatched",
    }
    (glue_dir / "SST-2/dev.tsv").unlink()
    with pytest.raises(InputError, match=r"missing .*SST-2/dev.tsv for task sst2"):
        load_glue_data("sst2", glue_dir=glue_dir)


def test_unknown_task_lists_valid_ones(glue_dir):
    with pytest.raises(InputError, match="unknown GLUE task") as err:
        load_glue_data("sst5", glue_dir=glue_dir)
    assert all(name in str(err.value) for name in TASK_NAMES)
    assert get_task("SST-2") is GLUE_TASKS["sst2"] and get_task("STS-B").num_labels == 1


def test_hub_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(InputError, match=r"nyu-mll/glue.*offline.*--glue_dir"):
        load_glue_data("rte", cache_dir=str(tmp_path / "cache"))


# ---------------------------------------------------------------------------------------------- custom files


NLI_ROWS = [
    {"index": 184, "premise": 'Winds are "frequent" here.', "hypothesis": "It is windy.", "label": "entailment"},
    {"index": 185, "premise": "It rained, then it snowed.", "hypothesis": "It was dry.", "label": "contradiction"},
    {"index": 186, "premise": "A man sleeps.", "hypothesis": "He is tired.", "label": "neutral"},
    {"index": 187, "premise": "A dog runs.", "hypothesis": "An animal moves.", "label": "entailment"},
]


def _write(path: Path, rows: list[dict], fmt: str) -> Path:
    cols = list(rows[0])
    if fmt == "tsv":
        text = "\t".join(cols) + "\n" + "".join("\t".join(str(r[c]) for c in cols) + "\n" for r in rows)
    elif fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        writer = csv.DictWriter(buf, cols)
        writer.writeheader()
        writer.writerows(rows)
        text = buf.getvalue()
    elif fmt == "jsonl":
        text = "".join(json.dumps(r) + "\n" for r in rows)
    else:
        text = json.dumps(rows)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["tsv", "csv", "json", "jsonl", "jsonl.gz"])
def test_custom_three_class_pair_task(tmp_path, fmt):
    base = fmt.split(".")[0]
    train = _write(tmp_path / f"train.{fmt}", NLI_ROWS, base)
    dev = _write(tmp_path / f"dev.{fmt}", NLI_ROWS[:2], base)
    test = _write(tmp_path / f"test.{fmt}", [{k: v for k, v in r.items() if k != "label"} for r in NLI_ROWS[:3]], base)
    ds = load_glue_data(
        train_file=train, validation_file=dev, test_file=test, sentence1_key="premise", sentence2_key="hypothesis"
    )
    assert {s: d.num_rows for s, d in ds.items()} == {"train": 4, "validation": 2, "test": 3}
    assert label_names_of(ds) == ["contradiction", "entailment", "neutral"]  # sorted, as run_glue does
    assert ds["train"]["label"] == [1, 0, 2, 1]
    assert ds["train"]["sentence1"][0] == 'Winds are "frequent" here.'
    assert ds["train"]["idx"] == [184, 185, 186, 187]
    assert ds["test"]["label"] == [-1, -1, -1]
    # With a GLUE task, its label order (MNLI: entailment, neutral, contradiction) and text columns are used.
    ds = load_glue_data("mnli", train_file=train, validation_file=dev)
    assert ds["train"]["label"] == [0, 2, 1, 0]


def test_custom_json_data_field_regression_and_single_sentence(tmp_path):
    path = tmp_path / "scores.json"
    path.write_text(json.dumps({"data": [{"text": "good", "label": 4.5}, {"text": "bad", "label": 1}]}))
    ds = load_glue_data(train_file=path)
    assert ds["train"].features["label"].dtype == "float32" and label_names_of(ds) == []
    assert ds["train"]["label"] == pytest.approx([4.5, 1.0]) and ds["train"]["sentence1"] == ["good", "bad"]
    # Integer labels are classes (sorted numerically); forcing regression is possible.
    path.write_text(json.dumps([{"sentence": "a", "label": 10}, {"sentence": "b", "label": 9}]))
    assert label_names_of(load_glue_data(train_file=path)) == ["9", "10"]
    assert load_glue_data(train_file=path, is_regression=True)["train"]["label"] == [10.0, 9.0]


# ---------------------------------------------------------------------------------------------- bad input


def test_missing_columns_named_with_columns_found(tmp_path):
    train = _write(tmp_path / "train.tsv", NLI_ROWS, "tsv")
    with pytest.raises(
        InputError,
        match=r"missing column\(s\) 'claim' \(sentence2_key\); columns found: "
        r"\['index', 'premise', 'hypothesis', 'label'\]",
    ):
        load_glue_data(train_file=train, sentence1_key="premise", sentence2_key="claim")
    with pytest.raises(InputError, match=r"'gold' \(label_key\)"):
        load_glue_data("mnli", train_file=train, label_key="gold")
    with pytest.raises(InputError, match="cannot tell the text column"):
        _write(tmp_path / "odd.tsv", [{"a": "x", "label": "1"}], "tsv")
        load_glue_data(train_file=tmp_path / "odd.tsv")


def test_labels_outside_label_set(tmp_path, glue_dir):
    rows = [dict(r) for r in NLI_ROWS]
    rows[1]["label"] = "contradicton"
    rows[3]["label"] = "7"
    train = _write(tmp_path / "train.tsv", rows, "tsv")
    with pytest.raises(InputError) as err:
        load_glue_data("mnli", train_file=train)
    message = str(err.value)
    assert "train.tsv" in message and "'contradicton' (row 1)" in message and "'7' (row 3)" in message
    assert "2 label(s) outside the label set ['entailment', 'neutral', 'contradiction']" in message
    # Validation labels unseen in training (custom task) are refused too.
    train = _write(tmp_path / "t.tsv", NLI_ROWS[:2], "tsv")
    dev = _write(tmp_path / "d.tsv", NLI_ROWS[2:], "tsv")
    with pytest.raises(InputError, match=r"d.tsv \(validation\).*'neutral' \(row 0\)"):
        load_glue_data(train_file=train, validation_file=dev)
    # A GLUE file with a label out of range.
    path = glue_dir / "SST-2/dev.tsv"
    path.write_text(path.read_text().replace("\t0\n", "\t2\n"))
    with pytest.raises(InputError, match=r"SST-2/dev.tsv \(validation\), column 'label': 1 label"):
        load_glue_data("sst2", glue_dir=glue_dir)


@pytest.mark.parametrize("train_labels, dev_label", [(["0", "2", "2", "0"], "1"), (["-1", "1", "1", "-1"], "0")])
def test_custom_digit_labels_are_names_not_class_ids(tmp_path, train_labels, dev_label):
    # Labels {0, 2}: a "1" used to become class 1 (= "2"); labels {-1, 1}: a "0" used to become "-1".
    train = _write(
        tmp_path / "train.tsv", [{"sentence": f"s {i}", "label": y} for i, y in enumerate(train_labels)], "tsv"
    )
    dev = _write(
        tmp_path / "dev.tsv",
        [{"sentence": "a", "label": train_labels[1]}, {"sentence": "b", "label": dev_label}],
        "tsv",
    )
    names = sorted(set(train_labels), key=int)
    with pytest.raises(InputError) as err:
        load_glue_data(train_file=train, validation_file=dev)
    message = str(err.value)
    assert (
        f"dev.tsv (validation), column 'label': 1 label(s) outside the label set {names}: '{dev_label}' (row 1)"
        in message
    )
    assert "expected one of the label names" in message and len(message.splitlines()) == 1
    # the labels that are in the set keep their names (class ids in the sorted order)
    ok = _write(
        tmp_path / "ok.tsv",
        [{"sentence": "a", "label": train_labels[1]}, {"sentence": "b", "label": train_labels[0]}],
        "tsv",
    )
    ds = load_glue_data(train_file=train, validation_file=ok)
    assert ds["validation"].features["label"].names == names
    assert [names[i] for i in ds["validation"]["label"]] == [train_labels[1], train_labels[0]]


def test_glue_tasks_still_read_class_ids_from_their_files(glue_dir):
    ds = load_glue_data("sst2", glue_dir=glue_dir)
    assert ds["train"]["label"] == [0, 0, 1] and ds["train"].features["label"].names == ["negative", "positive"]


def test_empty_split(tmp_path):
    train = _write(tmp_path / "train.tsv", NLI_ROWS, "tsv")
    empty = tmp_path / "dev.tsv"
    empty.write_text("index\tpremise\thypothesis\tlabel\n")
    with pytest.raises(InputError, match=r"dev.tsv \(validation\): no examples \(empty split\)"):
        load_glue_data(train_file=train, validation_file=empty)
    (tmp_path / "blank.jsonl").write_text("\n")
    with pytest.raises(InputError, match=r"blank.jsonl \(train\): no examples"):
        load_glue_data(train_file=tmp_path / "blank.jsonl")
    (tmp_path / "zero.tsv").write_text("")
    with pytest.raises(InputError, match="zero.tsv: the file is empty"):
        load_glue_data(train_file=tmp_path / "zero.tsv")


def test_regression_task_with_string_labels(tmp_path):
    rows = [{"sentence1": "a", "sentence2": "b", "label": "high"}, {"sentence1": "c", "sentence2": "d", "label": "2.5"}]
    train = _write(tmp_path / "train.tsv", rows, "tsv")
    with pytest.raises(InputError, match=r"stsb is a regression task and needs numeric labels.*'high' \(row 0\)"):
        load_glue_data("stsb", train_file=train)


def test_undecodable_and_malformed_files(tmp_path, glue_dir):
    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes("sentence\tlabel\ncaf\xe9\t1\n".encode("latin-1"))
    with pytest.raises(InputError, match="latin1.tsv: not valid UTF-8"):
        load_glue_data(train_file=latin1)
    ragged = glue_dir / "WNLI/dev.tsv"
    ragged.write_text(ragged.read_text() + "5\tonly one sentence\n")
    with pytest.raises(
        InputError, match=r"WNLI/dev.tsv: malformed tsv file: 1 line\(s\) without the 4 fields.*line 3 has 2"
    ):
        load_glue_data("wnli", glue_dir=glue_dir)
    extra = glue_dir / "RTE/dev.tsv"
    extra.write_text(extra.read_text() + "5\ta\tb\tentailment\tsurplus\n")
    with pytest.raises(InputError, match="RTE/dev.tsv: malformed tsv file.*line 4 has 5"):
        load_glue_data("rte", glue_dir=glue_dir)
    (tmp_path / "bad.csv").write_text('sentence,label\n"fine",1\n"unclosed" quote,0\n')
    with pytest.raises(InputError, match="bad.csv: malformed csv file near line 3"):
        load_glue_data(train_file=tmp_path / "bad.csv")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"sentence": "a", "label": 1}\n{"sentence": "b", "label": \n')
    with pytest.raises(InputError, match="bad.jsonl: malformed JSON on line 2"):
        load_glue_data(train_file=bad_json)
    (tmp_path / "scalar.json").write_text("42")
    with pytest.raises(InputError, match="scalar.json: expected a list of JSON objects"):
        load_glue_data(train_file=tmp_path / "scalar.json")
    (tmp_path / "data.parquet").write_text("x")
    with pytest.raises(InputError, match="unsupported file extension .parquet"):
        load_glue_data(train_file=tmp_path / "data.parquet")
    with pytest.raises(InputError, match="nowhere.tsv: file not found"):
        load_glue_data(train_file=tmp_path / "nowhere.tsv")


# ---------------------------------------------------------------------------------------------- submission


def test_submission_files(tmp_path):
    out = tmp_path / "submission"
    path = write_submission(out, get_task("cola"), "test", [0, 1, 2], [1, 0, 1])
    assert path.name == "CoLA.tsv" and path.read_text() == "index\tprediction\n0\t1\n1\t0\n2\t1\n"
    mnli = get_task("mnli")
    assert (
        write_submission(out, mnli, "test_mismatched", [3, 4], [0, 2]).read_text()
        == "index\tprediction\n3\tentailment\n4\tcontradiction\n"
    )
    assert write_submission(out, mnli, "test_ax", [0], [1]).name == "AX.tsv"
    assert (
        write_submission(out, get_task("stsb"), "test", [0, 1, 2], [5.7, -0.2, 2.34567]).read_text()
        == "index\tprediction\n0\t5.000\n1\t0.000\n2\t2.346\n"
    )
    assert write_submission(out, get_task("rte"), "test", [0], [1]).read_text().endswith("0\tnot_entailment\n")
    assert sorted(p.name for p in out.iterdir()) == ["AX.tsv", "CoLA.tsv", "MNLI-mm.tsv", "RTE.tsv", "STS-B.tsv"]
    with pytest.raises(InputError, match="no GLUE submission file for split 'validation'"):
        write_submission(out, get_task("cola"), "validation", [0], [0])
