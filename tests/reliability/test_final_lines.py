"""What a run says at the end and on the way (issue 32 item 5): a last line with the perplexity, the files and the
next command; a model card titled by the output folder; a tokenizer smaller than asked reported; plain progress
lines instead of a progress bar when the output goes to a file."""

from __future__ import annotations

import logging

from _launch import tiny_run_args

from core.errors import run_cli
from training.driver import final_lines


def test_final_lines_put_perplexity_first_leave_counts_out_and_say_the_next_command():
    result = {"eval_loss": 6.5541, "perplexity": 702.41, "eval_tokens": 4875, "train_loss": 7.0, "eval_history": []}
    lines = final_lines("out/run", result, ["model.safetensors", "all_results.json"], "python -m finetune.glue ...")
    assert lines == [
        "wrote out/run: perplexity 702.4, eval_loss 6.554; files: all_results.json, model.safetensors",
        "next: python -m finetune.glue ...",
    ]
    assert final_lines("p", {}, ["SST-2.tsv"]) == ["wrote p: no evaluation; files: SST-2.tsv"]


def test_pretraining_ends_with_perplexity_files_and_next_command_and_a_card_named_after_the_folder(
    assets, tmp_path, caplog, fresh_state
):
    from pretrain.cli import main

    out = tmp_path / "my-news-bert"
    with caplog.at_level(logging.INFO):
        assert run_cli(main, tiny_run_args(assets, out, "--max_train_steps", "2")) == 0
    messages = [r.getMessage() for r in caplog.records]
    wrote = [m for m in messages if m.startswith(f"wrote {out}:")]
    assert len(wrote) == 1 and "perplexity" in wrote[0] and "model.safetensors" in wrote[0], wrote
    assert "eval_tokens" not in wrote[0]
    if any("has not left the unigram plateau" in m for m in messages):  # 2 steps: usually still on it (issue 43)
        assert messages[-1].startswith("next: train it longer before fine-tuning (it is still on the unigram plateau)")
        assert f"--model_name_or_path {out} --output_dir {out}-more" in messages[-1]
    else:
        assert messages[-1].startswith(
            "next: fine-tune it on a task: python -m finetune.glue --model_name_or_path " + str(out)
        )
    assert (out / "README.md").read_text().split("\n# ", 1)[1].startswith("my-news-bert\n")


def test_a_tokenizer_smaller_than_asked_is_reported(assets, tmp_path, caplog, fresh_state):
    from pretrain.cli import main

    args = tiny_run_args(assets, tmp_path / "out", "--max_train_steps", "4", "--vocab_size", "5000")
    i = args.index("--tokenizer_name")
    del args[i : i + 2]
    with caplog.at_level(logging.WARNING):
        assert run_cli(main, args) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "fewer than the 5000 asked" in r.getMessage()]
    size = int(warning.split("the tokenizer has ")[1].split()[0])
    assert 0 < size < 5000 and warning.endswith(f"the model's vocabulary is {size}")


def test_without_a_terminal_progress_goes_into_plain_log_lines(toy_run, tmp_path, caplog, capsys, monkeypatch):
    import training.loop

    monkeypatch.setattr(training.loop, "PROGRESS_LOG_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="training.loop"):
        toy_run(tmp_path / "out", 4, logging_steps=1)  # under pytest stderr is captured: not a terminal
    progress = [r.getMessage() for r in caplog.records if "train_loss" in r.getMessage()]
    assert [m.split(":")[0] for m in progress] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    assert "\r" not in capsys.readouterr().err  # no progress bar redrawing its line
