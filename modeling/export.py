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
model without a :class:`modeling.spec.ModelSpec` (or one its spec refuses), an unknown architecture or task, an
``--output`` that is a folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from core.arguments import arg, parse_arguments
from core.errors import InputError, first_line, run_cli
from core.files import file_mode

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
    """Load ``model_name_or_path`` for export: ``(model in eval mode, float32, task, its family's ModelSpec)``.

    Raises:
        InputError: a missing folder or config.json, no spec (or its refusal), an architecture without task.
    """
    import transformers

    import modeling  # (registers the sesame-lm Auto classes)

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
    family = modeling.spec_for(config.model_type)
    if family is None:
        exportable = ", ".join(spec.model_type for spec in modeling.ALL_SPECS.values())
        raise InputError(f"{where}: model_type {config.model_type!r} cannot be exported yet; exportable: {exportable}")
    if why := family.export_refusal(config):
        raise InputError(f"{where}: {why}")
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
    example = family.export_sample(model.config, 2, 8, generator)
    with torch.no_grad():
        reference = model(**example, return_dict=True)
    fields = tuple(f for f in TASKS[task][1] if reference.get(f) is not None)
    wrapper = _Outputs(model, family.export_inputs, fields).eval()
    dims = {0: "batch", 1: "sequence"}
    # dynamo caches the bodies of scan loops (the ELMo-style LSTMs) across exports of this process; a body traced by an
    # earlier export would pin this one's batch and sequence length to that export's example
    torch._dynamo.reset()
    program = torch.onnx.export(
        wrapper,
        tuple(example[name] for name in family.export_inputs),
        input_names=list(family.export_inputs),
        output_names=list(fields),
        dynamic_shapes=(tuple(dims for _ in family.export_inputs),),
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
        inputs=list(family.export_inputs),
        outputs=list(fields),
        opset=program.model.opset_imports.get(""),
    )
    report["class"] = type(model).__name__
    report["max_abs_diff"] = check_onnx(model, target, family, fields) if check else None
    return report


def check_onnx(model, path: Path, family, fields: tuple[str, ...]) -> dict[str, float] | None:
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
    batch = family.export_sample(model.config, 3, 11, torch.Generator().manual_seed(1))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(list(fields), {name: batch[name].numpy() for name in family.export_inputs})
    with torch.no_grad():
        expected = model(**batch, return_dict=True)
    diff = {f: float((torch.from_numpy(g) - expected[f]).abs().max()) for f, g in zip(fields, got)}
    if max(diff.values()) > TOLERANCE:
        raise RuntimeError(f"{path}: onnxruntime differs from PyTorch by {diff} (more than {TOLERANCE})")
    return diff


@dataclasses.dataclass(frozen=True)
class ExportArguments:
    """``python -m modeling.export``: the model folder, the ONNX file, the head and the opset."""

    model_name_or_path: str = arg(help="a save_pretrained model folder")
    output: str = arg(help="the .onnx file to write")
    task: str = arg("auto", f"which head to export: auto (from config.json's architectures), {', '.join(TASKS)}")
    opset: int | None = arg(None, "ONNX opset version (default: the exporter's)")
    no_check: bool = arg(False, "do not compare onnxruntime with PyTorch")


def main(argv=None) -> int:
    description = "Export a saved sesame-lm model to ONNX (dynamic batch and sequence length)."
    (args,) = parse_arguments([ExportArguments], argv, prog="python -m modeling.export", description=description)
    report = export_onnx(args.model_name_or_path, args.output, args.task, args.opset, check=not args.no_check)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
