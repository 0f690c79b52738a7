"""transformers' own model tests (``ModelTesterMixin`` of transformers' ``tests/test_modeling_common.py``) on both
families: the SesameBert heads (in BERT's layout and in a ModernBERT-class config: rotary positions, GeGLU, no biases,
pre-norm, a local layer, grouped-query attention) and the SesameElmo heads, each one ``unittest`` class with a model
tester.

transformers' pip package does not ship its tests, and this project copies no public code, so the mixin is imported
from a transformers source tree named by ``TRANSFORMERS_TESTS_DIR`` (the folder that holds ``tests/``); without it
(CI) the whole module is skipped with that reason. A matching tree: the source distribution of the installed release,
``pip download transformers==<installed version> --no-binary :all: --no-deps`` and its ``tests/`` folder unpacked, or
a git checkout of the release's tag. The mixin also needs ``parameterized`` (skipped without it).

A release's source distribution holds the top-level ``tests/*.py`` files only: ``tests/exporters/test_export.py``
(``ExportTesterMixin``, a base of ``ModelTesterMixin``) and ``tests/generation/test_utils.py``
(``GenerationTesterMixin``, used only in an ``issubclass`` check) are then missing, and empty stand-ins take their
place: the export tests do not run (``tests/conformance/test_model_contract.py`` checks ``torch.export`` itself);
:data:`STAND_INS` says which were used.

How the testers talk to the mixin (its own hooks, as transformers' model tests use them):

* ``all_model_classes``, a ``model_tester`` with ``prepare_config_and_inputs_for_common()``, ``batch_size``,
  ``seq_length``, ``num_hidden_layers``, ``is_training``...;
* the mixin picks labels and skips base models by the class names of transformers' Auto mappings
  (``MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES`` ...); our families are registered with the Auto classes at
  run time, not in those static tables, so the imported mixin module gets copies of them with our classes added
  (:func:`_register_names`; transformers' own tables are not touched), and ``_prepare_for_class`` adds the labels of
  the pretraining heads (as transformers' BERT test does);
* a test that does not apply is overridden with ``self.skipTest(reason)`` (:data:`NOT_APPLICABLE`).

Run: ``TRANSFORMERS_TESTS_DIR=/path/to/transformers python -m pytest tests/conformance/test_transformers_common.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
import unittest
from pathlib import Path

import pytest
import torch
from _tiny import micro_elmo_kwargs, modern_layout

import modeling

TESTS_DIR = os.environ.get("TRANSFORMERS_TESTS_DIR")
_COMMON = Path(TESTS_DIR or ".", "tests", "test_modeling_common.py")
if not TESTS_DIR:
    pytest.skip(
        "TRANSFORMERS_TESTS_DIR is not set: it names a transformers source tree (with tests/test_modeling_common.py) "
        "to run transformers' common model tests from",
        allow_module_level=True,
    )
if not _COMMON.is_file():
    pytest.skip(f"TRANSFORMERS_TESTS_DIR={TESTS_DIR}: no {_COMMON}", allow_module_level=True)
pytest.importorskip("parameterized", reason="transformers' common model tests need parameterized (pip install)")

#: the package name transformers' ``tests/`` folder is imported under (not ``tests``: this project's folder)
PACKAGE = "_transformers_tests"
#: the modules of the source tree that were missing and replaced by empty stand-ins (module -> mixin class name)
STAND_INS: dict[str, str] = {}


def _load_common() -> types.ModuleType:
    """transformers' ``tests/test_modeling_common.py`` imported as ``_transformers_tests.test_modeling_common`` (its
    relative imports resolve in the source tree; the missing ones get the stand-ins of :data:`STAND_INS`)."""
    root = _COMMON.parent
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(root)]
    sys.modules.setdefault(PACKAGE, package)
    for module, mixin in (
        ("exporters.test_export", "ExportTesterMixin"),
        ("generation.test_utils", "GenerationTesterMixin"),
    ):
        if not (root / (module.replace(".", "/") + ".py")).is_file():
            parent, _ = module.split(".")
            sub = sys.modules.setdefault(f"{PACKAGE}.{parent}", types.ModuleType(f"{PACKAGE}.{parent}"))
            sub.__path__ = []
            stand_in = types.ModuleType(f"{PACKAGE}.{module}")
            setattr(stand_in, mixin, type(mixin, (), {"__doc__": "stand-in: the source tree has no " + module}))
            sys.modules[f"{PACKAGE}.{module}"] = stand_in
            STAND_INS[module] = mixin
    name = f"{PACKAGE}.test_modeling_common"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _COMMON)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


common = _load_common()

#: (mapping table of the mixin module, model_type -> our class names)
_NAMES = {
    "MODEL_MAPPING_NAMES": {"sesame-bert": "SesameBertModel", "sesame-elmo": "SesameElmoModel"},
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": {"sesame-bert": "SesameBertForMaskedLM"},
    "MODEL_FOR_PRETRAINING_MAPPING_NAMES": {
        "sesame-bert": "SesameBertForPreTraining",
        "sesame-elmo": "SesameElmoForBidirectionalLM",
    },
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": {
        "sesame-bert": "SesameBertForSequenceClassification",
        "sesame-elmo": "SesameElmoForSequenceClassification",
    },
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": {
        "sesame-bert": "SesameBertForQuestionAnswering",
        "sesame-elmo": "SesameElmoForQuestionAnswering",
    },
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": {
        "sesame-bert": "SesameBertForTokenClassification",
        "sesame-elmo": "SesameElmoForTokenClassification",
    },
}


def _register_names() -> None:
    """Give the mixin module copies of transformers' class-name tables with our classes added (what an in-tree model
    has): the mixin then gives each head its labels and treats the base models as base models."""
    for table, ours in _NAMES.items():
        setattr(common, table, {**getattr(common, table), **ours})


_register_names()

# ---- testers ---------------------------------------------------------------------------------------------------------
BATCH, LENGTH, VOCAB = 3, 7, 99


def _ids(shape, high: int, seed: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _mask() -> torch.Tensor:
    """(BATCH, LENGTH): row 1 ends in 2 padding positions, row 2 in 3."""
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1, -2:] = 0
    mask[2, -3:] = 0
    return mask


def _types() -> torch.Tensor:
    """(BATCH, LENGTH): a pair in every row (the second sentence from position 3 on, padding 0)."""
    types_ = torch.zeros(BATCH, LENGTH, dtype=torch.long)
    types_[:, 3:] = 1
    return types_ * _mask()


class _Tester:
    """The attributes the mixin reads; ``parent`` is the ``unittest.TestCase``."""

    batch_size, seq_length, vocab_size, is_training = BATCH, LENGTH, VOCAB, True
    num_hidden_layers = 2

    def __init__(self, parent):
        self.parent = parent


class SesameBertModelTester(_Tester):
    """A 2-layer SesameBert of width 32 (4 heads), no dropout, 3 labels."""

    hidden_size, num_attention_heads = 32, 4

    def get_config(self):
        return modeling.SesameBertConfig(
            vocab_size=VOCAB,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=37,
            max_position_embeddings=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_labels=3,
        )

    def prepare_config_and_inputs_for_common(self):
        mask = _mask()
        inputs = dict(input_ids=_ids((BATCH, LENGTH), VOCAB, 0) * mask, attention_mask=mask, token_type_ids=_types())
        return self.get_config(), inputs


class SesameModernBertModelTester(SesameBertModelTester):
    """The same width as a ModernBERT-class SesameBert (issue 41): 2 layers (global, then local in a 4-token window:
    the mixin wants at most 2 layers), rotary positions (global and local bases), GeGLU, no biases, pre-norm with the
    embedding norm and the identity as layer 0's attention norm, grouped-query attention (4 query heads on 2 key/value
    heads), ModernBERT's heads, no segment embeddings (so no ``token_type_ids``)."""

    def get_config(self):
        base = super().get_config()
        sizes = ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size", "max_position_embeddings")
        window = dict(global_attn_every_n_layers=2, local_attention=4, num_key_value_heads=2)
        return modeling.SesameBertConfig(
            **{name: getattr(base, name) for name in sizes},
            num_hidden_layers=self.num_hidden_layers,
            num_labels=3,
            **modern_layout(**window),
        )

    def prepare_config_and_inputs_for_common(self):
        config, inputs = super().prepare_config_and_inputs_for_common()
        inputs.pop("token_type_ids")
        return config, inputs


class SesameElmoModelTester(_Tester):
    """A 2-layer BiLM (projection 8, cell 16) over character ids, word ids for the LM's targets, 3 labels."""

    hidden_size = 16  # 2 * projection_dim: the width of every layer representation

    def get_config(self):
        return modeling.SesameElmoConfig(**micro_elmo_kwargs(VOCAB, num_labels=3, freeze_backbone=False))

    def prepare_config_and_inputs_for_common(self):
        mask = _mask()
        letters = _ids((BATCH, LENGTH, 3), 26, 1) + 98  # three letters per word (ELMo ids are byte + 1)
        char_ids = torch.full((BATCH, LENGTH, 50), 261)  # padding of the word's 50 slots
        char_ids[..., 0], char_ids[..., 1:4], char_ids[..., 4] = 259, letters, 260  # begin word, letters, end word
        inputs = dict(
            char_ids=char_ids * mask.unsqueeze(-1),
            attention_mask=mask,
            token_type_ids=_types(),
            input_ids=_ids((BATCH, LENGTH), VOCAB, 2) * mask,
        )
        return self.get_config(), inputs


class _FamilyTest(common.ModelTesterMixin):
    """What both families share: labels for the pretraining heads (the mixin adds the others by class name)."""

    model_tester_class: type

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        # the mixin reads transformers' warnings (e.g. "Reinit due to size mismatch"): its default verbosity, whatever
        # a test before this one in the same worker process set
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_warning()
        self.addCleanup(hf_logging.set_verbosity, verbosity)

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        if return_labels and model_class is modeling.SesameBertForPreTraining:
            inputs["labels"] = torch.zeros(BATCH, LENGTH, dtype=torch.long)
            inputs["next_sentence_label"] = torch.zeros(BATCH, dtype=torch.long)
        return inputs  # SesameElmoForBidirectionalLM: its targets are input_ids


class SesameBertModelTest(_FamilyTest, unittest.TestCase):
    """transformers' common model tests on the six SesameBert heads."""

    model_tester_class = SesameBertModelTester
    all_model_classes = (
        modeling.SesameBertModel,
        modeling.SesameBertForMaskedLM,
        modeling.SesameBertForPreTraining,
        modeling.SesameBertForSequenceClassification,
        modeling.SesameBertForQuestionAnswering,
        modeling.SesameBertForTokenClassification,
    )


class SesameModernBertModelTest(SesameBertModelTest):
    """transformers' common model tests on the six SesameBert heads of a ModernBERT-class config."""

    model_tester_class = SesameModernBertModelTester


#: the mixin's rotary tests, which run for every config with a ``rope_parameters`` attribute (SesameBert's since
#: issue 53 item 5, ``None`` without rotary positions) and set scaled or partial rotary embeddings on it after its
#: construction
_ROPE = (
    "SesameBert's rotary embeddings are RoFormer's, unscaled and on the whole head: the config refuses a rope_type "
    "other than 'default' and any other rope_parameters key (tests/bert/test_config_names.py), so {} does not apply"
)
ROPE_NOT_APPLICABLE = {
    **{
        f"test_model_rope_scaling_from_config_{i}_{kind}": _ROPE.format(f"{kind} scaling")
        for i, kind in enumerate(("linear", "dynamic", "yarn"))
    },
    "test_model_rope_with_partial_rotation": _ROPE.format("a partial_rotary_factor"),
}


_CHARACTERS = (
    "ELMo's input is characters: get_input_embeddings() is the character CNN over char_ids (B, T, 50), not a word "
    "embedding matrix over input_ids (B, T)"
)

#: the mixin's tests whose assumptions ELMo does not meet (most: a word-embedding input), each with the reason
NOT_APPLICABLE = {
    "test_inputs_embeds": f"{_CHARACTERS}; the test builds inputs_embeds as get_input_embeddings()(input_ids) "
    "(test_model_contract.py checks inputs_embeds = the character CNN's output against char_ids)",
    "test_inputs_embeds_matches_input_ids": f"{_CHARACTERS}; the test builds inputs_embeds as "
    "get_input_embeddings()(input_ids) (test_model_contract.py checks inputs_embeds against char_ids)",
    "test_model_get_set_embeddings": f"{_CHARACTERS}; the test asserts an nn.Embedding",
    "test_resize_tokens_embeddings": f"{_CHARACTERS}: no token matrix to resize",
    "test_resize_embeddings_untied": f"{_CHARACTERS}: no token matrix to resize",
    "test_resize_embeddings_untied_no_reinit_on_post_init": f"{_CHARACTERS}: no token matrix to resize",
    "test_load_with_mismatched_shapes": f"{_CHARACTERS}: the test's base-model half changes vocab_size (the BiLM "
    "softmax, absent from the base model) and calls the base model on word ids (2, 8); its num_labels half: "
    "tests/elmo/test_elmo_save_load.py::test_other_num_labels_reinitialises_both_classifiers",
    "test_can_load_ignoring_mismatched_shapes": "the test takes the head's first nn.Sequential child as the only "
    "classifier and wants every other parameter unchanged: ELMo's sentence head has two num_labels classifiers "
    "(pair_classifier for pairs, classifier for single sentences), both rightly re-initialised at the new size (its "
    "last check also expects config-scaled initialisation; ELMo's Linear layers start at N(0, 1/fan_in), bilm-tf); "
    "tests/elmo/test_elmo_save_load.py::test_other_num_labels_reinitialises_both_classifiers checks the rest",
}


def _not_applicable(reason: str):
    """A test method that skips with ``reason``."""

    def test(self):
        self.skipTest(reason)

    return test


class SesameElmoModelTest(_FamilyTest, unittest.TestCase):
    """transformers' common model tests on the five SesameElmo heads; :data:`NOT_APPLICABLE` skipped with reasons."""

    model_tester_class = SesameElmoModelTester
    has_attentions = False  # a BiLSTM: the mixin's own flag skips the attention tests
    all_model_classes = (
        modeling.SesameElmoModel,
        modeling.SesameElmoForBidirectionalLM,
        modeling.SesameElmoForSequenceClassification,
        modeling.SesameElmoForQuestionAnswering,
        modeling.SesameElmoForTokenClassification,
    )


for _name, _reason in NOT_APPLICABLE.items():
    setattr(SesameElmoModelTest, _name, _not_applicable(_reason))
for _name, _reason in ROPE_NOT_APPLICABLE.items():  # each class holds its own copies of the mixin's tests
    for _test in (SesameBertModelTest, SesameModernBertModelTest):
        setattr(_test, _name, _not_applicable(_reason))


def test_the_mixin_was_found():
    """The module ran transformers' tests (not skipped): the mixin is transformers', with its test methods."""
    assert common.__file__ == str(_COMMON)
    assert sum(name.startswith("test_") for name in dir(common.ModelTesterMixin)) > 50
