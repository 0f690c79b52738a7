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


# ---- the modern phases (issue 50) ------------------------------------------------------------------------------------
def test_modern_plan_fits_under_the_limit_and_runs_nothing(tmp_path):
    for flags, shape in ((["--modern"], check.MODERN_GPU), (["--modern", "--smoke"], check.MODERN_SMOKE)):
        out = subprocess.run(
            ["bash", str(ROOT / "bench" / "gpu_check.sh"), *flags, "--plan"], capture_output=True, text=True, check=True
        ).stdout
        rows = dict(line.split()[:2] for line in out.splitlines())
        plan = check.modern_phases(shape, tmp_path, tmp_path, tmp_path)
        names = ["env", "probe", "step", "reference", "compiled", "real_step", "pretrain"]
        assert [p.name for p in plan] == names and set(rows) == {*names, "total"}
        assert int(rows["total"]) == sum(p.planned_s for p in plan) <= 480
        assert not list(tmp_path.iterdir())  # nothing ran
    assert check.MODERN_GPU.deadline_s <= 540 and check.MODERN_GPU.timeout_scale == 1.3


def test_modern_phase_commands_carry_the_run_shape(tmp_path):
    plan = {p.name: p.command for p in check.modern_phases(check.MODERN_GPU, tmp_path / "prep", tmp_path, tmp_path)}
    step = plan["step"]
    assert step[step.index("--config_name") + 1] == "modernbert-base" and "--profile" in step
    assert step[step.index("--mixed_precision") + 1] == "bf16"
    compiled = ["--compiled", "--regional", "--cases", "a", "--output", str(tmp_path / "modern_compiled.json")]
    assert plan["compiled"][-6:] == compiled
    reference = plan["reference"]
    assert reference[reference.index("--lengths") + 1 : reference.index("--lengths") + 3] == ["1024", "8192"]
    assert {"transformers", "transformers_padding_free", "sesame_packed"} <= set(reference)
    loop = plan["pretrain"]
    assert loop[loop.index("--prepared_dataset") + 1] == str(tmp_path / "prep")
    assert loop[loop.index("--max_train_steps") + 1] == "40"


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_modern_summary_from_the_phase_files(tmp_path):
    """Hand-made phase files: the headline figures, the goals (hand-computed ratios) and the checks, a failing one
    included."""
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    _write(out / "modern_env.json", {"gpu": "NVIDIA H200", "window_size": True})
    probe = {"S1024 B32": {"local flex": {"ms": 2.0, "agrees": True}, "block_mask_host_ms": {"local_block_mask": 1.0}}}
    kernels = {"local flex": {"ms": 2.0, "agrees": True, "kind": "local", "relative_error": {"output": 0.01}}}
    shapes = [{"length": 1024, "batch": 32, "kernels": kernels, "block_mask_host_ms": {"local_block_mask": 1.0}}]
    _write(out / "modern_probe.json", {"ok": True, "shapes": shapes})
    case = {"length": 1024, "tokens_per_s": 200000.0, "mfu": 0.2, "peak_memory_mib": 10000.0, "dense_local_layers": 0}
    cases = {
        "a": {**case, "checks": {"no local layer on a dense (T, T) mask": True}},
        "b": {**case, "dense_local_layers": 14, "checks": {"no local layer on a dense (T, T) mask": False}},
        "c": {**case, "length": 8192, "peak_memory_mib": 10500.0, "checks": {}},
    }
    _write(out / "modern_step.json", {"cases": cases})
    compiled = {"tokens_per_s": 320000.0, "mfu": 0.3, "first_step_s": 40.0, "checks": {"no recompilation": True}}
    regional = {**compiled, "tokens_per_s": 250000.0, "first_step_s": 12.0}
    _write(out / "modern_compiled.json", {"cases": {"a": compiled, "a regional": regional}})
    rates = {"transformers": 125000.0, "transformers_padding_free": 160000.0, "sesame_packed": 190000.0}
    losses = {"transformers": 10.3, "transformers_padding_free": 10.301, "sesame_packed": 10.305}
    result = {"length": 1024, "tokens_per_s": rates, "mfu": {v: r / 1e6 for v, r in rates.items()}}
    _write(out / "reference" / "results.json", {"results": [{**result, "first_step_loss": losses}]})
    _write(out / "modern_real_step.json", {"step": {"tokens_per_s": {"eager on": 200000.0}}})
    _run_folder(scratch / "run-modern", [1.0, 180000.0, 190000.0, 170000.0])
    results = json.loads((scratch / "run-modern" / "all_results.json").read_text())
    (scratch / "run-modern" / "all_results.json").write_text(json.dumps({**results, "train_loss": 9.5}))

    summary = check.summarise_modern(out, scratch, {"env": {"status": "ok"}})
    assert summary["probe"] == probe
    modern = summary["modern"]
    assert modern["gpu"] == "NVIDIA H200"
    assert modern["figures"]["ours eager S1024 masking on"] == {"tokens_per_s": 200000.0, "mfu": 0.2}
    assert modern["figures"]["ours compiled S1024 masking on"]["first_step_s"] == 40.0
    assert modern["figures"]["ours regional compiled S1024 masking on"] == {
        "tokens_per_s": 250000.0,
        "mfu": 0.3,
        "first_step_s": 12.0,
    }
    assert modern["figures"]["reference S1024"]["transformers"] == {"tokens_per_s": 125000.0, "mfu": 0.125}
    goals = modern["goals"]
    assert goals["ours compiled S1024 tokens/s (goal >= 312k)"] == 320000.0
    # ours against transformers: the reference bench's SesameBert variant on the same documents
    assert goals["ours eager / transformers sdpa eager, S1024 (goal >= 1.3)"] == pytest.approx(190 / 125)
    assert goals["ours eager / transformers padding-free flash, S1024 (goal >= 1.0)"] == pytest.approx(190 / 160)
    assert goals["loop / real-batch step (goal >= 0.9)"] == pytest.approx(180000 / 200000)
    assert goals["peak memory S8192 / S1024 (goal <= 1.1)"] == pytest.approx(1.05)
    assert goals["local layers on a dense mask (goal 0)"] == 14
    checks = modern["checks"]
    assert checks["flash op takes window_size"] and checks["probe: every kernel agrees with the dense reference"]
    assert checks["step b: no local layer on a dense (T, T) mask"] is False
    assert checks["reference S1024: padding-free loss = ours within 1e-2 nats"]  # 0.004 nats apart
    assert checks["compiled: no recompilation"] and checks["pretrain: finite loss"]
    # a phase that has not run leaves its part out
    assert "goals" in check.summarise_modern(tmp_path / "none", tmp_path / "none", {})["modern"]
