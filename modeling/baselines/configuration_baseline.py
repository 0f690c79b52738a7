"""Configuration of the classic sentence-encoder baselines (``model_type = "sesame-baseline"``).

One config for five encoders chosen by ``encoder_type`` (a small table in ``encoders_baseline.py``, no class
hierarchy): bag of embeddings (CBoW), fastText with hashed character n-grams, Kim's CNN, a (bi)LSTM/GRU and a
binary Tree-LSTM. Imports only transformers / huggingface_hub and the standard library (remote code).
"""

from __future__ import annotations

from typing import Any, Literal

from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig

from .configuration_elmo import check_fields, finish_post_init

#: ``auto_map`` written into every saved config, so that any head loads any checkpoint with
#: ``trust_remote_code=True`` (``save_pretrained`` alone would record only the saved class).
DEFAULT_AUTO_MAP = {
    "AutoConfig": "configuration_baseline.SesameBaselineConfig",
    "AutoModel": "modeling_baseline.SesameBaselineModel",
    "AutoModelForSequenceClassification": "modeling_baseline.SesameBaselineForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_baseline.SesameBaselineForTokenClassification",
}

ENCODER_TYPES = ("cbow", "fasttext", "cnn", "rnn", "treelstm")


@strict
class SesameBaselineConfig(PretrainedConfig):
    r"""Configuration of :class:`SesameBaselineModel` and :class:`SesameBaselineForSequenceClassification`: a
    ``@strict`` dataclass (huggingface_hub), as ``SesameBertConfig``; each field's type and default below, the choices
    checked by :meth:`validate_architecture`.

    Words come from the ELMo-style word tokenizer (:class:`~modeling.elmo.tokenization_elmo.SesameElmoTokenizer`):
    ``input_ids`` are word ids, ``char_ids`` the UTF-8 bytes of each word (used by fastText's n-grams).
    ``<S>``/``</S>`` markers and padding are not part of a sentence for any encoder.

    Embeddings:

    Args:
        vocab_size (`int`, 20000): word vocabulary size; the tokenizer's ``len()``.
        embedding_dim (`int`, 100): word (and n-gram) embedding size; the size of the vectors of
            ``python -m tokenizer vectors`` when the embeddings are initialised from them.
        embedding_mode (`str`, "non-static"): Kim (2014)'s names: "static" (embeddings frozen), "non-static"
            (fine-tuned) or "multichannel" (``encoder_type="cnn"`` only: a frozen and a fine-tuned copy of
            the same initial vectors, each filter applied to both and the results added).
        embedding_dropout (`float`, 0.0): dropout on the word vectors.

    Encoder (``encoder_type``: "cbow" | "fasttext" | "cnn" | "rnn" | "treelstm"):

    Args:
        encoder_type (`str`, "cbow"): which sentence encoder (see ``encoders_baseline``).
        ngram_min_n (`int`, 3), ngram_max_n (`int`, 6): fastText character n-gram lengths (Bojanowski et al.
            2017: 3..6), over ``<word>``.
        ngram_buckets (`int`, 100000): hash buckets of the n-gram embeddings (fastText: 2,000,000; smaller
            here to fit a CPU). Must equal the ``--bucket`` of the vectors the model is initialised from.
        cnn_filter_sizes (`list[int]`, [3, 4, 5]), cnn_num_filters (`int`, 100): Kim (2014): widths 3/4/5
            with 100 feature maps each, ReLU, max-over-time pooling (``cnn_filter_sizes=None`` = the default).
        rnn_type (`str`, "lstm"): "lstm" | "gru".
        rnn_hidden_size (`int`, 256): hidden size per direction.
        rnn_num_layers (`int`, 2): stacked layers.
        rnn_bidirectional (`bool`, True): a forward and a backward RNN, states concatenated.
        rnn_dropout (`float`, 0.0): dropout between stacked layers.
        pooling (`str`, "max"): "max" | "mean" | "attention" (a learned query, Yang et al. 2016) over the RNN
            states. The GLUE baseline (Wang et al. 2018) is a 2-layer BiLSTM with max pooling.
        treelstm_hidden_size (`int`, 150): state size of the binary Tree-LSTM (Tai et al. 2015).
        tree_source (`str`, "latent"): "latent" -- trees composed bottom-up by a straight-through
            Gumbel-softmax choice of the adjacent pair to merge (Choi et al. 2018); "given" -- the trees
            passed as ``tree_merges`` (see :func:`~modeling.baselines.encoders_baseline.parse_binary_tree`);
            "auto" -- given when ``tree_merges`` is passed, latent otherwise.
        gumbel_temperature (`float`, 1.0): temperature of the Gumbel-softmax in training.

    Classifier:

    Args:
        classifier_hidden_size (`int`, 0): 0 = a linear classifier (fastText); > 0 = one hidden layer (ReLU).
        classifier_dropout (`float`, 0.0): dropout on the sentence vector(s) before the classifier
            (Kim 2014: 0.5).

    ELMo features (Peters et al. 2018, section 3.3: a frozen pretrained BiLM's layers, mixed by a task-specific
    ScalarMix, concatenated to the word vectors at the encoder's input):

    Args:
        elmo_config (`dict`, optional): the :class:`~modeling.elmo.SesameElmoConfig` (``to_dict()``) of the frozen
            BiLM; ``None`` (the default): no ELMo features. The BiLM's weights are part of the model's weights
            (``baseline.elmo.bilm.*``), so one folder holds the whole model.
        elmo_name_or_path (`str`, optional): where the BiLM's weights came from (a SesameElmo folder, or
            ``"random:<folder>"`` for a randomly initialised BiLM of that folder's shape, the control); recorded
            only, the weights themselves are in the model.
        elmo_dropout (`float`, 0.5): dropout on the mixed ELMo features (AllenNLP's ``Elmo`` default).
        elmo_l2_coef (`float`, 0.0): ``lambda`` of the paper's ``lambda * ||s||^2`` on the ScalarMix weights
            (before the softmax), added to the training loss (the paper: 0.001 or 1 per task; 0 = off).
        elmo_at_output (`bool`, False): also a second ScalarMix whose features are pooled over the sentence (the
            encoder's own ``pooling`` for "rnn", max otherwise) and concatenated to the sentence vector; for a
            max- or mean-pooled RNN this is the paper's ``[h_k; ELMo_k]`` at the encoder's output.
        elmo_cache_mb (`int`, 0): memory (MiB of float32) for keeping the frozen BiLM's layers per distinct sentence,
            so that a fixed training set passes through the BiLM once, not once per epoch (0 = off; eager mode only).
            ``finetune.baselines`` sets 2048 for its table runs.

    Special tokens (the ids of the word tokenizer's vocabulary; a sentence is its words without them):

    Args:
        pad_token_id (`int`, 0): ``<pad>``. bos_token_id (`int`, 1): ``<S>``. eos_token_id (`int`, 2): ``</S>``.
        unk_token_id (`int`, 3): ``<UNK>`` (fastText: a word outside the vocabulary has only its n-grams).

    Raises:
        ValueError: a string field outside its choices, ``multichannel`` embeddings for another encoder than
            "cnn", n-gram lengths out of order, a size < 1 or ``gumbel_temperature <= 0`` (raised as such at
            construction; ``save_pretrained`` re-runs the check through ``@strict``'s ``validate()``, which wraps it
            in ``StrictDataclassClassValidationError``).
    """

    model_type = "sesame-baseline"

    vocab_size: int = 20000
    embedding_dim: int = 100
    embedding_mode: Literal["static", "non-static", "multichannel"] = "non-static"
    embedding_dropout: float | int = 0.0
    encoder_type: Literal["cbow", "fasttext", "cnn", "rnn", "treelstm"] = "cbow"
    ngram_min_n: int = 3
    ngram_max_n: int = 6
    ngram_buckets: int = 100_000
    cnn_filter_sizes: list[int] | None = None
    cnn_num_filters: int = 100
    rnn_type: Literal["lstm", "gru"] = "lstm"
    rnn_hidden_size: int = 256
    rnn_num_layers: int = 2
    rnn_bidirectional: bool = True
    rnn_dropout: float | int = 0.0
    pooling: Literal["max", "mean", "attention"] = "max"
    treelstm_hidden_size: int = 150
    tree_source: Literal["latent", "given", "auto"] = "latent"
    gumbel_temperature: float | int = 1.0
    classifier_hidden_size: int = 0
    classifier_dropout: float | int = 0.0
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    unk_token_id: int | None = 3
    elmo_config: dict[str, Any] | None = None
    elmo_name_or_path: str | None = None
    elmo_dropout: float | int = 0.5
    elmo_l2_coef: float | int = 0.0
    elmo_at_output: bool = False
    elmo_cache_mb: int = 0

    @property
    def elmo_dim(self) -> int:
        """Width of the ELMo features: ``2 * projection_dim`` of the BiLM (forward and backward halves); 0 without
        ELMo."""
        return 2 * int(self.elmo_config["projection_dim"]) if self.elmo_config else 0

    @property
    def encoder_input_size(self) -> int:
        """What the encoder reads per word: ``embedding_dim`` plus :attr:`elmo_dim`."""
        return self.embedding_dim + self.elmo_dim

    def __post_init__(self, **kwargs):
        """Fill the list default (a fresh list, tuples accepted), the default ``auto_map``, and check the choices."""
        self.cnn_filter_sizes = list(self.cnn_filter_sizes) if self.cnn_filter_sizes is not None else [3, 4, 5]
        finish_post_init(self, SesameBaselineConfig, kwargs, DEFAULT_AUTO_MAP)

    def validate_architecture(self) -> None:
        """Check the string-valued choices and the sizes (``@strict`` class validator).

        Raises:
            ValueError: with the field, its value and what is expected.
        """
        super().validate_architecture()
        check_fields(self)
        if self.embedding_mode == "multichannel" and self.encoder_type != "cnn":
            raise ValueError("SesameBaselineConfig.embedding_mode='multichannel' applies to encoder_type='cnn' only")
        if not 1 <= self.ngram_min_n <= self.ngram_max_n:
            raise ValueError(
                f"SesameBaselineConfig: ngram_min_n={self.ngram_min_n}, ngram_max_n={self.ngram_max_n}; "
                "expected 1 <= ngram_min_n <= ngram_max_n"
            )
        for field in (
            "vocab_size",
            "embedding_dim",
            "ngram_buckets",
            "cnn_num_filters",
            "rnn_hidden_size",
            "rnn_num_layers",
            "treelstm_hidden_size",
        ):
            if getattr(self, field) < 1:
                raise ValueError(f"SesameBaselineConfig.{field}={getattr(self, field)}; expected >= 1")
        if self.elmo_config is not None:
            missing = [k for k in ("projection_dim", "num_layers") if k not in self.elmo_config]
            if self.elmo_config.get("model_type") != "sesame-elmo" or missing:
                raise ValueError(
                    "SesameBaselineConfig.elmo_config: expected a SesameElmoConfig as a dict (model_type "
                    f"'sesame-elmo' with projection_dim and num_layers), got model_type "
                    f"{self.elmo_config.get('model_type')!r}" + (f", missing {missing}" if missing else "")
                )
        if not 0 <= self.elmo_dropout < 1 or self.elmo_l2_coef < 0 or self.elmo_cache_mb < 0:
            raise ValueError(
                f"SesameBaselineConfig: elmo_dropout={self.elmo_dropout}, elmo_l2_coef={self.elmo_l2_coef}, "
                f"elmo_cache_mb={self.elmo_cache_mb}; expected 0 <= elmo_dropout < 1, elmo_l2_coef >= 0 and "
                "elmo_cache_mb >= 0"
            )
        if not self.gumbel_temperature > 0:
            raise ValueError(f"SesameBaselineConfig.gumbel_temperature={self.gumbel_temperature}; expected > 0")
