"""CPU threads per process (issue 43 item 1): the README's main job and an SST-2 fine-tune, optimizer steps per second
at the thread count the project chooses (``OMP_NUM_THREADS`` unset), at 1 thread and at every usable CPU, with the
machine idle and with one core kept busy by another process (a Python busy loop this script starts and ends).

    python bench/bench_threads.py --glue_dir glue --output_dir out/threads [--steps 60]

The main job is ``accelerate launch --config_file configs/one-process.yaml pretrain --max_train_steps N`` (the
bundled corpus); the fine-tune is ``python -m finetune.glue --task_name sst2 --max_train_steps N`` from the main job's
model. Steps per second = ``global_step / train_runtime_s`` of ``all_results.json`` (training only), the chosen count
from the run's plan line. Writes ``results.json`` and ``results.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import _script_env  # noqa: F401  (offline, the project root on sys.path; bench/ is the script's folder)

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--glue_dir", required=True, help="a folder with SST-2/")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--steps", type=int, default=60)
    return p.parse_args(argv)


def run(cmd: list[str], threads: int | None, out: Path) -> dict:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    results = json.loads((out / "all_results.json").read_text())
    chosen = re.search(r"(\d+) CPU threads? per process", done.stderr)
    return {
        "steps_per_s": results["global_step"] / results["train_runtime_s"],
        "threads": int(chosen.group(1)) if chosen else None,
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cpus = len(os.sched_getaffinity(0))
    steps = ["--max_train_steps", str(args.steps)]
    base = out / "main-job"

    def main_job(folder):
        accelerate = str(Path(sys.executable).parent / "accelerate")
        launch = [accelerate, "launch", "--config_file", "configs/one-process.yaml"]
        return [*launch, "pretrain", *steps, "--output_dir", str(folder)]

    def finetune(folder):
        cmd = [sys.executable, "-m", "finetune.glue", "--model_name_or_path", str(base), "--task_name", "sst2"]
        return [*cmd, "--glue_dir", args.glue_dir, *steps, "--output_dir", str(folder)]

    run(main_job(base), None, base)  # the model the fine-tunes start from
    rows = []
    for busy in (False, True):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for job, make in (("main job", main_job), ("SST-2 fine-tune", finetune)):
                for label, threads in (("chosen", None), ("1", 1), (f"all ({cpus})", cpus)):
                    folder = out / f"{job.split()[0]}-{label.split()[0]}-{'busy' if busy else 'idle'}"
                    result = run(make(folder), threads, folder)
                    row = {"job": job, "machine": "one core busy" if busy else "idle", "setting": label, **result}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    lines = ["| job | machine | threads | steps/s |", "|---|---|---|---:|"]
    for r in rows:
        setting = f"chosen: {r['threads']}" if r["setting"] == "chosen" else r["setting"]
        lines.append(f"| {r['job']} | {r['machine']} | {setting} | {r['steps_per_s']:.2f} |")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "cpus": cpus, "rows": rows}, indent=2) + "\n")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return {"rows": rows}


if __name__ == "__main__":
    main()
