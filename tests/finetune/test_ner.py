"""finetune.ner: CoNLL reading and its refusals, tag schemes, windows that score every word once, entity F1 against
seqeval on the command's own prediction file, and tiny end-to-end runs (SesameBert, SesameElmo)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from _helpers import reset_accelerate_state
from _tiny import tiny_bert_kwargs, tiny_elmo_kwargs

import modeling  # noqa: F401  (registers the Auto classes)
from core.errors import InputError, run_cli
from finetune import ner
from finetune.ner_data import (
    Sentence,
    align_windows,
    check_scheme,
    detect_scheme,
    plan_windows,
    read_conll,
    word_predictions,
)

TRAIN = """-DOCSTART- O\r
\r
the\tO\r
cat\tB-animal\r
sat\tO\r
on\tO\r
a\tO\r
mat\tB-thing\r
\t\r
he\tB-person\r
said\tO\r
yes\tO\r
 \r
a\tO\r
good\tB-thing\r
catdog\tI-thing\r
\r
"""
DEV = "the O\ndog B-animal\nsat O\n\nhe B-person\nsaid O\nno O\n"
TEST = "the\tO\ncatdog\tB-animal\nsat\tO\n\nplanes\tB-thing\nsaid\tO\n\n"


@pytest.fixture(scope="module")
def wordpiece_bert(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer SesameBert (hidden 32) whose WordPiece vocabulary splits some words in two
    (``catdog`` -> ``cat ##dog``, ``planes`` -> ``plane ##s``), saved with its tokenizer."""
    from transformers import BertTokenizer

    from modeling import SesameBertConfig, SesameBertModel

    path = tmp_path_factory.mktemp("wordpiece-bert")
    words = "the a cat dog sat on mat he said yes no good film plane it was".split()
    pieces = ["##dog", "##film", "##s", "##mat"]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(specials + words + pieces + [".", ","])})
    torch.manual_seed(0)
    SesameBertModel(SesameBertConfig(**tiny_bert_kwargs(len(tok), 64))).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "train": write(tmp_path / "train.conll", TRAIN),
        "dev": write(tmp_path / "dev.conll", DEV),
        "test": write(tmp_path / "test.conll", TEST),
    }


def ner_args(model, out, paths: dict, *flags: str) -> list[str]:
    return [
        "--model_name_or_path",
        str(model),
        "--train_file",
        str(paths["train"]),
        "--validation_file",
        str(paths["dev"]),
        "--output_dir",
        str(out),
        "--max_seq_length",
        "16",
        "--per_device_train_batch_size",
        "2",
        "--per_device_eval_batch_size",
        "2",
        "--learning_rate",
        "1e-3",
        *flags,
    ]


def test_read_conll_breaks_docstart_crlf_and_last_column(tmp_path):
    f = read_conll(write(tmp_path / "t.conll", TRAIN), "--train_file")
    assert [list(s.words) for s in f.sentences] == [
        ["the", "cat", "sat", "on", "a", "mat"],
        ["he", "said", "yes"],
        ["a", "good", "catdog"],
    ]
    assert f.sentences[1].tags == ("B-person", "O", "O") and f.sentences[1].lines == (10, 11, 12)
    conll03 = read_conll(write(tmp_path / "c.conll", "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"), "--train_file")
    assert conll03.sentences[0].words == ("EU", "rejects") and conll03.sentences[0].tags == ("B-ORG", "O")


def test_schemes_detected_and_checked(tmp_path):
    def conll(tags: list[str]) -> Path:
        return write(tmp_path / f"{'_'.join(tags)}.conll", "".join(f"w{i}\t{t}\n" for i, t in enumerate(tags)))

    cases = {
        ("O", "B-X", "I-X", "O"): "IOB2",
        ("I-X", "I-X", "B-X", "O"): "IOB1",
        ("B-X", "E-X", "S-Y", "O"): "BIOES",
    }
    for tags, scheme in cases.items():
        f = read_conll(conll(list(tags)), "--train_file")
        assert detect_scheme([f]) == scheme
        check_scheme(f, scheme, "--train_file")
    bad = {
        ("O", "I-X"): ("IOB2", 2),
        ("B-X", "I-Y"): ("IOB2", 2),
        ("O", "B-X"): ("IOB1", 2),
        ("B-X", "O"): ("BIOES", 2),
        ("O", "E-X"): ("BIOES", 2),
        ("B-X", "I-X"): ("BIOES", 2),
    }
    for tags, (scheme, line) in bad.items():
        f = read_conll(conll(list(tags)), "--train_file")
        with pytest.raises(InputError, match=rf"line {line}: "):
            check_scheme(f, scheme, "--train_file")


def _words_scored(windows, n_words):
    return sorted(w for win in windows for w in range(*win.scored)) == list(range(n_words))


def test_plan_windows_scores_every_word_exactly_once():
    rng = random.Random(0)
    for _ in range(300):
        counts = [rng.randint(1, 6) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(1, 20)
        stride = rng.randint(0, budget - 1)
        windows = plan_windows(counts, budget, stride)
        assert _words_scored(windows, len(counts))
        for w in windows:  # within the budget (an over-long word alone, counted as the budget)
            assert sum(min(c, budget) for c in counts[w.start : w.end]) <= budget
            assert w.start <= w.scored[0] <= w.scored[1] <= w.end
        assert windows[0].start == 0 and windows[-1].end == len(counts)
    assert plan_windows([1, 1, 1], 10, 2) == plan_windows([1, 1, 1], 3, 0)[:1]  # fits: one window


@pytest.mark.parametrize("fast", [False, True])
def test_windows_put_each_word_on_its_first_subtoken(wordpiece_bert, fast):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(wordpiece_bert, use_fast=fast)
    assert tok.tokenize("catdog") == ["cat", "##dog"]
    words = ("the", "catdog", "sat", "on", "the", "matfilm", "good", "he", "said", "planes", "yes") * 3
    tags = tuple("O" if i % 3 else "B-X" for i in range(len(words)))
    sentence = Sentence(words, tags, tuple(range(1, len(words) + 1)))
    label2id = {"O": 0, "B-X": 1}
    features, windows, firsts = align_windows(tok, [sentence], label2id, max_seq_length=12, stride=4)
    assert len(windows) > 2 and _words_scored(windows, len(words))
    for feature, window, first in zip(features, windows, firsts):
        assert len(feature["input_ids"]) <= 12
        for i, pos in enumerate(first):  # the token at the first sub-token position starts the word
            expected = tok.tokenize(words[window.start + i])[0]
            assert tok.convert_ids_to_tokens(feature["input_ids"][pos]) == expected
        scored = [p for p, label in enumerate(feature["labels"]) if label != -100]
        assert scored == [first[w - window.start] for w in range(*window.scored)]
    # every word gets one prediction: its gold label read back from its window's labels
    predicted = word_predictions([sentence], windows, firsts, [f["labels"] for f in features], fallback=0)
    assert predicted == [[label2id[t] for t in tags]]


def test_label_all_tokens_as_run_ner(wordpiece_bert):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(wordpiece_bert)
    assert len(tok.tokenize("catdog")) == 2
    sentence = Sentence(("catdog", "sat"), ("B-X", "O"), (1, 2))
    label2id = {"O": 0, "B-X": 1, "I-X": 2}
    first_only, _, _ = align_windows(tok, [sentence], label2id, 16, 4)
    all_tokens, _, _ = align_windows(tok, [sentence], label2id, 16, 4, label_all_tokens=True)
    assert first_only[0]["labels"] == [-100, 1, -100, 0, -100]
    assert all_tokens[0]["labels"] == [-100, 1, 2, 0, -100]


REFUSED = {
    "unknown dev tag": ("dev", "the O\ndog B-plant\n", "--validation_file", 2),
    "one column": ("train", "the\tO\ncat\n", "--train_file", 2),
    "I- after O in IOB2": ("dev", "the O\ncat B-animal\n\nsaid O\ndog I-animal\n", "--validation_file", 5),
    "only -DOCSTART-": ("dev", "-DOCSTART- -X- O O\n\n", "--validation_file", 1),
    "empty file": ("train", "\n\t\n", "--train_file", 1),
    "not a tag": ("train", "the\tO\ncat\tanimal\n", "--train_file", 2),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_input_refused_with_file_and_line(tiny_bert, tmp_path, capsys, case):
    split, text, flag, line = REFUSED[case]
    paths = files(tmp_path)
    paths[split] = write(tmp_path / f"bad-{split}.conll", text)
    out = tmp_path / "out"
    assert run_cli(ner.main, ner_args(tiny_bert, out, paths, "--max_train_steps", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {flag} {paths[split]} line {line}: "), err
    assert not out.exists()


def _conll_columns(path: Path) -> tuple[list[list[str]], list[list[str]]]:
    """Gold and predicted tag sequences of a prediction file (the last two columns), sentence by sentence."""
    gold, predicted, g, p = [], [], [], []
    for line in path.read_text().splitlines() + [""]:
        if not line.strip():
            if g:
                gold.append(g), predicted.append(p)
            g, p = [], []
            continue
        columns = line.split("\t") if "\t" in line else line.split()
        g.append(columns[-2]), p.append(columns[-1])
    return gold, predicted


def test_end_to_end_sesame_bert_f1_equals_seqeval_on_its_prediction_file(wordpiece_bert, tmp_path):
    from seqeval.metrics import f1_score, precision_score, recall_score

    paths = files(tmp_path)
    out = tmp_path / "out"
    args = ner_args(wordpiece_bert, out, paths, "--max_train_steps", "6", "--do_train", "--do_eval", "--do_predict")
    assert ner.main([*args, "--test_file", str(paths["test"]), "--max_seq_length", "6", "--doc_stride", "1"]) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert results["global_step"] == 6
    for key in ("eval_f1", "eval_precision", "eval_recall", "eval_accuracy", "eval_loss", "test_f1", "test_recall"):
        assert key in results, key
    lines = (out / "predictions.conll").read_text().splitlines()
    source = TEST.splitlines()
    assert len(lines) == len(source)
    for mine, theirs in zip(lines, source):  # the input's lines, each token line with one tag appended
        assert mine == theirs if not theirs.strip() else mine.rsplit("\t", 1)[0] == theirs
    gold, predicted = _conll_columns(out / "predictions.conll")
    assert results["test_f1"] == f1_score(gold, predicted, zero_division=0)
    assert results["test_precision"] == precision_score(gold, predicted, zero_division=0)
    assert results["test_recall"] == recall_score(gold, predicted, zero_division=0)
    config = json.loads((out / "config.json").read_text())
    assert sorted(config["id2label"].values()) == ["B-animal", "B-person", "B-thing", "I-thing", "O"]
    assert "## eval" in (out / "entity_scores.md").read_text()
    # under bf16 autocast the tagged test file's scores are still seqeval's on the written predictions
    bf16 = tmp_path / "bf16"
    flags = ["--model_name_or_path", str(out), "--do_predict", "--test_file", str(paths["test"])]
    reset_accelerate_state()  # one process, two precisions
    assert ner.main([*flags, "--output_dir", str(bf16), "--mixed_precision", "bf16"]) == 0
    gold, predicted = _conll_columns(bf16 / "predictions.conll")
    assert json.loads((bf16 / "all_results.json").read_text())["test_f1"] == f1_score(gold, predicted, zero_division=0)
    reset_accelerate_state()
    # the fine-tuned model tags an unlabelled file as it is (its id2label is the tag set)
    untagged = write(tmp_path / "words.conll", "the\ncat\n\nhe\n")
    again = tmp_path / "again"
    assert (
        ner.main(
            ["--model_name_or_path", str(out), "--do_predict", "--test_file", str(untagged), "--output_dir", str(again)]
        )
        == 0
    )
    rows = (again / "predictions.conll").read_text().splitlines()
    assert [r.split()[0] for r in rows if r] == ["the", "cat", "he"] and all(len(r.split()) == 2 for r in rows if r)


def test_entity_scores_match_a_hand_count():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    scores, types = ner.entity_scores(gold, predicted)
    # entities: gold {PER, LOC, ORG}, predicted {PER, ORG(wrong span type), ORG}: 2 of 3 right each way
    assert scores["precision"] == pytest.approx(2 / 3) and scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3) and scores["accuracy"] == pytest.approx(5 / 6)
    assert types["LOC"]["recall"] == 0.0 and types["PER"]["f1-score"] == 1.0


def test_elmo_tagging_trains_and_predicts(tmp_path, tiny_corpus):
    from modeling.elmo import SesameElmoConfig, SesameElmoModel
    from tokenizer.elmo_training import train_elmo_tokenizer

    model_dir = tmp_path / "tiny-elmo"
    tok = train_elmo_tokenizer([tiny_corpus], vocab_size=200, output_dir=tmp_path / "tok")
    config = SesameElmoConfig(**tiny_elmo_kwargs(len(tok), cnn_filters=[[1, 8], [2, 8]], task_hidden_size=8))
    torch.manual_seed(0)
    SesameElmoModel(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    paths = files(tmp_path)
    out = tmp_path / "elmo-out"
    args = ner_args(model_dir, out, paths, "--max_train_steps", "3", "--do_train", "--do_eval", "--do_predict")
    assert ner.main([*args, "--test_file", str(paths["test"]), "--max_seq_length", "5", "--doc_stride", "1"]) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert 0.0 <= results["eval_f1"] <= 1.0 and "test_f1" in results
    assert json.loads((out / "config.json").read_text())["architectures"] == ["SesameElmoForTokenClassification"]
    assert len((out / "predictions.conll").read_text().splitlines()) == len(TEST.splitlines())


def test_a_datasets_dataset_with_tokens_and_ner_tags(wordpiece_bert, tmp_path, capsys):
    import datasets

    tags = datasets.Sequence(datasets.ClassLabel(names=["O", "B-animal", "I-animal", "B-person"]))
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")), "ner_tags": tags})
    rows = {"tokens": [["the", "cat", "sat"], ["he", "said", "yes"]], "ner_tags": [[0, 1, 0], [3, 0, 0]]}
    folder = tmp_path / "ds"
    split = datasets.Dataset.from_dict(rows, features=features)
    datasets.DatasetDict({"train": split, "validation": split, "test": split}).save_to_disk(folder)
    out = tmp_path / "out"
    args = ["--model_name_or_path", str(wordpiece_bert), "--dataset_name", str(folder), "--output_dir", str(out)]
    assert ner.main([*args, "--max_train_steps", "2", "--do_train", "--do_eval", "--do_predict"]) == 0
    lines = (out / "predictions.conll").read_text().splitlines()
    assert [line.split("\t")[:2] for line in lines if line] == [
        ["the", "O"], ["cat", "B-animal"], ["sat", "O"], ["he", "B-person"], ["said", "O"], ["yes", "O"]
    ]  # fmt: skip
    # an I- tag that IOB2 forbids, named by its line of the CoNLL rendering
    bad = {"tokens": [["the", "cat"], ["a", "dog"]], "ner_tags": [[0, 2], [1, 0]]}  # IOB2: B- after O below
    bad_folder = tmp_path / "bad"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(bad, features=features)}).save_to_disk(bad_folder)
    argv = ["--model_name_or_path", str(wordpiece_bert), "--dataset_name", str(bad_folder), "--do_train"]
    capsys.readouterr()  # the progress bars of save_to_disk
    assert run_cli(ner.main, [*argv, "--output_dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: --dataset_name {bad_folder}[train] line 2: tag 'I-animal': IOB2 starts every entity with B-; "
        "I-animal must follow B-animal or I-animal"
    ]
