"""The time-to-quality bench without per-run process start-ups (issue 30, item 5): every run sizes its schedule in its
own process (ours ``pretrain --time_budget``, the reference ``--time_budget_s``) and gives the run that its steps
given explicitly give; the fine-tunes run in worker processes, in-process, with the metrics of a fine-tuning process
of their own. bench/ is not a package: the ttq package is imported from it, as the script imports it."""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import run_reference_in_process

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_time_to_quality.py"
sys.path.insert(0, str(SCRIPT.parent))  # bench/: the ttq package

import ttq.cli  # noqa: E402
import ttq.common  # noqa: E402
import ttq.data  # noqa: E402
import ttq.downstream  # noqa: E402
import ttq.reference  # noqa: E402
import ttq.runs  # noqa: E402
import ttq.scoring  # noqa: E402

BASE_ARGS = ["--train_file", "a.txt", "--validation_file", "v.txt", "--glue_dir", "g"]
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "red", "green", "blue", "cyan"]


@pytest.fixture(scope="module")
def tokenizer():
    """A WordPiece tokenizer over a hand-written vocabulary: [PAD] [UNK] [CLS] [SEP] [MASK] = ids 0-4, then words."""
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)})


def _documents(n_docs: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) for _ in range(n_docs)]


def test_checkpoint_fraction_resolves_to_the_bench_save_steps():
    """pretrain resolves a fractional --checkpointing_steps by exact decimal arithmetic (ceil(repr(f) x steps)): the
    bench's fraction gives its ceil(steps / points) for every run length, also where 1 / points' nearest float is
    above 1 / points (1/3, 1/5, 1/6 ... are below; 1/10 is exact), and never 1 or more."""
    from training.plan import resolve_interval

    for points in range(1, 41):
        fraction = ttq.runs.checkpoint_fraction(points)
        assert 0 < fraction < 1
        for steps in [*range(1, 2001), 10**6, 10**6 + 1, 10**9 + 7, 10**12]:
            assert resolve_interval(fraction, steps) == max(1, math.ceil(steps / points)), (points, steps)


def test_the_bench_probes_as_pretrain_does():
    """The reference's probe defaults to pretrain --time_budget's probe (10 optimizer steps, 2 not timed), and the
    plan counts pretrain's probe steps."""
    from pretrain.run_plan import BUDGET_PROBE_STEPS, BUDGET_PROBE_WARMUP

    args = ttq.cli.parse_args([*BASE_ARGS, "--output_dir", "o", "--budget_minutes", "1"], cuda=False)
    assert (args.probe_steps, args.probe_warmup) == (BUDGET_PROBE_STEPS, BUDGET_PROBE_WARMUP)
    assert ttq.common.PRETRAIN_PROBE_STEPS == BUDGET_PROBE_STEPS


def test_time_budget_commands(tmp_path):
    """With --budget_minutes no run is given steps: ours gets pretrain's --time_budget (minutes), checkpoints every
    1/points of the run, a log record every step and no evaluation inside the run; the reference --time_budget_s
    and --save_points. With steps (--budget_tokens) the flags are the steps' own."""
    args = ttq.cli.parse_args([*BASE_ARGS, "--output_dir", str(tmp_path), "--budget_minutes", "1.5"], cuda=False)
    ref, ours = ttq.runs.plan_pairs(args, tmp_path)[0]
    ref.lr, ref.budget_s, ours.budget_s = 1e-3, 90.0, 90.0
    data = {
        "reference_blocks": tmp_path / "blocks",
        "tokenizer": tmp_path / "tok",
        "variants": {"prepared": {"path": tmp_path / "prepared"}},
    }

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1] if name in cmd else None

    cmd = ttq.runs.run_command(ours, args, data, None, 6)
    assert flag(cmd, "--time_budget") == "1.5" and flag(cmd, "--max_train_steps") is None
    assert float(flag(cmd, "--checkpointing_steps")) == ttq.runs.checkpoint_fraction(6)
    assert flag(cmd, "--logging_steps") == "1" and int(flag(cmd, "--eval_steps")) >= 10**9
    assert flag(cmd, "--checkpoints_total_limit") == "0"
    cmd = ttq.runs.run_command(ref, args, data, None, 6)
    assert flag(cmd, "--time_budget_s") == "90.0" and flag(cmd, "--save_points") == "6"
    assert "--max_train_steps" not in cmd and "--save_steps" not in cmd
    assert (flag(cmd, "--probe_steps"), flag(cmd, "--probe_warmup")) == ("10", "2")
    cmd = ttq.runs.run_command(ours, args, data, 30, 6)
    assert (flag(cmd, "--max_train_steps"), flag(cmd, "--checkpointing_steps"), flag(cmd, "--logging_steps")) == (
        "30",
        "5",
        "5",
    )
    assert flag(cmd, "--eval_steps") == "31" and "--time_budget" not in cmd
    cmd = ttq.runs.run_command(ref, args, data, 30, 6)
    assert flag(cmd, "--max_train_steps") == "30" and "--time_budget_s" not in cmd
    assert cmd[cmd.index("--save_steps") + 1 : cmd.index("--weight_decay")] == ["5", "10", "15", "20", "25", "30"]


def _reference_data(tokenizer, tmp_path) -> list[str]:
    """The reference's data flags: ``--blocks`` (40 documents in 16-token blocks), ``--tokenizer``, ``--heldout``
    (6 documents masked with seed 5), written under ``tmp_path``."""
    from datasets import Dataset
    from safetensors.torch import save_file

    blocks, tok, heldout = (str(tmp_path / name) for name in ("blocks", "tok", "heldout.safetensors"))
    enc = tokenizer(_documents(40, seed=1), return_special_tokens_mask=True)
    Dataset.from_dict({k: list(v) for k, v in enc.items()}).map(
        ttq.data.group_texts, batched=True, fn_kwargs={"block_size": 16}
    ).save_to_disk(blocks)
    tokenizer.save_pretrained(tok)
    rows = ttq.data.heldout_blocks(_documents(6, seed=2), tokenizer, max_len=24)
    save_file(ttq.data.mask_heldout(rows, tokenizer, seed=5), heldout)
    return ["--blocks", blocks, "--tokenizer", tok, "--heldout", heldout]


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_reference_sizes_its_schedule_in_its_process(tokenizer, tmp_path, precision, seeded_single_thread):
    """--time_budget_s: the probe (on a copy of the model) gives max(1, floor(budget / seconds per step)) steps, and
    the run is then the run of --max_train_steps N with --save_steps of --save_points: the same losses at every
    step and the same held-out scores, bit for bit on the CPU (the probe leaves the model, the data order and the
    masking stream as they were); under bf16 autocast too."""
    common = [*_reference_data(tokenizer, tmp_path), "--model_shape", "bert-tiny", "--learning_rate", "3e-3"]
    common += ["--batch_size", "4", "--mixed_precision", precision]
    sized = run_reference_in_process(
        [*common, "--time_budget_s", "0.4", "--probe_steps", "4", "--probe_warmup", "1", "--save_points", "3"]
        + ["--output_dir", str(tmp_path / "sized")]
    )
    budget = sized["budget"]
    steps = budget["max_train_steps"]
    assert steps == max(1, int(0.4 / budget["seconds_per_step"])) and len(sized["steps"]) == steps
    assert (budget["probe_steps"], budget["probe_warmup"], budget["time_budget_s"]) == (4, 1, 0.4)
    saves = ttq.runs.save_steps(steps, 3)
    assert sorted(int(k) for k in sized["scores"]) == saves
    given = run_reference_in_process(
        [*common, "--max_train_steps", str(steps), "--save_steps", *map(str, saves), "--output_dir"]
        + [str(tmp_path / "given")]
    )
    assert given["budget"] == {}
    assert [s["loss"] for s in sized["steps"]] == [s["loss"] for s in given["steps"]]
    assert [s["tokens"] for s in sized["steps"]] == [s["tokens"] for s in given["steps"]]
    assert sized["scores"] == given["scores"]
    run = ttq.runs.Run("reference", "reference", tmp_path / "sized", 42, lr=3e-3)
    assert ttq.runs.budget_record(run) == {"seconds_per_step": budget["seconds_per_step"], "max_train_steps": steps}
    with pytest.raises(SystemExit):  # one run length: steps or a budget, not both
        ttq.reference.reference_parser().parse_args(
            [*common, "--max_train_steps", "3", "--time_budget_s", "1", "--output_dir", "x"]
        )


class FakeClock:
    """A clock that advances ``step`` seconds at every reading (pretrain's probe reads it twice per step)."""

    def __init__(self, step: float):
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_pretrain_with_the_bench_time_budget_flags(tmp_path, fresh_state, monkeypatch):
    """Our run under the bench's time-budget flags (:func:`ttq.runs.pretrain_length_flags`): pretrain sizes the
    schedule (0.5 s per probed step, 0.1 minutes -> 12 steps), checkpoints at the bench's save steps (every
    ceil(12 / 5) = 3 and the last), logs every step (each checkpoint step has its training seconds) and records
    the probe where the bench reads it (:func:`ttq.runs.budget_record`)."""
    from _launch import corpus_args

    from core.errors import run_cli
    from pretrain.cli import main
    from tokenizer.wordpiece import train_wordpiece_tokenizer
    from training import budget as budgets

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(3)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 25))) + "." for _ in range(400)]
    (corpus / "train.txt").write_text("\n\n".join(lines[:360]) + "\n", encoding="utf-8")
    with gzip.open(corpus / "valid.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n\n".join(lines[360:]) + "\n")
    tok = tmp_path / "tok"
    train_wordpiece_tokenizer([corpus / "train.txt"], 100, tmp_path / "wp", min_frequency=1).save_pretrained(tok)
    monkeypatch.setattr(budgets, "clock", FakeClock(0.5))
    run = ttq.runs.Run("ours", "recipe", tmp_path / "ours", 42, budget_s=6.0)
    flags = ttq.runs.pretrain_length_flags(run, None, 5)
    assert run_cli(main, corpus_args(corpus, run.folder, *flags, tokenizer=tok)) == 0
    assert ttq.runs.budget_record(run) == {"seconds_per_step": pytest.approx(0.5), "max_train_steps": 12}
    saved = sorted(int(p.name.split("_")[1]) for p in (run.folder / "checkpoints").glob("step_*"))
    assert saved == ttq.runs.save_steps(12, 5) == [3, 6, 9, 12]
    logged = [r["step"] for r in json.loads((run.folder / "trainer_log.json").read_text())]
    assert logged == list(range(1, 13))
    times = ttq.scoring.times_from_trainer_log(json.loads((run.folder / "trainer_log.json").read_text()), 10**6, 8)
    assert all(times[s]["seconds"] > 0 for s in saved)


def _sst2(root: Path) -> str:
    rows = ["sentence\tlabel"] + [f"{' '.join(WORDS[i % 12 : i % 12 + 4])}\t{i % 2}" for i in range(24)]
    (root / "SST-2").mkdir(parents=True)
    (root / "SST-2" / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (root / "SST-2" / "dev.tsv").write_text("\n".join(rows[:1] + rows[1:11]) + "\n", encoding="utf-8")
    return str(root)


def test_finetunes_in_a_worker_have_the_metrics_of_their_own_process(tokenizer, tmp_path):
    """Fine-tunes run one after another in one worker process (``_finetune``) give the metrics a ``python -m
    finetune.glue`` process of the same arguments gives (the second fine-tune of the worker, after a failed one
    and another: nothing carries over), and a failed fine-tune is recorded with its log, the others go on."""
    import modeling

    torch.manual_seed(0)
    config = modeling.get_preset_config("bert-tiny", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    model = modeling.SesameBertForMaskedLM(config)
    model.save_pretrained(str(tmp_path / "model"))
    tokenizer.save_pretrained(str(tmp_path / "model"))
    args = argparse.Namespace(
        tasks=["sst2"],
        seeds=2,
        glue_dir=_sst2(tmp_path / "glue"),
        finetune_learning_rate=1e-3,
        finetune_epochs=2.0,
        max_seq_length=32,
        max_train_samples=None,
        finetune_parallel=1,
        keep_finetuned=False,
    )
    models = {"broken": tmp_path / "missing-model", "tiny": tmp_path / "model"}
    out = tmp_path / "bench"
    got = ttq.downstream.finetune_all(models, args, out)
    assert got["broken"]["downstream"] == {"sst2": None} and len(got["broken"]["errors"]) == 2
    assert "see " in got["broken"]["errors"][0] and got["tiny"]["errors"] == []
    worker_log = (out / "logs" / "finetune" / "tiny-sst2-s43.log").read_text()
    assert "(in-process)" in worker_log
    # the same fine-tune (seed 43) in a process of its own
    own = tmp_path / "own"
    argv = ttq.downstream.finetune_argv(tmp_path / "model", "sst2", 43, own, args)
    proc = subprocess.run(
        [sys.executable, "-m", "finetune.glue", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **ttq.common.child_env(1)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    mine = json.loads((out / "finetune" / "tiny" / "sst2-s43" / "all_results.json").read_text())
    theirs = json.loads((own / "all_results.json").read_text())
    for key in ("eval_accuracy", "eval_loss", "train_loss"):
        assert mine[key] == theirs[key], key
    assert got["tiny"]["downstream_seeds"]["sst2"][1] == theirs["eval_accuracy"]


def test_reference_probe_goes_on_until_its_pair_has_started(tokenizer, seeded_single_thread):
    """keep_going(): the probe runs at least --probe_steps steps, then as long as keep_going() is true (the paired
    run still starting up), and times only its last probe_steps - probe_warmup steps; the model is left as it was."""
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling

    enc = tokenizer(_documents(10, seed=4), return_special_tokens_mask=True)
    blocks = Dataset.from_dict({k: list(v) for k, v in enc.items()}).map(
        ttq.data.group_texts, batched=True, fn_kwargs={"block_size": 16}
    )
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    model = ttq.reference.reference_model("bert-tiny", tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = argparse.Namespace(probe_steps=3, probe_warmup=1, batch_size=4, learning_rate=1e-3, weight_decay=0.0)
    asked = []

    def keep_going():
        asked.append(1)
        return len(asked) <= 4

    autocast = torch.autocast("cpu", enabled=False)
    per_step, ran = ttq.reference.probe_seconds_per_step(
        model, blocks, collator, args, torch.device("cpu"), autocast, keep_going
    )
    assert ran == 3 + 4 and len(asked) == 5 and per_step > 0
    per_step, ran = ttq.reference.probe_seconds_per_step(model, blocks, collator, args, torch.device("cpu"), autocast)
    assert ran == 3 and per_step > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    args.probe_warmup = 3
    with pytest.raises(ValueError, match="--probe_steps 3 --probe_warmup 3"):
        ttq.reference.probe_seconds_per_step(model, blocks, collator, args, torch.device("cpu"), autocast)


def test_a_worker_stops_after_a_fine_tune_stopped_by_a_signal(tmp_path, monkeypatch, capfd):
    """A fine-tune that exits 143 (SIGTERM: checkpoint written, training.signals) ends the worker's loop: the next
    job is not run; a refused or crashed one (2, 1) does not; each job's output goes to its own log."""
    from finetune import glue

    calls = []

    def fake_main(argv):
        calls.append(argv[0])
        os.write(1, f"running {argv[0]}\n".encode())  # what a process prints
        if argv[0] == "crash":
            raise RuntimeError("boom")
        return {"ok": 0, "stopped": 143}[argv[0]]

    monkeypatch.setattr(glue, "main", fake_main)
    jobs = [{"name": n, "argv": [n], "log": str(tmp_path / f"{n}.log")} for n in ("ok", "crash", "stopped", "never")]
    status = ttq.downstream.run_finetunes_in_process(jobs)
    assert status == {"ok": 0, "crash": 1, "stopped": 143} and calls == ["ok", "crash", "stopped"]
    assert "running ok" in (tmp_path / "ok.log").read_text()
    assert "RuntimeError: boom" in (tmp_path / "crash.log").read_text()
    assert not (tmp_path / "never.log").exists()
    assert "running" not in capfd.readouterr().out  # nothing on this process's own output


def test_modernbert_reference_trains_the_run_mlm_way(tokenizer, tmp_path, seeded_single_thread):
    """--reference_model modernbert (issue 50, item 7): transformers' ModernBertForMaskedLM at modernbert-tiny's
    sizes (its modern preset of the bert-tiny width, the sesame-modern recipe's), trained by the same run_mlm loop
    (group_texts blocks, DataCollatorForLanguageModeling, AdamW, linear decay) without project code; its held-out
    score at a save step is the score of its saved weights."""
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM

    import modeling

    log = run_reference_in_process(
        [*_reference_data(tokenizer, tmp_path), "--model_shape", "bert-tiny"]
        + ["--reference_model", "modernbert", "--learning_rate", "1e-3", "--batch_size", "4"]
        + ["--max_train_steps", "3", "--save_steps", "3", "--save_checkpoints", "--output_dir", str(tmp_path / "ref")]
    )
    assert log["model_class"].endswith("ModernBertForMaskedLM") and log["attn_implementation"] == "sdpa"
    assert log["collator_class"].endswith("DataCollatorForLanguageModeling") and len(log["steps"]) == 3
    saved = AutoModelForMaskedLM.from_pretrained(tmp_path / "ref" / "checkpoints" / "step_3")
    heldout = load_file(tmp_path / "heldout.safetensors")
    assert log["scores"]["3"] == pytest.approx(ttq.scoring.heldout_loss(saved, heldout), rel=1e-5)
    # its sizes and layer types are modernbert-tiny's (the preset pretrain trains for sesame-modern)
    preset = modeling.get_preset_config(ttq.common.MODERN_PRESET_OF["bert-tiny"])
    config = saved.config
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "local_attention"):
        assert getattr(config, name) == getattr(preset, name), name
    assert config.layer_types == preset.attention_types() and not config.sparse_prediction


def test_modern_shapes_are_the_modern_presets():
    import modeling

    for shape, sizes in ttq.common.MODERN_SHAPES.items():
        preset = modeling.get_preset_config(ttq.common.MODERN_PRESET_OF[shape])
        assert {k: getattr(preset, k) for k in sizes} == sizes
        assert preset.hidden_size == ttq.common.SHAPES[shape]["hidden_size"]  # the width of its --model_shape


def test_reference_model_reaches_the_reference_command(tmp_path):
    data = {
        "reference_blocks": tmp_path / "blocks",
        "tokenizer": tmp_path / "tok",
        "variants": {"prepared": {"path": tmp_path / "prepared"}},
    }
    for given, expected in (([], "bert"), (["--reference_model", "modernbert"], "modernbert")):
        argv = [*BASE_ARGS, "--output_dir", str(tmp_path), "--budget_minutes", "1", *given]
        args = ttq.cli.parse_args(argv, cuda=False)
        ref = ttq.runs.plan_pairs(args, tmp_path)[0][0]
        ref.lr, ref.budget_s = 1e-3, 60.0
        cmd = ttq.runs.run_command(ref, args, data, None, 6)
        assert cmd[cmd.index("--reference_model") + 1] == expected
        assert expected in ttq.report._reference_protocol(args, 1e-3)["model"].lower()
