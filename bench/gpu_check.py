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

``--modern`` runs the modern encoder's phases instead (issue 50; ``../shared/docs/gpu-modern-check.md``),
``modernbert-base`` at S1024 in bf16 (``--smoke``: ``modernbert-tiny`` S128 on the CPU), each phase under its planned
seconds x 1.3 and never past 480 s from the start; ``DATA`` is a folder of ``*.txt.gz`` files (prepared here at the
run's length with document masking) or one that holds ``prepared-1024/`` (``prepared-128/`` for the smoke run):

1. ``env``: ``bench/modern_check.py env``: the GPU and its capability, torch, transformers, cuDNN, SDPA's enabled
   kernels, the schema of ``aten._flash_attention_forward`` (**asserted** to take ``window_size_left`` / ``right``),
   whether ``flash_attn`` imports.
2. ``probe``: ``bench/modern_check.py probe``: one layer (H12 D64) at S1024 B32 and S8192 B4, global and local: every
   kernel's output and gradients **asserted** within bf16's tolerance of a float32 dense reference (the window
   honoured); milliseconds and peak memory per kernel; the sliding BlockMask's host time, ours against torch's.
3. ``step``: ``bench/modern_check.py step``: the model step, cases (a) S1024 masking on, (b) off, (c) S8192 on, (d)
   off, (e) S1024 on with attention dropout 0.1, (f) bert-base S1024 on: tokens/s, MFU, peak memory, host ms; the
   kernel of every layer type recorded and **asserted** (no local layer on a dense mask; flex, flash as designed).
4. ``reference``: ``bench/bench_modern_step.py``: transformers' ModernBertForMaskedLM with the same weights, sdpa on
   padded rows and padding-free on torch's FlashAttention-2 varlen op, against SesameBert packed, S1024 and S8192.
5. ``compiled``: ``bench/modern_check.py step --compiled --regional``: case (a) under ``torch.compile`` of the
   model, then with regional compilation (compile seconds, graphs, breaks; **asserted** no recompilation in the timed
   steps).
6. ``real_step``: ``bench/bench_document_step.py --time eager --masking on`` on the prepared data's first batch: the
   model step on real documents, the loop's denominator.
7. ``pretrain``: ``python -m pretrain`` for 40 steps on the prepared data (exit 0, finite loss).

``summary.json`` then holds ``modern``: modernbert-base S1024 bf16 tokens/s and MFU, eager and compiled, ours against
transformers' sdpa and padding-free flash; the local layers on a dense mask; peak memory at S8192 over S1024; loop /
step; the checks and the goals (:func:`summarise_modern`).
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


@dataclass
class ModernShape:
    """The modern phases' sizes: the preset, the row length, rows per step, vocabulary, precision, the BERT baseline,
    and the extra arguments of the probe, the step and the reference bench for the device."""

    config: str
    seq: int
    batch: int
    vocab: int
    precision: str
    baseline: str
    device: str
    probe: list[str]
    step: list[str]
    reference: list[str]
    loop_steps: int = 40
    timeout_scale: float = 1.3
    deadline_s: float = 480.0


MODERN_GPU = ModernShape(
    "modernbert-base", 1024, 32, 30000, "bf16", "bert-base", "cuda", probe=[], step=["--profile"],
    reference=["--lengths", "1024", "8192", "--batch_tokens", "32768", "--steps", "5", "--warmup", "2"],
)  # fmt: skip
MODERN_SMOKE = ModernShape(
    "modernbert-tiny", 128, 8, 2000, "no", "bert-tiny", "cpu",
    probe=["--shapes", "128x2", "--heads", "2", "--head_dim", "32", "--window", "32", "--repeats", "2"],
    step=["--lengths", "128", "256", "--batch_tokens", "1024", "--warmup", "1", "--steps", "2"],
    reference=["--lengths", "128", "256", "--batch_tokens", "512", "--steps", "2", "--warmup", "1", "--no_memory"],
    loop_steps=6, timeout_scale=4.0, deadline_s=1500.0,
)  # fmt: skip
#: the transformers variants and ours that the modern reference phase times (bench/bench_modern_step.py)
MODERN_VARIANTS = ["transformers", "transformers_padding_free", "sesame_packed"]


def modern_phases(shape: ModernShape, prepared: Path, out: Path, scratch: Path) -> list[Phase]:
    """The modern encoder's phases (module docstring), each a command."""
    py = sys.executable
    check = [py, str(ROOT / "bench" / "modern_check.py")]
    common = ["--device", shape.device, "--mixed_precision", shape.precision]
    step = [*check, "step", *common, "--config_name", shape.config, "--baseline_config", shape.baseline]
    step += ["--vocab_size", str(shape.vocab), *shape.step]
    reference = [py, str(ROOT / "bench" / "bench_modern_step.py"), *common, "--config_name", shape.config]
    reference += ["--documents", "full", "--variants", *MODERN_VARIANTS, "--vocab_size", str(shape.vocab)]
    reference += [*shape.reference, "--output_dir", str(out / "reference")]
    real = [py, str(ROOT / "bench" / "bench_document_step.py"), "--prepared_dataset", str(prepared), *common]
    real += ["--config_name", shape.config, "--batch_size", str(shape.batch), "--time", "eager", "--masking", "on"]
    real += ["--steps", "8", "--warmup", "3", "--output", str(out / "modern_real_step.json")]
    loop = [py, "-m", "pretrain", "--prepared_dataset", str(prepared), "--config_name", shape.config]
    loop += ["--per_device_train_batch_size", str(shape.batch), "--mixed_precision", shape.precision]
    loop += ["--max_train_steps", str(shape.loop_steps), "--logging_steps", str(max(shape.loop_steps // 4, 1))]
    loop += ["--eval_steps", "100000", "--checkpointing_steps", "100000", "--checkpoints_total_limit", "1"]
    loop += ["--max_eval_samples", "64", "--output_dir", str(scratch / "run-modern")]
    return [
        Phase("env", 15, [*check, "env", "--device", shape.device, "--output", str(out / "modern_env.json")]),
        Phase("probe", 45, [*check, "probe", *common, *shape.probe, "--output", str(out / "modern_probe.json")]),
        Phase("step", 120, [*step, "--output", str(out / "modern_step.json")]),
        Phase("reference", 75, reference),
        Phase(
            "compiled",
            130,
            [*step, "--compiled", "--regional", "--cases", "a", "--output", str(out / "modern_compiled.json")],
        ),
        Phase("real_step", 25, real),
        Phase("pretrain", 60, loop),
    ]


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def summarise_modern(out: Path, scratch: Path, record: dict) -> dict:
    """The modern check's summary (module docstring) from the phases' files as written: ``phases`` (status, seconds),
    ``env``, ``probe`` (per shape and kernel: ms, peak MiB, agrees), ``step`` (the cases), ``reference``,
    ``compiled``, ``pretrain``, and ``modern``: the headline figures, ``checks`` (what was asserted, per phase) and
    ``goals`` (issue 50's targets, each with its figure; ours against transformers from the reference bench, where
    both ran the same documents, the step's figures on its packed mix of document lengths)."""
    summary: dict = {"phases": record}
    env, probe = _read(out / "modern_env.json"), _read(out / "modern_probe.json")
    step, compiled = _read(out / "modern_step.json"), _read(out / "modern_compiled.json")
    reference, real = _read(out / "reference" / "results.json"), _read(out / "modern_real_step.json")
    checks: dict = {}
    if env:
        summary["env"] = env
        checks["flash op takes window_size"] = env.get("window_size") is True
    if probe:
        keys = ("ms", "peak_mib", "agrees", "error")
        summary["probe"] = {
            f"S{e['length']} B{e['batch']}": {
                **{n: {k: r[k] for k in keys if k in r} for n, r in e["kernels"].items()},
                "block_mask_host_ms": e.get("block_mask_host_ms"),
            }
            for e in probe["shapes"]
        }
        checks["probe: every kernel agrees with the dense reference"] = probe["ok"]
    figures: dict = {}
    cases = (step or {}).get("cases", {})
    short = f"S{cases['a']['length']}" if "a" in cases else "S1024"  # the smoke run's rows are shorter
    if cases:
        summary["step"] = cases
        for case, result in cases.items():
            for name, ok in result.get("checks", {}).items():
                checks[f"step {case}: {name}"] = ok
        figures["dense local layers"] = {c: r.get("dense_local_layers") for c, r in cases.items()}
        figures[f"ours eager {short} masking on"] = _rate(cases.get("a"))
        if cases.get("a", {}).get("peak_memory_mib") and cases.get("c", {}).get("peak_memory_mib"):
            ratio = cases["c"]["peak_memory_mib"] / cases["a"]["peak_memory_mib"]
            figures[f"peak memory S{cases['c']['length']} / {short} (goal <= 1.1)"] = ratio
    if compiled and compiled.get("cases", {}).get("a"):
        a = compiled["cases"]["a"]
        summary["compiled"] = a
        figures[f"ours compiled {short} masking on"] = {**_rate(a), "first_step_s": a.get("first_step_s")}
        for name, ok in a.get("checks", {}).items():
            checks[f"compiled: {name}"] = ok
    if compiled and compiled.get("cases", {}).get("a regional"):
        regional = compiled["cases"]["a regional"]
        figures[f"ours regional compiled {short} masking on"] = {
            **_rate(regional),
            "first_step_s": regional.get("first_step_s"),
        }
        for name, ok in regional.get("checks", {}).items():
            checks[f"regional compiled: {name}"] = ok
    if reference:
        summary["reference"] = reference["results"]
        for r in reference["results"]:
            rates, mfu = r["tokens_per_s"], r.get("mfu") or {}
            figures[f"reference S{r['length']}"] = {v: {"tokens_per_s": rates[v], "mfu": mfu.get(v)} for v in rates}
            losses = r["first_step_loss"]
            if "transformers_padding_free" in losses and "sesame_packed" in losses:
                spread = abs(losses["transformers_padding_free"] - losses["sesame_packed"])
                checks[f"reference S{r['length']}: padding-free loss = ours within 1e-2 nats"] = spread <= 1e-2
    loop = None
    if (scratch / "run-modern" / "all_results.json").is_file():
        summary["pretrain"] = loop = loop_figures(scratch / "run-modern")
        results = json.loads((scratch / "run-modern" / "all_results.json").read_text())
        loss = results.get("train_loss")
        checks["pretrain: finite loss"] = loss is not None and loss == loss and abs(loss) != float("inf")
    goals: dict = {}
    fast = figures.get(f"ours compiled {short} masking on")
    if fast and fast.get("tokens_per_s"):
        goals[f"ours compiled {short} tokens/s (goal >= 312k)"] = fast["tokens_per_s"]
    # against transformers on the same documents and weights: the reference bench's own SesameBert variant
    reference_rates = figures.get(f"reference {short}") or {}
    ours = reference_rates.get("sesame_packed")
    for variant, goal in (("transformers", "sdpa eager, {} (goal >= 1.3)"), ("transformers_padding_free", None)):
        if ours and variant in reference_rates:
            name = goal or "padding-free flash, {} (goal >= 1.0)"
            goals[f"ours eager / transformers {name.format(short)}"] = (
                ours["tokens_per_s"] / reference_rates[variant]["tokens_per_s"]
            )
    real_rate = ((real or {}).get("step") or {}).get("tokens_per_s", {}).get("eager on")
    if loop and loop.get("median_interval_tokens_per_s") and real_rate:
        goals["loop / real-batch step (goal >= 0.9)"] = loop["median_interval_tokens_per_s"] / real_rate
    goals.update({name: value for name, value in figures.items() if name.startswith("peak memory")})
    dense = figures.get("dense local layers")
    if dense:
        goals["local layers on a dense mask (goal 0)"] = sum(n or 0 for n in dense.values())
    summary["modern"] = {"gpu": (env or {}).get("gpu"), "figures": figures, "checks": checks, "goals": goals}
    return summary


def _rate(result: dict | None) -> dict:
    """``{"tokens_per_s", "mfu"}`` of a step case, ``{}`` without one."""
    return {"tokens_per_s": result["tokens_per_s"], "mfu": result.get("mfu")} if result else {}


def prepare_modern(data: Path, scratch: Path, shape: ModernShape, log) -> Path:
    """The prepared dataset of the modern phases: ``DATA/prepared-<seq>`` when carried, else prepared from the
    ``*.txt.gz`` files of ``DATA`` at the shape's length with document masking (into ``scratch``)."""
    carried = data / f"prepared-{shape.seq}"
    if (carried / "manifest.json").is_file():
        return carried
    files = sorted(str(p) for p in data.glob("*.txt*") if not p.name.startswith("validation"))
    if not files:
        raise SystemExit(f"{data}: no *.txt.gz files and no prepared-{shape.seq}/; expected one or the other")
    folder = scratch / f"prepared-modern-{shape.seq}"
    if not (folder / "manifest.json").is_file():
        valid = sorted(str(p) for p in data.glob("validation.txt*"))
        cmd = [
            sys.executable,
            "-m",
            "pretrain.prepare",
            "--train_file",
            *(files[:1] if shape.device == "cpu" else files),
        ]
        cmd += [*(["--validation_file", valid[0]] if valid else []), "--vocab_size", str(shape.vocab)]
        cmd += ["--max_seq_length", str(shape.seq), "--document_masking", "true", "--output_dir", str(folder)]
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return folder


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
    p.add_argument("--smoke", action="store_true", help="bert-tiny S32 B8 (--modern: modernbert-tiny S128) on the CPU")
    p.add_argument("--modern", action="store_true", help="the modern encoder's phases (modernbert-base S1024 bf16)")
    p.add_argument("data", nargs="?", default=None)
    p.add_argument("out", nargs="?", default="outputs/gpu_check")
    p.add_argument(
        "--scratch",
        default=None,
        help="where the runs and prepared data go (default OUT; OUT then keeps the small files)",
    )
    p.add_argument(
        "--deadline_s",
        type=float,
        default=None,
        help="no phase runs past this many seconds (default 540, --modern 480; smoke 1500)",
    )
    args = p.parse_args(argv)
    if args.modern:
        return run_modern(args, p)
    shape = SMOKE if args.smoke else GPU
    deadline = args.deadline_s or (1500.0 if args.smoke else 540.0)
    out = Path(args.out)
    if args.plan:
        plan = phases(shape, {"true": Path("DATA/prepared-true"), "false": Path("DATA/prepared-false")}, out, out)
        print_plan(plan, "a 10-minute slot: 600 s")
        return 0
    if args.data is None:
        p.error("DATA is required (a folder of *.txt.gz files, or of prepared-true/ and prepared-false/)")
    scratch = Path(args.scratch or out)
    out.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_check.log", "a") as log:
        prepared = prepare(Path(args.data), scratch, shape, log)
        plan = phases(shape, prepared, out, scratch)
        summary = run_phases(plan, out, deadline, shape.timeout_scale, log, lambda r: summarise(out, scratch, r))
    print(json.dumps(summary, indent=2))
    return 0 if all(r["status"] == "ok" for r in summary["phases"].values()) else 1


def print_plan(plan: list[Phase], slot: str) -> None:
    """Each phase's planned seconds, then the total."""
    for phase in plan:
        print(f"{phase.name:<22} {phase.planned_s:>4} s")
    print(f"{'total':<22} {sum(ph.planned_s for ph in plan):>4} s ({slot})")


def run_modern(args, parser) -> int:
    """The ``--modern`` check (module docstring)."""
    shape = MODERN_SMOKE if args.smoke else MODERN_GPU
    deadline = args.deadline_s or shape.deadline_s
    out = Path(args.out)
    if args.plan:
        print_plan(modern_phases(shape, Path(f"DATA/prepared-{shape.seq}"), out, out), "under a 540 s limit")
        return 0
    if args.data is None:
        parser.error(f"DATA is required (a folder of *.txt.gz files, or one that holds prepared-{shape.seq}/)")
    scratch = Path(args.scratch or out)
    out.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_check.log", "a") as log:
        plan = modern_phases(shape, prepare_modern(Path(args.data), scratch, shape, log), out, scratch)
        summary = run_phases(plan, out, deadline, shape.timeout_scale, log, lambda r: summarise_modern(out, scratch, r))
    print(json.dumps(summary, indent=2))
    ok = all(r["status"] == "ok" for r in summary["phases"].values()) and all(summary["modern"]["checks"].values())
    return 0 if ok else 1


def run_phases(plan: list[Phase], out: Path, deadline: float, scale: float, log, summarise_) -> dict:
    """Run the phases in order, each under ``min(planned x scale, the time left)``, its output appended to ``log``;
    ``OUT/summary.json`` (``summarise_(record)``) rewritten after each. Returns the last summary."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started, record = time.perf_counter(), {}
    summary = summarise_(record)
    for phase in plan:
        left = deadline - (time.perf_counter() - started)
        if left < 10:
            record[phase.name] = {"status": "skipped: no time left"}
            continue
        timeout = min(phase.planned_s * scale, left)
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
        summary = summarise_(record)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())
