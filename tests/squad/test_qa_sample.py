"""The first-run QA sample (issue 32 item 6): ``python -m finetune.qa_sample`` writes SQuAD files whose answers sit
at their offsets, from disjoint paragraphs, the same for the same seed, that ``finetune.squad`` reads."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from core.errors import InputError, run_cli
from finetune.qa_sample import bundled_corpus, main, make_sample
from finetune.squad_data import load_squad_file

NAMES = ["Elinor", "Marianne", "Edward", "Norland", "London", "Barton"]


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(3)
    lines = []
    for _ in range(60):
        sentences = [
            f"The letter from {rng.choice(NAMES)} arrived at the house after {rng.randint(2, 99)} days of rain."
            for _ in range(rng.randint(5, 9))
        ]
        lines.append(" ".join(sentences))
    lines += ["Too short.", "x" * 2000]
    path = tmp_path / "corpus.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_answers_sit_at_their_offsets_and_the_question_is_the_sentence_with_what(corpus):
    sample = make_sample(corpus, 30, 10, seed=1)
    assert len(sample["train"]) == 30 and len(sample["dev"]) == 10
    assert not {e["context"] for e in sample["train"]} & {e["context"] for e in sample["dev"]}
    for e in sample["train"] + sample["dev"]:
        (answer,), (start,) = e["answers"]["text"], e["answers"]["answer_start"]
        assert e["context"][start : start + len(answer)] == answer
        assert answer in NAMES or answer.isdigit()
        # put the answer back in place of "what": a sentence of the context (its final stop becomes "?")
        restored = e["question"][:-1].replace("what", answer, 1)
        assert restored in e["context"], (restored, e["context"])
    assert make_sample(corpus, 30, 10, seed=1) == sample and make_sample(corpus, 30, 10, seed=2) != sample


def test_the_command_writes_files_squad_reads_and_refuses_too_many_questions(corpus, tmp_path, monkeypatch, capsys):
    import finetune.qa_sample

    monkeypatch.setattr(finetune.qa_sample, "bundled_corpus", lambda: corpus)
    out = tmp_path / "qa"
    assert run_cli(main, ["--output_dir", str(out), "--train_questions", "20", "--eval_questions", "5"]) == 0
    train, report = load_squad_file(out / "train.json", version_2_with_negative=False)
    assert len(train) == 20 and report.questions == 20
    assert len(json.loads((out / "dev.json").read_text())["data"]) == 5
    assert "next: python -m finetune.squad" in capsys.readouterr().out
    assert run_cli(main, ["--output_dir", str(tmp_path / "x"), "--train_questions", "500"]) == 2
    assert capsys.readouterr().err.startswith("error: --train_questions 500 --eval_questions 200:")
    with pytest.raises(InputError):
        make_sample(corpus, 100, 100)


def test_the_bundled_corpus_is_found():
    assert bundled_corpus().is_file()
