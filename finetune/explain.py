"""``python -m finetune.explain``: which tokens drove a sequence classifier's prediction (saliency maps).

For a fine-tuned classifier of either family, the attribution of each input token to the score of one label
(the predicted one, or ``--target``), computed with Captum on the model's **layer-0 token representations**: what
``model.get_input_embeddings()`` computes from the model's main input, fed back as ``inputs_embeds`` (the
transformers contract; no hooks, no knowledge of a model family):

* BERT-like models (SesameBert, transformers' BERT, ...): the word embeddings (``(B, T, H)``), before position and
  token-type embeddings are added;
* ELMo-style models (SesameElmo): the character-CNN token representations (layer 0 of the BiLM, ``(B, T, P)``);
  a frozen BiLM is differentiated through all the same (its weights are not changed).

The explained score ``f`` is the log-probability of the label (``log_softmax`` of the logits; the predicted value
for a regression head). Methods (Captum):

* ``saliency`` -- the gradient ``∂f/∂x`` (Simonyan et al., 2014, "Deep Inside Convolutional Networks"; the
  lecture's ∂loss/∂x up to the sign, since the loss of the label is ``-f``); a token's score is the largest
  absolute gradient over its hidden dimension (unsigned; the paper's maximum over colour channels, eq. 10).
* ``input_x_gradient`` -- ``x ⊙ ∂f/∂x`` summed over the hidden dimension (signed; Shrikumar et al., 2016).
* ``integrated_gradients`` -- ``(x - x') ⊙ ∫₀¹ ∂f(x' + α(x - x'))/∂x dα`` summed over the hidden dimension
  (signed; Sundararajan et al., 2017, "Axiomatic Attribution for Deep Networks", eq. 1), Gauss-Legendre with
  ``--n_steps`` points, 4 times more (up to ``--max_steps``) until the scores sum to ``f(x) - f(x')`` within 5%
  (completeness; the remaining ``convergence_delta`` is reported). The baseline ``x'`` (:data:`BASELINES`):

  - models with a ``[MASK]`` token and ``input_ids`` (BERT-like, every layout): the ``[MASK]`` word embedding at
    every word piece, the special tokens' own ([CLS], [SEP], padding: their scores are 0). The path from it never
    comes near zero, so it is smooth also where no position embedding is added before the embedding norm
    (ModernBERT / EuroBERT layouts: rotary positions). A zero baseline there is no baseline at all: the embedding
    norm maps ``αx`` to the same vector for every α down to about ``sqrt(eps) / std(x)``, so ``f`` is flat along
    the path except a jump next to α = 0 that the quadrature misses (measured on modernbert-tiny's layout at width
    32 trained to p > 0.99: the zero baseline missed completeness by 52-590% at 3200 points, 40-60 s a sentence;
    the ``[MASK]`` one by under 1% at 200 points, 0.1-0.3 s);
  - other models (SesameElmo: character-CNN representations feed LSTMs, no norm): zero representations.

Word pieces are merged into words (the tokenizer's character offsets: pieces without a gap between them form a
word; special tokens are left out); a word's score is the sum of its pieces' scores (saliency: the maximum). Outputs in
``--output_dir``: ``explanations.json`` (per text: label, probabilities, words with
scores and character spans, word pieces with scores), ``explanations.html`` (words coloured by score: red
towards the label, blue against it) and ``explanations.png`` (one bar chart of word scores per text)::

    python -m finetune.explain --model_name_or_path outputs/sst2 --text "a charming and moving film" \\
        --text "dull , lifeless and far too long" --method integrated_gradients --output_dir outputs/sst2-explain
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import inspect
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from core.arguments import arg
from core.errors import InputError, run_cli

logger = logging.getLogger("finetune.explain")

METHODS = ("saliency", "input_x_gradient", "integrated_gradients")
#: Integrated gradients' baselines (the module docstring says why), by the name :func:`explain` reports.
BASELINES = {
    "mask": "the [MASK] word embedding at every word piece, the special tokens' own (models with a [MASK] token)",
    "zero": "zero layer-0 token representations (models without a [MASK] token, e.g. SesameElmo)",
}
#: Points α of the path x' + α(x - x') next to the baseline where f is read when completeness fails: half of
#: f(x) - f(x') or more within the first 1% of the path is a jump at the baseline (e.g. a norm of near-zero vectors).
NEAR_BASELINE = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)


class Layer0:
    """A model's layer-0 token representations as an input Captum can attribute to, through the public contract of
    transformers models: ``model.get_input_embeddings()`` computes them from the main input
    (``model.main_input_name``), and ``model(inputs_embeds=x, **the other inputs)`` runs the model from them.

    * BERT-like (``input_ids``): the word embeddings ``(B, T, H)``; the model adds position and token-type embeddings.
    * SesameElmo (``char_ids``): the character-CNN representations ``(B, T, P)``; for a sentence pair the model lays
      the two sentences out itself, as it does from ``char_ids``.

    Raises:
        InputError: a model without input embeddings, or whose ``forward`` takes no ``inputs_embeds``.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.main_input = getattr(model, "main_input_name", "input_ids")
        try:
            self.module = model.get_input_embeddings()
        except (AttributeError, NotImplementedError):
            self.module = None
        if self.module is None or "inputs_embeds" not in inspect.signature(model.forward).parameters:
            raise InputError(
                f"--model_name_or_path: {type(model).__name__} has no input embeddings to attribute to "
                "(get_input_embeddings and an inputs_embeds argument); expected a BERT-like or SesameElmo "
                "sequence classifier"
            )
        self.dtype: torch.dtype | None = None  # of the representations as the model computes them

    def representations(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Layer-0 representations ``(B, T, D)`` float32 of ``inputs`` (one batch of single texts or pairs)."""
        x = self.module(inputs[self.main_input]).detach()
        self.dtype = x.dtype
        return x.float()

    def baseline(self, inputs: dict[str, torch.Tensor], special: torch.Tensor, tokenizer) -> tuple[torch.Tensor, str]:
        """Integrated gradients' baseline ``(1, T, D)`` float32 and its key in :data:`BASELINES`: with ``input_ids``
        and a tokenizer with a mask token, the representations of ``input_ids`` whose non-special tokens
        (``special (T,)`` bool False) are all ``[MASK]`` ("mask"); else zeros ("zero")."""
        mask_id = getattr(tokenizer, "mask_token_id", None) if self.main_input == "input_ids" else None
        if mask_id is None:
            return torch.zeros_like(self.representations(inputs)), "zero"
        ids = inputs["input_ids"].masked_fill(~special.view(1, -1), mask_id)
        return self.module(ids).detach().float(), "mask"

    def forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits ``(B, C)`` of the model run from layer 0 ``x (B, T, D)`` (in the dtype the model computes it in,
        e.g. bf16 under autocast) and the other inputs."""
        x = x if self.dtype in (None, x.dtype) else x.to(self.dtype)
        others = {k: v for k, v in inputs.items() if k != self.main_input}
        return self.model(inputs_embeds=x, **others, return_dict=True).logits


def _score_fn(layer0: Layer0, regression: bool, names: Sequence[str]):
    """``f(x, *input tensors) -> (B, C)``: log-probabilities (or the regression value), for Captum."""

    def f(x, *tensors):
        logits = layer0.forward(x, dict(zip(names, tensors))).float()
        return logits if regression else torch.log_softmax(logits, dim=-1)

    return f


def merge_word_pieces(
    offsets: Sequence[tuple[int, int]], special: Sequence[int], segments: Sequence[int]
) -> list[list[int]]:
    """Group token positions into words: consecutive non-special tokens of the same segment whose character
    spans touch (the next starts where the previous ended) form one word.

    Args:
        offsets: ``(start, end)`` character span of each token in its own text.
        special: 1 for special tokens ([CLS], [SEP], <S>, padding), which belong to no word.
        segments: 0 / 1, the text of each token (first text or ``text_pair``).

    Returns:
        Lists of token positions, one list per word, in order.
    """
    words: list[list[int]] = []
    for i, ((start, end), is_special, seg) in enumerate(zip(offsets, special, segments)):
        if is_special or end <= start:
            continue
        if words:
            j = words[-1][-1]
            if j == i - 1 and segments[j] == seg and offsets[j][1] == start:
                words[-1].append(i)
                continue
        words.append([i])
    return words


def _encode(
    tokenizer, text: str, text_pair: str | None, max_length: int
) -> tuple[dict[str, torch.Tensor], dict[str, list]]:
    encoded = tokenizer(
        text,
        text_pair,
        truncation=True,
        max_length=max_length,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    meta = {
        "offsets": [tuple(o) for o in encoded.pop("offset_mapping")],
        "special": list(encoded.pop("special_tokens_mask")),
        "tokens": tokenizer.convert_ids_to_tokens(encoded["input_ids"]),
    }
    types = encoded.get("token_type_ids") or [0] * len(encoded["input_ids"])
    if text_pair is not None and not any(types):  # tokenizers without token types: the sequence ids tell
        seq = encoded.sequence_ids() if hasattr(encoded, "sequence_ids") else None
        types = [1 if s == 1 else 0 for s in seq] if seq else types
    meta["segments"] = list(types)
    inputs = {
        k: torch.tensor([v])
        for k, v in encoded.items()
        if k in ("input_ids", "attention_mask", "token_type_ids", "char_ids")
    }
    return inputs, meta


def explain(
    model: torch.nn.Module,
    tokenizer,
    text: str,
    text_pair: str | None = None,
    method: str = "saliency",
    target: int | str | None = None,
    n_steps: int = 50,
    max_length: int | None = None,
    max_steps: int = 3200,
    completeness_tolerance: float = 0.05,
) -> dict[str, Any]:
    """Per-word attributions of one text (or pair) to one label's score; see the module docstring.

    Args:
        model: an ``AutoModelForSequenceClassification`` (BERT-like or SesameElmo), put in eval mode here.
        tokenizer: its tokenizer (character offsets needed: a fast tokenizer or the SesameElmo tokenizer).
        text / text_pair: the input.
        method: one of :data:`METHODS`.
        target: label name or id to explain; default the predicted label (ignored for regression).
        n_steps: integration points of ``integrated_gradients`` to start with; multiplied by 4 (up to
            ``max_steps``) until ``|sum of scores - (f(x) - f(x'))| <= completeness_tolerance * |f(x) - f(x')|``
            (or 1e-4): the path from the baseline can cross the decision in a short stretch that few points miss.
        max_length: truncation length in tokens (default the model's ``max_position_embeddings`` or 512).

    Returns:
        A JSON-able dict: ``text``, ``text_pair``, ``method``, ``label`` (explained), ``label_id``,
        ``predicted_label``, ``probabilities`` (label -> p; regression: ``prediction``), ``score`` (f(x)),
        ``words`` (``word``, ``segment``, ``start``, ``end``, ``score``, ``pieces``), ``tokens`` (``token``,
        ``score``); ``integrated_gradients`` adds ``baseline`` (a :data:`BASELINES` description),
        ``baseline_score`` (f(x')), ``convergence_delta`` (sum of scores - (f(x) - f(x'))) and ``n_steps`` (the
        points used).

    Raises:
        InputError: unknown method or target label, empty text.
    """
    from captum.attr import InputXGradient, Saliency

    if method not in METHODS:
        raise InputError(f"--method {method!r}: expected one of {', '.join(METHODS)}")
    if not text or not text.strip():
        raise InputError("--text: empty; expected a sentence to explain")
    config, device = model.config, next(model.parameters()).device
    regression = getattr(config, "problem_type", None) == "regression" or config.num_labels == 1
    id2label = {int(k): v for k, v in (config.id2label or {}).items()}
    model.eval()
    max_length = max_length or min(getattr(config, "max_position_embeddings", 512) or 512, 512)
    inputs, meta = _encode(tokenizer, text, text_pair, max_length)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with _gradients_through(model, device):
        layer0, names = Layer0(model), list(inputs)
        f, x, extra = _score_fn(layer0, regression, names), layer0.representations(inputs), tuple(inputs.values())
        with torch.no_grad():
            out = f(x, *extra)[0].float()
        predicted = 0 if regression else int(out.argmax())
        label_id = predicted if target is None or regression else _label_id(target, id2label, config.num_labels)
        x.requires_grad_(True)
        result: dict[str, Any] = {}
        if method == "saliency":
            grads = Saliency(f).attribute(x, target=label_id, abs=False, additional_forward_args=extra)[0].float()
            per_token = grads.abs().amax(dim=-1)
        elif method == "input_x_gradient":
            per_token = (
                InputXGradient(f).attribute(x, target=label_id, additional_forward_args=extra)[0].float().sum(-1)
            )
        else:
            special = torch.tensor(meta["special"], dtype=torch.bool, device=device)
            baseline, kind = layer0.baseline(inputs, special, tokenizer)
            per_token, result = _integrated_gradients(
                f, x, baseline, kind, extra, label_id, float(out[label_id]), n_steps, max_steps, completeness_tolerance
            )
    return _explanation(
        result, meta, per_token, out, text, text_pair, method, label_id, predicted, regression, id2label
    )


def _explanation(
    result: dict[str, Any],
    meta: dict[str, list],
    per_token: torch.Tensor,
    out: torch.Tensor,
    text: str,
    text_pair: str | None,
    method: str,
    label_id: int,
    predicted: int,
    regression: bool,
    id2label: dict[int, str],
) -> dict[str, Any]:
    """:func:`explain`'s result: ``result`` (the method's extra keys) updated with the input, the explained and
    predicted labels, the score, the per-word and per-token scores, and the probabilities (or the prediction)."""
    scores = per_token.detach().cpu().tolist()
    name = (lambda i: "prediction") if regression else (lambda i: id2label.get(i, str(i)))
    result.update(
        {
            "text": text,
            "text_pair": text_pair,
            "method": method,
            "label": name(label_id),
            "label_id": label_id,
            "predicted_label": name(predicted),
            "score": float(out[label_id]),
            "words": _word_scores(meta, scores, (text, text_pair), method),
            "tokens": [{"token": t, "score": s} for t, s in zip(meta["tokens"], scores)],
        }
    )
    if regression:
        result["prediction"] = float(out[0])
    else:
        result["probabilities"] = {name(i): float(p) for i, p in enumerate(out.exp().tolist())}
    return result


@contextlib.contextmanager
def _gradients_through(model: torch.nn.Module, device: torch.device):
    """Within the block gradients reach layer 0 of a frozen backbone: SesameElmo runs a frozen BiLM under
    ``no_grad`` (``config.freeze_backbone`` is lifted, then restored), and cuDNN, which refuses an RNN backward pass in
    eval mode, is off on CUDA (torch's own LSTM kernels are used)."""
    config = model.config
    restore = getattr(config, "freeze_backbone", None)
    if restore:
        config.freeze_backbone = False
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":
            stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        try:
            yield
        finally:
            if restore:
                config.freeze_backbone = restore


def _integrated_gradients(
    f,
    x: torch.Tensor,
    baseline: torch.Tensor,
    kind: str,
    extra: tuple,
    label_id: int,
    score: float,
    n_steps: int,
    max_steps: int,
    tolerance: float,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Integrated gradients (Sundararajan et al. 2017, eq. 1) from ``baseline``, with 4x more Gauss-Legendre points
    (up to ``max_steps``) until the scores sum to f(x) - f(baseline) within ``tolerance`` (relative, or 1e-4).

    A gap that remains is logged with its cause (:func:`_incompleteness`).

    Args:
        f: ``(x, *extra) -> (B, C)`` scores; x, baseline: ``(1, T, D)`` float32 layer-0 representations; kind: the
            baseline's key in :data:`BASELINES`; score: f(x) of ``label_id``.

    Returns:
        ``(per-token attributions (T,) float32, {baseline, baseline_score, convergence_delta, n_steps})``.
    """
    from captum.attr import IntegratedGradients

    with torch.no_grad():
        gap = score - float(f(baseline, *extra)[0, label_id])
    ig, steps, deltas = IntegratedGradients(f), n_steps, []
    while True:  # more points until complete: a saturated classifier can switch within a short stretch of the path
        attributions, delta = ig.attribute(
            x,
            baselines=baseline,
            target=label_id,
            additional_forward_args=extra,
            n_steps=steps,
            method="gausslegendre",
            return_convergence_delta=True,
            internal_batch_size=64,
        )
        deltas.append((steps, float(delta.reshape(-1)[0])))
        if abs(deltas[-1][1]) <= max(tolerance * abs(gap), 1e-4) or steps >= max_steps:
            break
        steps = min(4 * steps, max_steps)
    delta = deltas[-1][1]
    if abs(delta) > max(tolerance * abs(gap), 1e-4):
        alphas = torch.tensor(NEAR_BASELINE, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        with torch.no_grad():
            batch = [t.expand(len(NEAR_BASELINE), *t.shape[1:]) for t in extra]
            near = f(baseline + alphas * (x - baseline), *batch)[:, label_id].tolist()
        logger.warning("%s", _incompleteness(gap, deltas, near))
    info = {"baseline": BASELINES[kind], "baseline_score": score - gap, "convergence_delta": delta, "n_steps": steps}
    return attributions[0].float().sum(-1), info


def _incompleteness(gap: float, deltas: Sequence[tuple[int, float]], near: Sequence[float]) -> str:
    """The warning of integrated gradients that miss completeness, with the reason that applies:

    * half of the gap or more lies within the first 1% of the path: the score jumps at the baseline (e.g. a
      normalisation of near-zero representations), which no number of points integrates;
    * the gap did not shrink to half in either of the last two 4x refinements: more points do not close it (one
      refinement is not enough to tell: a sharp transition is missed until the points resolve it, then the gap
      collapses);
    * else more points (``--max_steps``) may close it.

    Args:
        gap: f(x) - f(baseline); deltas: ``(points, sum of scores - gap)`` of each try, in order; near: f at the
            :data:`NEAR_BASELINE` points of the path.
    """
    steps, delta = deltas[-1]
    head = (
        f"integrated gradients: the scores miss f(x) - f(baseline) = {gap:.4g} by {delta:.4g} "
        f"({100 * abs(delta) / max(abs(gap), 1e-12):.0f}%) after {steps} points"
    )
    tries = ", ".join(f"{d:.3g} at {n}" for n, d in deltas)
    if abs(near[-1] - near[0]) >= 0.5 * abs(gap):
        i = max(range(1, len(near)), key=lambda k: abs(near[k] - near[k - 1]))
        return (
            f"{head}; more points cannot close it: the score changes by {near[-1] - near[0]:.4g} within the first "
            f"{NEAR_BASELINE[-1]:g} of the path (by {near[i] - near[i - 1]:.4g} between alpha {NEAR_BASELINE[i - 1]:g} "
            f"and {NEAR_BASELINE[i]:g}), a jump at the baseline (e.g. a normalisation of near-zero representations) "
            "that the integral does not see; these scores do not add up to the prediction's change"
        )
    shrunk = [abs(b) <= 0.5 * abs(a) for (_, a), (_, b) in zip(deltas, deltas[1:])]
    if len(shrunk) >= 2 and not any(shrunk[-2:]):
        return (
            f"{head}; more points do not shrink it ({tries}): the score is not smooth along the path from the "
            "baseline; these scores do not add up to the prediction's change"
        )
    return f"{head} ({tries}); more points may close it: raise --max_steps"


def _word_scores(meta: dict, scores: list[float], texts: tuple[str, str | None], method: str) -> list[dict[str, Any]]:
    """Token scores merged into words (:func:`merge_word_pieces`): the largest piece score for saliency, the sum
    otherwise; each word with its text, segment, character span and pieces."""
    words = []
    for group in merge_word_pieces(meta["offsets"], meta["special"], meta["segments"]):
        seg = meta["segments"][group[0]]
        start, end = meta["offsets"][group[0]][0], meta["offsets"][group[-1]][1]
        piece_scores = [scores[i] for i in group]
        score = max(piece_scores) if method == "saliency" else sum(piece_scores)
        words.append(
            {
                "word": texts[seg][start:end],
                "segment": seg,
                "start": start,
                "end": end,
                "score": score,
                "pieces": [meta["tokens"][i] for i in group],
            }
        )
    return words


def _label_id(target: int | str, id2label: dict[int, str], num_labels: int) -> int:
    names = {v.lower(): k for k, v in id2label.items()}
    key = str(target).strip()
    if key.lower() in names:
        return names[key.lower()]
    if key.isdigit() and int(key) < num_labels:
        return int(key)
    raise InputError(
        f"--target {target!r}: not a label of the model; expected one of {[id2label[i] for i in sorted(id2label)]} "
        f"or a class id 0..{num_labels - 1}"
    )


def top_words(explanation: dict[str, Any], k: int = 3) -> list[tuple[str, float]]:
    """The ``k`` words with the largest absolute scores, as ``(word, score)``, largest first."""
    ranked = sorted(explanation["words"], key=lambda w: -abs(w["score"]))
    return [(w["word"], w["score"]) for w in ranked[:k]]


# -- outputs -------------------------------------------------------------------------------------------------
def _color(score: float, scale: float) -> str:
    a = min(abs(score) / scale, 1.0) if scale > 0 else 0.0
    return f"rgba(214, 39, 40, {a:.3f})" if score >= 0 else f"rgba(31, 119, 180, {a:.3f})"


def render_html(explanations: Sequence[dict[str, Any]]) -> str:
    """An HTML page: one paragraph per explanation, each word on a background whose opacity is its score
    relative to the largest absolute score of that text (red: towards the label, blue: against it)."""
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>sesame-lm explanations</title>',
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:2}"
        " .w{padding:0.15em 0.25em;border-radius:0.25em;margin:0 0.05em} .meta{color:#555;font-size:0.9em}"
        " .sep{color:#999;margin:0 0.6em}</style></head><body>",
    ]
    for e in explanations:
        scale = max((abs(w["score"]) for w in e["words"]), default=0.0)
        prob = e.get("probabilities", {}).get(e["label"])
        head = (
            f"{html.escape(e['method'])}: label <b>{html.escape(str(e['label']))}</b>"
            + (f" (p = {prob:.3f})" if prob is not None else "")
            + f", predicted <b>{html.escape(str(e['predicted_label']))}</b>"
        )
        if "convergence_delta" in e:
            head += f"; completeness gap {e['convergence_delta']:.2e}"
        spans, segment = [], 0
        for w in e["words"]:
            if w["segment"] != segment:
                spans.append('<span class="sep">||</span>')
                segment = w["segment"]
            spans.append(
                f'<span class="w" style="background:{_color(w["score"], scale)}" title="{w["score"]:.4g}">'
                f"{html.escape(w['word'])}</span>"
            )
        parts.append(f'<div><p class="meta">{head}</p><p>{" ".join(spans)}</p></div><hr>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def plot_explanations(explanations: Sequence[dict[str, Any]]):
    """A figure (Agg canvas): one bar chart of word scores per explanation, bars red (towards the label) or blue."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(explanations)
    width = max(6.0, 0.45 * max(len(e["words"]) for e in explanations) + 1.5)
    fig = Figure(figsize=(width, 2.8 * n), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    for i, e in enumerate(explanations):
        ax = fig.add_subplot(n, 1, i + 1)
        scores = [w["score"] for w in e["words"]]
        ax.bar(range(len(scores)), scores, color=["#d62728" if s >= 0 else "#1f77b4" for s in scores])
        ax.set_xticks(range(len(scores)), [w["word"] for w in e["words"]], rotation=45, ha="right", fontsize=9)
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_ylabel("attribution")
        prob = e.get("probabilities", {}).get(e["label"])
        ax.set_title(
            f"{e['method']} for label '{e['label']}'" + (f" (p = {prob:.3f})" if prob is not None else ""), fontsize=10
        )
    return fig


def write_outputs(explanations: Sequence[dict[str, Any]], output_dir: str | os.PathLike) -> dict[str, Path]:
    """``explanations.json``, ``explanations.html`` and ``explanations.png`` in ``output_dir``, atomically."""
    from core.files import atomic_output_dir

    with atomic_output_dir(output_dir) as tmp:
        (tmp / "explanations.json").write_text(
            json.dumps(list(explanations), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        (tmp / "explanations.html").write_text(render_html(explanations), encoding="utf-8")
        plot_explanations(explanations).savefig(tmp / "explanations.png", dpi=100)
    out = Path(output_dir)
    return {k: out / f"explanations.{k}" for k in ("json", "html", "png")}


# -- command line ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class ExplainArguments:
    """``python -m finetune.explain``: what to explain, how, and where the outputs go."""

    model_name_or_path: str = arg(help="fine-tuned classifier folder (finetune.glue output) or hub repo")
    text: list[str] = arg(help="text to explain; repeat for several", action="extend")
    text_pair: list[str] | None = arg(None, "second text of a pair, one per --text", action="extend")
    method: str = arg(
        "saliency",
        "attribution method, on the word embeddings (SesameElmo: character-CNN layer 0); integrated_gradients start "
        "from the [MASK] embedding at every word piece (models without [MASK]: zero), not from zero embeddings, "
        "whose path a model with rotary positions (ModernBERT, EuroBERT) normalises into a jump",
        choices=list(METHODS),
    )
    target: str | None = arg(None, "label name or id to explain (default: the predicted label)")
    n_steps: int = arg(50, "integrated_gradients: integration points to start with")
    max_steps: int = arg(
        3200,
        "integrated_gradients: at most this many points (4x more each time the attributions are "
        "not complete within 5%%)",
    )
    max_seq_length: int | None = arg(None, "truncate inputs to N tokens (default: the model's positions, at most 512)")
    revision: str | None = arg(None, "hub revision of --model_name_or_path")
    trust_remote_code: bool = arg(False, "allow model code from the model repository")
    output_dir: str = arg(help="folder for explanations.json / .html / .png")

    def __post_init__(self) -> None:
        if self.text_pair is not None and len(self.text_pair) != len(self.text):
            raise InputError(
                f"--text_pair given {len(self.text_pair)} time(s) for {len(self.text)} --text; expected one per --text"
            )
        if self.n_steps < 1:
            raise InputError(f"--n_steps {self.n_steps}: expected an integer >= 1")


def check_trained_head(loading_info: dict, source: str) -> None:
    """Refuse a model whose weights ``from_pretrained`` had to initialise (``output_loading_info``'s
    ``missing_keys``): explaining a random classification head explains nothing.

    Raises:
        InputError: naming the folder and a few of the newly initialised weights.
    """
    missing = sorted(loading_info.get("missing_keys") or [])
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise InputError(
            f"--model_name_or_path {source}: its classification head is not trained ({shown} newly "
            "initialised); expected a fine-tuned sequence classifier (python -m finetune.glue output)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    from core.arguments import parse_arguments
    from core.logs import setup_logging
    from training.checkpoint_files import check_output_dir
    from training.pretrained import load_pretrained

    (args,) = parse_arguments(
        [ExplainArguments],
        argv,
        prog="python -m finetune.explain",
        description="Per-word attributions (Captum) of a fine-tuned sequence classifier's prediction.",
    )
    check_output_dir(args.output_dir)
    setup_logging()
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import modeling  # noqa: F401  (registers the sesame-lm Auto classes)

    hub = {"revision": args.revision, "trust_remote_code": args.trust_remote_code}
    where = (args.model_name_or_path, "--model_name_or_path", "a finetune.glue output folder")
    failure = "cannot load a sequence classifier"
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, *where, failure=failure, **hub)
    auto = AutoModelForSequenceClassification
    model, loading = load_pretrained(auto.from_pretrained, *where, failure=failure, output_loading_info=True, **hub)
    check_trained_head(loading, args.model_name_or_path)
    pairs = args.text_pair or [None] * len(args.text)
    explanations = [
        explain(
            model,
            tokenizer,
            t,
            p,
            method=args.method,
            target=args.target,
            n_steps=args.n_steps,
            max_length=args.max_seq_length,
            max_steps=max(args.max_steps, args.n_steps),
        )
        for t, p in zip(args.text, pairs)
    ]
    paths = write_outputs(explanations, args.output_dir)
    for e in explanations:
        top = ", ".join(f"{w} ({s:+.3g})" for w, s in top_words(e))
        print(f"{e['label']}: {e['text']!r}{' / ' + repr(e['text_pair']) if e['text_pair'] else ''} -> top words {top}")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
