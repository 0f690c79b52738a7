"""``python -m finetune.baselines``: the GLUE baseline table -- classic encoders (and pretrained models) on GLUE tasks.

For every task and backbone it runs ``finetune.glue`` (the same command a user runs, in a child process) with the
backbone's recipe (:data:`RECIPES`), then writes in ``--output_dir``:

* ``results.json`` -- one record per run: task, backbone, the task's main metric (:attr:`GlueTask.main_metric`)
  and its value on the dev set, every ``eval_*`` figure, ``train_runtime_s``, the recipe and the exact
  ``finetune.glue`` command; for the Tree-LSTM whether the trees were given or latent;
* ``results.md`` -- a task x backbone table (metric x 100, training time);
* ``results.png`` -- the same figures as grouped bars (matplotlib, Agg);
* ``models/<backbone>/`` -- the freshly initialised baseline folders (config, weights, word tokenizer) that
  ``finetune.glue`` fine-tunes, and ``runs/<task>-<backbone>/`` -- each run's folder.

Backbones: ``cbow``, ``fasttext``, ``cnn``, ``rnn``, ``treelstm`` (:mod:`modeling.baselines`; words from the word
tokenizer of ``--embeddings`` or ``--tokenizer_name``, embeddings from ``--embeddings`` or random), or a
model folder (a pretrained SesameBert / SesameElmo, fine-tuned with the recipe of its ``model_type``).

``--elmo SPEC [SPEC ...]`` adds, for every classic backbone, a ``<backbone>+elmo`` row per SPEC: the same encoder
and recipe with a frozen ELMo BiLM's layers mixed by a task ScalarMix and concatenated to the word vectors (Peters et
al. 2018, section 3.3; ``SesameBaselineConfig.elmo_config``). SPEC is a pretrained SesameElmo folder (row
``<backbone>+elmo``; with several folders, ``<backbone>+<folder name>``), or ``random:<folder or preset>`` for a
randomly initialised BiLM of that shape (row ``<backbone>+elmo-random``: the control that separates pretraining
from the extra parameters and the character CNN).

Example::

    python -m tokenizer train --model_type elmo --lowercase --train_file corpus.txt.gz --vocab_size 50000 \\
        --output_dir wordtok
    python -m tokenizer vectors --train_file corpus.txt.gz --tokenizer_name wordtok --output_dir vectors
    python -m finetune.baselines --glue_dir data/glue --tasks sst2 mrpc stsb cola \\
        --backbones cbow fasttext cnn rnn treelstm runs/bert-mini runs/elmo-small --embeddings vectors \\
        --output_dir table

Arguments after ``--`` go to every ``finetune.glue`` run (e.g. ``-- --max_train_samples 1000``); a ``--hub_token``
among them reaches the runs as ``HF_TOKEN`` in their environment, never on a command line, in ``results.json`` or
in the log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from core.arguments import arg, as_flags, parse_arguments
from core.errors import InputError, run_cli

logger = logging.getLogger("finetune.baselines")

BASELINES = ("cbow", "fasttext", "cnn", "rnn", "treelstm")


#: Fine-tuning recipe of each backbone: finetune.glue arguments, epochs per task ("default" for the rest), and
#: optionally ``max_train_samples`` and further finetune.glue arguments (``extra_args``) per task.
#: Small enough for a CPU; the baselines train everything (embeddings included unless static) with AdamW.
#: ``max_train_samples``: per task, train on the first N examples only (the latent Tree-LSTM's CPU time).
def _recipe(lr: float, batch: int, sst2_epochs: int, decay: float = 0.0, warmup: int = 0, **more) -> dict:
    return dict(
        learning_rate=lr,
        per_device_train_batch_size=batch,
        weight_decay=decay,
        num_warmup_steps=warmup,
        epochs={"sst2": sst2_epochs, "default": 3},
        **more,
    )


RECIPES: dict[str, dict] = {
    "cbow": _recipe(3e-3, 128, 3),
    "fasttext": _recipe(3e-3, 128, 3),
    # SST-2: 6 epochs, keeping the checkpoint with the best dev accuracy (evaluated every half epoch), as the GLUE
    # paper's baselines stopped early on dev; 3 epochs without it ended at 79.6-80.3, still rising
    "cnn": _recipe(2e-3, 128, 6, extra_args={"sst2": ["--eval_steps", "264", "--load_best_model_at_end"]}),
    "rnn": _recipe(1e-3, 64, 1),
    "treelstm": _recipe(1e-3, 64, 1, max_train_samples={"sst2": 20000}),
    "default": _recipe(5e-5, 32, 1, decay=0.01, warmup=50),
}


@dataclasses.dataclass(frozen=True)
class BaselinesArguments:
    """``python -m finetune.baselines``: tasks, backbones, word vectors and the output folder."""

    glue_dir: str = arg(help="the official GLUE folder (SST-2/train.tsv, ...)")
    tasks: list[str] = arg(help="GLUE tasks (sst2 mrpc stsb cola ...)", nargs="+")
    backbones: list[str] = arg(
        help=f"{' | '.join(BASELINES)} | a model folder (SesameBert, SesameElmo, ...)", nargs="+"
    )
    output_dir: str = arg(help="results.{json,md,png}, models/, runs/")
    embeddings: str | None = arg(
        None,
        "word vectors folder of python -m tokenizer vectors (its word tokenizer is used); default: random embeddings",
    )
    tokenizer_name: str | None = arg(
        None, "word tokenizer (python -m tokenizer train --model_type elmo) when no --embeddings"
    )
    embedding_dim: int | None = arg(None, "without --embeddings (default 100)")
    max_seq_length: int = arg(64, "tokens per input")
    seed: int = arg(42, "random seed")
    seeds: list[int] | None = arg(
        None,
        "several seeds (replaces --seed): every cell runs once per seed (initialisation and fine-tuning); the table "
        "shows the median and each seed's value",
        nargs="+",
    )
    num_train_epochs: float | None = arg(None, "override every recipe's epochs")
    elmo: list[str] | None = arg(
        None,
        "ELMo features for the classic backbones: a pretrained SesameElmo folder (adds <backbone>+elmo rows) and/or "
        "random:<folder or preset> (adds <backbone>+elmo-random rows: a randomly initialised BiLM of that shape)",
        nargs="+",
    )
    resume: bool = arg(
        False,
        "skip the cells whose run is already in --output_dir's results.json with the same finetune.glue command and no "
        "error (a long table continued after an interruption)",
    )
    elmo_rows_only: bool = arg(
        False,
        "with --elmo: run only the +elmo rows (the plain rows of the same backbones from another invocation into the "
        "same --output_dir: the results are merged)",
    )


DESCRIPTION = (
    "Fine-tune classic baselines (cbow, fasttext, cnn, rnn, treelstm) and pretrained model folders on GLUE "
    "tasks with finetune.glue; write results.json, results.md and results.png. Arguments after -- are passed "
    "to every finetune.glue run."
)


def init_baseline_model(
    backbone: str,
    output_dir: str | os.PathLike,
    *,
    embeddings: str | None = None,
    tokenizer_name: str | None = None,
    embedding_dim: int | None = None,
    seed: int = 42,
    elmo: str | None = None,
    **overrides,
) -> Path:
    """Write a freshly initialised baseline folder that ``finetune.glue`` (``AutoModelForSequenceClassification``)
    loads: ``config.json`` (the ``baseline-<backbone>`` preset), ``model.safetensors`` (a
    :class:`~modeling.baselines.SesameBaselineModel`; the classifier is added by the head), the word tokenizer.

    Args:
        backbone: one of ``cbow fasttext cnn rnn treelstm``.
        output_dir: the folder (written atomically).
        embeddings: a ``python -m tokenizer vectors`` folder: its tokenizer, and the embeddings initialised from
            its vectors (:func:`modeling.baselines.load_word_vectors`). None: random embeddings.
        tokenizer_name: the word tokenizer when ``embeddings`` is None.
        embedding_dim: embedding size without ``embeddings`` (default 100).
        seed: initialisation seed.
        elmo: ELMo features (:func:`load_bilm`): a pretrained SesameElmo folder, or ``"random:<folder or preset>"``;
            the BiLM's weights are copied into the model (``baseline.elmo.bilm``), so the folder is self-contained.
        **overrides: config fields replacing the preset's (e.g. ``embedding_mode="static"``).

    Raises:
        InputError: an unknown backbone, neither ``embeddings`` nor ``tokenizer_name``, or an ``elmo`` that
            :func:`load_bilm` refuses.
    """
    import torch
    from transformers import AutoTokenizer

    import modeling
    from core.files import atomic_output_dir
    from modeling.baselines import SesameBaselineModel, load_word_vectors

    if backbone not in BASELINES:
        raise InputError(
            f"--backbones {backbone}: not a baseline; expected one of {', '.join(BASELINES)} or a model folder"
        )
    source = embeddings or tokenizer_name
    if source is None:
        raise InputError("the baselines need a word tokenizer: pass --embeddings (vectors folder) or --tokenizer_name")
    tokenizer = AutoTokenizer.from_pretrained(source)
    info = None
    if embeddings is not None:
        from tokenizer.vectors import VECTORS_CONFIG

        info = json.loads((Path(embeddings) / VECTORS_CONFIG).read_text(encoding="utf-8"))
        dim = info["vector_size"]
        overrides.setdefault("ngram_min_n", info["min_n"])
        overrides.setdefault("ngram_max_n", info["max_n"])
        overrides.setdefault("ngram_buckets", info["bucket"])
    else:
        dim = embedding_dim or 100
    bilm = None
    if elmo is not None:
        bilm = load_bilm(elmo, tokenizer, seed)
        overrides.update(elmo_config=bilm_config_dict(bilm.config), elmo_name_or_path=elmo)
        overrides.setdefault("elmo_cache_mb", 2048)  # the frozen BiLM runs once per distinct sentence, not per epoch
    config = modeling.get_preset_config(
        f"baseline-{backbone}", vocab_size=len(tokenizer), embedding_dim=dim, **overrides
    )
    torch.manual_seed(seed)
    model = SesameBaselineModel(config)
    if embeddings is not None:
        load_word_vectors(model, embeddings, vocab=[tokenizer.convert_ids_to_tokens(i) for i in range(len(tokenizer))])
    if bilm is not None:
        model.elmo.bilm.load_state_dict(bilm.state_dict())
    with atomic_output_dir(output_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(output_dir)


def bilm_config_dict(config) -> dict:
    """A SesameElmoConfig as the ``elmo_config`` of a baseline: ``to_dict()`` without the saving bookkeeping
    (``architectures``, ``auto_map``, versions, the source path)."""
    drop = {"architectures", "auto_map", "_name_or_path", "transformers_version", "dtype", "torch_dtype"}
    return {k: v for k, v in config.to_dict().items() if k not in drop}


def load_bilm(elmo_source: str, tokenizer, seed: int = 42):
    """The ELMo BiLM (:class:`~modeling.elmo.SesameElmoModel`, eval mode) of an ``--elmo`` SPEC.

    Args:
        elmo_source: a SesameElmo folder (any head saved by ``pretrain --model_type elmo`` or ``save_pretrained``: its
            encoder weights), or ``"random:<folder or preset>"``: a BiLM of that folder's (or preset's, e.g.
            ``elmo-small``) shape with the ELMo family's own random initialisation (seeded by ``seed``).
        tokenizer: the baselines' word tokenizer: its character ids feed the BiLM, so its lower-casing must match
            the tokenizer the BiLM was trained with (checked when the folder has one).
        seed: the random initialisation's seed.

    Raises:
        InputError: the folder is missing or not a SesameElmo model, the preset is unknown, its config or weights
            cannot be read (a truncated or damaged ``model.safetensors``), its character vocabulary
            (``char_vocab_size``) is smaller than the word tokenizer's character ids need, or the BiLM was trained on
            text cased otherwise than the word tokenizer writes it.
    """
    from transformers import AutoConfig, AutoModel

    import modeling
    from core.logs import from_pretrained_quietly
    from modeling.elmo import SesameElmoModel
    from training.pretrained import load_pretrained

    random = elmo_source.startswith("random:")
    source = elmo_source.removeprefix("random:")
    expected = "a SesameElmo model folder (pretrain --model_type elmo output) or random:<folder or ELMo preset>"
    if random and source in modeling.PRESETS:
        config = modeling.get_preset_config(source, vocab_size=len(tokenizer))
    elif not (Path(source) / "config.json").is_file():
        raise InputError(f"--elmo {elmo_source}: no config.json in {source}; expected {expected}")
    else:
        config = load_pretrained(
            AutoConfig.from_pretrained, source, "--elmo", expected, failure="cannot read its config"
        )
    if config.model_type != "sesame-elmo":
        raise InputError(
            f"--elmo {elmo_source}: model_type {config.model_type!r}; expected a SesameElmo ('sesame-elmo') model"
        )
    _check_char_vocab(elmo_source, config)
    if random:
        import torch

        torch.manual_seed(seed)
        return SesameElmoModel(config).eval()
    _check_casing(elmo_source, Path(source), tokenizer)
    # AutoModel: the encoder of whatever head was saved; the pretraining softmax it leaves out is expected, so
    # transformers' LOAD REPORT (which lists it as UNEXPECTED) is not shown.
    load = from_pretrained_quietly(AutoModel.from_pretrained, logger)
    return load_pretrained(load, source, "--elmo", expected, failure="cannot load the weights").eval()


def _check_char_vocab(elmo_source: str, config) -> None:
    """Refuse a BiLM whose character embedding has fewer rows than the ELMo character ids the word tokenizer writes
    (:data:`modeling.elmo.tokenization_elmo.CHAR_VOCAB_SIZE`): every cell would end in an ``IndexError``."""
    from modeling.elmo.tokenization_elmo import CHAR_VOCAB_SIZE

    size = getattr(config, "char_vocab_size", None)
    if not isinstance(size, int) or size < CHAR_VOCAB_SIZE:
        raise InputError(
            f"--elmo {elmo_source}: char_vocab_size {size} in its config, but the word tokenizer writes ELMo "
            f"character ids 0..{CHAR_VOCAB_SIZE - 1}; expected a BiLM with char_vocab_size >= {CHAR_VOCAB_SIZE}"
        )


def _check_casing(elmo_source: str, folder: Path, tokenizer) -> None:
    """Refuse a BiLM whose own tokenizer (``tokenizer_config.json`` in ``folder``) cases text otherwise than the
    baselines' word tokenizer: the BiLM would read character ids of words it never saw in that form."""
    saved = folder / "tokenizer_config.json"
    if not saved.is_file():
        logger.warning(
            "--elmo %s: no tokenizer_config.json there, so whether its BiLM was trained on text cased as the word "
            "tokenizer writes it cannot be checked; save the BiLM's tokenizer in the folder to have it checked",
            elmo_source,
        )
        return
    trained = json.loads(saved.read_text(encoding="utf-8")).get("lowercase")
    ours = getattr(tokenizer, "lowercase", None)
    if trained is not None and ours is not None and bool(trained) != bool(ours):
        raise InputError(
            f"--elmo {elmo_source}: its BiLM was trained on {'lower-cased' if trained else 'cased'} text, but the "
            f"baselines' word tokenizer {'lower-cases' if ours else 'keeps the case'}; the character ids would differ "
            "from the BiLM's training. Pretrain the BiLM with a tokenizer of the same casing (python -m tokenizer "
            "train --model_type elmo [--lowercase]) or use such a word tokenizer for the baselines"
        )


def elmo_rows(backbones: Sequence[str], specs: Sequence[str] | None) -> dict[str, tuple[str, str]]:
    """The ``+elmo`` rows: row name -> (classic backbone, ELMo SPEC), in table order (each backbone's rows after it).

    A pretrained folder gives ``<backbone>+elmo`` (``<backbone>+<folder name>`` when several are given),
    ``random:...`` gives ``<backbone>+elmo-random`` (``+elmo-random-<name>`` when several)."""
    from modeling.elmo import SPEC  # the rows are named after the family whose features they concatenate

    specs = list(specs or [])
    pretrained = [s for s in specs if not s.startswith("random:")]
    randoms = [s for s in specs if s.startswith("random:")]

    def suffix(elmo_source: str) -> str:
        if elmo_source.startswith("random:"):
            return "elmo-random" if len(randoms) == 1 else f"elmo-random-{Path(elmo_source[7:]).name}"
        return SPEC.name if len(pretrained) == 1 else Path(elmo_source).name

    return {f"{b}+{suffix(s)}": (b, s) for b in backbones if b in BASELINES for s in specs}


def recipe_for(backbone: str) -> tuple[str, dict]:
    """``(recipe name, recipe)`` of a backbone: its own for a baseline, and for a saved baseline folder its encoder's;
    for another model folder its family's (:attr:`modeling.spec.ModelSpec.finetune_recipe` over ``RECIPES["default"]``,
    named by ``model_type``), else ``RECIPES["default"]``."""
    from modeling import baselines, spec_for

    if backbone in BASELINES:
        return backbone, RECIPES[backbone]
    config = Path(backbone) / "config.json"
    if not config.is_file():
        raise InputError(
            f"--backbones {backbone}: not a baseline ({', '.join(BASELINES)}) and no config.json there; "
            "expected a model folder written by save_pretrained"
        )
    saved = json.loads(config.read_text(encoding="utf-8"))
    model_type, encoder = saved.get("model_type", ""), saved.get("encoder_type")
    if (spec := spec_for(model_type)) is baselines.SPEC and encoder in BASELINES:
        return encoder, RECIPES[encoder]
    return (model_type, {**RECIPES["default"], **spec.finetune_recipe}) if spec else ("default", RECIPES["default"])


def glue_command(
    task: str, model_dir: str, run_dir: Path, recipe: dict, args: BaselinesArguments, extra: list[str]
) -> list[str]:
    """The ``finetune.glue`` command line of one run (``--overwrite_output_dir``: a table cell run again replaces
    the earlier run of that cell, its checkpoints deleted first)."""
    epochs = args.num_train_epochs or recipe["epochs"].get(task, recipe["epochs"]["default"])
    return [
        sys.executable,
        "-m",
        "finetune.glue",
        *as_flags(
            model_name_or_path=model_dir,
            task_name=task,
            glue_dir=args.glue_dir,
            output_dir=run_dir,
            max_seq_length=args.max_seq_length,
            learning_rate=recipe["learning_rate"],
            per_device_train_batch_size=recipe["per_device_train_batch_size"],
            weight_decay=recipe["weight_decay"],
            num_warmup_steps=recipe["num_warmup_steps"],
            num_train_epochs=epochs,
            seed=args.seed,
            report_to="none",
        ),
        "--overwrite_output_dir",
        *(
            ["--max_train_samples", str(recipe["max_train_samples"][task])]
            if task in recipe.get("max_train_samples", {})
            else []
        ),
        *recipe.get("extra_args", {}).get(task, []),
        *extra,
    ]


def backbone_name(backbone: str) -> str:
    return backbone if backbone in BASELINES else Path(backbone).name


def check_inputs(args: BaselinesArguments) -> dict:
    """Every argument and ``--elmo`` folder of ``python -m finetune.baselines`` checked before anything is written.

    Returns:
        ``{task name: task}`` of ``--tasks``.

    Raises:
        InputError: a missing ``--glue_dir`` / ``--embeddings`` / ``--tokenizer_name`` folder, baselines without a word
            tokenizer, ``--elmo`` without a classic backbone, ``--elmo_rows_only`` without ``--elmo``, or an
            ``--elmo`` BiLM that cannot be loaded for these words (:func:`load_bilm`).
    """
    from finetune.tasks import get_task

    tasks = {name: get_task(name) for name in args.tasks}
    glue_dir = Path(args.glue_dir)
    if not glue_dir.is_dir():
        raise InputError(f"--glue_dir {glue_dir}: not a folder; expected the GLUE data folder")
    if any(b in BASELINES for b in args.backbones) and not (args.embeddings or args.tokenizer_name):
        raise InputError("the baselines need a word tokenizer: pass --embeddings (vectors folder) or --tokenizer_name")
    for flag in ("embeddings", "tokenizer_name"):
        if getattr(args, flag) and not Path(getattr(args, flag)).is_dir():
            raise InputError(
                f"--{flag} {getattr(args, flag)}: not a folder; expected "
                + ("python -m tokenizer vectors output" if flag == "embeddings" else "a word tokenizer folder")
            )
    if args.elmo and not any(b in BASELINES for b in args.backbones):
        raise InputError(f"--elmo: adds rows to the classic backbones ({', '.join(BASELINES)}); none is in --backbones")
    if args.elmo_rows_only and not args.elmo:
        raise InputError("--elmo_rows_only: runs only the +elmo rows, but no --elmo is given; expected --elmo SPEC ...")
    if args.elmo:  # every --elmo SPEC is checked (config, character vocabulary, casing, weights) before any write
        from transformers import AutoTokenizer

        from training.pretrained import load_pretrained

        words = load_pretrained(
            AutoTokenizer.from_pretrained,
            args.embeddings or args.tokenizer_name,
            "--embeddings" if args.embeddings else "--tokenizer_name",
            "a word tokenizer folder (python -m tokenizer train --model_type elmo)",
        )
        for elmo_source in args.elmo:
            load_bilm(elmo_source, words, args.seed)
    return tasks


def main(argv: Sequence[str] | None = None) -> int:
    from finetune.cells import split_command_line

    own, extra, child_env = split_command_line(argv)
    (args,) = parse_arguments(
        [BaselinesArguments],
        own,
        prog="python -m finetune.baselines",
        description=DESCRIPTION,
    )
    from core.logs import setup_logging

    setup_logging()
    tasks = check_inputs(args)
    recipes = {b: recipe_for(b) for b in args.backbones}
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra_rows = elmo_rows(args.backbones, args.elmo)
    seeds = args.seeds or [args.seed]
    records: list[dict] = []
    done = _finished_runs(out) if args.resume else {}
    for seed in seeds:
        seed_args = dataclasses.replace(args, seed=seed)
        # one seed: models/<row>, runs/<task>-<row>; several: models/seed-<s>/<row>, runs/seed-<s>/<task>-<row>
        base_dir = out if len(seeds) == 1 else out / f"seed-{seed}"
        tree_source = _init_baselines(seed_args, out, extra_rows, base_dir / "models" if len(seeds) > 1 else None)
        rows = []  # (row name, source, model folder, classic backbone or None): each backbone, then its +elmo rows
        for b in args.backbones:
            classic = b if b in BASELINES else None
            if not (args.elmo_rows_only and classic):
                rows.append((backbone_name(b), b, base_dir / "models" / b if classic else Path(b), classic))
            rows += [
                (r, elmo_source, base_dir / "models" / r, base)
                for r, (base, elmo_source) in extra_rows.items()
                if base == b
            ]
        for task_name, task in tasks.items():
            for name, source, model_dir, base in rows:
                run_dir = (out / "runs" if len(seeds) == 1 else out / "runs" / f"seed-{seed}") / f"{task_name}-{name}"
                cmd = glue_command(task_name, str(model_dir), run_dir, recipes[base or source][1], seed_args, extra)
                if done.get((task_name, name, seed)) == cmd[1:]:
                    logger.info(
                        "%s / %s / seed %d: in results.json with the same command (--resume): skipped",
                        task_name,
                        name,
                        seed,
                    )
                    continue
                record = _run_cell(task_name, task, name, cmd, run_dir, child_env)
                record.update(source=str(source), recipe=recipes[base or source][0], seed=seed)
                if base in tree_source:
                    record["tree_source"] = tree_source[base]
                if base:
                    record["embeddings"] = args.embeddings or "random"
                if name in extra_rows:  # the BiLM folder (or random:...) whose features the row concatenates
                    from modeling.elmo import SPEC as ELMO

                    record[ELMO.name] = source
                key = (task_name, name, seed)
                records = [r for r in records if (r["task"], r["backbone"], r.get("seed")) != key] + [record]
                write_results(out, records)
    return _final_line(out, records)


def _final_line(out: Path, records: list[dict]) -> int:
    """Print the run's last line and return the exit status: 0 and ``results: <out>/results.md (N cells)`` on stdout
    when every cell of this invocation succeeded (none ran: the table as it was); else 1 and one ``error:`` line on
    stderr naming ``results.md``, each failed cell (task / row / seed) and where its log is."""
    failed = [r for r in records if "error" in r]
    if not failed:
        print(f"results: {out / 'results.md'} ({len(records)} cell run(s) of this invocation, none failed)")
        return 0
    cells = "; ".join(
        f"{r['task']} / {r['backbone']}"
        + (f" / seed {r['seed']}" if r.get("seed") is not None else "")
        + f" ({r['error']})"
        for r in failed
    )
    print(
        f"error: {len(failed)} of {len(records)} cell(s) failed: {cells}; they read 'failed' in {out / 'results.md'}, "
        f"each run's output is in {out / 'runs'}/<task>-<row>.log; expected every cell to train",
        file=sys.stderr,
    )
    return 1


def _finished_runs(out: Path) -> dict[tuple[str, str, int | None], list[str]]:
    """(task, row, seed) -> the ``finetune.glue`` command of each successful run recorded in ``out/results.json``."""
    path = out / "results.json"
    runs = json.loads(path.read_text(encoding="utf-8"))["runs"] if path.is_file() else []
    return {(r["task"], r["backbone"], r.get("seed")): r["command"] for r in runs if "error" not in r}


def _run_cell(task_name: str, task, name: str, cmd: list[str], run_dir: Path, env: dict) -> dict:
    """Run one table cell's ``finetune.glue`` command; its log goes next to ``run_dir`` (``<run_dir>.log``).

    Returns:
        the run's record: task, backbone (row name), metric, command, wall time, and either the metric's ``value``,
        ``train_runtime_s`` and every ``eval_*`` figure, or the ``error`` (the run's last stderr line)."""
    from finetune import cells  # the cell runner shared with finetune.suite

    logger.info("%s / %s: %s", task_name, name, " ".join(cmd))
    start = time.perf_counter()
    returncode, stderr_tail = cells.run_command(
        cmd, env, run_dir.with_name(run_dir.name + ".log"), f"{task_name} / {name}"
    )
    wall = time.perf_counter() - start
    record = {
        "task": task_name,
        "backbone": name,
        "metric": task.main_metric,
        "command": cmd[1:],
        "wall_s": round(wall, 1),
    }
    if returncode != 0:
        record["error"] = stderr_tail or f"exit status {returncode}"
        logger.warning("%s / %s failed: %s", task_name, name, record["error"])
        return record
    res = json.loads((run_dir / "all_results.json").read_text(encoding="utf-8"))
    record.update(
        value=res.get(f"eval_{task.main_metric}"),
        train_runtime_s=res.get("train_runtime_s"),
        eval={k: v for k, v in res.items() if k.startswith("eval_")},
    )
    logger.info("%s / %s: %s = %.4f (%.0f s)", task_name, name, task.main_metric, record["value"], wall)
    return record


def _init_baselines(
    args: BaselinesArguments, out: Path, extra_rows: dict[str, tuple[str, str]], models: Path | None = None
) -> dict[str, str]:
    """Initialise the model folder ``out/models/<row>`` of every classic baseline among ``args.backbones`` and of
    every ``+elmo`` row of ``extra_rows`` (:func:`elmo_rows`), reused when its ``init.json`` records the same
    settings: backbone, embeddings, tokenizer, embedding size, seed, ELMo SPEC (and the BiLM folder's weights file
    size and time, so a re-trained BiLM is picked up).

    ``models``: the folder of the model folders (default ``out/models``).

    Returns:
        backbone -> the source of its parse trees, for the backbones that compose trees (the Tree-LSTM).
    """
    models = models or out / "models"
    tree_source = {}
    todo = [(b, b, None) for b in args.backbones if b in BASELINES and not args.elmo_rows_only]
    todo += [(row, b, elmo_source) for row, (b, elmo_source) in extra_rows.items()]
    common = dict(
        embeddings=args.embeddings, tokenizer_name=args.tokenizer_name, embedding_dim=args.embedding_dim, seed=args.seed
    )
    for row, b, elmo_source in todo:
        settings = {"backbone": b, **common}
        if elmo_source is not None:
            weights = Path(elmo_source) / "model.safetensors"
            stat = weights.stat() if weights.is_file() else None
            settings.update(elmo=elmo_source, elmo_weights=[stat.st_size, stat.st_mtime_ns] if stat else None)
        marker = models / row / "init.json"
        if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == settings:
            logger.info("%s: reusing %s (initialised with the same settings)", row, marker.parent)
        else:
            init_baseline_model(b, models / row, elmo=elmo_source, **common)
            marker.write_text(json.dumps(settings) + "\n", encoding="utf-8")
        if b == "treelstm":  # GLUE files carry no parse trees: the Tree-LSTM composes latent trees
            tree_source[b] = "latent (Gumbel-softmax, Choi et al. 2018): the GLUE files have no tree column"
    return tree_source


def write_results(out: Path, records: list[dict]) -> None:
    """``results.json``, ``results.md`` and ``results.png`` from the run records (rewritten after every run).

    Records already in ``results.json`` for other (task, backbone, seed) cells are kept, under a file lock, so that
    several invocations (e.g. the baselines and the pretrained rows in parallel) can fill one table."""
    import fcntl

    with open(out / ".results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = out / "results.json"
        old = json.loads(path.read_text(encoding="utf-8"))["runs"] if path.is_file() else []
        mine = {(r["task"], r["backbone"], r.get("seed")) for r in records}
        records = [r for r in old if (r["task"], r["backbone"], r.get("seed")) not in mine] + records
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"runs": records}, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        _write_table(out, records)


def _write_table(out: Path, records: list[dict]) -> None:
    from finetune.tasks import TASK_NAMES

    tasks = sorted(
        dict.fromkeys(r["task"] for r in records), key=lambda t: (TASK_NAMES.index(t) if t in TASK_NAMES else 99, t)
    )
    seen = list(dict.fromkeys(r["backbone"] for r in records))
    # baselines in their usual order, each followed by its +elmo rows, then model folders
    backbones = [r for b in BASELINES for r in [b] * (b in seen) + sorted(r for r in seen if r.startswith(f"{b}+"))]
    backbones += [b for b in seen if b not in backbones]
    cell = median_cells(records)
    metric = {r["task"]: r["metric"] for r in records}

    def fmt(r):
        if r is None:
            return "--"
        if r["value"] is None:
            return "failed"
        seeds = " / ".join(f"{100 * v:.1f}" for v in r["values"]) if len(r["values"]) > 1 else ""
        failed = f", {r['failed']} failed" if r["failed"] else ""
        return f"{100 * r['value']:.2f} ({r['train_runtime_s'] / 60:.1f} min{'; ' + seeds if seeds else ''}{failed})"

    lines = ["| backbone | " + " | ".join(f"{t} {metric[t]}" for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    lines += [f"| {b} | " + " | ".join(fmt(cell.get((t, b))) for t in tasks) + " |" for b in backbones]
    notes = sorted({f"{r['backbone']}: trees {r['tree_source']}" for r in records if "tree_source" in r})
    text = (
        "# GLUE dev results\n\nMetric x 100 on the dev set (training time in minutes); with several seeds the "
        "median, then each seed's value.\n\n" + "\n".join(lines) + "\n" + "".join(f"\n{n}\n" for n in notes)
    )
    (out / "results.md").write_text(text, encoding="utf-8")
    plot_results(out / "results.png", tasks, backbones, cell, metric)


def median_cells(records: list[dict]) -> dict[tuple[str, str], dict]:
    """(task, backbone) -> ``value`` and ``train_runtime_s``: the medians over the cell's successful runs (one per
    seed; ``statistics.median``: the mean of the middle two for an even count), ``values`` (each run's, by seed),
    ``failed`` (how many runs failed). ``value`` is None when every run failed."""
    import statistics

    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["task"], r["backbone"]), []).append(r)
    cells = {}
    for key, runs in groups.items():
        ok = sorted(
            (r for r in runs if "error" not in r and r.get("value") is not None), key=lambda r: r.get("seed") or 0
        )
        cells[key] = {
            "value": statistics.median(r["value"] for r in ok) if ok else None,
            "train_runtime_s": statistics.median(r["train_runtime_s"] for r in ok) if ok else None,
            "values": [r["value"] for r in ok],
            "failed": len(runs) - len(ok),
        }
    return cells


def plot_results(path: Path, tasks, backbones, cell, metric) -> None:
    """Grouped bars: one group per task, one bar per backbone, labelled with the (median) value; with several seeds
    each seed's value as a dot on its bar."""
    from finetune.cells import grouped_bars

    series = {
        b: [(r["value"], r.get("values", ())) if (r := cell.get((t, b))) else None for t in tasks] for b in backbones
    }
    groups = [f"{t}\n({metric[t]})" for t in tasks]
    grouped_bars(path, groups, series, "dev metric x 100", "GLUE dev: classic baselines and pretrained models")


if __name__ == "__main__":
    sys.exit(run_cli(main))
