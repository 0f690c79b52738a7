"""Issue 43: metrics are never reported over zero predicted tokens (the refusals before step 0 are in
``tests/reliability/test_catalogue.py``: ``pretrain: ... of special tokens only``)."""

from __future__ import annotations

import pytest
from _tiny import tiny_bert_kwargs

from core.errors import InputError


def test_an_evaluation_that_masked_nothing_is_refused_not_reported_as_perplexity_1(
    tmp_path, bert_tokenizer, fresh_state
):
    """The real held-out evaluation (a tiny MLM model, the objective's own evaluation collator, an accelerator on the
    CPU): validation blocks of special tokens only leave the collator nothing to mask, and the evaluation refuses
    them instead of reporting loss 0 / perplexity 1; blocks of words give the mean negative log-likelihood of the
    masked tokens, computed here from the same masks with the model's logits."""
    import torch
    from accelerate import Accelerator
    from datasets import Dataset

    from modeling import SesameBertConfig, SesameBertForMaskedLM
    from pretrain.cli import parse
    from pretrain.parts import held_out_evaluation

    plan = parse(["--validation_file", "valid.txt", "--output_dir", str(tmp_path / "out"), "--max_train_steps", "1"])
    _, eval_collator = plan.objective.collators(bert_tokenizer, plan.masking, plan.training.seed)
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(SesameBertConfig(**tiny_bert_kwargs(len(bert_tokenizer), 64))).eval()
    accelerator = Accelerator(cpu=True)
    cls, sep = bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id
    specials = [{"input_ids": [cls, sep, cls, sep], "word_start": [1, 1, 1, 1], "index": i} for i in range(3)]
    evaluate = held_out_evaluation(plan, Dataset.from_list(specials), eval_collator, accelerator)
    with pytest.raises(InputError, match=r"^--validation_file valid\.txt: the evaluation masked no token in its 3 "):
        evaluate(model)

    ids = bert_tokenizer("the whale rose from the sea and sailors lowered the boats at once")["input_ids"]
    words = [{"input_ids": ids, "word_start": [1] * len(ids), "index": i} for i in range(4)]
    metrics = held_out_evaluation(plan, Dataset.from_list(words), eval_collator, accelerator)(model)
    batch = eval_collator(words)  # the evaluation's masks: fixed per example index (the collator's salt)
    assert (batch["labels"] != -100).any()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    reference = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    assert metrics["eval_loss"] == pytest.approx(float(reference), rel=1e-5)


def test_fine_tuning_warns_about_a_model_whose_pretraining_evaluated_0_tokens(tmp_path):
    import json

    from training.unigram import backbone_plateau_message

    (tmp_path / "all_results.json").write_text(json.dumps({"eval_loss": 0.0, "perplexity": 1.0, "eval_tokens": 0}))
    message = backbone_plateau_message(tmp_path)
    assert message.startswith(f"{tmp_path} reported its pretraining's held-out loss over 0 tokens")
    assert "perplexity 1.0 say nothing" in message
    (tmp_path / "all_results.json").write_text(json.dumps({"eval_loss": 2.0, "eval_tokens": 10, "unigram_loss": 7}))
    assert backbone_plateau_message(tmp_path) is None
