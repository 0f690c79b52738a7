"""``bench/bench_long_context.py`` made small: both variants at one length, each in a process of its own, with the
layer types each ran, tokens/s and the process's own peak memory; the table and the files written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_long_context as bench  # noqa: E402


def test_both_variants_run_and_report(tmp_path, capsys):
    report = bench.main(
        [
            "--lengths",
            "128",
            "--batch_tokens",
            "256",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--output_dir",
            str(tmp_path),
        ]  # fmt: skip
    )
    by_variant = {r["variant"]: r for r in report["results"]}
    assert set(by_variant) == {"global", "local"} and not any("failed" in r for r in report["results"])
    assert by_variant["global"]["layer_types"] == ["full_attention"] * 3
    assert by_variant["local"]["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    for r in by_variant.values():
        assert r["rows"] == 2 and r["tokens_per_s"] > 0
        # the step's own memory: activations of 2 x 128 tokens and the gradients of 4.3M parameters (17 MB), well
        # under what the pytest parent had resident (ru_maxrss, carried across exec, would report that)
        assert 0 < r["peak_mb"] < 300, r
    assert json.loads((tmp_path / "results.json").read_text())["results"] == report["results"]
    assert (tmp_path / "results.md").read_text().count("\n") == 4 and (tmp_path / "results.png").stat().st_size > 0
    assert "| 128 | 2 | local |" in capsys.readouterr().out
