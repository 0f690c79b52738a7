"""One modeling convention across the three families (SesameBert, SesameElmo, SesameBaseline): Auto registration
through one helper, transformers' problem-type loss in every sequence classifier."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

import modeling
from modeling._auto import register_family
from modeling.elmo.tokenization_elmo import SesameElmoTokenizer

FAMILIES = {"bert": modeling.bert, "elmo": modeling.elmo, "baselines": modeling.baselines}
CONFIGS = {"bert": modeling.SesameBertConfig, "elmo": modeling.SesameElmoConfig, "baselines": modeling.SesameBaselineConfig}


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
