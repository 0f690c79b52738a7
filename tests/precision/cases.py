"""Every head of both families with labels for the batches of ``conftest.py``: ``{name: (class, config overrides,
batch -> label kwargs)}``; shared by the autocast tests and the CUDA tests (tests/gpu)."""

from __future__ import annotations

import torch

from modeling import (
    SesameBertForMaskedLM,
    SesameBertForPreTraining,
    SesameBertForQuestionAnswering,
    SesameBertForSequenceClassification,
    SesameBertForTokenClassification,
)
from modeling.elmo import (
    SesameElmoForBidirectionalLM,
    SesameElmoForQuestionAnswering,
    SesameElmoForSequenceClassification,
    SesameElmoForTokenClassification,
)

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _mlm_labels(b):
    labels = b["input_ids"].clone()
    labels[(torch.arange(labels.numel()).reshape(labels.shape) % 3 != 0) | (b["attention_mask"] == 0)] = -100
    return labels


BERT_CASES = {
    "mlm": (SesameBertForMaskedLM, {}, lambda b: dict(labels=_mlm_labels(b))),
    "mlm-dense": (SesameBertForMaskedLM, dict(sparse_prediction=False), lambda b: dict(labels=_mlm_labels(b))),
    "pretraining": (
        SesameBertForPreTraining,
        {},
        lambda b: dict(labels=_mlm_labels(b), next_sentence_label=torch.tensor([0, 1, 0])),
    ),
    **{
        f"classification-{pooling}": (
            SesameBertForSequenceClassification,
            dict(classifier_pooling=pooling, num_labels=3),
            lambda b: dict(labels=torch.tensor([0, 2, 1])),
        )
        for pooling in ("cls", "mean", "max", "attention")
    },
    "regression": (
        SesameBertForSequenceClassification,
        dict(num_labels=1),
        lambda b: dict(labels=torch.tensor([0.5, -1.0, 2.0])),
    ),
    "qa": (
        SesameBertForQuestionAnswering,
        {},
        lambda b: dict(start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([2, 5, 3])),
    ),
    "tagging": (
        SesameBertForTokenClassification,
        dict(num_labels=3),
        lambda b: dict(labels=(b["input_ids"] % 3).masked_fill(b["attention_mask"] == 0, -100)),
    ),
}

ELMO_CASES = {
    "bilm-full": (SesameElmoForBidirectionalLM, dict(softmax="full"), lambda b: {}),
    "bilm-sampled": (SesameElmoForBidirectionalLM, dict(softmax="sampled"), lambda b: {}),
    "bilm-adaptive": (SesameElmoForBidirectionalLM, dict(softmax="adaptive", adaptive_cutoffs=[20, 40]), lambda b: {}),
    **{
        f"classification-{pooling}": (
            SesameElmoForSequenceClassification,
            dict(num_labels=3, pooling=pooling, freeze_backbone=False),
            lambda b: dict(labels=torch.tensor([0, 2, 1])),
        )
        for pooling in ("max", "mean", "attention", "cnn")
    },
    "regression": (
        SesameElmoForSequenceClassification,
        dict(num_labels=1, freeze_backbone=False),
        lambda b: dict(labels=torch.tensor([0.5, -1.0, 2.0])),
    ),
    "tagging": (
        SesameElmoForTokenClassification,
        dict(num_labels=3, freeze_backbone=False),
        lambda b: dict(labels=(b["input_ids"] % 3).masked_fill(b["attention_mask"] == 0, -100)),
    ),
    "qa": (
        SesameElmoForQuestionAnswering,
        dict(freeze_backbone=False),
        lambda b: dict(start_positions=torch.tensor([4, 3, 2]), end_positions=torch.tensor([5, 4, 2])),
    ),
}
