"""Training curves as a picture: ``curves.png`` beside ``trainer_log.json`` in every run folder.

:func:`write_curves` draws, against the optimizer step, the logged training loss and learning rate
(``trainer_log.json``: the loop's log history) and the evaluation metrics (``eval_history.json``): the
evaluation loss, perplexities in one panel on a log scale (ELMo-style runs: ``forward_perplexity`` and
``backward_perplexity`` beside ``perplexity``), and the task metrics (accuracy, F1, exact match, correlations, ...)
in another. Several runs are overlaid in the same panels, one colour per run, for comparison::

    python -m training.plot outputs/sst2-a outputs/sst2-b --output compare.png

The figure is drawn with matplotlib's Agg canvas (no display needed; nothing is shown). Each panel is
:data:`PANEL_SIZE` inches at :data:`DPI`, up to :data:`MAX_COLUMNS` panels a row, so a figure with ``n`` panels
is ``(PANEL_SIZE[0] * DPI * min(n, 3), PANEL_SIZE[1] * DPI * ceil(n / 3))`` pixels (width, height).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from core.arguments import arg, parse_arguments
from core.errors import InputError, run_cli
from core.files import read_json

#: Files of a run folder read by :func:`load_run`.
LOG_FILE, EVAL_FILE = "trainer_log.json", "eval_history.json"
#: Inches (width, height) of one panel, and the resolution of the PNG.
PANEL_SIZE, DPI, MAX_COLUMNS = (4.8, 3.2), 100, 3
#: Evaluation keys that are bookkeeping, not curves (matched as substrings).
_NOT_CURVES = ("runtime", "samples", "tokens", "_total", "thresh", "per_second", "step")


def load_run(run: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """A run's histories: ``{"name", "log_history": [{step, train_loss, learning_rate, ...}], "eval_history":
    [{step, eval_loss, ...}]}``.

    Args:
        run: a run folder (``trainer_log.json`` and/or ``eval_history.json``), or a mapping with
            ``log_history`` / ``eval_history`` lists (and optionally ``name``), e.g. a training result.

    Raises:
        InputError: a folder with neither file, or an unreadable / malformed history file.
    """
    if isinstance(run, Mapping):
        return {
            "name": str(run.get("name", "run")),
            "log_history": list(run.get("log_history") or []),
            "eval_history": list(run.get("eval_history") or []),
        }
    folder = Path(run)
    histories: dict[str, Any] = {"name": folder.name or str(folder)}
    for key, name in (("log_history", LOG_FILE), ("eval_history", EVAL_FILE)):
        path = folder / name
        if not path.is_file():
            histories[key] = []
            continue
        records = read_json(path, "the history", "the JSON list written by a run")
        if not isinstance(records, list) or not all(isinstance(r, dict) and "step" in r for r in records):
            raise InputError(f"{path}: expected a JSON list of records with a 'step' each")
        histories[key] = records
    if not histories["log_history"] and not histories["eval_history"]:
        raise InputError(
            f"{folder}: no {LOG_FILE} or {EVAL_FILE} with records; expected a run folder (--output_dir of "
            "pretrain, finetune.glue or finetune.squad)"
        )
    return histories


def _series(records: Iterable[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        value = r.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(float(r["step"]))
            ys.append(float(value))
    return xs, ys


def _panels(runs: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, list[str], str]]:
    """``(title, history, keys, y scale)`` of each panel with data, in a fixed order."""
    eval_keys: list[str] = []
    for run in runs:
        for record in run["eval_history"]:
            for key, value in record.items():
                if key not in eval_keys and isinstance(value, (int, float)) and not any(s in key for s in _NOT_CURVES):
                    eval_keys.append(key)
    perplexities = [k for k in eval_keys if "perplexity" in k]
    losses = [k for k in eval_keys if "loss" in k]
    scores = [k for k in eval_keys if k not in perplexities and k not in losses]
    panels = [
        ("training loss", "log_history", ["train_loss"], "linear"),
        ("learning rate", "log_history", ["learning_rate"], "linear"),
        ("evaluation loss", "eval_history", losses, "linear"),
        ("perplexity", "eval_history", perplexities, "log"),
        ("evaluation metrics", "eval_history", scores, "linear"),
    ]
    return [p for p in panels if any(_series(run[p[1]], k)[0] for run in runs for k in p[2])]


def plot_curves(runs: Sequence[str | os.PathLike | Mapping[str, Any]]):
    """A ``matplotlib.figure.Figure`` (Agg canvas) with the curves of ``runs`` overlaid (see the module docstring).

    Every line is one logged series: x = the records' ``step``, y = the value of its key; its label is the key
    (prefixed by the run name when several runs are drawn). Non-finite values are left out.

    Raises:
        InputError: a run without histories (:func:`load_run`), or nothing to plot.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    loaded = [load_run(r) for r in runs]
    if not loaded:
        raise InputError("no run given; expected at least one run folder")
    panels = _panels(loaded)
    if not panels:
        names = ", ".join(r["name"] for r in loaded)
        raise InputError(f"{names}: the histories hold no train_loss, learning_rate or evaluation metric to plot")
    ncols = min(len(panels), MAX_COLUMNS)
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(PANEL_SIZE[0] * ncols, PANEL_SIZE[1] * nrows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    colors = [f"C{i % 10}" for i in range(len(loaded))]
    styles = ["-", "--", ":", "-."]
    for n, (title, history, keys, scale) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, n + 1)
        for run, color in zip(loaded, colors):
            for k, key in enumerate(keys):
                xs, ys = _series(run[history], key)
                if not xs:
                    continue
                label = key if len(loaded) == 1 else f"{run['name']}: {key}"
                ax.plot(
                    xs,
                    ys,
                    color=color if len(loaded) > 1 else f"C{k % 10}",
                    linestyle=styles[k % len(styles)],
                    marker="o" if history == "eval_history" and len(xs) < 30 else None,
                    markersize=3,
                    label=label,
                )
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_yscale(scale)
        ax.grid(True, alpha=0.3)
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        if len(ax.get_lines()) > 1 or len(loaded) > 1 or title == "evaluation metrics":
            ax.legend(fontsize="small")
    if len(loaded) == 1:
        fig.suptitle(loaded[0]["name"])
    return fig


def write_curves(run_dir_or_histories, path: str | os.PathLike):
    """Write ``curves.png`` (or any ``path``) for one run or several overlaid; return the figure.

    Args:
        run_dir_or_histories: a run folder, a mapping with ``log_history`` / ``eval_history`` (e.g. the result of
            :meth:`training.loop.Trainer.train`), or a list of these (overlaid).
        path: the PNG to write (written to a temporary name, then renamed).

    Raises:
        InputError: see :func:`plot_curves`.
    """
    runs = run_dir_or_histories if isinstance(run_dir_or_histories, (list, tuple)) else [run_dir_or_histories]
    fig = plot_curves(runs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from core.files import open_atomic

    with open_atomic(path, "wb") as f:
        fig.savefig(f, dpi=DPI, format="png")
    return fig


@dataclasses.dataclass(frozen=True)
class PlotArguments:
    """``python -m training.plot RUN [RUN ...] --output F.png``."""

    output: str = arg(help="PNG file to write")
    runs: list[str] = arg(
        help="run folder (with trainer_log.json / eval_history.json)", nargs="+", metavar="RUN", positional=True
    )


def main(argv: Sequence[str] | None = None) -> int:
    description = "Plot (and overlay) the training curves of run folders."
    (args,) = parse_arguments([PlotArguments], argv, prog="python -m training.plot", description=description)
    for run in args.runs:
        if not Path(run).is_dir():
            raise InputError(f"{run}: not a folder; expected a run folder (--output_dir of a training run)")
    write_curves(list(args.runs), args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
