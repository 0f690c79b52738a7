"""Held-out scores and what is computed from them: :func:`heldout_loss` (the one score of every model), the
models a run is scored with (:class:`CheckpointScorer`), the unigram plateau, training time per step from
``trainer_log.json``, and the curves' ratios (quality per token, time to quality)."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import numpy as np

from .common import BenchError, median_or_none


def heldout_batches(heldout: dict, max_tokens: int = 4096):
    """``(input_ids, labels)`` batches of equal-length blocks (no padding), each (B, S) int64, B x S <= max_tokens
    (at least one block), in order of length then position."""
    import torch

    lengths = heldout["lengths"].tolist()
    starts = [0, *itertools.accumulate(lengths)][:-1]
    for length, group in itertools.groupby(
        sorted(range(len(lengths)), key=lambda i: (lengths[i], i)), key=lambda i: lengths[i]
    ):
        group = list(group)
        per = max(1, max_tokens // length)
        for i in range(0, len(group), per):
            rows = [slice(starts[j], starts[j] + length) for j in group[i : i + per]]
            yield (
                torch.stack([heldout["input_ids"][r] for r in rows]),
                torch.stack([heldout["labels"][r] for r in rows]),
            )


def heldout_loss(model, heldout: dict, device=None) -> float:
    """Mean cross-entropy (nats) over the masked held-out positions, from ``model``'s full MLM logits in eval mode
    (``model(input_ids, attention_mask=1, token_type_ids=0).logits`` of shape (B, S, V), any
    ``AutoModelForMaskedLM``), accumulated in float64.

    Raises:
        BenchError: the logits are not (B, S, V) (e.g. a model that predicts only at labelled positions).
    """
    import torch

    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    nll, count = torch.zeros((), dtype=torch.float64), 0
    with torch.inference_mode():
        for ids, labels in heldout_batches(heldout):
            ids, labels = ids.to(device), labels.to(device)
            logits = model(
                input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids)
            ).logits
            if tuple(logits.shape[:2]) != tuple(ids.shape):
                raise BenchError(
                    f"{type(model).__name__}: logits {tuple(logits.shape)} for inputs {tuple(ids.shape)}; "
                    "expected full (B, S, V) MLM logits in eval mode"
                )
            sel = labels != -100
            nll += torch.nn.functional.cross_entropy(logits[sel].float(), labels[sel], reduction="sum").double().cpu()
            count += int(sel.sum())
    model.train(was_training)
    return float(nll) / max(count, 1)


def scored_by_generator(folder: Path) -> bool:
    """Whether the run in ``folder`` saved an MLM generator beside its model (``--objective rtd``): then the held-out
    MLM score is the generator's (:func:`load_scored_mlm`)."""
    return (folder / "generator" / "config.json").is_file()


def load_scored_mlm(folder: Path, weights: Path | None = None):
    """The MLM that a run of ours is scored with: :func:`load_mlm` of the run folder, or for an RTD run its generator
    (``folder/generator``; with ``weights``, a checkpoint's ``model.safetensors`` of the whole RTD model, the
    ``generator.`` part of it).

    Raises:
        BenchError: the checkpoint's generator weights do not fit the saved generator.
    """
    if not scored_by_generator(folder):
        return load_mlm(folder, weights)
    model = load_mlm(folder / "generator")
    if weights is not None:
        from safetensors.torch import load_file

        state = {k[len("generator.") :]: v for k, v in load_file(str(weights)).items() if k.startswith("generator.")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {"cls.decoder.weight"}:  # the decoder is tied to the word embeddings
            raise BenchError(
                f"{weights}: the generator's weights do not fit {folder / 'generator'} (missing "
                f"{sorted(missing)}, unexpected {sorted(unexpected)})"
            )
    return model


def load_mlm(folder: Path, weights: Path | None = None):
    """``AutoModelForMaskedLM.from_pretrained`` of a model folder; with ``weights`` (a checkpoint's
    ``model.safetensors``), the folder's config with those weights (:func:`from_pretrained_with`)."""
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    import modeling  # noqa: F401  (registers SesameBert with the Auto classes)

    hf_logging.disable_progress_bar()
    return from_pretrained_with(AutoModelForMaskedLM, folder, weights)


def from_pretrained_with(auto_class, folder: Path, weights: Path | None = None):
    """``auto_class.from_pretrained`` (a transformers Auto class) of the model folder ``folder``; with ``weights`` (a
    checkpoint's ``model.safetensors``), the folder's ``config.json`` with those weights instead, through a temporary
    folder of links to the two files."""
    import tempfile

    if weights is None:
        return auto_class.from_pretrained(str(folder))
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink((folder / "config.json").resolve(), Path(tmp) / "config.json")
        os.symlink(weights.resolve(), Path(tmp) / "model.safetensors")
        return auto_class.from_pretrained(tmp)


def training_unigram_loss(reference_blocks: Path, tokenizer_dir: Path, heldout: dict) -> float:
    """:func:`training.unigram.unigram_loss` of the held-out labels under the reference blocks' non-special token
    frequencies (the same function ``pretrain`` logs its plateau with)."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from training.unigram import token_counts, unigram_loss

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    blocks = load_from_disk(str(reference_blocks))
    counts = sum(
        token_counts(batch["input_ids"], len(tok), tok.all_special_ids) for batch in blocks.iter(batch_size=4096)
    )
    return unigram_loss(counts, heldout["labels"].numpy(), tok.all_special_ids)


def interpolate(curve: list[dict], x_key: str, x: float) -> float:
    """The held-out loss of ``curve`` (points with ``x_key`` increasing and ``eval_loss``) at ``x``, linear between
    points (``numpy.interp``; clamped to the end points outside them)."""
    return float(np.interp(x, [p[x_key] for p in curve], [p["eval_loss"] for p in curve]))


def quality_per_token(ours: list[dict], reference: list[dict], unigram: float) -> dict:
    """(unigram - ours) / (unigram - reference) at T tokens, T = the smaller final token count, both losses
    interpolated on their loss-vs-tokens curves. ``ratio`` None when the reference is not below ``unigram``."""
    tokens = min(ours[-1]["tokens"], reference[-1]["tokens"])
    lo, lr = interpolate(ours, "tokens", tokens), interpolate(reference, "tokens", tokens)
    ratio = (unigram - lo) / (unigram - lr) if unigram - lr > 0 else None
    return {"quality_per_token": ratio, "tokens_compared": tokens, "loss_at_tokens": {"ours": lo, "reference": lr}}


def reach(curve: list[dict], target: float, x_key: str = "seconds") -> tuple[float | None, bool]:
    """The ``x_key`` (``"seconds"`` or ``"tokens"``) at which ``curve`` first reaches ``eval_loss <= target`` (linear
    between the two points around the crossing), and whether its first point already does (then its value: an upper
    bound); ``(None, False)`` when never reached."""
    if curve and curve[0]["eval_loss"] <= target:
        return curve[0][x_key], True
    for prev, cur in zip(curve, curve[1:]):
        if cur["eval_loss"] <= target < prev["eval_loss"]:
            frac = (prev["eval_loss"] - target) / (prev["eval_loss"] - cur["eval_loss"])
            return prev[x_key] + frac * (cur[x_key] - prev[x_key]), False
    return None, False


def seconds_to_reach(curve: list[dict], target: float) -> tuple[float | None, bool]:
    """:func:`reach` on the training seconds."""
    return reach(curve, target, "seconds")


def time_to_quality(ours: list[dict], reference: list[dict]) -> dict:
    """Target = the reference's final held-out loss; ratio = the reference's final training seconds / the seconds
    ``ours`` needs to reach the target (None: not reached)."""
    target, ref_seconds = reference[-1]["eval_loss"], reference[-1]["seconds"]
    seconds, first = seconds_to_reach(ours, target)
    return {
        "time_to_quality": ref_seconds / seconds if seconds else None,
        "target_loss": target,
        "reference_seconds": ref_seconds,
        "seconds_to_target": seconds,
        "reached_by_first_point": first,
    }


def tokens_to_quality(ours: list[dict], reference: list[dict]) -> dict:
    """Tokens to quality (data efficiency, the tokens axis of :func:`time_to_quality`): the reference's final
    training tokens / the tokens ``ours`` needs to reach the reference's final held-out loss (None: not reached;
    ``tokens_reached_by_first_point``: an upper bound on the tokens, so a lower bound on the ratio)."""
    ref_tokens = reference[-1]["tokens"]
    tokens, first = reach(ours, reference[-1]["eval_loss"], "tokens")
    return {
        "tokens_to_quality": ref_tokens / tokens if tokens else None,
        "reference_tokens": ref_tokens,
        "tokens_to_target": tokens,
        "tokens_reached_by_first_point": first,
    }


def steps_samples(step: int, n_blocks: int, per_step: int) -> int:
    """Blocks in optimizer step ``step`` (1-based) of a loop over ``n_blocks`` blocks per epoch, ``per_step`` per
    step, the last batch of an epoch short (``drop_last=False``)."""
    steps_per_epoch = math.ceil(n_blocks / per_step)
    return per_step if step % steps_per_epoch else n_blocks - per_step * (steps_per_epoch - 1)


def times_from_trainer_log(records: list[dict], n_blocks: int, per_step: int) -> dict[int, dict]:
    """``{step: {"seconds", "tokens"}}`` cumulative at every logged step of ``pretrain``'s ``trainer_log.json``: the
    loop's own cumulative ``train_seconds`` and ``train_tokens`` where every record has them (a bench run is one
    session, never resumed; exact under a batch-size warmup, whose first steps hold fewer than ``per_step``
    blocks); else (logs of earlier versions) an interval's seconds = its blocks (:func:`steps_samples`) / its
    ``samples_per_second`` and its tokens = seconds x ``tokens_per_second``."""
    if records and all("train_seconds" in r and "train_tokens" in r for r in records):
        return {r["step"]: {"seconds": r["train_seconds"], "tokens": r["train_tokens"]} for r in records}
    out, seconds, tokens, prev = {}, 0.0, 0.0, 0
    for rec in sorted(records, key=lambda r: r["step"]):
        blocks = sum(steps_samples(s, n_blocks, per_step) for s in range(prev + 1, rec["step"] + 1))
        dt = blocks / rec["samples_per_second"]
        seconds, tokens, prev = seconds + dt, tokens + dt * rec["tokens_per_second"], rec["step"]
        out[rec["step"]] = {"seconds": seconds, "tokens": tokens}
    return out


def scoring_device():
    """Where the bench scores checkpoints: the first CUDA device when there is one, else the CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class CheckpointScorer:
    """Scores a run's checkpoints in this process on ``device``: the run's scored MLM (:func:`load_scored_mlm` of the
    run folder) is built once, then each checkpoint's ``model.safetensors`` is loaded into it (``load_state_dict``;
    an RTD checkpoint's ``generator.`` part) and scored by :func:`heldout_loss` -- the same numbers as building the
    model from each checkpoint (:func:`load_scored_mlm`; tested), without a model construction per checkpoint.

    Raises:
        BenchError: a checkpoint's weights do not fit the model (a key missing that is not tied to a loaded one, an
            unexpected key, or a tensor of another shape).
    """

    def __init__(self, folder: Path, device=None):
        self.folder = Path(folder)
        self.device = device if device is not None else scoring_device()
        self.generator = scored_by_generator(self.folder)
        self.model = load_scored_mlm(self.folder).to(self.device)

    def load(self, weights: Path):
        """Load the weights of a checkpoint's ``model.safetensors`` into the model; return the model."""
        from safetensors.torch import load_file

        state = load_file(str(weights), device=str(self.device))
        if self.generator:
            state = {k[len("generator.") :]: v for k, v in state.items() if k.startswith("generator.")}
        own = self.model.state_dict()
        try:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
        except RuntimeError as err:  # a tensor of another shape
            raise BenchError(f"{weights}: the weights do not fit {self.folder}: {err}") from err
        loaded = {own[k].data_ptr() for k in state if k in own}
        untied = [k for k in missing if own[k].data_ptr() not in loaded]
        if unexpected or untied:
            raise BenchError(
                f"{weights}: the weights do not fit {self.folder} (missing {sorted(untied)}, unexpected "
                f"{sorted(unexpected)})"
            )
        return self.model

    def score(self, weights: Path, heldout: dict) -> float:
        """:func:`heldout_loss` (nats) of the checkpoint ``weights``."""
        return heldout_loss(self.load(weights), heldout, self.device)


#: Why a run scored by its generator (``heldout_model`` "generator") has no MLM ratios.
NOT_APPLICABLE = (
    "scored by its generator (an MLM of 1/4 the width, trained beside the discriminator that is "
    "fine-tuned): its held-out loss is not the loss of a model of the reference's shape"
)


def ratios_for(pairs_scored: list[tuple[dict, dict]], unigram: float) -> dict:
    """A recipe's ratios from its (reference copy, ours) ``copies`` entries, one pair per repeat: medians, repeat
    0's details and every repeat's ratios. A run scored by its generator gets ``None`` ratios and
    ``not_applicable`` (:data:`NOT_APPLICABLE`)."""
    if pairs_scored and pairs_scored[0][1].get("heldout_model") == "generator":
        none = {"quality_per_token": None, "time_to_quality": None, "tokens_to_quality": None}
        return {**none, "not_applicable": NOT_APPLICABLE, "per_repeat": []}
    per = []
    for ref, ours in pairs_scored:
        per.append(
            {
                "repeat": ours["repeat"],
                **quality_per_token(ours["curve"], ref["curve"], unigram),
                **time_to_quality(ours["curve"], ref["curve"]),
                **tokens_to_quality(ours["curve"], ref["curve"]),
            }
        )
    first = dict(per[0])
    first.update(
        quality_per_token=median_or_none(p["quality_per_token"] for p in per),
        time_to_quality=median_or_none(p["time_to_quality"] for p in per),
        tokens_to_quality=median_or_none(p["tokens_to_quality"] for p in per),
        per_repeat=per,
    )
    return first
