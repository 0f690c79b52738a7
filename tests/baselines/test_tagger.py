"""The classic BiLSTM tagger (SesameBaselineForTokenClassification), with and without frozen ELMo features: its
outputs at the words and only there, a frozen BiLM, and finetune.ner training and predicting with it."""

from __future__ import annotations

import json

import pytest
import torch
from _tiny import micro_bilm_kwargs

from modeling.baselines import SesameBaselineForTokenClassification

TRAIN = "the\tO\nwhale\tB-animal\nrose\tO\n\nthe\tO\nsea\tB-place\nrose\tO\n\n"
DEV = "the O\nwhale B-animal\n\nthe O\nsea B-place\n"


@pytest.fixture
def bilm(word_tokenizer):
    from modeling.elmo import SesameElmoConfig, SesameElmoModel

    torch.manual_seed(11)
    kwargs = micro_bilm_kwargs(cnn_filters=[[1, 4], [2, 8]], projection_dim=6, cell_size=10, softmax="full")
    return SesameElmoModel(SesameElmoConfig(vocab_size=len(word_tokenizer), **kwargs)).eval()


@pytest.mark.parametrize("with_elmo", [False, True])
def test_tagger_scores_each_word_and_keeps_the_bilm_frozen(tiny, word_tokenizer, bilm, with_elmo):
    extra = {"elmo_config": bilm.config.to_dict(), "elmo_dropout": 0.0} if with_elmo else {}
    model = SesameBaselineForTokenClassification(tiny("rnn", vocab_size=len(word_tokenizer), **extra))
    if with_elmo:
        model.baseline.elmo.bilm.load_state_dict(bilm.state_dict())
    # one sentence per call: the base class's batch path unwraps a one-word list into a string (transformers 5.24)
    rows = [word_tokenizer(words, is_split_into_words=True) for words in (["The", "whale", "rose"], ["It"])]
    batch = word_tokenizer.pad(rows, padding=True, return_tensors="pt")
    labels = torch.full(batch["input_ids"].shape, -100)
    labels[0, 1:4], labels[1, 1] = torch.tensor([0, 1, 2]), 1
    out = model(**batch, labels=labels)
    assert out.logits.shape == (*batch["input_ids"].shape, 3)
    # <S>, </S> and padding have no state: their logits are the classifier's bias alone
    bias = model.classifier.bias
    torch.testing.assert_close(out.logits[0, 0], bias), torch.testing.assert_close(out.logits[1, 3], bias)
    assert not torch.allclose(out.logits[0, 1], bias)
    manual = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 3), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, manual)
    before = {k: v.clone() for k, v in model.state_dict().items() if ".bilm." in k}
    out.loss.backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5).step()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert model.classifier.weight.grad is not None


def test_only_the_rnn_encoder_tags(tiny):
    with pytest.raises(ValueError, match="expected 'rnn'"):
        SesameBaselineForTokenClassification(tiny("cnn"))


@pytest.mark.parametrize("with_elmo", [False, True])
def test_finetune_ner_trains_and_predicts_the_bilstm_tagger(tmp_path, word_tokenizer, bilm, with_elmo):
    from finetune import ner
    from finetune.baselines import init_baseline_model

    word_tokenizer.save_pretrained(tmp_path / "wordtok")
    elmo = None
    if with_elmo:
        bilm.save_pretrained(tmp_path / "elmo")
        word_tokenizer.save_pretrained(tmp_path / "elmo")
        elmo = str(tmp_path / "elmo")
    model = init_baseline_model(
        "rnn", tmp_path / "tagger", tokenizer_name=str(tmp_path / "wordtok"), embedding_dim=8, elmo=elmo,
        rnn_hidden_size=6, rnn_num_layers=1,
    )  # fmt: skip
    (tmp_path / "train.conll").write_text(TRAIN)
    (tmp_path / "dev.conll").write_text(DEV)
    out = tmp_path / "out"
    args = ["--model_name_or_path", str(model), "--train_file", str(tmp_path / "train.conll")]
    args += ["--validation_file", str(tmp_path / "dev.conll"), "--test_file", str(tmp_path / "dev.conll")]
    args += ["--do_train", "--do_eval", "--do_predict", "--output_dir", str(out), "--max_train_steps", "4"]
    assert ner.main([*args, "--learning_rate", "1e-2", "--per_device_train_batch_size", "2"]) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert 0.0 <= results["eval_f1"] <= 1.0 and results["eval_f1"] == results["test_f1"]  # the same file twice
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["SesameBaselineForTokenClassification"]
    assert bool(config.get("elmo_config")) == with_elmo
    lines = (out / "predictions.conll").read_text().splitlines()
    assert [line.split()[0] for line in lines if line] == ["the", "whale", "the", "sea"]
