"""Our recipes (:data:`RECIPES`), the flags the bench sets itself, ``--recipes`` / ``--recipe_flags`` into a
table, the prepared dataset a recipe trains on, and ``--config_name PRESET:field=value`` written out as a config."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from .common import flag_value

#: sesame-modern in micro-batches of 8 blocks x 4 accumulation (the bench's default 32 blocks per step).
_MODERN_8X4 = ["--config_name", "modernbert-tiny", "--per_device_train_batch_size", "8"]
_MODERN_8X4 += ["--gradient_accumulation_steps", "4"]

#: Our recipes: name -> the ``python -m pretrain`` flags added to ``--prepared_dataset D/prepared --config_name SHAPE
#: --per_device_train_batch_size B`` and the bench's run flags (:data:`BENCH_FLAGS` may not be set by a recipe).
#: ``note`` says what the recipe is. ``--recipe_flags NAME='--flag v ...'`` adds one for a single invocation.
RECIPES: dict[str, dict] = {
    "sesame-default": dict(
        flags=[],
        note="the recipe for user data at the bench's --model_shape: no flags (a bert-* shape: BERT's post-LN layout, "
        "lr 2e-3 x 128 / hidden size, 30% masking, warmup 6%, stable, 1 - sqrt decay over the "
        "last 20%, weight decay 0.01, float32, output bias at the log unigram frequencies)",
    ),
    "sesame-before-22": dict(
        flags=[
            "--output_bias_init",
            "zeros",
            "--learning_rate",
            "1e-4",
            "--mlm_probability",
            "0.15",
            "--lr_scheduler_type",
            "linear",
            "--document_masking",
            "false",
        ],
        note="the default before issue 22, spelled out: lr 1e-4 (BERT's), 15% masking, linear "
        "decay, documents joined by [SEP], zero output bias (BERT's)",
    ),
    "sesame-modern": dict(
        flags=["--config_name", "modernbert-tiny"],
        note="the default with the ModernBERT-class preset modernbert-tiny (issue 41: pre-LN without biases, GeGLU, "
        "RoPE, local attention in a 64-token window on two layers of three; 4.31M parameters against bert-tiny's "
        "4.35M at vocab 30,000) and its default lr (pre-LN at hidden size 128: 2e-3; 1e-3 before session 52, add "
        "--learning_rate 1e-3 to repeat the earlier tables); with --model_shape bert-tiny",
    ),
    # issue 52, item 5: ModernBERT's training choices, each alone on top of sesame-modern
    "sesame-modern-stable-adamw": dict(
        flags=[
            "--config_name",
            "modernbert-tiny",
            "--optim",
            "stable_adamw",
            "--decoupled_weight_decay",
            "--weight_decay",
            "1e-5",
        ],
        note="sesame-modern with StableAdamW (torch-optimi, ModernBERT's optimizer) and decoupled weight decay 1e-5 "
        "(ModernBERT's): at the peak lr 1e-3 the same decay per step as sesame-modern's AdamW with 0.01 "
        "(1e-3 x 0.01), so the optimizer is what differs",
    ),
    "sesame-modern-mask30to15": dict(
        flags=["--config_name", "modernbert-tiny", "--mlm_probability", "0.3", "--mlm_probability_end", "0.15"],
        note="sesame-modern with the masking rate lowered linearly from 30% to 15% over the run (Ettin / mmBERT "
        "lower it per phase); the held-out scoring keeps one rate, so curves compare",
    ),
    "sesame-modern-bsw": dict(
        flags=[*_MODERN_8X4, "--batch_size_warmup_tokens", "100000"],
        note="sesame-modern with a batch-size warmup: 8 -> 32 blocks per step over the first 100k tokens (~10% of a "
        "10-minute CPU run; ModernBERT: 50B of 1.7T), in micro-batches of 8 x 4 accumulation; compare with "
        "sesame-modern-8x4 (the same micro-batches, no warmup) and sesame-modern (one batch of 32) at --batch_size 32",
    ),
    "sesame-modern-8x4": dict(
        flags=_MODERN_8X4,
        note="sesame-modern in micro-batches of 8 x 4 accumulation (32 blocks per step), no batch-size warmup: the "
        "control of sesame-modern-bsw",
    ),
    "sesame-lr1e-3": dict(flags=["--learning_rate", "1e-3"], note="the default with peak learning rate 1e-3"),
    "sesame-lr1e-3-bf16": dict(
        flags=["--learning_rate", "1e-3", "--mixed_precision", "bf16"],
        note="lr 1e-3 with bf16 autocast (docs/results.md: the CPU choice for pretraining)",
    ),
    "rtd": dict(
        flags=["--objective", "rtd", "--learning_rate", "1e-3"],
        note="ELECTRA replaced-token detection (issue 21), lr 1e-3 as sesame-lr1e-3: a generator of 1/4 the "
        "width and the discriminator (the preset's shape, fine-tuned downstream); its held-out curve is "
        "the generator's MLM loss, so the MLM ratios do not apply",
    ),
}


DEFAULT_RECIPES = ("sesame-default", "sesame-before-22")


#: ``pretrain`` flags the bench sets itself: a recipe giving one of them is refused.
BENCH_FLAGS = (
    "--prepared_dataset",
    "--train_file",
    "--validation_file",
    "--dataset_name",
    "--tokenizer_name",
    "--model_name_or_path",
    "--output_dir",
    "--overwrite_output_dir",
    "--max_train_steps",
    "--num_train_epochs",
    "--checkpointing_steps",
    "--checkpoints_total_limit",
    "--logging_steps",
    "--eval_steps",
    "--max_eval_samples",
    "--max_train_samples",
    "--seed",
    "--report_to",
    "--resume_from_checkpoint",
    "--push_to_hub",
    "--load_best_model_at_end",
    "--early_stopping_patience",
    "--streaming",
    "--max_seq_length",
)


def select_recipes(names: list[str], ad_hoc: list[str]) -> dict[str, list[str]]:
    """``{name: pretrain flags}`` of ``--recipes`` (from :data:`RECIPES`) then ``--recipe_flags`` entries
    (``NAME='--flag v ...'``, split as a shell would).

    Raises:
        ValueError: an unknown recipe name, a malformed or duplicate entry, or a flag of :data:`BENCH_FLAGS`.
    """
    table: dict[str, list[str]] = {}
    for name in names:
        if name not in RECIPES:
            raise ValueError(f"--recipes {name}: unknown; expected one of {', '.join(RECIPES)} (or --recipe_flags)")
        table[name] = list(RECIPES[name]["flags"])
    for entry in ad_hoc:
        name, sep, flags = entry.partition("=")
        if not sep or not name or name in table or name.startswith("reference") or name.startswith("random"):
            raise ValueError(f"--recipe_flags {entry!r}: expected NAME='--flag value ...' with a new name")
        table[name] = shlex.split(flags)
    for name, flags in table.items():
        taken = [f for f in flags if f.split("=")[0] in BENCH_FLAGS]
        if taken:
            raise ValueError(f"recipe {name}: {' '.join(taken)} is set by the bench; expected other pretrain flags")
    if not table:
        raise ValueError("no recipe: expected at least one of --recipes / --recipe_flags")
    return table


def data_variant(flags: list[str]) -> str:
    """The prepared dataset a recipe trains on, named by what its blocks depend on among the recipe's flags:
    ``prepared`` (the objective's default blocks: mlm with document boundaries), ``prepared-nodoc``
    (``--document_masking false``: documents joined by ``[SEP]``, no ``position_ids``), ``prepared-<objective>``
    (``--objective X`` other than mlm), or both suffixes."""
    objective = flag_value(flags, "--objective", "mlm")
    document_masking = (flag_value(flags, "--document_masking") or "").lower()
    return (
        "prepared"
        + ("" if objective == "mlm" else f"-{objective}")
        + ("-nodoc" if document_masking in ("false", "0", "no") else "")
    )


def variant_flags(name: str) -> list[str]:
    """The ``pretrain.prepare`` flags of a :func:`data_variant` name."""
    flags, rest = [], name[len("prepared") :]
    if rest.endswith("-nodoc"):
        flags, rest = ["--document_masking", "false"], rest[: -len("-nodoc")]
    return (["--objective", rest[1:]] if rest else []) + flags


def materialize_configs(flags: list[str], out: Path) -> list[str]:
    """``flags`` with a ``--config_name PRESET:field=value,...`` written out as a config folder in ``out/configs``
    (the preset with those fields; values read as JSON where they parse, else as strings)."""
    value = flag_value(flags, "--config_name")
    if value is None or ":" not in value:
        return list(flags)
    import modeling

    preset, _, fields = value.partition(":")
    overrides = {}
    for item in filter(None, fields.split(",")):
        key, _, raw = item.partition("=")
        try:
            overrides[key] = json.loads(raw)
        except ValueError:
            overrides[key] = raw
    folder = out / "configs" / value.replace(":", "-").replace(",", "-").replace("=", "_")
    modeling.get_preset_config(preset, **overrides).save_pretrained(str(folder))
    result, skip = [], False
    for item in flags:
        if skip:
            skip = False
        elif item == "--config_name":
            result += [item, str(folder)]
            skip = True
        elif item.startswith("--config_name="):
            result.append(f"--config_name={folder}")
        else:
            result.append(item)
    return result
