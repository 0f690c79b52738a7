"""The bench's phases after the data: the budget into steps, the reference's learning-rate sweep,
pretraining and scoring every run, and the per-run summaries and ratios."""

from __future__ import annotations

import math
from pathlib import Path

from .common import log
from .runs import (
    Run,
    copy_record,
    groups_for,
    per_step_blocks,
    score_run,
    summarize,
    train_groups,
)
from .scoring import ratios_for, scoring_device


def budget_steps(args, pairs: list[tuple[Run, Run]]) -> tuple[int | None, dict[str, int | None]]:
    """``(reference steps, {recipe: steps})`` of a ``--budget_tokens`` budget (ceil(tokens / tokens per step)); with
    ``--budget_minutes`` every run sizes its own schedule in its own process (None steps: ``pretrain
    --time_budget``, the reference's ``--time_budget_s``; :func:`runs.run_command`), and each run's ``budget_s`` is
    set here to the budget."""
    first = [p for p in pairs if p[0].repeat == 0]
    if args.budget_tokens is None:
        for ref, ours in pairs:
            ref.budget_s = ours.budget_s = args.budget_minutes * 60
        return None, {ours.recipe: None for _, ours in first}
    ref_steps = math.ceil(args.budget_tokens / (args.batch_size * args.max_seq_length))
    recipe_steps = {
        ours.recipe: math.ceil(args.budget_tokens / (per_step_blocks(ours, args) * args.max_seq_length))
        for _, ours in first
    }
    return ref_steps, recipe_steps


def reference_sweep(args, data: dict, out: Path, heldout: dict, ref_steps: int | None) -> tuple[float, dict]:
    """The reference's learning rate: the lowest final held-out loss of ``--reference_lrs`` after
    ``--reference_sweep_fraction`` of its steps (with ``--budget_minutes``: of its budget, each sweep run sizing its
    schedule in its process) (2 runs at a time when ``paired``). Returns it and ``{"steps": {lr: steps},
    "final_eval_loss": {lr: loss}}`` (no runs, ``{}``, for one learning rate)."""
    if len(args.reference_lrs) == 1:
        return args.reference_lrs[0], {}
    steps = max(1, round(ref_steps * args.reference_sweep_fraction)) if ref_steps else None
    budget = None if ref_steps else args.budget_minutes * 60 * args.reference_sweep_fraction
    runs = [
        Run(f"sweep lr {lr:g}", "reference", out / "sweep" / f"reference-lr{lr:g}", args.seed, lr=lr, budget_s=budget)
        for lr in args.reference_lrs
    ]
    width = 1 if args.schedule == "sequential" else 2
    groups = [runs[i : i + width] for i in range(0, len(runs), width)]
    length = f"{steps} steps" if steps else f"{budget:g} s of steps"
    log(f"reference learning-rate sweep: {', '.join(f'{lr:g}' for lr in args.reference_lrs)} for {length}")
    train_groups(groups, args, data, out, lambda r: steps, 1)
    finals = {run.lr: score_run(run, args, data, heldout, final_only=True)[-1] for run in runs}
    sweep = {lr: point["eval_loss"] for lr, point in finals.items()}
    return min(sweep, key=sweep.get), {
        "steps": {f"{k:g}": point["step"] for k, point in finals.items()},
        "final_eval_loss": {f"{k:g}": v for k, v in sweep.items()},
    }


def pretrain_and_score(pairs: list[tuple[Run, Run]], args, data: dict, out: Path, heldout: dict) -> dict[str, dict]:
    """Train the runs of ``pairs`` (steps and learning rates already set) group by group per ``args.schedule``, scoring
    each on ``heldout``; return {run name: copy_record}. A run is scored after its group, or on the CPU as soon as
    it has ended while others of its group still run (the reference copy scores itself in its process: our run's
    scoring then takes our run's core, so the machine's load stays that of the pair); never while a run of the
    next group trains."""
    copies: dict[str, dict] = {}

    def score(run: Run) -> None:
        copies[run.name] = copy_record(run, score_run(run, args, data, heldout), out)
        log(
            f"{run.name}: held-out loss {copies[run.name]['final_eval_loss']:.4f} after "
            f"{copies[run.name]['steps']} steps, {copies[run.name]['tokens']:.3g} tokens, "
            f"{copies[run.name]['seconds']:.0f} s"
        )

    def score_early(run: Run) -> None:  # beside a run still training: the threads our run had, not more
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(min(threads, args.threads))
        try:
            score(run)
        finally:
            torch.set_num_threads(threads)

    early = scoring_device().type == "cpu"
    for group in groups_for(args.schedule, pairs):
        on_done = score_early if early and len(group) > 1 else None
        train_groups([group], args, data, out, lambda r: r.steps, args.curve_points, on_done=on_done)
        for run in group:
            if run.name not in copies:
                score(run)
    return copies


def summarize_pairs(args, pairs: list[tuple[Run, Run]], copies: dict[str, dict], unigram: float) -> tuple[dict, dict]:
    """Take the pairs, their scored ``copies`` and the unigram loss; return (runs: the reference's and every recipe's
    summary, ratios: {recipe: ratios_for its pairs})."""
    ref_copies = [copies[ref.name] for ref, _ in pairs]
    runs = {"reference": summarize("reference", [], ref_copies)}
    ratios = {}
    for name, flags in args.recipe_table.items():
        mine = [(copies[ref.name], copies[ours.name]) for ref, ours in pairs if ours.recipe == name]
        runs[name] = summarize("recipe", flags, [o for _, o in mine])
        ratios[name] = ratios_for(mine, unigram)
    return runs, ratios
