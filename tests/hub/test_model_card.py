"""Model cards parse with ``huggingface_hub.ModelCard`` and carry the run's metadata and metrics."""

from __future__ import annotations

import json

import pytest
from _tiny import tiny_bert_kwargs
from huggingface_hub import ModelCard

from core.errors import InputError
from modeling import SPECS
from training.model_card import render_model_card, results_from_dir


def test_pretraining_card_metadata_and_sections(tmp_path):
    results = {
        "train_loss": 3.25,
        "eval_loss": 3.0,
        "perplexity": 20.0855,
        "train_runtime_s": 12.5,
        "train_tokens_per_second": 1234.5,
        "eval_samples_per_second": 99.0,
    }
    (tmp_path / "all_results.json").write_text(json.dumps(results))
    text = render_model_card(
        model_type="sesame-elmo",
        family=SPECS["elmo"].description,  # what pretrain passes: the family's spec (modeling/elmo)
        objective=["bilm"],
        repo_id="alice/elmo-small",
        preset="elmo-small",
        task="feature-extraction",
        training_data=["train.txt.gz: public-domain prose"],
        hyperparameters={"learning_rate": 5e-4, "seed": 7},
        results=results_from_dir(tmp_path),
        license="apache-2.0",
        language="en",
    )
    card = ModelCard(text)
    data = card.data
    assert data.library_name == "transformers" and data.pipeline_tag == "feature-extraction"
    assert data.license == "apache-2.0" and data.language == "en"
    assert data.tags[:3] == ["sesame-lm", "sesame-elmo", "feature-extraction"]
    # quality metrics only (no runtimes / throughputs) go to model-index, with their values
    assert {r.metric_type: r.metric_value for r in data.eval_results} == {"loss": 3.0, "perplexity": 20.0855}
    assert data.metrics == ["loss", "perplexity"] and data.model_name == "elmo-small"
    body = card.text
    for heading in (
        "## Model",
        "## Training data",
        "## Objective",
        "## Training hyperparameters",
        "## Results",
        "## How to use",
        "## Limitations",
    ):
        assert heading in body
    assert "BiLM" in body and "Preset: `elmo-small`" in body and "| `learning_rate` | 0.0005 |" in body
    assert "| `train_tokens_per_second` | 1234.5 |" in body
    assert 'AutoModel.from_pretrained("alice/elmo-small", trust_remote_code=True)' in body
    assert 'pipeline("feature-extraction", model="alice/elmo-small", trust_remote_code=True)' in body


def test_finetuning_card_and_errors(tmp_path):
    text = render_model_card(
        model_type="sesame-bert",
        repo_id="alice/bert-sst2",
        task="text-classification",
        finetuned_task="sst2",
        datasets=["nyu-mll/glue"],
        base_model="alice/bert-small",
        results={"eval_accuracy": 0.875, "eval_loss": 0.41, "epoch": 3},
    )
    data = ModelCard(text).data
    assert data.base_model == "alice/bert-small" and data.datasets == ["nyu-mll/glue"]
    (result,) = [r for r in data.eval_results if r.metric_type == "accuracy"]
    assert (
        result.metric_value == 0.875 and result.dataset_config == "sst2" and result.task_type == "text-classification"
    )
    assert "AutoModelForSequenceClassification" in text and "MLM" not in text and "fine-tuned" in text.lower()
    assert ModelCard(render_model_card(model_type="sesame-bert")).data.eval_results is None  # no results: no index

    with pytest.raises(InputError, match="summarization"):
        render_model_card(model_type="sesame-bert", task="summarization")
    assert results_from_dir(tmp_path) == {}
    (tmp_path / "all_results.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="all_results.json"):
        results_from_dir(tmp_path)


def test_card_for_run_reads_config_results_and_args(tmp_path):
    import argparse

    from training.model_card import card_for_run

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "sesame-bert", "hidden_size": 64}))
    (tmp_path / "all_results.json").write_text(json.dumps({"eval_accuracy": 0.75, "train_runtime_s": 3.0}))
    args = argparse.Namespace(
        config_name=None,
        model_name_or_path="alice/bert-small",
        task_name="rte",
        train_file=[str(tmp_path / "train.tsv")],
        dataset_name=None,
        learning_rate=2e-5,
        per_device_train_batch_size=32,
        seed=42,
        weight_decay=None,
        hub_model_id="alice/rte",
    )
    text = card_for_run(tmp_path, vars(args), task="text-classification", license="mit")
    data = ModelCard(text).data
    assert data.base_model == "alice/bert-small" and data.license == "mit" and "sesame-bert" in data.tags
    assert [(r.metric_type, r.metric_value, r.dataset_name) for r in data.eval_results] == [("accuracy", 0.75, "rte")]
    assert "| `learning_rate` | 2e-05 |" in text and "| `seed` | 42 |" in text and "weight_decay" not in text
    assert "`train.tsv`" in text and 'from_pretrained("alice/rte"' in text
    with pytest.raises(InputError, match="config.json"):
        card_for_run(tmp_path / "missing", vars(args))


def test_question_answering_card_example_runs(tmp_path, capsys):
    """The QA card's loading example (no QA pipeline in transformers 5) runs on a saved QA model and prints a
    span of the question + context tokens."""
    import torch
    from transformers import AutoModelForQuestionAnswering, BertTokenizer

    import modeling  # noqa: F401  (registers SesameBert)
    from modeling import SesameBertConfig

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "walked", "to", "the", "house", "?", "elizabeth", "."]
    torch.manual_seed(0)
    config = SesameBertConfig(**tiny_bert_kwargs(len(words), 64, width=16, layers=1))
    AutoModelForQuestionAnswering.from_config(config).save_pretrained(tmp_path / "qa")
    BertTokenizer(vocab={w: i for i, w in enumerate(words)}).save_pretrained(tmp_path / "qa")
    text = render_model_card(model_type="sesame-bert", repo_id=str(tmp_path / "qa"), task="question-answering")
    assert "pipeline(" not in text and ModelCard(text).data.pipeline_tag == "question-answering"
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "card", "exec"), {})
    printed = capsys.readouterr().out.strip().split()
    allowed = "who walked to the house ? [SEP] elizabeth .".split()
    assert set(printed) <= set(allowed)  # a (possibly empty) span of the encoded pair, decoded
