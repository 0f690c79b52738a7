"""The outputs: ``results.json``'s protocol block, ``results.md``, ``results.png`` and the ratios printed last."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from .common import MODERN_PRESET_OF, MODERN_SHAPES, SHAPES
from .data import HELDOUT_FILE
from .downstream import CLASSIC_BASELINES, FINETUNE, FINETUNE_MAX_TRAIN_SAMPLES, TASK_METRICS
from .recipes import RECIPES
from .scoring import scoring_device


def write_outputs(results: dict, out: Path) -> None:
    """``results.json``, ``results.md`` and ``results.png`` in ``out`` (the load average now as ``after``)."""
    results["protocol"]["load_average_after"] = os.getloadavg()[0]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (out / "results.md").write_text(results_markdown(results), encoding="utf-8")
    plot_results(results, out / "results.png")


def _reference_protocol(args, lr: float) -> dict:
    """Take the parsed args and the reference's chosen learning rate; return protocol["reference"]."""
    return {
        "model": (
            f"transformers ModernBertForMaskedLM at {MODERN_PRESET_OF[args.model_shape]}'s sizes "
            f"{MODERN_SHAPES[args.model_shape]}, attn_implementation sdpa, ModernBertConfig defaults otherwise "
            "(dense MLM head)"
            if getattr(args, "reference_model", "bert") == "modernbert"
            else "transformers BertForMaskedLM, attn_implementation sdpa, BertConfig defaults otherwise"
        ),
        "collator": "DataCollatorForLanguageModeling(mlm_probability=0.15)",
        "data": "run_mlm group_texts blocks of the documents ([CLS] doc [SEP]), shuffled per epoch",
        "optimizer": "torch AdamW fused, betas (0.9, 0.999), eps 1e-8",
        "weight_decay": args.reference_weight_decay,
        "schedule": "linear decay to 0, no warmup",
        "max_grad_norm": 1.0,
        "mixed_precision": args.reference_mixed_precision,
        "learning_rates_swept": args.reference_lrs,
        "sweep_fraction": args.reference_sweep_fraction,
        "learning_rate": lr,
    }


def _prepared_dataset_protocol(data: dict) -> dict:
    """Take prepare_shared_data's dict; return protocol["prepared_dataset"] (paths and sizes of the blocks)."""
    manifest = data["manifest"]
    return {
        "path": str(data["prepared"]),
        "blocks": manifest["blocks"],
        "tokens": manifest["tokens"],
        "variants": {
            n: {
                "path": str(v["path"]),
                "blocks": v["manifest"]["blocks"],
                "tokens": v["manifest"]["tokens"],
                "document_boundaries": v["manifest"].get("document_boundaries", False),
            }
            for n, v in data["variants"].items()
        },
    }


def _finetune_protocol(args) -> dict:
    """Take the parsed args; return protocol["finetune"] (the fine-tuning settings, per-task caps included)."""
    cap = {
        t: min(x for x in (FINETUNE_MAX_TRAIN_SAMPLES.get(t), args.max_train_samples) if x is not None)
        for t in args.tasks
        if t in FINETUNE_MAX_TRAIN_SAMPLES or args.max_train_samples is not None
    }
    return {
        **FINETUNE,
        "num_train_epochs": args.finetune_epochs,
        "learning_rate": args.finetune_learning_rate,
        "max_seq_length": args.max_seq_length,
        "max_train_samples": cap,
        "seeds": [42 + i for i in range(args.seeds)],
        "tasks": args.tasks,
        "metric": {t: TASK_METRICS[t] for t in args.tasks},
        "mixed_precision": "no",
        "parallel": args.finetune_parallel,
        "statistic": "median over seeds",
    }


def budget_protocol(args, copies: dict[str, dict]) -> dict | str:
    """``protocol``'s ``budget_to_steps``: "tokens / tokens per step", or how each run sized its schedule for the
    wall-clock budget in its own process, with the seconds per step its probe measured (``copies``: the scored
    runs' :func:`runs.copy_record`)."""
    if args.budget_tokens is not None:
        return "tokens / tokens per step"
    return {
        "how": "each run in its own process: max(1, floor(budget / the mean seconds of a probe step)), the probe "
        "timed on a copy of the model (ours: pretrain --time_budget, 10 steps, 2 untimed; the reference: "
        "--time_budget_s, --probe_steps, --probe_warmup untimed)",
        "budget_seconds": args.budget_minutes * 60,
        "reference_probe_steps": args.probe_steps,
        "reference_probe_warmup": args.probe_warmup,
        "seconds_per_step": {n: (c.get("budget") or {}).get("seconds_per_step") for n, c in copies.items()},
    }


def size_label(proto: dict) -> str:
    """The size the titles name: ``--model_shape`` (a BERT shape), or with ``--reference_model modernbert`` the
    modern preset of its width that both sides train (``"modernbert-tiny (bert-tiny width)"``)."""
    shape = proto["model_shape"]
    if proto.get("reference_model") == "modernbert" and shape in MODERN_PRESET_OF:
        return f"{MODERN_PRESET_OF[shape]} ({shape} width)"
    return shape


def protocol(args, data: dict, lr: float, steps: dict, budget: dict | str, load_before: float) -> dict:
    """The ``protocol`` block of ``results.json``: every setting the figures depend on (``steps``: ``{run: steps}``,
    ``budget``: :func:`budget_protocol`)."""
    import torch
    import transformers

    manifest = data["manifest"]
    return {
        "budget_minutes": args.budget_minutes,
        "budget_tokens": args.budget_tokens,
        "model_shape": args.model_shape,
        "shape": SHAPES[args.model_shape],
        "reference_model": getattr(args, "reference_model", "bert"),
        "vocab_size": manifest["tokenizer_size"],
        "max_seq_length": args.max_seq_length,
        "batch_size": args.batch_size,
        "tokens_per_step": args.batch_size * args.max_seq_length,
        "schedule": args.schedule,
        "threads_per_run": args.threads,
        "repeats": args.repeats,
        "pretraining_seeds": [args.seed + r for r in range(args.repeats)],
        "curve_points": args.curve_points,
        "budget_to_steps": budget,
        "steps": steps,
        "reference": _reference_protocol(args, lr),
        "recipes": {
            n: {"flags": f, "note": RECIPES.get(n, {}).get("note", "--recipe_flags")}
            for n, f in args.recipe_table.items()
        },
        "default_recipe": args.default_recipe,
        "prepared_dataset": _prepared_dataset_protocol(data),
        "finetune": _finetune_protocol(args),
        "random_inits": [f"random-{k}" for k in args.random_inits],
        "heldout": {
            "file": str(Path(args.output_dir) / HELDOUT_FILE),
            "seed": args.heldout_seed,
            "mlm_probability": 0.15,
            "mask_replace_prob": 0.8,
            "random_replace_prob": 0.1,
            "blocks": "one document per block, [CLS] chunk [SEP], <= max_seq_length tokens",
            "score": "mean cross-entropy (nats) over masked positions, full logits, eval mode",
        },
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "mixed_precision": {
            "reference": args.reference_mixed_precision,
            "ours": args.mixed_precision or "pretrain default",
        },
        "preprocessing_num_workers": args.preprocessing_num_workers,
        "scoring": "reference: in its own process at its save steps; ours: checkpoints in the bench process; "
        f"both on {scoring_device()}",
        "cpu_count": os.cpu_count(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "load_average_before": load_before,
    }


def _fmt(value, spec: str = ".3f", none: str = "--") -> str:
    return none if value is None else format(value, spec)


def _md_ratio_lines(results: dict) -> list[str]:
    """Take results.json's dict; return results.md's title, held-out summary and ratios table, as lines."""
    proto, ratios = results["protocol"], results["ratios"]
    budget = (
        f"{proto['budget_minutes']:g} minutes"
        if proto["budget_minutes"] is not None
        else f"{proto['budget_tokens']:,} tokens"
    )
    lines = [
        f"# Time to quality: {size_label(proto)}, {budget} per run",
        "",
        f"Unigram held-out loss {results['unigram_loss']:.4f} nats; held-out set {results['heldout']['blocks']} "
        f"blocks, {results['heldout']['masked']} masked tokens "
        f"(sha256 `{results['heldout_sha256'][:16]}...`).",
        "",
        f"## Ratios (default recipe: {ratios['default_recipe']})",
        "",
        f"Each recipe against its paired reference copy. The two ratios are medians over {proto['repeats']} "
        "repeat(s) (every repeat in results.json); the other columns are repeat 0's.",
        "",
        "| recipe | quality per token | at tokens | loss ours / reference there | time to quality | target loss "
        "| reference s | ours s to target | tokens to quality | reference tokens | ours tokens to target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in ratios["by_recipe"].items():
        if r.get("not_applicable"):
            lines.append(f"| {name} | n/a | | | n/a | | | {r['not_applicable']} | n/a | | |")
            continue
        reached = (
            "not reached"
            if r["seconds_to_target"] is None
            else f"{r['seconds_to_target']:.0f}" + (" (<= first point)" if r["reached_by_first_point"] else "")
        )
        tokens = (
            "not reached"
            if r["tokens_to_target"] is None
            else f"{r['tokens_to_target']:.3g}" + (" (<= first point)" if r["tokens_reached_by_first_point"] else "")
        )
        qpt = _fmt(r["quality_per_token"], ".3f", "-- (reference not below unigram)")
        lines.append(
            f"| {name} | {qpt} | {r['tokens_compared']:.3g} | "
            f"{r['loss_at_tokens']['ours']:.4f} / {r['loss_at_tokens']['reference']:.4f} | "
            f"{_fmt(r['time_to_quality'], '.2f', 'not reached')} | {r['target_loss']:.4f} | "
            f"{r['reference_seconds']:.0f} | {reached} | {_fmt(r['tokens_to_quality'], '.2f', 'not reached')} | "
            f"{r['reference_tokens']:.3g} | {tokens} |"
        )
    return lines


def _md_runs_lines(runs: dict, tasks: list[str]) -> list[str]:
    """Take results["runs"] and the fine-tuning tasks; return results.md's "Runs" section, as lines."""
    head = "| run | lr | steps | tokens | train s | tokens/s | held-out loss |" + "".join(f" {t} |" for t in tasks)
    lines = [
        "",
        "## Runs",
        "",
        "Medians over copies (the reference: one copy per recipe and repeat); downstream: "
        "median over fine-tuning seeds, metric x 100.",
        "",
        head,
        "|---" * (7 + len(tasks)) + "|",
    ]
    for name, run in runs.items():
        down = run.get("downstream", {})
        cells = [
            _fmt(run.get("learning_rate"), "g"),
            _fmt(run.get("steps"), ".0f"),
            _fmt(run.get("tokens"), ".3g"),
            _fmt(run.get("seconds"), ".0f"),
            _fmt(run.get("tokens_per_second"), ".0f"),
            _fmt(run.get("final_eval_loss"), ".4f")
            + (" (generator)" if run.get("heldout_model") == "generator" else ""),
        ]
        cells += [_fmt(None if down.get(t) is None else 100 * down[t], ".1f") for t in tasks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _md_pretraining_buys_lines(buys: dict, tasks: list[str]) -> list[str]:
    """Take results["pretraining_buys"] (non-empty) and the tasks; return the "What pretraining buys" section."""
    lines = [
        "",
        "## What pretraining buys (metric x 100)",
        "",
        "| run | " + " | ".join(f"{t}: vs random init | {t}: vs best classic" for t in tasks) + " |",
        "|---" * (1 + 2 * len(tasks)) + "|",
    ]
    for name, per in buys.items():
        cells = []
        for t in tasks:
            b = per.get(t, {})
            vs_init = None if b.get("vs_random_init") is None else 100 * b["vs_random_init"]
            vs_best = None if b.get("vs_best_classic") is None else 100 * b["vs_best_classic"]
            cells += [
                f"{_fmt(vs_init, '+.1f')} ({b.get('random_init') or '--'})",
                f"{_fmt(vs_best, '+.1f')} ({b.get('best_classic') or 'no baselines'})",
            ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _md_protocol_lines(results: dict) -> list[str]:
    """Take results.json's dict; return results.md's "Protocol" and "Command" sections, as lines."""
    proto = results["protocol"]
    ft = proto["finetune"]
    lines = [
        "",
        "## Protocol",
        "",
        f"- shape {proto['model_shape']} {proto['shape']}, vocabulary {proto['vocab_size']}, batch "
        f"{proto['batch_size']} x {proto['max_seq_length']} = {proto['tokens_per_step']} tokens per step; "
        f"steps {proto['steps']}",
        f"- schedule `{proto['schedule']}`, {proto['threads_per_run']} thread(s) per run, {proto['repeats']} "
        f"repeat(s), seeds {proto['pretraining_seeds']}; budget to steps: {proto['budget_to_steps']}",
        f"- reference: {proto['reference']['model']}; {proto['reference']['collator']}; "
        f"{proto['reference']['data']}; {proto['reference']['optimizer']}, weight decay "
        f"{proto['reference']['weight_decay']}, {proto['reference']['schedule']}, clip 1.0, mixed precision "
        f"{proto['reference']['mixed_precision']}; learning rate {proto['reference']['learning_rate']:g} of "
        f"{proto['reference']['learning_rates_swept']} (sweep {results['sweep'] or 'none'})",
        *[
            f"- recipe `{n}`: `{' '.join(r['flags']) or '(no flags)'}` -- {r['note']}"
            for n, r in proto["recipes"].items()
        ],
        f"- fine-tuning: `python -m finetune.glue`, lr {ft['learning_rate']:g}, batch "
        f"{ft['per_device_train_batch_size']}, {ft['num_train_epochs']:g} epochs, warmup ratio "
        f"{ft['warmup_ratio']}, weight decay {ft['weight_decay']}, max_seq_length {ft['max_seq_length']}, "
        f"training caps {ft['max_train_samples']}, seeds {ft['seeds']}, {ft['statistic']}; random inits "
        f"{proto['random_inits']}",
        f"- device {proto['device']} ({proto['cpu_count']} cores), load average "
        f"{proto['load_average_before']:.1f} before, {proto.get('load_average_after', float('nan')):.1f} after; "
        f"wall seconds per phase {results['timings']}",
        "",
        "## Command",
        "",
        "```",
        shlex.join(results["command"]),
        "```",
        "",
    ]
    return lines


def results_markdown(results: dict) -> str:
    """``results.md``: the ratios, a table per run, what pretraining buys, the protocol and the command."""
    tasks = results["protocol"]["finetune"]["tasks"]
    lines = _md_ratio_lines(results) + _md_runs_lines(results["runs"], tasks)
    if results["pretraining_buys"]:
        lines += _md_pretraining_buys_lines(results["pretraining_buys"], tasks)
    lines += _md_protocol_lines(results)
    return "\n".join(lines)


def _plot_loss_panel(ax, key: str, label: str, results: dict, recipes: dict, colors: dict) -> None:
    """Draw held-out loss vs ``key`` ("seconds" or "tokens", x label ``label``) on ``ax``: the ``recipes`` runs in
    ``colors``, the reference copies and the unigram/untrained/target levels of ``results``; returns None."""
    runs = results["runs"]
    for name, run in recipes.items():
        generator = run.get("heldout_model") == "generator"  # an RTD run: its generator's MLM loss
        ax.plot(
            [p[key] for p in run["curve"]],
            [p["eval_loss"] for p in run["curve"]],
            marker="x" if generator else "o",
            markersize=3,
            linestyle=":" if generator else "-",
            color=colors[name],
            label=f"{name} (lr {run['learning_rate']:g})" + (": generator's MLM loss" if generator else ""),
        )
    # the reference: vs seconds each recipe's paired copy (dashed, the recipe's colour: its time-to-quality
    # partner); vs tokens one copy (the copies of a repeat share the trajectory)
    copies = [c for c in runs.get("reference", {}).get("copies", []) if c["repeat"] == 0]
    copies = list({c["name"]: c for c in reversed(copies)}.values())[::-1]  # --schedule shared: one run, once
    for copy in copies if key == "seconds" else copies[:1]:
        paired = next((n for n in recipes if copy["paired_with"] == n or copy["name"].endswith("@" + n)), None)
        ax.plot(
            [p[key] for p in copy["curve"]],
            [p["eval_loss"] for p in copy["curve"]],
            marker="o",
            markersize=3,
            linestyle="--",
            color=colors.get(paired, "black") if key == "seconds" else "black",
            label=f"reference (lr {copy['learning_rate']:g})" + (f", paired with {paired}" if key == "seconds" else ""),
        )
    ax.axhline(results["unigram_loss"], color="gray", linestyle=":", label="unigram plateau")
    if "random-sesame" in runs:
        ax.axhline(
            runs["random-sesame"]["final_eval_loss"],
            color="tab:red",
            linestyle=":",
            linewidth=0.8,
            label="random init (untrained)",
        )
    if copies:
        ax.axhline(
            copies[0]["final_eval_loss"],
            color="black",
            linewidth=0.6,
            linestyle="-.",
            label="reference final (target)",
        )
    ax.set_xlabel(label)
    ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    ax.set_ylabel("held-out MLM loss (nats)")
    ax.grid(alpha=0.3)


def _plot_downstream_panel(ax, results: dict, tasks: list[str], colors: dict) -> None:
    """Draw the downstream medians of ``results`` per task in ``tasks`` as grouped bars on ``ax`` (run colours from
    ``colors``), with the best classic baseline marked; returns None."""
    runs = results["runs"]
    names = [n for n, r in runs.items() if r.get("downstream")]
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(tasks))]
        ys = [100 * (runs[name]["downstream"].get(t) or 0.0) for t in tasks]
        color = colors.get(name, {"reference": "0.3", "random-sesame": "0.7"}.get(name, "0.5"))
        ax.bar_label(ax.bar(xs, ys, width, label=name, color=color), fmt="%.1f", fontsize=6, padding=1)
    for i, t in enumerate(tasks):
        best = max((v for b, v in results["baselines"].get(t, {}).items() if b in CLASSIC_BASELINES), default=None)
        if best is not None:
            ax.hlines(
                100 * best,
                i - 0.45,
                i + 0.45,
                color="black",
                linewidth=1.2,
                label="best classic baseline" if i == 0 else None,
            )
    labels = [t + "\n(" + TASK_METRICS[t].replace("_", "\n") + ")" for t in tasks]  # matthews\ncorrelation
    ax.set_xticks(range(len(tasks)), labels)
    ax.set_ylabel("GLUE dev metric x 100 (median over seeds)")
    ax.set_title("downstream after fine-tuning")
    ax.axhline(0, color="black", linewidth=0.5)


def plot_results(results: dict, path: Path) -> None:
    """``results.png``: held-out loss vs training seconds and vs tokens (every trained run's first copy, the unigram
    level, the untrained level, the reference's final loss), and the downstream medians as grouped bars (the best
    classic baseline marked)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: the process's backend stays as it is
    from matplotlib.figure import Figure

    runs, tasks = results["runs"], results["protocol"]["finetune"]["tasks"]
    fig = Figure(figsize=(16, 6.0))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3 if tasks else 2)
    recipes = {n: r for n, r in runs.items() if r.get("kind") == "recipe"}
    colors = {n: f"C{i}" for i, n in enumerate(recipes)}
    for ax, key, label in ((axes[0], "seconds", "training seconds"), (axes[1], "tokens", "training tokens")):
        _plot_loss_panel(ax, key, label, results, recipes, colors)
    axes[0].set_title("held-out loss vs training seconds")
    axes[1].set_title("held-out loss vs tokens")
    if tasks:
        _plot_downstream_panel(axes[2], results, tasks, colors)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:  # the bar panel is empty before fine-tuning
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    proto = results["protocol"]
    budget = (
        f"{proto['budget_minutes']:g} min"
        if proto["budget_minutes"] is not None
        else f"{proto['budget_tokens']:,} tokens"
    )
    fig.suptitle(f"time to quality: {size_label(proto)}, {budget} per run, schedule {proto['schedule']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_ratios(results: dict) -> None:
    """The summary lines, the default recipe's ratios last."""
    for name, run in results["runs"].items():
        if "steps" in run:
            which = " (generator)" if run.get("heldout_model") == "generator" else ""
            print(
                f"{name:24s} held-out loss {run['final_eval_loss']:.4f}{which}  {run['steps']:.0f} steps  "
                f"{run['tokens']:.3g} tokens  {run['seconds']:.0f} s  {run['tokens_per_second']:.0f} tokens/s"
            )
    print(f"unigram loss {results['unigram_loss']:.4f}")
    ratios = results["ratios"]
    for name, r in ratios["by_recipe"].items():
        if r.get("not_applicable"):
            print(f"{name}: no quality per token / time to quality: {r['not_applicable']}")
        elif name != ratios["default_recipe"]:
            qpt = _fmt(r["quality_per_token"], ".3f", "None (reference not below unigram)")
            print(
                f"{name}: quality per token {qpt}, time to quality {_fmt(r['time_to_quality'], '.2f', 'not reached')}, "
                f"tokens to quality {_fmt(r['tokens_to_quality'], '.2f', 'not reached')}"
            )
    r = ratios["by_recipe"][ratios["default_recipe"]]
    if r.get("not_applicable"):
        return
    print(
        f"{ratios['default_recipe']} vs reference: quality per token "
        f"{_fmt(r['quality_per_token'], '.3f', 'None (reference not below unigram)')} "
        f"(at {r['tokens_compared']:.3g} tokens); time to quality {_fmt(r['time_to_quality'], '.2f', 'not reached')} "
        f"(target {r['target_loss']:.4f}: reference {r['reference_seconds']:.0f} s, ours "
        + ("not reached)" if r["seconds_to_target"] is None else f"{r['seconds_to_target']:.0f} s)")
        + f"; tokens to quality {_fmt(r['tokens_to_quality'], '.2f', 'not reached')}"
    )
