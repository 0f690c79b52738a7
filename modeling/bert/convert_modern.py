"""transformers' ModernBERT and EuroBERT <-> SesameBert: configs, parameter names, and whole models, both ways.

ModernBERT (Warner et al. 2024, "Smarter, Better, Faster, Longer", transformers' ``modernbert``) and EuroBERT (Boizard
et al. 2025, "EuroBERT: Scaling Multilingual Encoders for European Languages", transformers' ``eurobert``) are
SesameBert configs (``configuration_sesame_bert``'s modern fields):

* ModernBERT: pre-LN LayerNorm (``norm_bias``), embedding norm, the identity as layer 0's attention norm, a final
  norm, GeGLU, RoPE with a global and a local base, ``layer_types`` with ``local_attention``, and its prediction head
  (``head_layout="modernbert"``). No segment embeddings (``type_vocab_size=0``).
* EuroBERT: the Llama block (pre-LN RMSNorm, SwiGLU, RoPE, grouped-query attention, ``head_dim``), no embedding norm,
  a final norm; its heads (``head_layout="eurobert"``): the MLM decoder on the hidden states, ``act(dense(pool(h)))``
  for sequence classification (``"bos"`` and ``"mean"`` pooling; ``"late"``: ``classifier_pooling="late"``), a linear
  tagger.

:func:`to_sesame` / :func:`from_sesame` map a model of either family to the SesameBert class with the same head and
back (:data:`SESAME_CLASS_OF`); the parameters are copied (fused or split: EuroBERT's q/k/v and gate/up projections are
SesameBert's ``qkv`` and ``fc1``), so the two compute the same function (``tests/bert/test_convert_modern.py``).

Errors: :class:`core.errors.InputError` for configs that have no counterpart on the other side (a rope scaling
type other than ``"default"``, an activation without a GLU, a pooling the other side lacks, a SesameBert config that
is not of the target's layout).
"""

from __future__ import annotations

import torch
from huggingface_hub.errors import StrictDataclassError

from core.errors import InputError, first_line

from . import modeling_sesame_bert as sesame
from .configuration_sesame_bert import GLU_ACTS, HIDDEN_ACTS, LAYER_TYPES, LAYOUTS, SesameBertConfig

#: The conversion sources this module reads (the ``model_type`` of their transformers configs; ``--to`` targets too).
SOURCES = ("modernbert", "eurobert")
#: transformers class name -> SesameBert class name (the same head).
SESAME_CLASS_OF = {
    "ModernBertModel": "SesameBertModel",
    "ModernBertForMaskedLM": "SesameBertForMaskedLM",
    "ModernBertForSequenceClassification": "SesameBertForSequenceClassification",
    "ModernBertForTokenClassification": "SesameBertForTokenClassification",
    "ModernBertForQuestionAnswering": "SesameBertForQuestionAnswering",
    "EuroBertModel": "SesameBertModel",
    "EuroBertForMaskedLM": "SesameBertForMaskedLM",
    "EuroBertForSequenceClassification": "SesameBertForSequenceClassification",
    "EuroBertForTokenClassification": "SesameBertForTokenClassification",
}
#: Parameter name parts of the encoder, transformers (without ``model.``) -> SesameBert (without ``bert.``), per
#: family; a part ending in "." at the start of a name is a prefix (the final norms).
ENCODER_RENAMES = {
    "modernbert": (
        ("embeddings.tok_embeddings.", "embeddings.word_embeddings."),
        ("attn_norm.", "norm1."),
        ("attn.Wqkv.", "attn.qkv."),
        ("attn.Wo.", "attn.out."),
        ("mlp_norm.", "norm2."),
        ("mlp.Wi.", "ffn.fc1."),
        ("mlp.Wo.", "ffn.fc2."),
    ),
    "eurobert": (
        ("embed_tokens.", "embeddings.word_embeddings."),
        ("input_layernorm.", "norm1."),
        ("self_attn.o_proj.", "attn.out."),
        ("post_attention_layernorm.", "norm2."),
        ("mlp.down_proj.", "ffn.fc2."),
        ("self_attn.q_proj.", "attn.qkv."),
        ("self_attn.k_proj.", "attn.qkv."),
        ("self_attn.v_proj.", "attn.qkv."),
        ("mlp.gate_proj.", "ffn.fc1."),
        ("mlp.up_proj.", "ffn.fc1."),
    ),
}
FINAL_NORMS = {"modernbert": "final_norm.", "eurobert": "norm."}
#: The heads' parameter name prefixes, transformers -> SesameBert, per class (others keep their names).
HEAD_RENAMES = {
    "ModernBertForMaskedLM": (("head.", "cls."), ("decoder.", "cls.decoder.")),
    "ModernBertForSequenceClassification": (("head.", "bert.pooler."),),
    "ModernBertForQuestionAnswering": (("classifier.", "qa_outputs."),),
    "EuroBertForMaskedLM": (("lm_head.", "cls.decoder."),),
    "EuroBertForSequenceClassification": (("dense.", "bert.pooler.dense."),),
}
#: Config fields of the same name and meaning in SesameBert and both sources.
_SAME_NAMES = """vocab_size hidden_size num_hidden_layers num_attention_heads intermediate_size max_position_embeddings
initializer_range pad_token_id tie_word_embeddings attention_bias mlp_bias num_labels id2label label2id"""
#: Config fields carried over as they are, both ways: transformers name -> SesameBert name, for both sources (``""``)
#: and per source (the special tokens, :data:`TOKEN_FIELDS`, when set).
FIELDS = {
    "": {
        **{name: name for name in _SAME_NAMES.split()},
        "attention_dropout": "attention_probs_dropout_prob",
    },
    "modernbert": {
        "mlp_dropout": "hidden_dropout_prob",
        "norm_eps": "layer_norm_eps",
        **{n: n for n in "norm_bias decoder_bias classifier_bias classifier_activation local_attention".split()},
        "sparse_prediction": "sparse_prediction",
    },
    "eurobert": {"rms_norm_eps": "layer_norm_eps"},
}


def _fields(config, family: str, to_sesame: bool) -> dict:
    """The :data:`FIELDS` of ``family`` (and the special tokens that are set) read from ``config``, named for the
    other side: SesameBert's names when ``to_sesame``, transformers' otherwise."""
    pairs = [*FIELDS[""].items(), *FIELDS[family].items(), *((t, t) for t in TOKEN_FIELDS)]
    pairs = [(theirs, ours) if to_sesame else (ours, theirs) for theirs, ours in pairs]
    return {
        new: getattr(config, old)
        for old, new in pairs
        if getattr(config, old, None) is not None or old not in TOKEN_FIELDS
    }


#: Special-token ids carried over both ways (as plain config attributes on the SesameBert side).
TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id", "mask_token_id")
#: A source's ``classifier_pooling`` -> SesameBert's, per source (``modeling_sesame_bert.POOLINGS`` are functions).
POOLING_NAMES = {
    "modernbert": {"cls": "cls", "mean": "mean"},
    "eurobert": {"bos": "cls", "mean": "mean", "late": "late"},
}


def _rope_theta(parameters: dict | None, where: str) -> float:
    if not parameters or parameters.get("rope_type", "default") != "default":
        raise InputError(f"{where}: rope_parameters={parameters!r}; only the default rotary embeddings convert")
    return parameters["rope_theta"]


def _glu(activation: str, where: str) -> str:
    glu = {gate: name for name, gate in GLU_ACTS.items()}.get(activation)
    if glu is None:
        raise InputError(f"{where}: activation {activation!r}; expected one of {', '.join(GLU_ACTS.values())} (a GLU)")
    return glu


def sesame_config(config, where: str = "config.json", pooled: bool = True) -> SesameBertConfig:
    """The :class:`SesameBertConfig` of a transformers ``ModernBertConfig`` or ``EuroBertConfig``.

    Args:
        config: the transformers config.
        where: names the config in error messages.
        pooled: whether the model pools (sequence classification): else an unknown pooling is read as ``"cls"``, as it
            is never used.

    Raises:
        InputError: another family, a rope scaling type, an activation without a GLU, a pooling SesameBert lacks.
    """
    family = getattr(config, "model_type", None)
    if family not in SOURCES:
        raise InputError(f"{where}: model_type={family!r}; expected one of {', '.join(SOURCES)}")
    pooling = POOLING_NAMES[family].get(config.classifier_pooling, None if pooled else "cls")
    if pooling is None:
        raise InputError(
            f"{where}: classifier_pooling={config.classifier_pooling!r}; expected one of "
            f"{', '.join(POOLING_NAMES[family])}"
        )
    common = dict(_fields(config, family, to_sesame=True), classifier_pooling=pooling, **LAYOUTS[family].fixed)
    try:
        return _sesame_config(config, family, common, where)
    except (ValueError, StrictDataclassError) as err:  # the SesameBertConfig validators: a field it cannot take
        if isinstance(err, InputError):
            raise
        raise InputError(f"{where}: {first_line(err)}") from err


def _sesame_config(config, family: str, common: dict, where: str) -> SesameBertConfig:
    if family == "modernbert":
        if config.classifier_activation not in HIDDEN_ACTS:
            raise InputError(
                f"{where}: classifier_activation={config.classifier_activation!r}; expected one of "
                f"{', '.join(HIDDEN_ACTS)}"
            )
        return SesameBertConfig(
            **common,
            hidden_act=_glu(config.hidden_activation, where),
            classifier_dropout=config.classifier_dropout,
            rope_parameters={
                t: dict(ROPE, rope_theta=_rope_theta(config.rope_parameters.get(t), where)) for t in LAYER_TYPES
            },
            layer_types=list(config.layer_types),
        )
    return SesameBertConfig(
        **common,
        **LAYOUTS[family].reference,
        hidden_act=_glu(config.hidden_act, where),
        decoder_bias=config.mlp_bias,
        rope_parameters={"full_attention": dict(ROPE, rope_theta=_rope_theta(config.rope_parameters, where))},
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
    )


def _refuse(config: SesameBertConfig, family: str, expected: dict) -> None:
    for field, value in expected.items():
        if getattr(config, field) != value:
            raise InputError(
                f"a SesameBert config with {field}={getattr(config, field)!r} has no {family} counterpart; expected "
                f"{field}={value!r}"
            )


#: The rotary scaling of every converted config: none (transformers' ``rope_type`` "default").
ROPE = {"rope_type": "default"}


def transformers_config(config: SesameBertConfig, family: str):
    """The transformers ``ModernBertConfig`` (``family="modernbert"``) or ``EuroBertConfig`` of a SesameBert config
    of that layout (as :func:`sesame_config` writes it).

    Raises:
        InputError: an unknown family, or a config with a field that the family cannot express (named).
    """
    if family not in SOURCES:
        raise InputError(f"--to {family}: expected one of bert, {', '.join(SOURCES)}")
    c = config
    shared = dict(LAYOUTS[family].fixed, hidden_act=c.hidden_act if c.hidden_act in GLU_ACTS else "geglu")
    common = _fields(c, family, to_sesame=False)
    pooling = {v: k for k, v in POOLING_NAMES[family].items()}.get(c.classifier_pooling)
    if pooling is None:
        raise InputError(
            f"a SesameBert config with classifier_pooling={c.classifier_pooling!r} has no {family} counterpart; "
            f"expected one of {', '.join(POOLING_NAMES[family].values())}"
        )
    build = _modernbert_config if family == "modernbert" else _eurobert_config
    return build(c, common, shared, pooling)


def _modernbert_config(c: SesameBertConfig, common: dict, shared: dict, pooling: str):
    """transformers' ``ModernBertConfig`` of ``c`` (:func:`transformers_config`); ``common`` holds the fields both
    families share, ``shared`` the fixed values of the family's layout (``LAYOUTS``) and a GLU (refused otherwise,
    :func:`_refuse`)."""
    from transformers import ModernBertConfig

    _refuse(
        c,
        "modernbert",
        dict(shared, key_value_heads=c.num_attention_heads, attention_head_dim=c.hidden_size // c.num_attention_heads),
    )
    return ModernBertConfig(
        **common,
        hidden_activation=GLU_ACTS[c.hidden_act],
        classifier_dropout=c.classifier_dropout or 0.0,
        classifier_pooling=pooling,
        layer_types=c.attention_types(),
        rope_parameters={t: dict(c.rope_parameters.get(t, c.rope_parameters["full_attention"])) for t in LAYER_TYPES},
    )


def _eurobert_config(c: SesameBertConfig, common: dict, shared: dict, pooling: str):
    """transformers' ``EuroBertConfig`` of ``c`` (:func:`transformers_config`; see :func:`_modernbert_config`)."""
    from transformers import EuroBertConfig

    _refuse(
        c,
        "eurobert",
        dict(shared, decoder_bias=c.mlp_bias),
    )
    if "sliding_attention" in c.attention_types():
        raise InputError("a SesameBert config with sliding_attention layers has no eurobert counterpart")
    return EuroBertConfig(
        **common,
        hidden_act=GLU_ACTS[c.hidden_act],
        num_key_value_heads=c.key_value_heads,
        head_dim=c.attention_head_dim,
        rope_parameters=dict(c.rope_parameters["full_attention"]),
        classifier_pooling=pooling,
    )


def _family(class_name: str) -> str:
    return "modernbert" if class_name.startswith("ModernBert") else "eurobert"


def key_map(state: dict[str, torch.Tensor], class_name: str) -> dict[str, tuple[str, int, int]]:
    """Where every parameter of a transformers ModernBERT / EuroBERT state dict (of the class ``class_name``) lives in
    SesameBert's: name -> ``(SesameBert name, first row, end row)``. EuroBERT's q, k, v projections are the row blocks
    of ``attn.qkv`` and its gate, up projections those of ``ffn.fc1`` (the gate first: it goes through the
    activation), in that order; every other parameter is a whole tensor. Rotary buffers are left out. The names of a
    bare encoder (``*Model``) are those of ``SesameBertModel`` (no ``bert.`` prefix)."""
    family, base = _family(class_name), class_name.endswith("Model")
    out, rows = {}, {}
    for key, value in state.items():
        if "rotary_emb" in key:
            continue
        if base or key.startswith("model."):
            name = key if base else key[len("model.") :]
            if name.startswith(FINAL_NORMS[family]):
                name = "encoder.final_norm." + name[len(FINAL_NORMS[family]) :]
            for old, new in ENCODER_RENAMES[family]:
                name = name.replace(old, new)
            name = ("" if base else "bert.") + name.replace("layers.", "encoder.layer.", 1)
        else:
            name = key
            for old, new in HEAD_RENAMES.get(class_name, ()):
                if key.startswith(old):
                    name = new + key[len(old) :]
        first = rows.get(name, 0)
        rows[name] = first + value.shape[0]
        out[key] = (name, first, rows[name])
    return out


def to_sesame(model):
    """The SesameBert model (eval mode, float32) with the same head (:data:`SESAME_CLASS_OF`) and the same function as a
    transformers ModernBERT / EuroBERT ``model``.

    Raises:
        InputError: a class without a SesameBert counterpart, or a config :func:`sesame_config` refuses.
    """
    name = type(model).__name__
    if name not in SESAME_CLASS_OF:
        raise InputError(f"{name}: expected one of {', '.join(SESAME_CLASS_OF)}")
    config = sesame_config(model.config, f"{name}.config", pooled=name.endswith("SequenceClassification"))
    ours = getattr(sesame, SESAME_CLASS_OF[name])(config).eval()
    state = model.state_dict()
    parts: dict[str, list] = {}
    for key, (target, _, _) in key_map(state, name).items():
        parts.setdefault(target, []).append(state[key])
    result = ours.load_state_dict({k: torch.cat(v) if len(v) > 1 else v[0] for k, v in parts.items()}, strict=False)
    # every SesameBert parameter comes from the source, but a bare encoder's pooler (it has no counterpart)
    missing = [k for k in result.missing_keys if not (name.endswith("Model") and k.startswith("pooler."))]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"{name}: missing {missing}, unexpected {result.unexpected_keys}")
    return ours


def from_sesame(model, family: str):
    """The transformers ModernBERT / EuroBERT model (``family``; eval mode) with the same head and function as a
    SesameBert ``model`` of that layout.

    Raises:
        InputError: an unknown family, a SesameBert class or config without a counterpart (:func:`transformers_config`).
    """
    import transformers

    config = transformers_config(model.config, family)
    prefix = {"modernbert": "ModernBert", "eurobert": "EuroBert"}[family]
    name = next((k for k, v in SESAME_CLASS_OF.items() if k.startswith(prefix) and v == type(model).__name__), None)
    if name is None:
        raise InputError(f"{type(model).__name__}: has no {family} counterpart")
    theirs = getattr(transformers, name)(config).eval()
    ours = model.state_dict()
    state = {key: ours[target][first:end] for key, (target, first, end) in key_map(theirs.state_dict(), name).items()}
    theirs.load_state_dict(state, strict=False)
    missing = set(theirs.state_dict()) - set(state) - {k for k in theirs.state_dict() if "rotary_emb" in k}
    if missing:
        raise RuntimeError(f"{name}: parameters without a SesameBert counterpart: {sorted(missing)}")
    return theirs


__all__ = ["SESAME_CLASS_OF", "SOURCES", "from_sesame", "key_map", "sesame_config", "to_sesame", "transformers_config"]
