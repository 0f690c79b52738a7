"""bench/elmo_budget_curve.py: medians over seeds per BiLM budget, the plain and random-control rows, the figure;
imported by path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _launch import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "elmo_budget_curve.py"


curve = load_module(SCRIPT, "elmo_budget_curve")


def _run(task, backbone, seed, value):
    return {"task": task, "backbone": backbone, "seed": seed, "value": value, "train_runtime_s": 1.0, "metric": "m"}


def _write(path: Path, runs) -> str:
    path.write_text(json.dumps({"runs": runs}))
    return str(path)


def test_budget_curve_medians_table_and_figure(tmp_path):
    plain = [_run("sst2", "cnn", s, v) for s, v in ((42, 0.60), (43, 0.64), (44, 0.62))]
    plain += [_run("sst2", "cnn+elmo-random", 42, 0.58)]
    ten = [_run("sst2", "cnn+elmo", s, v) for s, v in ((42, 0.61), (43, 0.70), (44, 0.65))]
    thirty = [_run("sst2", "cnn+elmo", s, v) for s, v in ((42, 0.66), (43, 0.64))]  # two seeds: mean of the two
    thirty.append({**_run("sst2", "cnn+elmo", 44, None), "error": "boom"})
    argv = ["--table", "10=" + _write(tmp_path / "t10.json", ten), "30=" + _write(tmp_path / "t30.json", thirty)]
    argv += ["--plain", _write(tmp_path / "plain.json", plain), "--tasks", "sst2", "--backbones", "cnn"]
    argv += ["--perplexity", "30=153.9", "--output_dir", str(tmp_path / "out")]
    assert curve.main(argv) == 0
    md = (tmp_path / "out" / "curve.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| sst2 | cnn |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "62.0 (3 seeds: 60.0 / 64.0 / 62.0)"  # plain: median 0.62
    assert cells[3] == "58.0 (1 seeds: 58.0)"  # the random control at budget 0
    assert cells[4] == "65.0 (3 seeds: 61.0 / 70.0 / 65.0)"
    assert cells[5] == "65.0 (2 seeds: 66.0 / 64.0)"  # the failed seed left out
    assert "+elmo 30 min (ppl 153.9)" in md.splitlines()[0]
    assert (tmp_path / "out" / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_inputs_name_the_file_or_flag(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match=f"{bad}: not a finetune.baselines results.json"):
        curve.main(["--table", f"10={bad}", "--plain", str(bad), "--output_dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="--table ten=x: expected MINUTES=results.json"):
        curve.main(["--table", "ten=x", "--plain", str(bad), "--output_dir", str(tmp_path)])
