"""training.plot: the plotted series are the logged ones, the PNG has the size the layout gives, runs overlay."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from core.errors import InputError, run_cli
from training import plot


def _write_run(folder: Path, *, elmo: bool = False, shift: float = 0.0) -> tuple[list[dict], list[dict]]:
    folder.mkdir(parents=True, exist_ok=True)
    log = [
        {
            "step": s,
            "train_loss": 3.0 / s + shift,
            "learning_rate": 1e-3 * min(1.0, s / 4) * (1 - s / 40),
            "grad_norm": 1.0,
            "tokens_per_second": 100.0,
            "epoch": s / 10,
        }
        for s in range(1, 21)
    ]
    evals = []
    for s in (0, 10, 20):
        record = {"step": s, "eval_loss": 2.5 - 0.05 * s + shift, "eval_runtime_s": 0.3}
        if elmo:
            record.update(
                perplexity=math.exp(record["eval_loss"]),
                forward_perplexity=math.exp(record["eval_loss"] + 0.1),
                backward_perplexity=math.exp(record["eval_loss"] - 0.1),
            )
        else:
            record.update(eval_accuracy=0.5 + 0.02 * s, eval_macro_f1=0.4 + 0.02 * s)
        evals.append(record)
    (folder / "trainer_log.json").write_text(json.dumps(log))
    (folder / "eval_history.json").write_text(json.dumps(evals))
    return log, evals


def _lines(fig) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    return {
        (ax.get_title(), line.get_label()): (list(line.get_xdata()), list(line.get_ydata()))
        for ax in fig.axes
        for line in ax.get_lines()
    }


def test_plotted_series_are_the_logged_ones_and_the_png_has_the_layout_size(tmp_path):
    import matplotlib.image

    log, evals = _write_run(tmp_path / "run")
    fig = plot.write_curves(tmp_path / "run", tmp_path / "run" / "curves.png")
    lines = _lines(fig)
    assert lines[("training loss", "train_loss")] == ([r["step"] for r in log], [r["train_loss"] for r in log])
    assert lines[("learning rate", "learning_rate")] == ([r["step"] for r in log], [r["learning_rate"] for r in log])
    assert lines[("evaluation loss", "eval_loss")] == ([0, 10, 20], [r["eval_loss"] for r in evals])
    assert lines[("evaluation metrics", "eval_accuracy")][1] == [r["eval_accuracy"] for r in evals]
    assert lines[("evaluation metrics", "eval_macro_f1")][1] == [r["eval_macro_f1"] for r in evals]
    assert not any("runtime" in label for _, label in lines)  # bookkeeping is not plotted
    image = matplotlib.image.imread(tmp_path / "run" / "curves.png")
    # 4 panels: 3 a row -> 2 rows of 3 columns, 480 x 320 pixels each
    assert image.shape[:2] == (2 * 320, 3 * 480)


def test_elmo_runs_plot_forward_and_backward_perplexity_on_a_log_scale(tmp_path):
    _, evals = _write_run(tmp_path / "elmo", elmo=True)
    fig = plot.plot_curves([tmp_path / "elmo"])
    lines = _lines(fig)
    for key in ("perplexity", "forward_perplexity", "backward_perplexity"):
        assert lines[("perplexity", key)] == ([0, 10, 20], [r[key] for r in evals])
    assert next(ax for ax in fig.axes if ax.get_title() == "perplexity").get_yscale() == "log"


def test_histories_in_memory_and_overlaid_runs(tmp_path):
    log_a, _ = _write_run(tmp_path / "a")
    log_b, _ = _write_run(tmp_path / "b", shift=1.0)
    fig = plot.plot_curves([tmp_path / "a", tmp_path / "b"])
    lines = _lines(fig)
    assert lines[("training loss", "a: train_loss")][1] == [r["train_loss"] for r in log_a]
    assert lines[("training loss", "b: train_loss")][1] == [r["train_loss"] for r in log_b]
    # a training result (histories in memory, no eval): two panels side by side
    fig = plot.write_curves({"log_history": log_a, "eval_history": []}, tmp_path / "mem.png")
    assert [ax.get_title() for ax in fig.axes] == ["training loss", "learning rate"]
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "mem.png").shape[:2] == (320, 2 * 480)


def test_cli_overlays_runs_and_refuses_folders_without_histories(tmp_path, capsys):
    _write_run(tmp_path / "a")
    _write_run(tmp_path / "b", shift=0.5)
    assert run_cli(plot.main, [str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(tmp_path / "cmp.png")]) == 0
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    (tmp_path / "empty").mkdir()
    assert run_cli(plot.main, [str(tmp_path / "empty"), "--output", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no trainer_log.json or eval_history.json" in err
    assert not (tmp_path / "x.png").exists()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "trainer_log.json").write_text("{not json")
    with pytest.raises(InputError, match="trainer_log.json: cannot read the history"):
        plot.load_run(tmp_path / "bad")
