"""Configuration of the ELMo-style BiLM (``model_type = "sesame-elmo"``).

Field names follow bilm-tf's ``options.json`` where one exists (``char_cnn.filters``, ``n_highway``,
``lstm.dim`` = ``cell_size``, ``lstm.projection_dim``, ``cell_clip``, ``proj_clip``, ``n_negative_samples_batch``
= ``num_sampled``). Imports only transformers / huggingface_hub and the standard library (remote code).
"""

from __future__ import annotations

import inspect
import math
from typing import Literal, get_args, get_origin

from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig

#: Peters et al. (2018) / bilm-tf character CNN: (width, number of filters); 2048 filters in all.
ELMO_CNN_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]

#: ``auto_map`` written into every saved config, so that any head loads any checkpoint with
#: ``trust_remote_code=True`` (``save_pretrained`` alone would record only the saved class).
DEFAULT_AUTO_MAP = {
    "AutoConfig": "configuration_elmo.SesameElmoConfig",
    "AutoModel": "modeling_elmo.SesameElmoModel",
    "AutoModelForPreTraining": "modeling_elmo.SesameElmoForBidirectionalLM",
    "AutoModelForSequenceClassification": "modeling_elmo.SesameElmoForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_elmo.SesameElmoForQuestionAnswering",
    "AutoModelForTokenClassification": "modeling_elmo.SesameElmoForTokenClassification",
}


def finish_post_init(config: PretrainedConfig, cls: type, kwargs: dict, auto_map: dict) -> None:
    """The end of ``cls.__post_init__`` (SesameElmo, SesameBaseline): the default ``auto_map``, transformers'
    ``__post_init__``, then ``validate_architecture()`` here, as transformers' own checks, so that a bad value raises
    a plain ``ValueError`` (callers catch it); ``@strict`` runs it again (wrapped) after ``__init__`` and before every
    save."""
    kwargs.setdefault("auto_map", dict(auto_map))
    super(cls, config).__post_init__(**kwargs)
    config.validate_architecture()


def check_fields(config: PretrainedConfig, positive: tuple[str, ...] = ()) -> None:
    """Check the fields annotated on ``type(config)`` itself: each ``Literal[...]`` one against its choices, each
    number (not a bool; ``None`` allowed) finite and >= 0 (no field of these configs has a negative meaning), the
    ``positive`` ones (sizes, scales) > 0, then each dropout (a name ending in ``dropout`` or ``dropout_prob``)
    against [0, 1): ``torch.nn.Dropout`` takes a probability, and a value off it used to fail only when the model was
    built, as a traceback.

    Raises:
        ValueError: ``"<Class>.<field>=<value>; expected ..."`` for the first field off its choices, its sign or
            range.
    """
    annotations = inspect.get_annotations(type(config), eval_str=True)
    name = type(config).__name__
    for field, annotation in annotations.items():
        allowed = get_args(annotation) if get_origin(annotation) is Literal else ()
        if allowed and getattr(config, field) not in allowed:
            raise ValueError(f"{name}.{field}={getattr(config, field)!r}; expected one of {allowed}")
    for field in annotations:
        value = getattr(config, field, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value < 0 or (field in positive and value == 0):
            expected = "a positive finite number" if field in positive else "a finite number >= 0"
            raise ValueError(f"{name}.{field}={value!r}; expected {expected}")
    for field in annotations:
        value = getattr(config, field, None)
        if not field.endswith(("dropout", "dropout_prob")) or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"{type(config).__name__}.{field}={value!r}; expected a probability in [0, 1)")


#: The :class:`SesameElmoConfig` fields that must be > 0 (sizes, scales; :func:`check_fields`); the others may be 0
#: (``task_hidden_size`` 0: no task BiLSTM; ``classifier_hidden_size`` 0: a linear classifier).
ELMO_POSITIVE = (
    "vocab_size",
    "char_vocab_size",
    "max_characters_per_token",
    "char_embedding_dim",
    "projection_dim",
    "cell_size",
    "num_sampled",
    "adaptive_div_value",
    "initializer_range",
    "cnn_pool_filters",
    "cell_clip",
    "proj_clip",
)


@strict
class SesameElmoConfig(PretrainedConfig):
    r"""Configuration of :class:`SesameElmoModel` and its heads: a ``@strict`` dataclass (huggingface_hub), as
    ``SesameBertConfig``; each field's type and default below, the choices checked by :meth:`validate_architecture`.

    BiLM (Peters et al. 2018, "Deep contextualized word representations"; bilm-tf):

    Args:
        vocab_size (`int`, 30000): word vocabulary size (softmax outputs); the tokenizer's ``len()``.
        char_vocab_size (`int`, 262): character ids 0..261 (ELMo ids, 0 = masked token).
        max_characters_per_token (`int`, 50): characters per token.
        char_embedding_dim (`int`, 16): character embedding size.
        cnn_filters (`list[list[int]]`): ``[[width, n_filters], ...]`` of the character CNN (max-pooled over
            the characters); ``None`` (the default) = the paper's, :data:`ELMO_CNN_FILTERS` (2048 filters).
        cnn_activation (`str`, "relu"): "relu" | "tanh" after each convolution (ELMo: relu).
        num_highway_layers (`int`, 2): highway layers on the concatenated CNN features.
        projection_dim (`int`, 512): size of layer 0 (the projection after the highway layers) and of each
            LSTM's output (its projection), as in bilm-tf where both equal ``lstm.projection_dim``.
        cell_size (`int`, 4096): LSTM memory cell size (GRU hidden size for ``cell_type="gru"``).
        num_layers (`int`, 2): LSTM layers per direction (>= 1).
        cell_type (`str`, "lstm"): "lstm" (``nn.LSTM(proj_size=projection_dim)``) | "gru" (``nn.GRU`` of
            ``cell_size`` followed by a linear projection to ``projection_dim``).
        cell_clip (`float`, optional): clip the LSTM memory cell to ``[-c, c]`` (bilm-tf: 3). ``None`` =
            no clipping, the fast fused ``nn.LSTM``; set, a step-by-step loop with the same parameters.
        proj_clip (`float`, optional): clip the LSTM projection output (bilm-tf: 3); as ``cell_clip``.
        use_residual (`bool`, True): residual connection around every LSTM layer but the first.
        fused_cpu_lstm (`bool`, True): on CPU, run the forward and backward LSTMs (with projection, no
            clipping) of each layer together in one kernel with hand-written backpropagation through time
            (``BiLSTMProjectionFunction``): the same function as two ``nn.LSTM`` calls, faster on CPU (an
            elmo-small sampled-softmax training step 1.40x faster at B=32, T=128, 2 threads). Ignored on GPU
            (cuDNN) and under autocast.
        dropout (`float`, 0.1): dropout on each LSTM layer's input and on the top layer before the softmax.
        softmax (`str`, "full"): training softmax, "full" | "sampled" (Jean et al. 2015, log-uniform
            sampler, ``num_sampled`` negatives shared by the batch) | "adaptive" (Grave et al. 2017).
            Evaluation (``model.eval()``) always reports the exact normalised NLL.
        num_sampled (`int`, 8192): negatives of the sampled softmax (ELMo used 8192).
        adaptive_cutoffs (`list[int]`, optional): cluster cut-offs of the adaptive softmax (increasing,
            < vocab_size); default ``[V/20, V/4]`` rounded (>= 2 words each).
        adaptive_div_value (`float`, 4.0): size divisor of the tail clusters' projections.
        initializer_range (`float`, 0.05): read by transformers' generic utilities (the default ``_init_weights``,
            ``resize_token_embeddings``); SesameElmo's own initialisation (fan-in normal, Xavier LSTMs; see
            ``SesameElmoPreTrainedModel._init_weights``) does not use it.

    Downstream heads (Peters et al. 2018, section 3.3: ELMo_k = gamma * sum_j softmax(s)_j h_{k,j}):

    Args:
        freeze_backbone (`bool`, True): keep the BiLM's weights frozen (and its dropout off); the heads
            train only ScalarMix's gamma and s and the task layers. False fine-tunes the BiLM too. A field of this
            config only: fine-tuning scripts set it for any model whose config has it.
        scalar_mix_layer_norm (`bool`, False): layer-normalise each layer before mixing (AllenNLP's
            ``do_layer_norm``).
        task_hidden_size (`int`, 128): hidden size per direction of the task BiLSTM (0 = no BiLSTM).
        pooling (`str`, "max"): sentence pooling "max" | "mean" | "attention" | "cnn" (Kim 2014).
        cnn_pool_widths (`list[int]`, [3, 4, 5]): filter widths of the "cnn" pooling (``None`` = the default).
        cnn_pool_filters (`int`, 100): filters per width of the "cnn" pooling.
        classifier_hidden_size (`int`, 256): hidden size of the classification MLP (0 = linear).
        classifier_dropout (`float`, 0.2): dropout on the mixed features and before the classifier.

    Special tokens (the ids of :class:`SesameElmoTokenizer`'s vocabulary):

    Args:
        pad_token_id (`int`, 0): ``<pad>``. bos_token_id (`int`, 1): ``<S>``. eos_token_id (`int`, 2): ``</S>``.

    Raises:
        ValueError: a string field outside its choices, clipping with ``cell_type="gru"``, or ``num_layers < 1``
            (raised as such at construction; ``save_pretrained`` re-runs the check through ``@strict``'s
            ``validate()``, which wraps it in ``StrictDataclassClassValidationError``).
    """

    model_type = "sesame-elmo"

    vocab_size: int = 30000
    char_vocab_size: int = 262
    max_characters_per_token: int = 50
    char_embedding_dim: int = 16
    cnn_filters: list[list[int]] | None = None
    cnn_activation: Literal["relu", "tanh"] = "relu"
    num_highway_layers: int = 2
    projection_dim: int = 512
    cell_size: int = 4096
    num_layers: int = 2
    cell_type: Literal["lstm", "gru"] = "lstm"
    cell_clip: float | int | None = None
    proj_clip: float | int | None = None
    use_residual: bool = True
    fused_cpu_lstm: bool = True
    dropout: float | int = 0.1
    softmax: Literal["full", "sampled", "adaptive"] = "full"
    num_sampled: int = 8192
    adaptive_cutoffs: list[int] | None = None
    adaptive_div_value: float | int = 4.0
    initializer_range: float = 0.05
    freeze_backbone: bool = True
    scalar_mix_layer_norm: bool = False
    task_hidden_size: int = 128
    pooling: Literal["max", "mean", "attention", "cnn"] = "max"
    cnn_pool_widths: list[int] | None = None
    cnn_pool_filters: int = 100
    classifier_hidden_size: int = 256
    classifier_dropout: float | int = 0.2
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2

    def __post_init__(self, **kwargs):
        """Fill the list defaults (fresh lists, tuples accepted), the default ``auto_map``, and check the choices."""
        self.cnn_filters = [list(f) for f in (self.cnn_filters if self.cnn_filters is not None else ELMO_CNN_FILTERS)]
        self.adaptive_cutoffs = list(self.adaptive_cutoffs) if self.adaptive_cutoffs is not None else None
        self.cnn_pool_widths = list(self.cnn_pool_widths) if self.cnn_pool_widths is not None else [3, 4, 5]
        finish_post_init(self, SesameElmoConfig, kwargs, DEFAULT_AUTO_MAP)

    def validate_architecture(self) -> None:
        """Check the string-valued choices, clipping and ``num_layers`` (``@strict`` class validator).

        Raises:
            ValueError: with the field, its value and what is expected.
        """
        super().validate_architecture()
        check_fields(self, ELMO_POSITIVE)
        if self.cell_type == "gru" and (self.cell_clip is not None or self.proj_clip is not None):
            raise ValueError("SesameElmoConfig: cell_clip/proj_clip apply to cell_type='lstm' only")
        if self.num_layers < 1:
            raise ValueError(f"SesameElmoConfig.num_layers={self.num_layers}; expected >= 1")

    @property
    def hidden_size(self) -> int:
        """Width of every layer representation of :class:`SesameElmoModel`: ``2 * projection_dim``."""
        return 2 * self.projection_dim

    def resolved_adaptive_cutoffs(self) -> list[int]:
        """The adaptive softmax cut-offs: ``adaptive_cutoffs`` or ``[V // 20, V // 4]`` (made increasing)."""
        if self.adaptive_cutoffs:
            return list(self.adaptive_cutoffs)
        v = self.vocab_size
        first = max(2, v // 20)
        second = max(first + 2, v // 4)
        return [first, second] if second < v else [first]
