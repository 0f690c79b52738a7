"""The GPU check of the compiled and GPU path, in one 10-minute slot of a bare one-GPU machine (issue 40).

    bash bench/gpu_check.sh --plan                        # each phase's planned seconds, nothing run
    bash bench/gpu_check.sh DATA [OUT]                    # bert-base S128 B256 bf16 on the GPU (~8.5 minutes)
    bash bench/gpu_check.sh --smoke DATA [OUT]            # the same phases at bert-tiny S32 B8 on the CPU

``DATA`` is a folder of ``*.txt.gz`` files (prepared here into ``OUT``, one tokenizer for both), or a folder that
holds ``prepared-true/`` and ``prepared-false/`` made by ``python -m pretrain.prepare --document_masking true|false``
(as ``../shared/hooks/device-bundle.sh`` users carry them, so that the GPU's minutes go to the GPU). The phases, in
order, each a process of its own under its own timeout (its planned seconds x 1.6, and never past ``--deadline_s``
from the start), its output appended to ``OUT/gpu_check.log``, ``OUT/summary.json`` rewritten after each one:

1. ``env``: the GPU, torch, transformers.
2. ``kernel``: ``bench/bench_document_step.py --prove``: FlashAttention's varlen kernel runs forward and backward once
   per layer at the run's shapes, agrees with the dense mask, reads nothing back from the device (sync debug mode
   "error"), and compiles.
3. ``step_eager``: the model's own step (no loop) with document masking off and on, eager.
4. ``pretrain_on`` / ``pretrain_off``: ``pretrain --time_budget`` with masking on and off (evaluation and checkpoints
   only at the ends): the loop's tokens/s (the median of ``trainer_log.json``'s intervals after the first) and the
   budget probe's seconds per step against the run's.
5. ``step_compiled``: the model step compiled, masking on.
6. ``pretrain_on_compiled``: ``pretrain --torch_compile true`` with masking on, a fixed number of steps.
7. ``cuda_tests``: ``pytest -m gpu`` on the CUDA document tests (the kernels asserted).

The summary's ratios: loop / model step (eager off and on, compiled on; goal >= 0.9) and masking on / off (loop and
model step; goal >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Shape:
    config: str
    seq: int
    batch: int
    vocab: int
    precision: str
    budget_minutes: float
    compiled_steps: int
    logging: int
    device: str
    timeout_scale: float = 1.6


GPU = Shape("bert-base", 128, 256, 30000, "bf16", 0.2, 60, 10, "cuda")
SMOKE = Shape("bert-tiny", 32, 8, 2000, "no", 0.05, 6, 2, "cpu", timeout_scale=4.0)  # CPU compilation: minutes


@dataclass
class Phase:
    name: str
    planned_s: int
    command: list[str] = field(default_factory=list)


def phases(shape: Shape, prepared: dict[str, Path], out: Path, scratch: Path) -> list[Phase]:
    py = sys.executable
    step = [py, str(ROOT / "bench" / "bench_document_step.py"), "--prepared_dataset", str(prepared["true"])]
    step += ["--device", shape.device, "--config_name", shape.config, "--batch_size", str(shape.batch)]
    step += ["--mixed_precision", shape.precision]

    def pretrain(name: str, masking: str, *extra: str) -> list[str]:
        cmd = [py, "-m", "pretrain", "--prepared_dataset", str(prepared[masking]), "--config_name", shape.config]
        cmd += ["--per_device_train_batch_size", str(shape.batch), "--mixed_precision", shape.precision]
        cmd += ["--logging_steps", str(shape.logging), "--max_eval_samples", "64", "--eval_steps", "100000"]
        cmd += ["--checkpointing_steps", "100000", "--checkpoints_total_limit", "1"]
        return [*cmd, "--output_dir", str(scratch / f"run-{name}"), *extra]

    budget = ["--time_budget", str(shape.budget_minutes)]
    env = "import torch, transformers, accelerate; print('torch', torch.__version__, '| transformers', "
    env += "transformers.__version__, '| accelerate', accelerate.__version__, '| cuda', torch.cuda.is_available() "
    env += "and torch.cuda.get_device_name(0))"
    return [
        Phase("env", 30, [py, "-c", env]),
        Phase("kernel", 75, [*step, "--prove", "--output", str(out / "kernel.json")]),
        Phase("step_eager", 40, [*step, "--time", "eager", "--output", str(out / "step_eager.json")]),
        Phase("pretrain_on", 70, pretrain("on", "true", *budget)),
        Phase("pretrain_off", 55, pretrain("off", "false", *budget)),
        Phase(
            "step_compiled",
            60,
            [*step, "--time", "compiled", "--masking", "on", "--output", str(out / "step_compiled.json")],
        ),
        Phase(
            "pretrain_on_compiled",
            110,
            pretrain("on_compiled", "true", "--max_train_steps", str(shape.compiled_steps), "--torch_compile", "true"),
        ),
        Phase("cuda_tests", 80, [py, "-m", "pytest", "-q", "-m", "gpu", "-x", "-p", "no:cacheprovider", *CUDA_TESTS]),
    ]


#: The CUDA document tests (the kernels asserted): what the GPU check runs of ``pytest -m gpu``.
CUDA_TESTS = ["tests/gpu/test_document_flex.py"]


def loop_figures(folder: Path) -> dict:
    """The loop's tokens/s (median of the logged intervals after the first; the session's mean) and, with a time
    budget, the probe's seconds per step against the run's."""
    log = json.loads((folder / "trainer_log.json").read_text())
    rates = [r["tokens_per_second"] for r in log[1:] if "tokens_per_second" in r]
    results = json.loads((folder / "all_results.json").read_text())
    config = json.loads((folder / "run_config.json").read_text())
    figures = {
        "steps": results["global_step"],
        "median_interval_tokens_per_s": statistics.median(rates) if rates else None,
        "session_tokens_per_s": results.get("train_tokens_per_second"),
    }
    probe = config.get("time_budget_seconds_per_step")
    if probe:
        run = results["train_runtime_s"] / results["global_step"]
        figures.update(probe_s_per_step=probe, run_s_per_step=run, run_over_probe=run / probe)
    return figures


def summarise(out: Path, scratch: Path, record: dict) -> dict:
    """The summary of what has run: each phase's status and seconds, its figures, and the ratios."""
    summary: dict = {"phases": record}
    for name in ("kernel", "step_eager", "step_compiled"):
        path = out / f"{name}.json"
        if path.is_file():
            summary[name] = json.loads(path.read_text()).get("proof" if name == "kernel" else "step")
    for name in ("on", "off", "on_compiled"):
        folder = scratch / f"run-{name}"
        if (folder / "all_results.json").is_file():
            summary[f"pretrain_{name}"] = loop_figures(folder)
    step = {**(summary.get("step_eager") or {}).get("tokens_per_s", {})}
    step.update((summary.get("step_compiled") or {}).get("tokens_per_s", {}))
    ratios = {}
    for run, variant in (("on", "eager on"), ("off", "eager off"), ("on_compiled", "compiled on")):
        loop = (summary.get(f"pretrain_{run}") or {}).get("median_interval_tokens_per_s")
        if loop and step.get(variant):
            ratios[f"loop / model step, {variant} (goal >= 0.9)"] = loop / step[variant]
    on, off = (summary.get(f"pretrain_{n}", {}).get("median_interval_tokens_per_s") for n in ("on", "off"))
    if on and off:
        ratios["loop masking on / off (goal >= 0.95)"] = on / off
    if step.get("eager on") and step.get("eager off"):
        ratios["model step masking on / off, eager (goal >= 0.95)"] = step["eager on"] / step["eager off"]
    summary["ratios"] = ratios
    return summary


def prepare(data: Path, out: Path, shape: Shape, log) -> dict[str, Path]:
    """``{"true": folder, "false": folder}``: carried ones in ``data``, or prepared from its ``*.txt.gz`` files."""
    if (data / "prepared-true" / "manifest.json").is_file():
        return {m: data / f"prepared-{m}" for m in ("true", "false")}
    files = sorted(str(p) for p in data.glob("*.txt*") if not p.name.startswith("validation"))
    if not files:
        raise SystemExit(f"{data}: no *.txt.gz files and no prepared-true/; expected one or the other")
    if shape.device == "cpu":
        files = files[:1]
    valid = sorted(str(p) for p in data.glob("validation.txt*"))
    folders = {m: out / f"prepared-{m}" for m in ("true", "false")}
    for masking, folder in folders.items():
        if (folder / "manifest.json").is_file():
            continue
        tok = (
            ["--vocab_size", str(shape.vocab)]
            if masking == "true"
            else ["--tokenizer_name", str(folders["true"] / "tokenizer")]
        )
        cmd = [
            sys.executable,
            "-m",
            "pretrain.prepare",
            "--train_file",
            *files,
            *(["--validation_file", valid[0]] if valid else []),
        ]
        cmd += [*tok, "--max_seq_length", str(shape.seq), "--document_masking", masking, "--output_dir", str(folder)]
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return folders


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", action="store_true", help="print each phase's planned seconds and exit")
    p.add_argument("--smoke", action="store_true", help="bert-tiny S32 B8 on the CPU")
    p.add_argument("data", nargs="?", default=None)
    p.add_argument("out", nargs="?", default="outputs/gpu_check")
    p.add_argument(
        "--scratch",
        default=None,
        help="where the runs and prepared data go (default OUT; OUT then keeps the small files)",
    )
    p.add_argument(
        "--deadline_s", type=float, default=None, help="no phase runs past this many seconds (default 540; smoke 1500)"
    )
    args = p.parse_args(argv)
    shape = SMOKE if args.smoke else GPU
    deadline = args.deadline_s or (1500.0 if args.smoke else 540.0)
    out = Path(args.out)
    if args.plan:
        plan = phases(shape, {"true": Path("DATA/prepared-true"), "false": Path("DATA/prepared-false")}, out, out)
        for phase in plan:
            print(f"{phase.name:<22} {phase.planned_s:>4} s")
        print(f"{'total':<22} {sum(ph.planned_s for ph in plan):>4} s (a 10-minute slot: 600 s)")
        return 0
    if args.data is None:
        p.error("DATA is required (a folder of *.txt.gz files, or of prepared-true/ and prepared-false/)")
    scratch = Path(args.scratch or out)
    out.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started, record = time.perf_counter(), {}
    summary = summarise(out, scratch, record)
    with open(out / "gpu_check.log", "a") as log:
        prepared = prepare(Path(args.data), scratch, shape, log)
        for phase in phases(shape, prepared, out, scratch):
            left = deadline - (time.perf_counter() - started)
            if left < 10:
                record[phase.name] = {"status": "skipped: no time left"}
                continue
            timeout = min(phase.planned_s * shape.timeout_scale, left)
            log.write(f"\n== {time.strftime('%H:%M:%S')} {phase.name}: {' '.join(phase.command)}\n")
            log.flush()
            print(f"== {time.strftime('%H:%M:%S')} {phase.name} (planned {phase.planned_s} s)", flush=True)
            t0 = time.perf_counter()
            try:
                done = subprocess.run(
                    phase.command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout
                )
                status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
            except subprocess.TimeoutExpired:
                status = f"timed out after {timeout:.0f} s"
            record[phase.name] = {"status": status, "seconds": round(time.perf_counter() - t0, 1)}
            print(f"   {status} in {record[phase.name]['seconds']} s", flush=True)
            summary = summarise(out, scratch, record)
            (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if all(r["status"] == "ok" for r in record.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
