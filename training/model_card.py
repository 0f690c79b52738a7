"""Model cards: the README.md pushed with a model, with YAML metadata the Hub indexes.

:func:`render_model_card` writes the card of a pretrained or fine-tuned sesame-lm model: YAML front matter
(``library_name: transformers``, ``tags``, ``pipeline_tag``, ``datasets``, ``license``, ``base_model`` and the
run's metrics as ``model-index`` results) rendered by ``huggingface_hub.ModelCardData`` -- not hand-written
YAML -- and the sections of the Hub's model card guide (Mitchell et al. 2019, "Model Cards for Model
Reporting"): model type and preset, training data, objective, hyperparameters, results, how to load it,
limitations. :func:`results_from_dir` reads the run's ``all_results.json`` (flat keys: ``train_loss``,
``eval_loss``, ``perplexity``, ``eval_<metric>``, ...).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.files import read_json

#: Auto class that loads the model for each pipeline task.
AUTO_CLASS_BY_TASK = {
    "fill-mask": "AutoModelForMaskedLM",
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "token-classification": "AutoModelForTokenClassification",
}

_OBJECTIVES = {
    "mlm": (
        "Masked language modelling (MLM; Devlin et al., 2019): a fraction of the input tokens "
        "(`mlm_probability`) is selected; of those, 80% are replaced by the mask token, 10% by a random "
        "token and 10% kept, and the model predicts the original tokens (cross-entropy over the vocabulary)."
    ),
    "nsp": (
        "Next sentence prediction (NSP; Devlin et al., 2019): a binary classifier on the first token "
        "predicts whether segment B followed segment A in the corpus (50% of pairs) or was sampled at random."
    ),
    "rtd": (
        "Replaced-token detection (RTD; ELECTRA, Clark et al., 2020): a small masked-language-model generator "
        "fills the masked positions with tokens sampled from its predictions, and this model (the discriminator) "
        "predicts for every token whether it was replaced; the loss is the generator's MLM loss plus lambda "
        "(50 by default) times the discriminator's binary cross-entropy over all tokens. The generator is saved "
        "in `generator/`."
    ),
    "bilm": (
        "Bidirectional language modelling (BiLM; Peters et al., 2018): token representations from a "
        "character CNN with highway layers feed a forward and a backward stacked LSTM; the forward LM "
        "predicts the next token, the backward LM the previous one, and the loss is the mean of the two "
        "directions' negative log-likelihoods. Downstream, the layers are combined by a learned ScalarMix."
    ),
}

_EXAMPLE_INPUT = {
    "fill-mask": 'f"Paris is the {pipe.tokenizer.mask_token} of France."',
    "feature-extraction": '"The whale rose from the sea."',
    "text-classification": '"A gripping, beautifully acted film."',
    "token-classification": '"Elizabeth walked to Netherfield."',
}


def results_from_dir(output_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's ``all_results.json`` as a dict; ``{}`` when the file does not exist.

    Raises:
        InputError: the file exists but is not a JSON object.
    """
    path = Path(output_dir) / "all_results.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not valid JSON ({err}); expected the run's flat results object") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object of results, got {type(data).__name__}")
    return data


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(rows: Mapping[str, Any], header: tuple[str, str]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| `{key}` | {_fmt(value)} |" for key, value in rows.items()]
    return "\n".join(lines)


def _metric_results(results: Mapping[str, Any]) -> dict[str, float]:
    """Quality metrics worth indexing: ``eval_<metric>`` (not runtime, speed or counts) and ``perplexity`` (also the
    BiLM's
    ``forward_perplexity`` / ``backward_perplexity``)."""
    skip = ("runtime", "per_second", "samples", "steps", "epoch", "tokens")
    out = {}
    for key, value in results.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if key.endswith("perplexity") or (key.startswith("eval_") and not any(s in key for s in skip)):
            out[key.removeprefix("eval_")] = float(value)
    return out


def render_model_card(
    *,
    model_type: str,
    family: str | None = None,
    repo_id: str | None = None,
    preset: str | None = None,
    task: str = "fill-mask",
    objective: str | Sequence[str] | None = None,
    training_data: str | Sequence[str] | None = None,
    datasets: Sequence[str] = (),
    finetuned_task: str | None = None,
    base_model: str | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | None = None,
    license: str | None = None,  # noqa: A002 - the model card field's name
    language: str | Sequence[str] | None = None,
    auto_class: str | None = None,
    extra_tags: Sequence[str] = (),
    limitations: Sequence[str] = (),
    title: str | None = None,
) -> str:
    """Render README.md (YAML front matter + markdown) for a sesame-lm model.

    Args:
        model_type: ``config.model_type``, e.g. ``"sesame-bert"`` or ``"sesame-elmo"``.
        family: how the card names the model (the commands pass their spec's ``description``); ``model_type``.
        repo_id: where the model lives (used in the loading examples; ``"path/to/model"`` when None).
        preset: the config preset name (``--config_name``), e.g. ``"bert-tiny"``.
        task: pipeline tag: ``fill-mask`` / ``feature-extraction`` (pretraining), ``text-classification``,
            ``question-answering``, ``token-classification`` (fine-tuning).
        objective: ``"mlm"``, ``"nsp"``, ``"bilm"`` (or a list of them) or free text, as ``pretrain`` passes them.
        training_data: description(s) of the training data (file names, corpus name).
        datasets: Hub dataset ids (go to the ``datasets`` metadata).
        finetuned_task: e.g. ``"sst2"``, ``"squad_v2"``.
        base_model: repo id (or path) of the pretrained model that was fine-tuned.
        hyperparameters: shown as a table (learning rate, batch size, steps, warmup, ...).
        results: the run's ``all_results.json``; ``eval_*`` metrics and ``perplexity`` also go to ``model-index``.
        license: SPDX-like Hub license id (``"apache-2.0"``), when known.
        language: ISO 639-1 code(s).
        auto_class: Auto class of the loading example (default by task, see :data:`AUTO_CLASS_BY_TASK`).
        extra_tags / limitations / title: more tags / limitation bullet points / the title (default: ``repo_id``'s end).

    Returns:
        The card text; ``huggingface_hub.ModelCard(text).data`` parses back to the metadata.

    Raises:
        InputError: an unknown ``task``.
    """
    from huggingface_hub import ModelCardData

    if task not in AUTO_CLASS_BY_TASK:
        raise InputError(f"model card task {task!r}: expected one of {', '.join(AUTO_CLASS_BY_TASK)}")
    results, hyperparameters, repo = dict(results or {}), dict(hyperparameters or {}), repo_id or "path/to/model"
    name = title or repo.rsplit("/", 1)[-1]
    family = family or model_type
    finetuning = task not in ("fill-mask", "feature-extraction")
    objective = objective if objective is not None else []
    metrics = _metric_results(results)

    eval_results = _eval_results(metrics, task, datasets, finetuned_task)
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=task,
        license=license,
        language=language,
        tags=list(dict.fromkeys(["sesame-lm", model_type, task, "trust-remote-code", *extra_tags])),
        datasets=list(datasets) or None,
        base_model=base_model,
        metrics=list(metrics) or None,
        model_name=name if eval_results else None,
        eval_results=eval_results,
    )

    out = _title_lines(name, family, model_type, task, finetuned_task, finetuning)
    out += _model_lines(family, preset, base_model) + _training_data_lines(training_data, datasets)
    out += _objective_lines(task, finetuned_task, finetuning, objective)
    out += _run_lines(hyperparameters, results)
    out += _usage_lines(task, repo, auto_class or AUTO_CLASS_BY_TASK[task]) + _limitation_lines(finetuning, limitations)
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(out) + "\n"


def _title_lines(
    name: str, family: str, model_type: str, task: str, finetuned_task: str | None, finetuning: bool
) -> list[str]:
    """The card's title and its one-sentence description: the model family, and pretrained or fine-tuned."""
    article = "An" if family[:1].upper() in "AEIOU" else "A"
    what = f"{article} {family} (`model_type: {model_type}`) trained with [sesame-lm](https://github.com/sesame-lm/sesame-lm)"
    return [
        f"# {name}",
        "",
        what
        + (
            f", fine-tuned for {task}" + (f" on {finetuned_task}" if finetuned_task else "")
            if finetuning
            else ", pretrained from scratch"
        )
        + ".",
        "",
    ]


def _model_lines(family: str, preset: str | None, base_model: str | None) -> list[str]:
    """The card's "Model" section: architecture, preset and the model it was fine-tuned from."""
    out = [
        "## Model",
        "",
        f"- Architecture: {family}",
        f"- Preset: `{preset}`" if preset else "- Preset: custom config",
    ]
    return out + ([f"- Fine-tuned from: `{base_model}`"] if base_model else [])


def _training_data_lines(training_data: str | Sequence[str] | None, datasets: Sequence[str]) -> list[str]:
    """The card's "Training data" section: the data descriptions and the Hub dataset ids."""
    data_items = [training_data] if isinstance(training_data, str) else list(training_data or [])
    out = ["", "## Training data", "", *([f"- {d}" for d in data_items] or ["- (not recorded)"])]
    return out + [f"- Hub dataset: `{d}`" for d in datasets]


def _run_lines(hyperparameters: Mapping[str, Any], results: Mapping[str, Any]) -> list[str]:
    """The card's "Training hyperparameters" and "Results" sections, as tables."""
    out = [
        "",
        "## Training hyperparameters",
        "",
        _table(hyperparameters, ("hyperparameter", "value")) if hyperparameters else "(not recorded)",
    ]
    return out + ["", "## Results", "", _table(results, ("metric", "value")) if results else "(no results recorded)"]


def _objective_lines(task: str, finetuned_task: str | None, finetuning: bool, objective) -> list[str]:
    """The card's "Objective" section: the fine-tuning task, and each pretraining objective explained."""
    objectives = [objective] if isinstance(objective, str) else list(objective)
    out = ["", "## Objective", ""]
    if finetuning:
        out.append(
            f"Fine-tuned end to end for {task}"
            + (f" ({finetuned_task})" if finetuned_task else "")
            + ": a task head on top of the encoder, all weights trained with the task loss."
        )
    return out + [_OBJECTIVES.get(o.lower(), o) for o in objectives]


def _limitation_lines(finetuning: bool, limitations: Sequence[str]) -> list[str]:
    """The card's "Limitations" section: the data's biases, the validation split, and ``limitations``."""
    bullets = [
        "Trained on the data above only; it inherits that data's topics, period, language and biases, and "
        "has not been evaluated for fairness or safety.",
        "The results above are from this run's own validation split; expect lower scores on other domains.",
    ]
    if not finetuning:
        bullets.append(
            "A pretrained encoder: fine-tune it (or train a ScalarMix + head on its features) before "
            "using it for a downstream task."
        )
    return ["", "## Limitations", "", *(f"- {b}" for b in [*bullets, *limitations])]


def _eval_results(metrics: Mapping[str, float], task: str, datasets: Sequence[str], finetuned_task: str | None):
    """The ``model-index`` entries (``huggingface_hub.EvalResult``) of the card's metrics, or None without any."""
    from huggingface_hub import EvalResult

    if not metrics:
        return None
    dataset_type = datasets[0] if datasets else (finetuned_task or "custom")
    dataset_name = (
        f"{dataset_type} ({finetuned_task})"
        if finetuned_task and datasets
        else finetuned_task or (datasets[0] if datasets else "held-out validation split")
    )
    return [
        EvalResult(
            task_type=task,
            dataset_type=dataset_type,
            dataset_name=dataset_name,
            dataset_config=finetuned_task if datasets else None,
            dataset_split="validation",
            metric_type=metric,
            metric_value=value,
        )
        for metric, value in metrics.items()
    ]


def _usage_lines(task: str, repo: str, auto: str) -> list[str]:
    """The card's "How to use" section: loading with ``trust_remote_code`` and one example call."""
    out = [
        "",
        "## How to use",
        "",
        "The model code is in the repository (`auto_map`); `trust_remote_code=True` loads it without installing "
        "sesame-lm. Review the code first, and pin `revision=` to a commit id to load exactly what you reviewed.",
        "",
        "```python",
        f"from transformers import AutoTokenizer, {auto}" + ("" if task == "question-answering" else ", pipeline"),
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{repo}", trust_remote_code=True)',
        f'model = {auto}.from_pretrained("{repo}", trust_remote_code=True)',
        "",
    ]
    if task == "question-answering":  # transformers 5 has no question-answering pipeline: the best span by hand
        out += [
            'inputs = tokenizer("Who walked to the house?", "Elizabeth walked to the house.", return_tensors="pt")',
            "out = model(**inputs)",
            "start, end = int(out.start_logits[0].argmax()), int(out.end_logits[0].argmax())",
            'print(tokenizer.decode(inputs["input_ids"][0, start : end + 1]))  # greedy: start and end separately',
        ]
    else:
        out += [f'pipe = pipeline("{task}", model="{repo}", trust_remote_code=True)', f"pipe({_EXAMPLE_INPUT[task]})"]
    return out + [
        "```",
        "",
        "With sesame-lm installed, `import modeling` registers the classes and `trust_remote_code` is not needed.",
    ]


#: Run arguments shown in the card's hyperparameter table (when present and not None).
HYPERPARAMETER_ARGS = (
    "config_name",
    "max_seq_length",
    "mlm_probability",
    "whole_word_mask",
    "nsp",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "lr_scheduler_type",
    "num_warmup_steps",
    "warmup_ratio",
    "max_train_steps",
    "num_train_epochs",
    "doc_stride",
    "mixed_precision",
    "seed",
)


def card_for_run(
    output_dir: str | os.PathLike,
    settings: Mapping[str, Any],
    *,
    task: str = "fill-mask",
    repo_id: str | None = None,
    **overrides: Any,
) -> str:
    """:func:`render_model_card` filled from a finished run: ``config.json`` and ``all_results.json`` in
    ``output_dir``, hyperparameters and training data from the run's resolved ``settings`` (the flat dict of its
    typed arguments, :func:`core.arguments.run_config`).

    ``model_type`` comes from ``config.json``; the preset from ``config_name`` when it is not a path; the
    training data from ``train_file`` / ``dataset_name`` (``dataset_config_name``) or the sources in the
    manifest of ``prepared_dataset``, for pretraining without any the bundled corpus (the ``pretrain`` demo);
    ``base_model`` from ``model_name_or_path`` for fine-tuning tasks. Keyword ``overrides`` win.

    Raises:
        InputError: ``output_dir`` has no readable ``config.json``; as :func:`render_model_card`.
    """
    config = read_json(Path(output_dir) / "config.json", "the model config", "save_pretrained output")
    values = dict(settings)
    config_name = values.get("config_name")
    files = values.get("train_file") or []
    files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    data = [f"`{Path(f).name}`" for f in files]
    if values.get("prepared_dataset"):  # the sources recorded by `python -m pretrain.prepare`
        try:
            sources = json.loads((Path(values["prepared_dataset"]) / "manifest.json").read_text(encoding="utf-8"))[
                "sources"
            ]
        except (OSError, ValueError, KeyError):
            sources = {}
        data += [f"`{Path(f['path']).name}`" for f in sources.get("train", [])]
        if sources.get("dataset_name"):
            values = {
                **values,
                "dataset_name": sources["dataset_name"],
                "dataset_config_name": sources.get("dataset_config_name"),
            }
    if values.get("dataset_name"):
        data.append(
            f"`{values['dataset_name']}`"
            + (f" ({values['dataset_config_name']})" if values.get("dataset_config_name") else "")
        )
    finetuning = task not in ("fill-mask", "feature-extraction")
    if not data and not finetuning:
        data = ["the public-domain English prose corpus bundled with sesame-lm (`pretrain/corpus`)"]
    kwargs: dict[str, Any] = dict(
        model_type=config.get("model_type", "unknown"),
        repo_id=repo_id or values.get("hub_model_id"),
        task=task,
        preset=config_name if config_name and not os.path.exists(str(config_name)) else None,
        training_data=data or None,
        hyperparameters={k: values[k] for k in HYPERPARAMETER_ARGS if values.get(k) not in (None, False)},
        results=results_from_dir(output_dir),
        finetuned_task=values.get("task_name"),
        # the run's output folder names the model (the card is written in a temporary folder next to it)
        title=None if repo_id or values.get("hub_model_id") else Path(values.get("output_dir") or output_dir).name,
    )
    base = values.get("model_name_or_path")
    if finetuning and base and not os.path.exists(str(base)):  # a Hub repo id (local paths are not metadata)
        kwargs["base_model"] = base
    if values.get("dataset_name") and not os.path.exists(str(values["dataset_name"])):
        kwargs["datasets"] = [values["dataset_name"]]
    kwargs.update(overrides)
    return render_model_card(**kwargs)


__all__ = ["AUTO_CLASS_BY_TASK", "HYPERPARAMETER_ARGS", "card_for_run", "render_model_card", "results_from_dir"]
