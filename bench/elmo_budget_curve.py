"""ELMo features against the BiLM's pretraining budget (issue 31): the ``<backbone>+elmo`` rows of several
``python -m finetune.baselines`` tables, one table per pretrained BiLM, next to the plain rows and the
random-BiLM control (budget 0), as one figure and one markdown table of medians over seeds.

    python bench/elmo_budget_curve.py --table 10=runs/out10/results.json --table 30=runs/out30/results.json \\
        --plain runs/out30/results.json --output_dir runs/curve [--tasks sst2 stsb] [--backbones cnn rnn]

``--table MINUTES=results.json``: the table whose ``<backbone>+elmo`` rows used a BiLM pretrained for MINUTES CPU
minutes; ``--plain``: the table holding the plain ``<backbone>`` rows and the ``<backbone>+elmo-random`` control
(drawn at budget 0). Values are the task's main metric x 100, the median over the recorded seeds
(:func:`finetune.baselines.median_cells`); each seed is a dot. Writes ``curve.png`` and ``curve.md`` into
``--output_dir``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load_runs(path: str | Path) -> list[dict]:
    """The run records of a ``finetune.baselines`` ``results.json``.

    Raises:
        SystemExit: the file is missing or not a results.json (no ``runs`` list), naming the file.
    """
    path = Path(path)
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: {path}: not a finetune.baselines results.json ({e})") from None
    if not isinstance(runs, list):
        raise SystemExit(f"error: {path}: 'runs' is not a list")
    return runs


def curve_points(tables: dict[float, list[dict]], plain: list[dict], tasks, backbones) -> dict:
    """``{(task, backbone): {"plain": cell, "random": cell, "budgets": {minutes: cell}}}`` where a cell is
    :func:`finetune.baselines.median_cells`'s (``value``, ``values`` by seed, ``failed``), or None when absent."""
    from finetune.baselines import median_cells

    plain_cells = median_cells(plain)
    budget_cells = {minutes: median_cells(runs) for minutes, runs in tables.items()}
    out = {}
    for task in tasks:
        for b in backbones:
            out[task, b] = {
                "plain": plain_cells.get((task, b)),
                "random": plain_cells.get((task, f"{b}+elmo-random")),
                "budgets": {m: cells.get((task, f"{b}+elmo")) for m, cells in sorted(budget_cells.items())},
            }
    return out


def _fmt(cell) -> str:
    if not cell or cell["value"] is None:
        return "—"
    seeds = " / ".join(f"{100 * v:.1f}" for v in cell["values"])
    return f"{100 * cell['value']:.1f} ({len(cell['values'])} seeds: {seeds})"


def write_markdown(path: Path, points: dict, budgets: list[float], perplexities: dict[float, str]) -> None:
    """One row per (task, backbone): plain, random control, then each budget's ``+elmo`` median (x 100)."""
    head = ["task", "backbone", "plain", "+elmo-random (0 min)"]
    head += [f"+elmo {m:g} min" + (f" (ppl {perplexities[m]})" if m in perplexities else "") for m in budgets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (task, b), p in points.items():
        row = [task, b, _fmt(p["plain"]), _fmt(p["random"])] + [_fmt(p["budgets"].get(m)) for m in budgets]
        lines.append("| " + " | ".join(row) + " |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def plot(path: Path, points: dict, tasks, backbones, budgets: list[float]) -> None:
    """One panel per task: each backbone's ``+elmo`` median against the budget (0 = the random-BiLM control), seeds
    as dots, its plain row as a dashed line of the same colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for i, b in enumerate(backbones):
            colour = f"C{i}"
            p = points[task, b]
            xs, ys = [], []
            for x, cell in [(0.0, p["random"])] + [(m, p["budgets"].get(m)) for m in budgets]:
                if cell and cell["value"] is not None:
                    xs.append(x)
                    ys.append(100 * cell["value"])
                    ax.scatter(
                        [x] * len(cell["values"]), [100 * v for v in cell["values"]], s=12, color=colour, alpha=0.4
                    )
            ax.plot(xs, ys, "o-", color=colour, label=f"{b}+elmo (0 = random BiLM)")
            if p["plain"] and p["plain"]["value"] is not None:
                ax.axhline(100 * p["plain"]["value"], color=colour, ls="--", lw=1, label=f"{b} (no ELMo)")
        ax.set_title(task)
        ax.set_xlabel("BiLM pretraining budget (CPU minutes)")
        ax.set_ylabel("dev metric x 100 (median of seeds)")
        ax.set_xticks([0.0, *budgets])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", nargs="+", required=True, help="MINUTES=results.json, one per pretrained BiLM")
    parser.add_argument("--plain", required=True, help="results.json with the plain and +elmo-random rows")
    parser.add_argument("--perplexity", nargs="*", default=[], help="MINUTES=PPL: the BiLMs' held-out perplexities")
    parser.add_argument("--tasks", nargs="+", default=["sst2", "stsb"])
    parser.add_argument("--backbones", nargs="+", default=["cnn", "rnn"])
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)
    tables = {}
    for spec in args.table:
        minutes, sep, path = spec.partition("=")
        try:
            budget = float(minutes)
        except ValueError:
            budget = None
        if budget is None or not sep:
            raise SystemExit(f"error: --table {spec}: expected MINUTES=results.json, e.g. 30=out/results.json")
        tables[budget] = load_runs(path)
    perplexities = {float(k): v for k, _, v in (s.partition("=") for s in args.perplexity)}
    points = curve_points(tables, load_runs(args.plain), args.tasks, args.backbones)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    budgets = sorted(tables)
    write_markdown(out / "curve.md", points, budgets, perplexities)
    plot(out / "curve.png", points, args.tasks, args.backbones, budgets)
    print((out / "curve.md").read_text(encoding="utf-8"), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
