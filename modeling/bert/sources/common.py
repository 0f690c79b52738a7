"""What every conversion source shares: a :class:`Source` is one transformers family (BERT, ModernBERT, EuroBERT) as
data (its field map, key map, class pairs and reference layout, ``LAYOUTS``) plus its source-specific config hooks;
its methods map configs, parameter names and whole models both ways, the same for every source.

Errors: :class:`core.errors.InputError` for a config or class without a counterpart on the other side (named, with
what was expected); :class:`RuntimeError` for a parameter the key map leaves without a place (a bug of the map).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch
from huggingface_hub.errors import StrictDataclassError

from core.errors import InputError, first_line

from .. import modeling_sesame_bert as sesame
from ..configuration_sesame_bert import GLU_ACTS, ReferenceLayout, SesameBertConfig
from .folders import BUFFERS

#: The label fields every source carries both ways (a classification head's size and names).
LABELS = ("num_labels", "id2label", "label2id")
#: Config fields of ModernBERT and EuroBERT carried both ways, transformers name -> SesameBert name.
MODERN_FIELDS = {
    **{name: name for name in "vocab_size hidden_size num_hidden_layers num_attention_heads intermediate_size".split()},
    **{name: name for name in "max_position_embeddings initializer_range pad_token_id tie_word_embeddings".split()},
    "attention_bias": "attention_bias",
    "mlp_bias": "mlp_bias",
    "attention_dropout": "attention_probs_dropout_prob",
}
#: The rotary scaling of every converted rotary config: none (transformers' ``rope_type`` "default").
ROPE = {"rope_type": "default"}
#: Special-token ids the modern sources carry both ways when they are set (plain attributes on the SesameBert side).
TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id", "mask_token_id")


def pairs(text: str) -> tuple[tuple[str, str], ...]:
    """The ``(old, new)`` pairs of a table written as text: names separated by white space, each old one followed by
    its new one."""
    names = text.split()
    return tuple(zip(names[::2], names[1::2], strict=True))


def classes(prefix: str, heads: str) -> dict[str, str]:
    """transformers class -> SesameBert class of each head in ``heads`` (names separated by white space), the
    transformers classes' names starting with ``prefix``: ``classes("Bert", "Model")`` is
    ``{"BertModel": "SesameBertModel"}``."""
    return {f"{prefix}{head}": f"SesameBert{head}" for head in heads.split()}


def rename(name: str, renames) -> str:
    """``name`` with each ``(old, new)`` of ``renames`` replaced in order; an ``old`` starting with ``^`` is replaced
    only at the start of the name."""
    for old, new in renames:
        if not old.startswith("^"):
            name = name.replace(old, new)
        elif name.startswith(old[1:]):
            name = new + name[len(old) - 1 :]
    return name


def rope_theta(parameters: dict | None, where: str) -> float:
    """The base of transformers' ``rope_parameters`` (one layer type's). Raises :class:`InputError` for a scaled
    rotary embedding (a ``rope_type`` other than ``"default"``)."""
    if not parameters or parameters.get("rope_type", "default") != "default":
        raise InputError(f"{where}: rope_parameters={parameters!r}; only the default rotary embeddings convert")
    return parameters["rope_theta"]


def glu(activation: str, where: str) -> str:
    """SesameBert's GLU ``hidden_act`` of a gated source's activation (``"gelu"`` -> ``"geglu"``). Raises
    :class:`InputError` for an activation without a GLU."""
    name = {gate: name for name, gate in GLU_ACTS.items()}.get(activation)
    if name is None:
        raise InputError(f"{where}: activation {activation!r}; expected one of {', '.join(GLU_ACTS.values())} (a GLU)")
    return name


def refuse(config: SesameBertConfig, title: str, expected: Mapping[str, object]) -> None:
    """Refuse a SesameBert config that ``title``'s format cannot express: every field of ``expected`` must equal its
    value (a tuple: be one of its values).

    Raises:
        InputError: the first field that differs, named with its value and what was expected.
    """
    for field, value in expected.items():
        got = getattr(config, field)
        if got in value if isinstance(value, tuple) else got == value:
            continue
        want = f" one of {', '.join(map(repr, value))}" if isinstance(value, tuple) else f"={value!r}"
        raise InputError(f"a SesameBert config with {field}={got!r} has no {title} counterpart; expected {field}{want}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Source:
    """One conversion source: a transformers model family and its SesameBert counterpart, as a module of
    ``modeling.bert.sources`` declares it (:meth:`of`).

    Attributes:
        layout: its reference layout (a row of ``LAYOUTS``); its name is the transformers ``model_type`` and the
            ``--to`` format.
        title: the family's name in messages and help (``"ModernBERT"``).
        fields: config fields carried over both ways, transformers name -> SesameBert name (with :data:`LABELS`).
        keys: the encoder's parameter renames (:func:`rename`), transformers -> SesameBert, without prefixes;
            blocks that several transformers tensors fill (a fused projection) are filled in their order.
        heads: per transformers class, the renames of the head parameters (outside the encoder).
        classes: transformers class -> SesameBert class with the same head.
        optional: config fields carried over both ways under the same name when they are set.
        poolings: ``classifier_pooling`` values, transformers -> SesameBert (empty: the layout fixes it).
        prefix: the encoder's name prefix in a transformers model with a head (SesameBert's is ``bert.``).
        aliases: transformers parameter names that are another parameter's tensor (tied).
        load_as: the transformers class a source folder is read as (``None``: its ``architectures[0]``).
        may_lack: name prefixes of :attr:`load_as` a source may lack, each with the head it belongs to.
        new_heads: SesameBert name prefixes that may be new after a conversion (heads the source lacks).
        file_renames: renames of names in older weight files (TF-era norms).
        inputs: the model inputs of the sample a conversion is checked on.
        sesame_fields: ``(config, where) -> dict``: the SesameBertConfig fields only this source sets; raises
            :class:`InputError` for what SesameBert cannot express.
        transformers_fields: ``(SesameBertConfig) -> dict``: the transformers config fields only this source sets;
            refuses (:func:`refuse`) what the source cannot express.
    """

    layout: ReferenceLayout
    title: str
    fields: Mapping[str, str]
    keys: tuple[tuple[str, str], ...]
    heads: Mapping[str, tuple[tuple[str, str], ...]]
    classes: Mapping[str, str]
    optional: tuple[str, ...] = ()
    poolings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    prefix: str = "model."
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    load_as: str | None = None
    may_lack: Mapping[str, str] = dataclasses.field(default_factory=dict)
    new_heads: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"pooler.": "pooler"})
    file_renames: tuple[tuple[str, str], ...] = ()
    inputs: tuple[str, ...] = ("input_ids", "attention_mask")
    sesame_fields: Callable[[object, str], dict]
    transformers_fields: Callable[[SesameBertConfig], dict]

    @classmethod
    def of(cls, module) -> Source:
        """The source a module declares: its constants named as the attributes in capitals (``LAYOUT``, ``FIELDS``,
        ``KEYS``, ...; those left out take the defaults) and its functions ``sesame_fields`` / ``transformers_fields``.
        """
        names = {field.name: field.name.upper() for field in dataclasses.fields(cls)}
        names.update(sesame_fields="sesame_fields", transformers_fields="transformers_fields")
        return cls(**{name: getattr(module, attr) for name, attr in names.items() if hasattr(module, attr)})

    @property
    def name(self) -> str:
        """The transformers ``model_type`` (the layout's name, the ``--to`` format)."""
        return self.layout.name

    def carried(self, config, to_sesame: bool) -> dict:
        """The fields of ``config`` carried over (:attr:`fields`, :data:`LABELS`, :attr:`optional` when set), named
        for the other side: SesameBert's names when ``to_sesame``, transformers' otherwise."""
        pairs = [*self.fields.items(), *((t, t) for t in LABELS + self.optional)]
        pairs = [(theirs, ours) if to_sesame else (ours, theirs) for theirs, ours in pairs]
        unset = {old for old, _ in pairs if old in self.optional and getattr(config, old, None) is None}
        return {new: getattr(config, old) for old, new in pairs if old not in unset}

    def sesame_config(self, config, where: str = "config.json", pooled: bool = True) -> SesameBertConfig:
        """The :class:`SesameBertConfig` of a transformers config of this source: the carried fields, the layout's
        fixed values and the source's own (:attr:`sesame_fields`). ``pooled``: whether the model pools (sequence
        classification); else a pooling SesameBert lacks is read as ``"cls"``, as it is never used.

        Raises:
            InputError: another ``model_type``, a pooling SesameBert lacks, a value SesameBert cannot take.
        """
        if getattr(config, "model_type", None) != self.name:
            raise InputError(f"{where}: model_type={getattr(config, 'model_type', None)!r}; expected {self.name!r}")
        fields = self.carried(config, to_sesame=True)
        if self.poolings:
            fields["classifier_pooling"] = self.poolings.get(config.classifier_pooling, None if pooled else "cls")
            if fields["classifier_pooling"] is None:
                raise InputError(
                    f"{where}: classifier_pooling={config.classifier_pooling!r}; expected one of "
                    f"{', '.join(self.poolings)}"
                )
        try:
            return SesameBertConfig(**fields, **self.layout.fixed, **self.sesame_fields(config, where))
        except (ValueError, StrictDataclassError) as err:  # the SesameBertConfig validators: a field it cannot take
            if isinstance(err, InputError):
                raise
            raise InputError(f"{where}: {first_line(err)}") from err

    def transformers_config(self, config: SesameBertConfig):
        """The transformers config of a SesameBert config of this source's layout (as :meth:`sesame_config` writes it).

        Raises:
            InputError: a field whose value the source cannot express (named; :func:`refuse`).
        """
        import transformers

        refuse(config, self.title, self.layout.fixed)
        fields = self.carried(config, to_sesame=False)
        if self.poolings:
            refuse(config, self.title, {"classifier_pooling": tuple(self.poolings.values())})
            fields["classifier_pooling"] = {v: k for k, v in self.poolings.items()}[config.classifier_pooling]
        return transformers.AutoConfig.for_model(self.name, **fields, **self.transformers_fields(config))

    def key_map(self, state: Mapping[str, torch.Tensor], class_name: str) -> dict[str, tuple[str, int, int]]:
        """Where every parameter of a transformers state dict (of the class ``class_name``, or read from its files)
        lives in SesameBert's: name -> ``(SesameBert name, first row, end row)``. Tensors that fill one SesameBert
        tensor (fused q, k, v or gate, up projections) are its row blocks in the order of ``state``; buffers are left
        out; an alias (:attr:`aliases`) maps where its tensor does. A bare encoder (``*Model``) has the names of
        ``SesameBertModel`` (no ``bert.`` prefix)."""
        bare = class_name.endswith("Model")
        out, rows = {}, {}
        for key, value in state.items():
            original = self.aliases.get(key, key)
            if key.endswith(BUFFERS) or (original != key and original in state):
                continue
            if bare or original.startswith(self.prefix):
                name = rename(original if bare else original[len(self.prefix) :], self.keys)
                name = name if bare else "bert." + name
            else:
                name = rename(original, self.heads.get(class_name, ()))
            first = rows.get(name, 0)
            rows[name] = first + value.shape[0]
            out[key] = (name, first, rows[name])
        return out | {key: out[original] for key, original in self.aliases.items() if key in state and original in out}

    def sesame_state(self, state: Mapping[str, torch.Tensor], class_name: str) -> dict[str, torch.Tensor]:
        """A transformers state dict (of ``class_name``) in SesameBert's names (:meth:`key_map`), fused blocks
        concatenated along the rows."""
        blocks: dict[str, dict[int, torch.Tensor]] = {}
        for key, (target, first, _) in self.key_map(state, class_name).items():
            blocks.setdefault(target, {})[first] = state[key]
        return {k: torch.cat([b[i] for i in sorted(b)]) if len(b) > 1 else b[0] for k, b in blocks.items()}

    def file_state(self, files: Mapping[str, torch.Tensor], names) -> dict[str, torch.Tensor]:
        """The tensors of a source's weight files under the names of the model they were loaded into (``names``, in
        its order: the fused blocks' order): older names renamed (:attr:`file_renames`), a bare encoder's names
        prefixed where the model has a head; names the model lacks left out."""
        renamed = {rename(k, self.file_renames): v for k, v in files.items()}
        renamed = {k if k in names or self.prefix + k not in names else self.prefix + k: v for k, v in renamed.items()}
        return {k: renamed[k] for k in names if k in renamed}

    def to_sesame(self, model):
        """The SesameBert model (eval mode) with the same head (:attr:`classes`) and function as a transformers
        ``model`` of this source: every parameter copied (fused where SesameBert fuses), but a bare encoder's pooler.

        Raises:
            InputError: a class without a SesameBert counterpart, or a config :meth:`sesame_config` refuses.
        """
        name = type(model).__name__
        if name not in self.classes:
            raise InputError(f"{name}: expected one of {', '.join(self.classes)}")
        config = self.sesame_config(model.config, f"{name}.config", pooled=name.endswith("SequenceClassification"))
        ours = getattr(sesame, self.classes[name])(config).eval()
        result = ours.load_state_dict(self.sesame_state(model.state_dict(), name), strict=False)
        missing = [k for k in result.missing_keys if not (name.endswith("Model") and k.startswith("pooler."))]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"{name}: missing {missing}, unexpected {result.unexpected_keys}")
        decoder, embeddings = ours.get_output_embeddings(), ours.get_input_embeddings()
        if config.tie_word_embeddings and decoder is not None and decoder.weight is not embeddings.weight:
            raise RuntimeError("the MLM decoder lost its tie to the word embeddings")
        return ours

    def from_sesame(self, model):
        """The transformers model of this source (eval mode) with the same head and function as a SesameBert
        ``model`` of its layout: fused SesameBert tensors split into their blocks, the others renamed back.

        Raises:
            InputError: a SesameBert class or config without a counterpart (:meth:`transformers_config`).
        """
        import transformers

        config = self.transformers_config(model.config)
        name = next((k for k, v in self.classes.items() if v == type(model).__name__), None)
        if name is None:
            raise InputError(
                f"{type(model).__name__}: has no {self.title} counterpart; expected one of "
                f"{', '.join(self.classes.values())}"
            )
        if name.endswith("QuestionAnswering"):
            config.num_labels = 2  # transformers' span heads have num_labels outputs
        theirs = getattr(transformers, name)(config).eval()
        ours = model.state_dict()
        keys = self.key_map(theirs.state_dict(), name)
        state = {key: ours[target][first:end] for key, (target, first, end) in keys.items() if target in ours}
        missing = [k for k in theirs.state_dict() if k not in state and not k.endswith(BUFFERS)]
        if missing:
            raise RuntimeError(f"{name}: parameters without a SesameBert counterpart: {missing}")
        theirs.load_state_dict(state, strict=False)
        return theirs


__all__ = [
    "LABELS",
    "MODERN_FIELDS",
    "ROPE",
    "TOKEN_FIELDS",
    "Source",
    "classes",
    "glu",
    "pairs",
    "refuse",
    "rename",
    "rope_theta",
]
