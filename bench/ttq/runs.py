"""Training runs: a reference copy or a recipe run (:class:`Run`), its child command, groups of runs started
together, its training times and its scored curve."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .common import SCRIPT, BenchError, Job, child_env, flag_value, log, run_jobs
from .data import HELDOUT_FILE
from .recipes import data_variant, materialize_configs
from .reference import reference_log
from .scoring import (
    CheckpointScorer,
    heldout_loss,
    load_mlm,
    scored_by_generator,
    scoring_device,
    times_from_trainer_log,
)


@dataclass
class Run:
    """One training process: a recipe copy or a reference copy (``lr`` set), in ``folder``."""

    name: str
    kind: str  # "recipe" | "reference"
    folder: Path
    seed: int
    recipe: str = ""  # the recipe of a recipe run, or the one a reference copy is paired with
    steps: int = 0
    flags: list[str] = field(default_factory=list)
    lr: float | None = None
    repeat: int = 0
    budget_s: float | None = None  # seconds of steps, when the run sizes its own schedule (``steps`` 0)
    paired_with: str | None = None


def save_steps(steps: int, points: int) -> list[int]:
    """The checkpoint steps of a run: every ceil(steps / points) steps, and the last step."""
    every = max(1, math.ceil(steps / points))
    return sorted({*range(every, steps + 1, every), steps})


def checkpoint_fraction(points: int) -> float:
    """``--checkpointing_steps`` as a fraction of a run whose length ``pretrain`` finds itself (``--time_budget``):
    the float below 1 whose decimal ``repr`` (what ``training.plan.resolve_interval`` multiplies, exactly) is the
    largest not above ``1 / points`` (``1 - 2**-53`` for one point: only the last step), so that the loop's
    ``ceil(fraction x steps)`` is :func:`save_steps`' ``ceil(steps / points)`` for every run under 10**14 steps
    (tested)."""
    from fractions import Fraction

    exact = Fraction(1, points)
    value = math.nextafter(1.0, 0.0) if points == 1 else 1.0 / points
    while Fraction(repr(value)) > exact:
        value = math.nextafter(value, 0.0)
    return value


#: ``--eval_steps`` of our runs: never within the run (pretrain evaluates before the first and after the last step).
NO_PERIODIC_EVAL = 10**9


def _reference_command(run: Run, args, data: dict, steps: int | None, points: int) -> list[str]:
    """The ``_reference`` child command of a reference run: ``steps`` optimizer steps and its :func:`save_steps`,
    or (None) the run's ``budget_s`` seconds, sized in its process (``--time_budget_s``, ``--save_points``)."""
    length = ["--max_train_steps", str(steps)] if steps else ["--time_budget_s", repr(run.budget_s)]
    saves = ["--save_steps", *map(str, save_steps(steps, points))] if steps else ["--save_points", str(points)]
    return [
        sys.executable,
        str(SCRIPT),
        "_reference",
        "--blocks",
        str(data["reference_blocks"]),
        "--tokenizer",
        str(data["tokenizer"]),
        "--model_shape",
        args.model_shape,
        "--reference_model",
        getattr(args, "reference_model", "bert"),
        "--learning_rate",
        str(run.lr),
        *length,
        "--probe_steps",
        str(args.probe_steps),
        "--probe_warmup",
        str(args.probe_warmup),
        "--batch_size",
        str(args.batch_size),
        "--seed",
        str(run.seed),
        *saves,
        "--weight_decay",
        str(args.reference_weight_decay),
        "--mixed_precision",
        args.reference_mixed_precision,
        "--threads",
        str(args.threads),
        "--heldout",
        str(Path(args.output_dir) / HELDOUT_FILE),
        *(["--save_checkpoints"] if args.keep_checkpoints else []),
        "--output_dir",
        str(run.folder),
    ]


def pretrain_length_flags(run: Run, steps: int | None, points: int) -> list[str]:
    """``pretrain``'s run-length flags of our run: ``steps`` steps, or (None) ``--time_budget`` of the run's
    ``budget_s``; checkpoints (all kept) every ``ceil(steps / points)`` steps (:func:`checkpoint_fraction` of the
    run under a time budget) and at the end, a log record at each of them (every step under a time budget), the
    run's own evaluation only before the first and after the last step."""
    if steps:
        every = max(1, math.ceil(steps / points))
        length = ["--max_train_steps", str(steps), "--checkpointing_steps", str(every), "--logging_steps", str(every)]
        evals = steps + 1
    else:
        fraction = repr(checkpoint_fraction(points))
        length = ["--time_budget", repr(run.budget_s / 60), "--checkpointing_steps", fraction, "--logging_steps", "1"]
        evals = NO_PERIODIC_EVAL
    return [*length, "--checkpoints_total_limit", "0", "--eval_steps", str(evals)]


def run_command(run: Run, args, data: dict, steps: int | None, points: int) -> list[str]:
    """The child command of ``run`` for ``steps`` optimizer steps, or (``steps`` None) for its ``budget_s`` seconds
    of steps, the run sizing its schedule in its own process: ours ``pretrain --time_budget`` (checkpoints every
    :func:`checkpoint_fraction` of the run, a log record every step so that every checkpoint step has its training
    time), the reference ``--time_budget_s``."""
    if run.kind == "reference":
        return _reference_command(run, args, data, steps, points)
    prepared = data["variants"][data_variant(run.flags)]["path"]
    return [
        sys.executable,
        "-m",
        "pretrain",
        "--prepared_dataset",
        str(prepared),
        "--config_name",
        args.model_shape,
        "--per_device_train_batch_size",
        str(args.batch_size),
        *(["--mixed_precision", args.mixed_precision] if args.mixed_precision else []),
        *materialize_configs(run.flags, run.folder.parent),
        "--output_dir",
        str(run.folder),
        "--overwrite_output_dir",
        *pretrain_length_flags(run, steps, points),
        "--seed",
        str(run.seed),
        "--max_eval_samples",
        "32",
        "--report_to",
        "none",
    ]


def per_step_blocks(run: Run, args) -> int:
    """Blocks per optimizer step of ``run`` (its recipe's batch x accumulation, else ``--batch_size``)."""
    if run.kind == "reference":
        return args.batch_size
    batch = int(flag_value(run.flags, "--per_device_train_batch_size", str(args.batch_size)))
    return batch * int(flag_value(run.flags, "--gradient_accumulation_steps", "1"))


def step_times(run: Run, args, data: dict) -> dict[int, dict]:
    """``{step: {"seconds", "tokens"}}`` cumulative training time and tokens of a finished run (see the docstring)."""
    if run.kind == "reference":
        records = reference_log(run.folder)["steps"]
        return {r["step"]: {"seconds": r["seconds"], "tokens": r["tokens"]} for r in records}
    path = run.folder / "trainer_log.json"
    if not path.is_file():
        raise BenchError(f"{run.name}: no {path}; expected pretrain's run files")
    manifest = data["variants"][data_variant(run.flags)]["manifest"]
    return times_from_trainer_log(
        json.loads(path.read_text(encoding="utf-8")), manifest["blocks"]["train"], per_step_blocks(run, args)
    )


def groups_for(schedule: str, pairs: list[tuple[Run, Run]]) -> list[list[Run]]:
    """Runs started together: each (reference copy, recipe) pair at once (``paired``); one at a time, per repeat
    its first reference copy and then every recipe (``sequential``: a copy alone has the same seed, steps and
    conditions as the others of its repeat, so one serves them all; :func:`shared_copies` fills them in); or per
    repeat its first pair, then the other recipes two at a time without reference copies (``shared``, likewise)."""
    if schedule == "paired":
        return [list(p) for p in pairs]
    if schedule == "sequential":
        groups, seen = [], set()
        for ref, ours in pairs:
            if ref.repeat not in seen:
                seen.add(ref.repeat)
                groups.append([ref])
            groups.append([ours])
        return groups
    groups = []
    for repeat in sorted({ours.repeat for _, ours in pairs}):
        mine = [p for p in pairs if p[1].repeat == repeat]
        rest = [ours for _, ours in mine[1:]]
        groups += [list(mine[0])] + [rest[i : i + 2] for i in range(0, len(rest), 2)]
    return groups


def shared_copies(pairs: list[tuple[Run, Run]], copies: dict[str, dict]) -> None:
    """``--schedule shared``: every reference copy that did not run is its repeat's run (the same seed and steps:
    the same trajectory; its seconds were measured beside the first recipe only)."""
    ran = {ref.repeat: copies[ref.name] for ref, _ in pairs if ref.name in copies}
    for ref, _ in pairs:
        copies.setdefault(ref.name, {**ran[ref.repeat], "paired_with": f"{ran[ref.repeat]['paired_with']} (shared)"})


def _length(steps: int | None, run: Run) -> str:
    """A run's length for the log: its steps, or its time budget."""
    return f"{steps} steps" if steps else f"{run.budget_s:g} s of steps, sized in its process"


#: What ``pretrain`` logs once its set-up is done, right before its first step (docs/pretraining.md: "the run plan").
RUN_PLAN_LINE = "run plan:"


def train_groups(groups: list[list[Run]], args, data: dict, out: Path, steps_of, points: int, on_done=None):
    """Run each group's runs at the same time (``--threads`` threads each), group after group. In a group with a
    recipe run, the reference copies wait (``--start_file``) until the recipe has logged its run plan (or ended), so
    that both start their first step together rather than the reference training during ``pretrain``'s start-up.
    ``on_done(run)``, if given, is called as soon as a run has ended, while the others of its group go on."""
    for group in groups:
        jobs, start = [], None
        recipe = next((r for r in group if r.kind == "recipe"), None)
        for run in group:
            cmd = run_command(run, args, data, steps_of(run), points)
            if run.kind == "reference" and recipe is not None:
                start = out / "logs" / f".start-{run.folder.name}"
                start.unlink(missing_ok=True)
                cmd += ["--start_file", str(start)]
            jobs.append(
                Job(
                    f"{run.name} (train)",
                    cmd,
                    out / "logs" / f"{run.folder.name}.log",
                    child_env(args.threads),
                )
            )
        log("  ".join(f"{j.name}: {_length(steps_of(r), r)}" for j, r in zip(jobs, group)))
        on_poll = None
        if start is not None:
            recipe_job = jobs[group.index(recipe)]

            def on_poll(start=start, recipe_job=recipe_job):
                if not start.exists() and (
                    recipe_job.returncode is not None
                    or RUN_PLAN_LINE in recipe_job.log.read_text(encoding="utf-8", errors="replace")
                ):
                    start.touch()

        done = None if on_done is None else (lambda job, group=group, jobs=jobs: on_done(group[jobs.index(job)]))
        run_jobs(jobs, parallel=len(jobs), on_poll=on_poll, on_done=done)
        if start is not None:
            start.unlink(missing_ok=True)


def learning_rate_of(run: Run, out: Path) -> float | None:
    """The run's peak learning rate: the reference's, a recipe's ``--learning_rate``, else the one ``pretrain``'s
    run plan line logged ("learning rate X (source)")."""
    if run.lr is not None:
        return run.lr
    given = flag_value(run.flags, "--learning_rate")
    if given is not None:
        return float(given)
    text = (out / "logs" / f"{run.folder.name}.log").read_text(encoding="utf-8", errors="replace")
    found = re.search(r"learning rate ([0-9.eE+-]+) \(", text)
    return float(found.group(1)) if found else None


def score_run(run: Run, args, data: dict, heldout: dict, final_only: bool = False) -> list[dict]:
    """The run's curve: ``[{"seconds", "tokens", "step", "eval_loss"}]`` at its checkpoints (the last only with
    ``final_only``), scored by :func:`heldout_loss`: a reference run's scores as its own process logged them (it
    scores its live model at its save steps, :func:`reference_main`), a recipe run's checkpoints in this process on
    the scoring device (:class:`CheckpointScorer`); the checkpoints are removed unless ``--keep_checkpoints``.

    Raises:
        BenchError: a scored step without a logged training time.
    """
    times = step_times(run, args, data)
    folder = run.folder / "checkpoints"
    logged = {}
    if run.kind == "reference":
        logged = {int(k): v for k, v in reference_log(run.folder).get("scores", {}).items()}
    if logged:
        steps = sorted(logged)
    else:
        steps = sorted(int(p.name.split("_")[1]) for p in folder.glob("step_*")) if folder.is_dir() else []
    if final_only:
        steps = steps[-1:]
    curve, scorer = [], None
    for step in steps:
        if step not in times:
            raise BenchError(f"{run.name}: no training time logged at checkpoint step {step}")
        if step in logged:
            loss = logged[step]
        elif run.kind == "reference":
            loss = heldout_loss(load_mlm(folder / f"step_{step}").to(scoring_device()), heldout)
        else:
            scorer = scorer or CheckpointScorer(run.folder)
            loss = scorer.score(folder / f"step_{step}" / "model.safetensors", heldout)
        curve.append(
            {"seconds": times[step]["seconds"], "tokens": times[step]["tokens"], "step": step, "eval_loss": loss}
        )
    if not args.keep_checkpoints and folder.is_dir():
        shutil.rmtree(folder)
    return curve


def budget_record(run: Run) -> dict | None:
    """How a run that sized its own schedule did it: ``{"seconds_per_step", "max_train_steps"}`` of its probe (the
    reference's ``reference_log.json`` ``budget``; ours: ``pretrain``'s ``run_config.json``); None for a run given
    its steps."""
    if run.kind == "reference":
        budget = reference_log(run.folder).get("budget") or {}
        per_step = budget.get("seconds_per_step")
    else:
        path = run.folder / "run_config.json"
        budget = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        per_step = budget.get("time_budget_seconds_per_step")
    return None if per_step is None else {"seconds_per_step": per_step, "max_train_steps": budget["max_train_steps"]}


def copy_record(run: Run, curve: list[dict], out: Path) -> dict:
    """The ``copies`` entry of a scored run."""
    last = curve[-1]
    return {
        "name": run.folder.name,
        "repeat": run.repeat,
        "seed": run.seed,
        "paired_with": run.paired_with,
        "heldout_model": "generator" if run.kind == "recipe" and scored_by_generator(run.folder) else "model",
        "final_eval_loss": last["eval_loss"],
        "tokens": last["tokens"],
        "seconds": last["seconds"],
        "steps": last["step"],
        "tokens_per_second": last["tokens"] / max(last["seconds"], 1e-9),
        "learning_rate": learning_rate_of(run, out),
        "budget": budget_record(run),
        "curve": curve,
    }


def summarize(kind: str, flags, copies: list[dict]) -> dict:
    """A ``runs`` entry: medians over ``copies``, the first copy's curve."""
    med = {
        k: statistics.median(c[k] for c in copies)
        for k in ("final_eval_loss", "tokens", "seconds", "steps", "tokens_per_second")
    }
    return {
        "kind": kind,
        "flags": flags,
        **med,
        "learning_rate": copies[0]["learning_rate"],
        "heldout_model": copies[0].get("heldout_model", "model"),
        "curve": copies[0]["curve"],
        "copies": copies,
    }


def plan_pairs(args, out: Path) -> list[tuple[Run, Run]]:
    """(reference copy, recipe run) for every repeat and recipe, in run order."""
    pairs = []
    for r in range(args.repeats):
        for name, flags in args.recipe_table.items():
            suffix = f"-r{r}" if args.repeats > 1 else ""
            ours = Run(
                f"{name}{suffix}",
                "recipe",
                out / "runs" / f"{name}{suffix}",
                args.seed + r,
                name,
                flags=flags,
                repeat=r,
            )
            ref = Run(
                f"reference{suffix}@{name}",
                "reference",
                out / "runs" / f"reference{suffix}@{name}",
                args.seed + r,
                name,
                repeat=r,
                paired_with=ours.name,
            )
            ours.paired_with = ref.name
            pairs.append((ref, ours))
    return pairs
