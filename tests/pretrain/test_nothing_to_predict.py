"""Issue 43: metrics are never reported over zero predicted tokens (the refusals before step 0 are in
``tests/reliability/test_catalogue.py``: ``pretrain: ... of special tokens only``)."""

from __future__ import annotations

import pytest

from core.errors import InputError


def test_an_evaluation_that_masked_nothing_is_refused_not_reported_as_perplexity_1(tmp_path, monkeypatch):
    from datasets import Dataset

    import training.evaluation
    from pretrain.cli import parse
    from pretrain.parts import held_out_evaluation

    plan = parse(["--validation_file", "valid.txt", "--output_dir", str(tmp_path / "out"), "--max_train_steps", "1"])
    sums = {"nll_sum": 0.0, "count": 0.0}
    monkeypatch.setattr(training.evaluation, "evaluate_sums", lambda *a, **k: dict(sums))
    evaluate = held_out_evaluation(plan, Dataset.from_list([{"input_ids": [2, 7, 3]}]), None, None)
    with pytest.raises(InputError, match=r"^--validation_file valid\.txt: the evaluation masked no token in its 1 "):
        evaluate(None)
    sums["count"], sums["nll_sum"] = 4.0, 8.0
    assert evaluate(None)["eval_loss"] == pytest.approx(2.0)


def test_fine_tuning_warns_about_a_model_whose_pretraining_evaluated_0_tokens(tmp_path):
    import json

    from training.unigram import backbone_plateau_message

    (tmp_path / "all_results.json").write_text(json.dumps({"eval_loss": 0.0, "perplexity": 1.0, "eval_tokens": 0}))
    message = backbone_plateau_message(tmp_path)
    assert message.startswith(f"{tmp_path} reported its pretraining's held-out loss over 0 tokens")
    assert "perplexity 1.0 say nothing" in message
    (tmp_path / "all_results.json").write_text(json.dumps({"eval_loss": 2.0, "eval_tokens": 10, "unigram_loss": 7}))
    assert backbone_plateau_message(tmp_path) is None
