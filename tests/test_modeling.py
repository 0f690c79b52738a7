"""One modeling convention across the three families (SesameBert, SesameElmo, SesameBaseline): Auto registration
through one helper, ``@strict`` dataclass configs, transformers' problem-type loss in every sequence classifier."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

import modeling
from modeling._auto import register_family
from modeling.elmo.tokenization_elmo import SesameElmoTokenizer

FAMILIES = {"bert": modeling.bert, "elmo": modeling.elmo, "baselines": modeling.baselines}
CONFIGS = {
    "bert": modeling.SesameBertConfig,
    "elmo": modeling.SesameElmoConfig,
    "baselines": modeling.SesameBaselineConfig,
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_is_registered_in_process_and_for_auto_map(family):
    package, config_class = FAMILIES[family], CONFIGS[family]
    assert AutoConfig.for_model(config_class.model_type).__class__ is config_class
    assert config_class._auto_class == "AutoConfig"
    assert AutoModel in package.AUTO_CLASSES and AutoModelForSequenceClassification in package.AUTO_CLASSES
    for auto, model_class in package.AUTO_CLASSES.items():
        assert auto._model_mapping[config_class] is model_class, auto.__name__
        assert model_class._auto_class == auto.__name__
    if family != "bert":  # the word + character tokenizer serves SesameElmo and the baselines
        assert TOKENIZER_MAPPING[config_class] is SesameElmoTokenizer


class _ToyConfig(PretrainedConfig):
    model_type = "sesame-toy-registration"


class _ToyModel(PreTrainedModel):
    config_class = _ToyConfig

    def __init__(self, config):
        super().__init__(config)
        self.linear = torch.nn.Linear(2, 2)
        self.post_init()


class _OtherConfig(PretrainedConfig):
    model_type = "sesame-toy-other"


def test_register_family_registers_and_marks_a_new_family():
    register_family(_ToyConfig, {AutoModel: _ToyModel})
    register_family(_ToyConfig, {AutoModel: _ToyModel})  # again: harmless
    assert type(AutoModel.from_config(_ToyConfig())) is _ToyModel
    assert type(AutoConfig.for_model("sesame-toy-registration")) is _ToyConfig
    assert _ToyConfig._auto_class == "AutoConfig" and _ToyModel._auto_class == "AutoModel"
    with pytest.raises(ValueError):  # a model class whose config_class is another config
        register_family(_OtherConfig, {AutoModelForSequenceClassification: _ToyModel})


# -- configs -----------------------------------------------------------------------------------------------------
_ELMO_AUTO_MAP = {
    "AutoConfig": "configuration_elmo.SesameElmoConfig",
    "AutoModel": "modeling_elmo.SesameElmoModel",
    "AutoModelForPreTraining": "modeling_elmo.SesameElmoForBidirectionalLM",
    "AutoModelForQuestionAnswering": "modeling_elmo.SesameElmoForQuestionAnswering",
    "AutoModelForSequenceClassification": "modeling_elmo.SesameElmoForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_elmo.SesameElmoForTokenClassification",
}
_BASELINE_AUTO_MAP = {
    "AutoConfig": "configuration_baseline.SesameBaselineConfig",
    "AutoModel": "modeling_baseline.SesameBaselineModel",
    "AutoModelForSequenceClassification": "modeling_baseline.SesameBaselineForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_baseline.SesameBaselineForTokenClassification",
}
#: config.json files as the configs with an ``__init__`` of ``self.x = x`` wrote them (main at 4b28f4f), non-defaults
#: (clipping given as an int, a cnn pooling, a problem type, labels) included.
OLD_CONFIG_FILES = {
    "sesame-elmo": {
        "adaptive_cutoffs": [10, 30],
        "adaptive_div_value": 4.0,
        "auto_map": _ELMO_AUTO_MAP,
        "bos_token_id": 1,
        "cell_clip": 3,
        "cell_size": 16,
        "cell_type": "lstm",
        "char_embedding_dim": 4,
        "char_vocab_size": 262,
        "classifier_dropout": 0.2,
        "classifier_hidden_size": 0,
        "cnn_activation": "relu",
        "cnn_filters": [[1, 4], [2, 4]],
        "cnn_pool_filters": 3,
        "cnn_pool_widths": [2, 3],
        "dropout": 0.1,
        "eos_token_id": 2,
        "freeze_backbone": False,
        "fused_cpu_lstm": True,
        "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},
        "initializer_range": 0.05,
        "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
        "max_characters_per_token": 50,
        "model_type": "sesame-elmo",
        "num_highway_layers": 1,
        "num_layers": 1,
        "num_sampled": 8192,
        "pad_token_id": 0,
        "pooling": "cnn",
        "problem_type": "single_label_classification",
        "proj_clip": 3.0,
        "projection_dim": 8,
        "scalar_mix_layer_norm": False,
        "softmax": "adaptive",
        "task_hidden_size": 4,
        "transformers_version": "5.24.0",
        "use_residual": True,
        "vocab_size": 60,
    },
    "sesame-baseline": {
        "auto_map": _BASELINE_AUTO_MAP,
        "bos_token_id": 1,
        "classifier_dropout": 0.0,
        "classifier_hidden_size": 0,
        "cnn_filter_sizes": [2],
        "cnn_num_filters": 4,
        "embedding_dim": 8,
        "embedding_dropout": 0.0,
        "embedding_mode": "multichannel",
        "encoder_type": "cnn",
        "eos_token_id": 2,
        "gumbel_temperature": 2,
        "id2label": {"0": "a", "1": "b", "2": "c", "3": "d"},
        "label2id": None,
        "model_type": "sesame-baseline",
        "ngram_buckets": 100000,
        "ngram_max_n": 6,
        "ngram_min_n": 3,
        "pad_token_id": 0,
        "pooling": "max",
        "rnn_bidirectional": True,
        "rnn_dropout": 0.0,
        "rnn_hidden_size": 256,
        "rnn_num_layers": 2,
        "rnn_type": "lstm",
        "transformers_version": "5.24.0",
        "tree_source": "latent",
        "treelstm_hidden_size": 150,
        "unk_token_id": 3,
        "vocab_size": 60,
    },
}


#: Fields added to a config class after its old file above was written, with their defaults (issue 31: ELMo features).
ADDED_SINCE = {
    "sesame-baseline": {
        "elmo_config": None,
        "elmo_name_or_path": None,
        "elmo_dropout": 0.5,
        "elmo_l2_coef": 0.0,
        "elmo_at_output": False,
        "elmo_cache_mb": 0,
    }
}


@pytest.mark.parametrize("model_type", sorted(OLD_CONFIG_FILES))
def test_a_config_json_written_before_the_dataclass_configs_loads_and_saves_the_same(tmp_path, model_type):
    old = OLD_CONFIG_FILES[model_type]
    (tmp_path / "config.json").write_text(json.dumps(old))
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config).model_type == model_type and dataclasses.is_dataclass(config)
    for key, value in old.items():
        if key not in ("id2label", "transformers_version"):
            assert getattr(config, key) == value, key
    assert config.id2label == {int(k): v for k, v in old["id2label"].items()}
    config.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    added = ADDED_SINCE.get(model_type, {})  # fields added later are written at their defaults, nothing else changes
    assert {**again, "transformers_version": None} == {**old, **added, "transformers_version": None}
    model = AutoModelForSequenceClassification.from_config(config)
    assert model.config.num_labels == len(old["id2label"])


_BASE_FIELDS = {f.name for f in dataclasses.fields(PretrainedConfig)}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_configs_are_strict_dataclasses_with_every_field_documented(family):
    config_class = CONFIGS[family]
    assert dataclasses.is_dataclass(config_class) and callable(getattr(config_class, "validate", None))
    own = [f.name for f in dataclasses.fields(config_class) if f.name not in _BASE_FIELDS]
    assert len(own) >= 20
    undocumented = [name for name in own if f"{name} (" not in config_class.__doc__]
    assert not undocumented


@pytest.mark.parametrize(
    ("config_class", "field", "bad"),
    [
        (modeling.SesameElmoConfig, "softmax", "hierarchical"),
        (modeling.SesameElmoConfig, "num_layers", 0),
        (modeling.SesameBaselineConfig, "encoder_type", "bow"),
        (modeling.SesameBaselineConfig, "gumbel_temperature", 0.0),
    ],
)
def test_a_bad_value_set_after_construction_is_refused_at_save(tmp_path, config_class, field, bad):
    with pytest.raises(ValueError, match=f"{config_class.__name__}.{field}={bad!r}"):  # at construction: ValueError
        config_class(**{field: bad})
    config = config_class()
    setattr(config, field, bad)
    with pytest.raises(Exception, match=f"{config_class.__name__}.{field}={bad!r}"):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


# -- problem-type loss -------------------------------------------------------------------------------------------
def _classifier(family: str, num_labels: int, **config):
    """A tiny sequence classifier of ``family`` and a batch of 4 single sentences of 7 tokens for it."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 30, (4, 7), generator=g)
    if family == "bert":
        cfg = modeling.get_preset_config("bert-tiny", vocab_size=30, num_labels=num_labels, **config)
        return modeling.SesameBertForSequenceClassification(cfg), {"input_ids": ids}
    batch = {
        "input_ids": ids,
        "char_ids": torch.randint(1, 262, (4, 7, 50), generator=g),
        "attention_mask": torch.ones_like(ids),
    }
    if family == "elmo":
        cfg = modeling.SesameElmoConfig(
            vocab_size=30,
            char_embedding_dim=4,
            cnn_filters=[[1, 4], [2, 4]],
            num_highway_layers=1,
            projection_dim=8,
            cell_size=16,
            num_layers=1,
            task_hidden_size=4,
            classifier_hidden_size=0,
            num_labels=num_labels,
            **config,
        )
        return modeling.SesameElmoForSequenceClassification(cfg), batch
    cfg = modeling.get_preset_config("baseline-cbow", vocab_size=30, embedding_dim=8, num_labels=num_labels, **config)
    return modeling.SesameBaselineForSequenceClassification(cfg), batch


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sequence_classification_losses_by_problem_type(family):
    """Each head's loss against torch's own functions on the head's logits, for every problem type and label dtype."""
    import torch.nn.functional as F

    model, batch = _classifier(family, 1)
    model.eval()
    scores = torch.tensor([0.5, -1.0, 2.0, 0.0])
    for labels in (scores, scores[:, None], scores.double(), torch.tensor([0, 1, 2, 3])):  # regression (num_labels 1)
        model.config.problem_type = None
        out = model(**batch, labels=labels)
        assert model.config.problem_type == "regression" and out.loss.dtype == torch.float32
        torch.testing.assert_close(out.loss, F.mse_loss(out.logits[:, 0], labels.reshape(-1).float()))

    model, batch = _classifier(family, 3)
    model.eval()
    classes = torch.tensor([0, 2, 1, 2])
    out = model(**batch, labels=classes)
    assert model.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, classes))

    multi_hot = torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]])
    reference = F.binary_cross_entropy_with_logits(out.logits, multi_hot.float())
    model.config.problem_type = None
    out = model(**batch, labels=multi_hot.float())  # float labels: multi-label inferred
    assert model.config.problem_type == "multi_label_classification"
    torch.testing.assert_close(out.loss, reference)
    torch.testing.assert_close(model(**batch, labels=multi_hot).loss, reference)  # long multi-hot, problem type set


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sequence_classifiers_use_the_models_loss_function(family):
    """The loss is the model's ``loss_function`` (transformers' ``ForSequenceClassificationLoss`` unless a user sets
    another), called with the labels, the float32 logits and the config."""
    model, batch = _classifier(family, 3)
    calls = []

    def loss_function(labels, pooled_logits, config, **kwargs):
        calls.append((labels, pooled_logits.dtype, config))
        return pooled_logits.sum() * 0 + 42.0

    from transformers.loss.loss_utils import ForSequenceClassificationLoss

    assert model.loss_function is ForSequenceClassificationLoss
    model.loss_function = loss_function
    labels = torch.tensor([0, 2, 1, 2])
    assert model(**batch, labels=labels).loss.item() == 42.0
    assert len(calls) == 1 and calls[0][0] is labels and calls[0][1] == torch.float32 and calls[0][2] is model.config
