"""bench/gpu_check.py (issue 40): the plan fits a 10-minute slot, and the summary's figures and ratios are computed
from the phases' files as written (hand-made files, hand-computed ratios); imported by path."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from _launch import load_module

ROOT = Path(__file__).resolve().parents[2]
check = load_module(ROOT / "bench" / "gpu_check.py", "gpu_check")


def test_plan_fits_the_slot_and_runs_nothing(tmp_path):
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "--plan"], capture_output=True, text=True, check=True
    ).stdout
    rows = dict(line.split()[:2] for line in out.splitlines())
    prepared = {"true": tmp_path, "false": tmp_path}
    assert set(rows) == {p.name for p in check.phases(check.GPU, prepared, tmp_path, tmp_path)} | {"total"}
    assert int(rows["total"]) == sum(int(v) for k, v in rows.items() if k != "total") <= 540


def _run_folder(folder: Path, rates, seconds_per_step=None, runtime=None, steps=20):
    folder.mkdir(parents=True)
    log = [{"step": 10 * i, "tokens_per_second": r} for i, r in enumerate(rates, 1)]
    (folder / "trainer_log.json").write_text(json.dumps(log))
    results = {"global_step": steps, "train_tokens_per_second": 1.0, "train_runtime_s": runtime or 1.0}
    (folder / "all_results.json").write_text(json.dumps(results))
    config = {} if seconds_per_step is None else {"time_budget_seconds_per_step": seconds_per_step}
    (folder / "run_config.json").write_text(json.dumps(config))


def test_summary_ratios_from_the_phase_files(tmp_path):
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    out.mkdir()
    step = {"tokens_per_s": {"eager off": 400.0, "eager on": 380.0}}
    (out / "step_eager.json").write_text(json.dumps({"step": step}))
    (out / "step_compiled.json").write_text(json.dumps({"step": {"tokens_per_s": {"compiled on": 500.0}}}))
    (out / "kernel.json").write_text(json.dumps({"proof": {"no_device_read": True}}))
    _run_folder(scratch / "run-on", [10.0, 360.0, 370.0, 350.0], seconds_per_step=0.5, runtime=12.0)  # first dropped
    _run_folder(scratch / "run-off", [5.0, 380.0, 390.0])
    _run_folder(scratch / "run-on_compiled", [1.0, 450.0, 460.0])
    summary = check.summarise(out, scratch, {"env": {"status": "ok"}})
    assert summary["kernel"] == {"no_device_read": True}
    on = summary["pretrain_on"]
    assert on["median_interval_tokens_per_s"] == 360.0 and on["run_s_per_step"] == pytest.approx(0.6)
    assert on["run_over_probe"] == pytest.approx(1.2)
    assert "probe_s_per_step" not in summary["pretrain_off"]
    ratios = summary["ratios"]
    assert ratios["loop / model step, eager on (goal >= 0.9)"] == pytest.approx(360 / 380)
    assert ratios["loop / model step, eager off (goal >= 0.9)"] == pytest.approx(385 / 400)
    assert ratios["loop / model step, compiled on (goal >= 0.9)"] == pytest.approx(455 / 500)
    assert ratios["loop masking on / off (goal >= 0.95)"] == pytest.approx(360 / 385)
    assert ratios["model step masking on / off, eager (goal >= 0.95)"] == pytest.approx(380 / 400)
