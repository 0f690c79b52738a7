"""Small helpers shared by the test folders (importable as ``_helpers``: ``pyproject.toml`` puts ``tests/`` on
``sys.path``)."""

from __future__ import annotations

import gzip
from pathlib import Path


def write_text(path: Path, text: str, gz: bool | None = None) -> Path:
    """Write ``text`` to ``path`` as UTF-8, gzip-compressed where ``gz`` (default: where the name ends in ``.gz``).
    Returns ``path``."""
    if gz if gz is not None else path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def write_corpus(path: Path, documents: list[list[str]], gz: bool | None = None) -> Path:
    """Write documents (lists of paragraph lines) separated by blank lines, as the corpus files are, with
    :func:`write_text`."""
    return write_text(path, "\n\n".join("\n".join(doc) for doc in documents) + "\n", gz)


def one_step_config(output_dir: Path, lr: float, accumulation: int):
    """The ``TrainingConfig`` of a step checked by hand: one optimizer step over ``accumulation`` micro-batches at the
    constant learning rate ``lr``, no gradient clipping, logged, into ``output_dir``."""
    from training.config import TrainingConfig

    fixed = dict(max_train_steps=1, max_grad_norm=0.0, lr_scheduler_type="constant", logging_steps=1)
    return TrainingConfig(
        output_dir=str(output_dir), learning_rate=lr, gradient_accumulation_steps=accumulation, **fixed
    )


def assert_documents_alone(model, input_ids, packed, splits: list[list[int]], atol: float) -> None:
    """Each document of packed rows gets the hidden states of its own forward pass: ``packed`` (rows, length,
    hidden) are the packed batch's last hidden states, ``input_ids`` (rows, length) its ids, ``splits[row]`` the
    lengths of row ``row``'s documents in order; each document run alone through ``model`` must match within
    ``atol`` (rtol 0). Call under ``torch.no_grad()``."""
    import torch

    for row, lengths in enumerate(splits):
        start = 0
        for n in lengths:
            alone = model(input_ids[row : row + 1, start : start + n]).last_hidden_state[0]
            torch.testing.assert_close(packed[row, start : start + n], alone, rtol=0, atol=atol)
            start += n


def assert_same_gradients(model, reference, loss, reference_loss, low_precision: bool) -> None:
    """``model``'s loss and parameter gradients equal ``reference``'s (two copies of one model, after backward):
    elementwise (rtol 1e-4, atol 1e-5) in float32; under bf16 autocast the loss within 2e-2 and each gradient within
    2% of its norm (the kernels round differently)."""
    import torch

    if not low_precision:
        torch.testing.assert_close(loss, reference_loss, rtol=1e-4, atol=1e-5)
        for (name, a), b in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
        return
    torch.testing.assert_close(loss, reference_loss, rtol=0, atol=2e-2)
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert (a.grad - b.grad).norm() <= 0.02 * b.grad.norm() + 1e-6, name


def reset_accelerate_state() -> None:
    """A fresh accelerate state (``AcceleratorState`` and ``GradientState``), as a new process has: before and after a
    command run in the test process."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def run_reference_in_process(argv: list[str]) -> dict:
    """The time-to-quality bench's ``ttq.reference.reference_main(argv)`` in this process (faster than a child), its
    import blocker removed afterwards (``bench/`` must be on ``sys.path``, as the bench tests put it)."""
    import sys

    import ttq.reference

    try:
        return ttq.reference.reference_main(argv)
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, ttq.reference._ProjectImportBlocker)]


def assert_rows_classified_alone(model, batch: dict) -> None:
    """A batch whose row 0 is a single sentence and whose other rows are pairs (``batch``: the model's inputs, each
    (rows, ...)): row 0 gets the logits of row 0 alone (without ``token_type_ids``), the other rows those of the pairs
    alone, within 1e-6 (rtol 0)."""
    import torch

    with torch.no_grad():
        mixed = model(**batch).logits
        single = model(**{k: v[:1] for k, v in batch.items() if k != "token_type_ids"}).logits
        pairs = model(**{k: v[1:] for k, v in batch.items()}).logits
    torch.testing.assert_close(mixed[:1], single, rtol=0, atol=1e-6)
    torch.testing.assert_close(mixed[1:], pairs, rtol=0, atol=1e-6)


def compile_without_inductor(monkeypatch) -> list:
    """``torch.compile`` with a backend that runs dynamo's graphs as they are (as dynamo's ``eager`` backend does) for
    this test: the model is still wrapped in an ``OptimizedModule`` (whose state dict keys start with ``_orig_mod.``),
    without inductor's minutes of codegen. Returns the list of the ``torch.fx.GraphModule`` s dynamo hands the backend
    (filled as the compiled modules run: empty while nothing ran compiled)."""
    import functools

    import torch

    graphs: list = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    return graphs


def assert_saved_as_trained(output_dir: Path, checkpoint: Path, model_class) -> None:
    """``output_dir/model.safetensors`` holds the module's own keys (none from ``torch.compile``'s wrapper), loads
    with ``from_pretrained`` without a missing or unexpected key, and the loaded weights equal the trained module's
    (those of the run's last checkpoint, which accelerate saves from the eager module)."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(output_dir / "model.safetensors")
    assert not [k for k in saved if "_orig_mod" in k], sorted(saved)[:3]
    model, info = model_class.from_pretrained(output_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    trained = load_file(checkpoint / "model.safetensors")
    loaded = model.state_dict()
    assert trained.keys() <= loaded.keys()
    for key, value in trained.items():
        assert torch.equal(loaded[key], value), key


def attention_kernel(name: str):
    """The attention kernel the model runs for ``name`` (``modeling_sesame_bert.ALL_ATTENTION_FUNCTIONS[name]``,
    including a test's own :func:`swap_attention_kernel`)."""
    from modeling.bert import modeling_sesame_bert

    return modeling_sesame_bert.ALL_ATTENTION_FUNCTIONS[name]


def swap_attention_kernel(monkeypatch, name: str, kernel) -> None:
    """Make the model run ``kernel`` for the attention implementation ``name`` for one test, undone at teardown.

    The model module's ``ALL_ATTENTION_FUNCTIONS`` is replaced by an ``AttentionInterface`` of its own (transformers'
    local mapping: the kernels the test already swapped, and ``name``). ``monkeypatch.setitem`` on transformers' shared
    ``ALL_ATTENTION_FUNCTIONS`` would not undo itself: its ``__setitem__`` writes the instance's local mapping, and
    the undo writes the original kernel back there, an override that shadows every later
    ``AttentionInterface.register`` in the process (``bench/modern_check.py``'s kernel recorder then saw no local
    layer when a local-attention test had run before it in the same worker)."""
    from transformers import AttentionInterface

    from modeling.bert import modeling_sesame_bert

    current, registered = modeling_sesame_bert.ALL_ATTENTION_FUNCTIONS, AttentionInterface()
    interface = AttentionInterface()
    for key in current:  # the overrides of the interface the model reads now (a swap earlier in this test)
        if key not in registered or current[key] is not registered[key]:
            interface[key] = current[key]
    interface[name] = kernel
    monkeypatch.setattr(modeling_sesame_bert, "ALL_ATTENTION_FUNCTIONS", interface)
