"""Issue 43: ``python -m finetune.baselines`` checks every argument and ``--elmo`` folder before writing anything (one
``error:`` line, exit 2), exits 1 with a final line naming ``results.md`` and the failed cells when a cell fails, and
says how a cell is getting on while it trains."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch
from _tiny import micro_bilm_kwargs

TINY_BILM = micro_bilm_kwargs(cnn_filters=[[1, 4], [2, 8]], projection_dim=6, cell_size=10, softmax="full")


@pytest.fixture
def folders(tmp_path, word_tokenizer, make_glue_dir):
    """(the common arguments, the output folder, a BiLM folder with the word tokenizer) for one cbow cell."""
    from modeling.elmo import SesameElmoConfig, SesameElmoForBidirectionalLM

    torch.manual_seed(11)
    bilm = SesameElmoForBidirectionalLM(SesameElmoConfig(vocab_size=len(word_tokenizer), **TINY_BILM))
    bilm.save_pretrained(tmp_path / "elmo")
    word_tokenizer.save_pretrained(tmp_path / "elmo")
    out = tmp_path / "table"
    args = ["--glue_dir", str(make_glue_dir(tmp_path / "glue")), "--tasks", "sst2", "--backbones", "cbow"]
    args += ["--tokenizer_name", str(tmp_path / "wordtok"), "--embedding_dim", "8", "--output_dir", str(out)]
    return args, out, tmp_path / "elmo"


def _refused(argv, capsys) -> str:
    from core.errors import run_cli
    from finetune.baselines import main

    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_elmo_rows_only_without_elmo_is_refused(folders, capsys):
    args, out, _ = folders
    err = _refused([*args, "--elmo_rows_only"], capsys)
    assert "error: --elmo_rows_only:" in err and "expected --elmo" in err
    assert not out.exists()


@pytest.mark.parametrize("damage", ["truncated", "random bytes"])
def test_unreadable_bilm_weights_are_one_line_before_anything_is_written(folders, capsys, damage):
    args, out, elmo = folders
    weights = elmo / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else bytes(range(256)) * 40)
    err = _refused([*args, "--elmo", str(elmo)], capsys)
    assert err.startswith(f"error: --elmo {elmo}: cannot load the weights (") and "expected a SesameElmo" in err
    assert not out.exists()  # no models/cbow written first


def test_a_bilm_with_a_smaller_character_vocabulary_is_refused(folders, capsys):
    args, out, elmo = folders
    config = json.loads((elmo / "config.json").read_text())
    (elmo / "config.json").write_text(json.dumps({**config, "char_vocab_size": 100}))
    err = _refused([*args, "--elmo", str(elmo)], capsys)
    assert f"error: --elmo {elmo}: char_vocab_size 100" in err and "expected a BiLM with char_vocab_size >= 262" in err
    assert not out.exists()


def test_a_bilm_folder_without_tokenizer_files_is_warned_about_and_loads_without_a_report(folders, caplog, capfd):
    from transformers import AutoTokenizer

    from finetune.baselines import load_bilm

    args, _, elmo = folders
    (elmo / "tokenizer_config.json").unlink()
    words = AutoTokenizer.from_pretrained(args[args.index("--tokenizer_name") + 1])
    caplog.set_level(logging.INFO)
    bilm = load_bilm(str(elmo), words)
    assert type(bilm).__name__ == "SesameElmoModel"
    assert "no tokenizer_config.json there" in caplog.text and "cannot be checked" in caplog.text
    # transformers' LOAD REPORT (its own stderr handler) would list the pretraining softmax as UNEXPECTED
    err = capfd.readouterr().err
    assert "UNEXPECTED" not in caplog.text + err and "LOAD REPORT" not in caplog.text + err


def test_a_failed_cell_exits_1_with_a_final_line_naming_results_md(folders, capsys, monkeypatch):
    import finetune.baselines as baselines
    from finetune import cells

    args, out, _ = folders
    monkeypatch.setattr(cells, "run_command", lambda cmd, env, log, cell: (1, "IndexError: out of range"))
    assert baselines.main(args) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: 1 of 1 cell(s) failed: sst2 / cbow / seed 42 (IndexError: out of range)")
    assert str(out / "results.md") in lines[-1]
    assert "| cbow | failed |" in (out / "results.md").read_text()


def test_a_successful_table_ends_with_a_line_naming_results_md(folders, capsys, monkeypatch, tmp_path):
    import finetune.baselines as baselines
    from finetune import cells

    args, out, _ = folders

    def ok(cmd, env, log, cell):
        run_dir = tmp_path / "table" / "runs" / "sst2-cbow"
        run_dir.mkdir(parents=True)
        (run_dir / "all_results.json").write_text(json.dumps({"eval_accuracy": 0.5, "train_runtime_s": 1.0}))
        return 0, ""

    monkeypatch.setattr(cells, "run_command", ok)
    assert baselines.main(args) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"results: {out / 'results.md'} (1 cell run(s) of this invocation, none failed)"
    )


def test_progress_lines_while_a_cell_runs_and_its_output_in_the_log(tmp_path, monkeypatch, caplog):
    from finetune import cells

    monkeypatch.setattr(cells, "PROGRESS_EVERY_S", 0.2)
    child = (
        "import sys, time\nprint('out line')\n"
        "for i in range(3):\n    print(f'step {i}', file=sys.stderr, flush=True)\n    time.sleep(0.3)\n"
    )
    caplog.set_level(logging.INFO)
    status, last = cells.run_command([sys.executable, "-c", child], None, tmp_path / "c.log", "sst2 / cnn")
    assert (status, last) == (0, "step 2")
    assert "sst2 / cnn: training," in caplog.text and "last line: step" in caplog.text
    assert {"out line", "step 0", "step 2"} <= set((tmp_path / "c.log").read_text().splitlines())
