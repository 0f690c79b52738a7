"""finetune.explain reaches layer 0 through the public contract of transformers models only: the module of
``get_input_embeddings()`` applied to ``main_input_name``, and ``inputs_embeds`` back into ``forward``."""

from __future__ import annotations

import pytest
import torch

from core.errors import InputError
from finetune import explain as ex


def test_layer0_runs_a_model_from_its_input_embeddings_whatever_the_family():
    """transformers' own BERT (no sesame-lm code involved): the representations are its word embeddings and the
    logits from them are the model's logits."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    ).eval()
    inputs = {
        "input_ids": torch.tensor([[2, 7, 9, 3, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 0]]),
        "token_type_ids": torch.zeros(1, 5, dtype=torch.long),
    }
    layer0 = ex.Layer0(model)
    x = layer0.representations(inputs)
    torch.testing.assert_close(x, model.bert.embeddings.word_embeddings(inputs["input_ids"]))
    with torch.no_grad():
        torch.testing.assert_close(layer0.forward(x, inputs), model(**inputs).logits)


def test_layer0_refuses_a_model_without_inputs_embeds():
    """A model with word embeddings but no ``inputs_embeds`` argument in ``forward`` is refused, not silently
    ignored (every sesame family now takes ``inputs_embeds``, so the model here is a minimal one without it)."""

    class NoInputsEmbeds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(30, 4)

        def get_input_embeddings(self):
            return self.embed

        def forward(self, input_ids, attention_mask=None):
            return self.embed(input_ids).sum(1)

    with pytest.raises(InputError, match="no input embeddings to attribute to .*inputs_embeds"):
        ex.Layer0(NoInputsEmbeds())
