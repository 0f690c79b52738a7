"""Export a saved sesame-lm model to ONNX (the ``torch.export``-based exporter of torch, "dynamo").

    python -m modeling.export --model_name_or_path D --output F.onnx [--task auto|base|masked-lm|pretraining|
        sequence-classification|question-answering|token-classification] [--opset N] [--no_check]

``D`` is a ``save_pretrained`` folder (or a run's output folder). The model class is the Auto class of ``--task``;
``auto`` (the default) takes it from the first entry of ``architectures`` in ``D/config.json`` (e.g.
``SesameBertForSequenceClassification`` -> ``sequence-classification``), ``base`` exports the bare encoder.

The ONNX graph has the family's inputs (SesameBert: ``input_ids``, ``attention_mask``, ``token_type_ids``, int64,
shape (batch, sequence)) with a dynamic batch and sequence length, and the task's outputs, named as the fields of the
model's output (``last_hidden_state`` (batch, sequence, H) and ``pooler_output`` (batch, H) for ``base``;
``logits`` for classification, tagging and MLM; ``start_logits`` and ``end_logits`` (batch, sequence) for QA;
``prediction_logits`` and ``seq_relationship_logits`` for pretraining). Everything is float32, one file (weights
inside; external data only above 1.5 GiB). Pass ``attention_mask`` (1 = token, 0 = padding) for padded batches:
the graph always applies it.

Unless ``--no_check``, onnxruntime (when installed) runs the exported file on a padded batch of another shape than
the export example and the largest |difference| to PyTorch per output is printed in the JSON report; above 1e-4 the
command fails (exit status 1). Refused input (exit status 2, one ``error:`` line): a missing folder or config, a
model family that cannot be exported yet (see :data:`FAMILIES`), an unknown architecture or task, an ``--output``
that is a folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from training.errors import InputError, add_debug_argument, first_line, run_cli
from training.files import file_mode

#: --task -> (Auto class name in transformers, output fields exported in this order; absent fields are skipped).
TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "base": ("AutoModel", ("last_hidden_state", "pooler_output")),
    "masked-lm": ("AutoModelForMaskedLM", ("logits",)),
    "pretraining": ("AutoModelForPreTraining", ("prediction_logits", "seq_relationship_logits")),
    "sequence-classification": ("AutoModelForSequenceClassification", ("logits",)),
    "question-answering": ("AutoModelForQuestionAnswering", ("start_logits", "end_logits")),
    "token-classification": ("AutoModelForTokenClassification", ("logits",)),
}
#: class-name suffix in ``config.architectures`` -> task (``Model``: the bare encoder).
ARCHITECTURE_SUFFIXES = {
    "ForMaskedLM": "masked-lm",
    "ForPreTraining": "pretraining",
    "ForSequenceClassification": "sequence-classification",
    "ForQuestionAnswering": "question-answering",
    "ForTokenClassification": "token-classification",
    "Model": "base",
}
#: Largest |ONNX Runtime - PyTorch| accepted by the check (float32).
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Family:
    """How to export one model family: its graph inputs and a sample batch.

    Attributes:
        inputs: names of the ``forward`` arguments that become graph inputs, each int64 of shape (batch, sequence)
            (ELMo-style ``char_ids``: (batch, sequence, characters)); batch and sequence are dynamic.
        sample: ``(config, batch, length, generator) -> {input name: tensor}``, a batch with padding (the last row
            shorter), for tracing and for the check.
    """

    inputs: tuple[str, ...]
    sample: Callable[..., dict[str, torch.Tensor]]


def _bert_sample(config, batch: int, length: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(min(5, config.vocab_size - 1), config.vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, length // 2 :] = 0  # the last row is padded
    input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id or 0)
    token_type_ids = torch.zeros_like(input_ids)
    if config.type_vocab_size > 1:
        token_type_ids[:, length // 2 :] = 1
    token_type_ids = token_type_ids * attention_mask
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


def _elmo_sample(config, batch: int, length: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Rows as the ELMo-style tokenizer writes them (``modeling/elmo/tokenization_elmo.py``): random words of 1-8 bytes
    as ELMo character ids (begin of word 259, byte + 1, end of word 260, padding characters 261), ``<S>`` / ``</S>``
    around each sentence; every row but the first a pair ``<S> a </S> <S> b </S>`` (token types 0 / 1), the first a
    single sentence; the last row padded (masked tokens: all 0)."""
    width = config.max_characters_per_token
    char_ids = torch.full((batch, length, width), 261, dtype=torch.long)
    char_ids[:, :, 0] = 259
    n_bytes = torch.randint(1, 9, (batch, length), generator=generator)
    chars = torch.randint(98, 123, (batch, length, width), generator=generator)  # bytes of a-z, + 1
    at = torch.arange(width)
    char_ids = torch.where((at >= 1) & (at <= n_bytes.unsqueeze(-1)), chars, char_ids)
    char_ids = torch.where(at == n_bytes.unsqueeze(-1) + 1, torch.tensor(260), char_ids)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[-1, length // 2 + 1 :] = 0  # the last row is padded
    token_type_ids = torch.zeros_like(attention_mask)
    for row in range(batch):
        n = int(attention_mask[row].sum())
        bounds = [(0, n)] if row == 0 else [(0, n // 2), (n // 2, n)]
        for segment, (start, end) in enumerate(bounds):
            token_type_ids[row, start:end] = segment
            for position, marker in ((start, 257), (end - 1, 258)):  # <S> and </S>: [bow, marker, eow, pad ...]
                char_ids[row, position, 1:] = 261
                char_ids[row, position, 1:3] = torch.tensor([marker, 260])
    char_ids = char_ids * attention_mask.unsqueeze(-1)
    return dict(char_ids=char_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


#: model_type -> Family: the families whose ``forward`` traces into one graph (no data-dependent shapes or branches).
FAMILIES: dict[str, Family] = {
    "sesame-bert": Family(("input_ids", "attention_mask", "token_type_ids"), _bert_sample),
    "sesame-elmo": Family(("char_ids", "attention_mask", "token_type_ids"), _elmo_sample),
}


class _Outputs(torch.nn.Module):
    """``model`` with a plain tuple of the chosen output fields (ONNX outputs are positional)."""

    def __init__(self, model: torch.nn.Module, inputs: tuple[str, ...], fields: tuple[str, ...]):
        super().__init__()
        self.model, self.inputs, self.fields = model, inputs, fields

    def forward(self, *args):
        out = self.model(**dict(zip(self.inputs, args)), return_dict=True)
        return tuple(out[field] for field in self.fields)


def _task_of(config, task: str, where: str) -> str:
    if task != "auto":
        if task not in TASKS:
            raise InputError(f"--task {task}: unknown; expected auto or one of {', '.join(TASKS)}")
        return task
    architectures = getattr(config, "architectures", None) or []
    if not architectures:
        raise InputError(f"{where}: no 'architectures' in config.json; pass --task ({', '.join(TASKS)})")
    for suffix, name in ARCHITECTURE_SUFFIXES.items():
        if architectures[0].endswith(suffix):
            return name
    raise InputError(f"{where}: architecture {architectures[0]!r} has no export task; pass --task ({', '.join(TASKS)})")


def load_for_export(model_name_or_path: str, task: str = "auto"):
    """Load ``model_name_or_path`` for export: ``(model in eval mode, float32, task, Family)``.

    Raises:
        InputError: a missing folder or config.json, a family not in :data:`FAMILIES`, an architecture without task.
    """
    import transformers

    import modeling  # noqa: F401  (registers the sesame-lm Auto classes)

    path = Path(model_name_or_path)
    where = f"--model_name_or_path {model_name_or_path}"
    if not path.is_dir():
        raise InputError(f"{where}: no such folder; expected a save_pretrained model folder")
    if not (path / "config.json").is_file():
        raise InputError(f"{where}: no config.json; expected a save_pretrained model folder")
    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise InputError(f"{where}: cannot read config.json ({first_line(err)})") from err
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise InputError(
            f"{where}: model_type {config.model_type!r} cannot be exported yet; exportable: {', '.join(FAMILIES)}"
        )
    task = _task_of(config, task, where)
    auto = getattr(transformers, TASKS[task][0])
    try:
        model = auto.from_pretrained(path, config=config, dtype=torch.float32)
    except (OSError, ValueError) as err:
        raise InputError(f"{where}: cannot load a {TASKS[task][0]} ({first_line(err)})") from err
    return model.eval(), task, family


def export_onnx(
    model_name_or_path: str, output: str, task: str = "auto", opset: int | None = None, check: bool = True
) -> dict:
    """Export a saved model to one ONNX file; see the module docstring.

    Args:
        model_name_or_path: a ``save_pretrained`` folder.
        output: the ``.onnx`` file to write (parent folders are made; an existing file is replaced atomically).
        task: a key of :data:`TASKS`, or ``"auto"`` (from ``config.architectures``).
        opset: ONNX opset version; ``None`` = the exporter's default.
        check: compare onnxruntime with PyTorch on a padded batch (skipped when onnxruntime is not installed).

    Returns:
        The report: ``model_name_or_path``, ``output``, ``class``, ``task``, ``inputs``, ``outputs``, ``opset``,
        ``max_abs_diff`` ({output: float} or ``None`` when not checked).

    Raises:
        InputError: refused input (see :func:`load_for_export`; ``output`` is a folder).
        RuntimeError: onnxruntime and PyTorch differ by more than :data:`TOLERANCE`.
    """
    target = Path(output)
    if target.is_dir():
        raise InputError(f"--output {output}: is a folder; expected the path of the .onnx file to write")
    model, task, family = load_for_export(model_name_or_path, task)
    generator = torch.Generator().manual_seed(0)
    example = family.sample(model.config, 2, 8, generator)
    with torch.no_grad():
        reference = model(**example, return_dict=True)
    fields = tuple(f for f in TASKS[task][1] if reference.get(f) is not None)
    wrapper = _Outputs(model, family.inputs, fields).eval()
    dims = {0: "batch", 1: "sequence"}
    # dynamo caches the bodies of scan loops (the ELMo-style LSTMs) across exports of this process; a body traced by an
    # earlier export would pin this one's batch and sequence length to that export's example
    torch._dynamo.reset()
    program = torch.onnx.export(
        wrapper,
        tuple(example[name] for name in family.inputs),
        input_names=list(family.inputs),
        output_names=list(fields),
        dynamic_shapes=(tuple(dims for _ in family.inputs),),
        opset_version=opset,
        dynamo=True,
        verbose=False,
    )
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".onnx", dir=target.parent)
    os.close(fd)
    os.chmod(tmp, file_mode())  # mkstemp makes it private; give it the permissions of a normal file
    try:
        program.save(tmp, external_data=size > 1.5 * 2**30)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    report = dict(
        model_name_or_path=str(model_name_or_path),
        output=str(target),
        task=task,
        inputs=list(family.inputs),
        outputs=list(fields),
        opset=program.model.opset_imports.get(""),
    )
    report["class"] = type(model).__name__
    report["max_abs_diff"] = check_onnx(model, target, family, fields) if check else None
    return report


def check_onnx(model, path: Path, family: Family, fields: tuple[str, ...]) -> dict[str, float] | None:
    """Run ``path`` in onnxruntime on a padded (3, 11) batch and compare with ``model``.

    Returns:
        {output name: max |onnxruntime - PyTorch|}, or ``None`` when onnxruntime is not installed.

    Raises:
        RuntimeError: a difference above :data:`TOLERANCE`.
    """
    try:
        import onnxruntime
    except ImportError:
        return None
    batch = family.sample(model.config, 3, 11, torch.Generator().manual_seed(1))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(list(fields), {name: batch[name].numpy() for name in family.inputs})
    with torch.no_grad():
        expected = model(**batch, return_dict=True)
    diff = {f: float((torch.from_numpy(g) - expected[f]).abs().max()) for f, g in zip(fields, got)}
    if max(diff.values()) > TOLERANCE:
        raise RuntimeError(f"{path}: onnxruntime differs from PyTorch by {diff} (more than {TOLERANCE})")
    return diff


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modeling.export",
        description="Export a saved sesame-lm model to ONNX (dynamic batch and sequence length).",
    )
    parser.add_argument("--model_name_or_path", required=True, help="a save_pretrained model folder")
    parser.add_argument("--output", required=True, help="the .onnx file to write")
    parser.add_argument(
        "--task",
        default="auto",
        help=f"which head to export: auto (from config.json's architectures), {', '.join(TASKS)}",
    )
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset version (default: the exporter's)")
    parser.add_argument("--no_check", action="store_true", help="do not compare onnxruntime with PyTorch")
    add_debug_argument(parser)
    args = parser.parse_args(argv)
    report = export_onnx(args.model_name_or_path, args.output, args.task, args.opset, check=not args.no_check)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
