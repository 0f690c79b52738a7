"""finetune.suite: the GLUE score formula against a hand count, finished cells not rerun, warm starts from MNLI,
model-index cards, CPU shares of parallel cells (with a fake cell runner), and one real tiny table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from core.errors import run_cli
from finetune import cells, suite


def fake_results(task: str, seed: int) -> dict:
    """Made-up ``all_results.json`` of a cell: every metric a function of (task, seed)."""
    base = 0.5 + 0.01 * seed + 0.001 * len(task)
    return {
        "eval_accuracy": base,
        "eval_f1": base + 0.1,
        "eval_matthews_correlation": base - 0.3,
        "eval_pearson": base + 0.2,
        "eval_spearmanr": base + 0.15,
        "eval_matched_accuracy": base,
        "eval_mismatched_accuracy": base + 0.02,
        "train_runtime_s": 1.0,
    }


@pytest.fixture
def fake_runner(monkeypatch):
    """Replace the child process of every cell: write the fake results into its --output_dir; record the commands."""
    calls = []

    def run(cmd, env, log, name):
        calls.append((list(cmd), dict(env or {})))
        out = Path(cmd[cmd.index("--output_dir") + 1])
        task = cmd[cmd.index("--task_name") + 1] if "--task_name" in cmd else "ner"
        out.mkdir(parents=True, exist_ok=True)
        (out / "all_results.json").write_text(json.dumps(fake_results(task, int(cmd[cmd.index("--seed") + 1]))))
        log.parent.mkdir(parents=True, exist_ok=True)
        return 0, ""

    monkeypatch.setattr(cells, "run_command", run)
    return calls


def model_folder(tmp_path: Path, name: str = "tiny") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "sesame-bert"}))
    return folder


def test_glue_score_is_the_mean_of_task_medians_by_hand(fake_runner, glue_dir, tmp_path, capsys):
    model, out = model_folder(tmp_path), tmp_path / "suite"
    argv = [str(model), "--glue_dir", str(glue_dir), "--tasks", "cola", "stsb", "mrpc", "mnli", "wnli"]
    assert suite.main([*argv, "--seeds", "1", "2", "3", "--output_dir", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    s = doc["models"]["tiny"]
    # by hand: the task score of each seed, its median; WNLI not counted by default
    by_hand = {
        "cola": [fake_results("cola", k)["eval_matthews_correlation"] for k in (1, 2, 3)],
        "stsb": [
            (fake_results("stsb", k)["eval_pearson"] + fake_results("stsb", k)["eval_spearmanr"]) / 2 for k in (1, 2, 3)
        ],
        "mrpc": [
            (fake_results("mrpc", k)["eval_f1"] + fake_results("mrpc", k)["eval_accuracy"]) / 2 for k in (1, 2, 3)
        ],
        "mnli": [fake_results("mnli", k)["eval_accuracy"] + 0.01 for k in (1, 2, 3)],
    }
    for task, values in by_hand.items():
        assert s["tasks"][task]["scores"] == pytest.approx(values)
        assert s["tasks"][task]["median"] == pytest.approx(values[1])
        assert s["tasks"][task]["sd"] == pytest.approx(statistics.stdev(values))
    assert s["glue_score"] == pytest.approx(sum(v[1] for v in by_hand.values()) / 4)
    assert s["absent"] == ["sst2", "qqp", "qnli", "rte", "wnli"] and not s["wnli_counted"]
    table = (out / "results.md").read_text()
    assert f"{100 * s['glue_score']:.2f}" in table and "absent from it: sst2, qqp, qnli, rte, wnli" in table
    assert (out / "results.png").stat().st_size > 0
    assert f"tiny: GLUE score {100 * s['glue_score']:.2f}" in capsys.readouterr().out
    # --score_wnli: WNLI counted (the cells are finished: nothing runs again)
    n = len(fake_runner)
    assert suite.main([*argv, "--seeds", "1", "2", "3", "--output_dir", str(out), "--score_wnli"]) == 0
    s = json.loads((out / "results.json").read_text())["models"]["tiny"]
    assert len(fake_runner) == n and s["wnli_counted"]
    assert s["glue_score"] == pytest.approx((sum(v[1] for v in by_hand.values()) + 0.5 + 0.02 + 0.004) / 5)


def test_a_rerun_runs_only_the_unfinished_cells(fake_runner, glue_dir, tmp_path, capsys):
    model, out = model_folder(tmp_path), tmp_path / "suite"
    argv = [
        str(model),
        "--glue_dir",
        str(glue_dir),
        "--tasks",
        "sst2",
        "rte",
        "--seeds",
        "1",
        "2",
        "--output_dir",
        str(out),
    ]
    assert suite.main(argv) == 0 and len(fake_runner) == 4
    # as if killed during a cell: its run folder half there, no marker
    marker = out / "runs" / "tiny" / "rte" / "seed-2.cell.json"
    marker.unlink()
    assert suite.main(argv) == 0
    assert len(fake_runner) == 5 and "--task_name" in fake_runner[-1][0]
    cmd = fake_runner[-1][0]
    assert cmd[cmd.index("--task_name") + 1] == "rte" and cmd[cmd.index("--seed") + 1] == "2"
    assert "(1 cell(s) run, 3 finished before)" in capsys.readouterr().out
    # another command for the same cell (other flags after --) is not a finished cell
    assert suite.main([*argv, "--", "--max_train_samples", "8"]) == 0 and len(fake_runner) == 9


def test_warm_start_mnli_and_protocol_flags(fake_runner, glue_dir, tmp_path):
    model, out = model_folder(tmp_path), tmp_path / "suite"
    argv = [str(model), "--glue_dir", str(glue_dir), "--tasks", "rte", "mnli", "sst2", "--seeds", "7"]
    assert suite.main([*argv, "--warm_start", "mnli", "--protocol", "glue_sane", "--output_dir", str(out)]) == 0
    commands = [c for c, _ in fake_runner]
    tasks = [c[c.index("--task_name") + 1] for c in commands]
    assert tasks.index("mnli") < tasks.index("rte")
    rte = commands[tasks.index("rte")]
    assert rte[rte.index("--model_name_or_path") + 1] == str(out / "runs" / "tiny" / "mnli" / "seed-7")
    assert "--ignore_mismatched_sizes" in rte
    sst2 = commands[tasks.index("sst2")]
    assert sst2[sst2.index("--model_name_or_path") + 1] == str(model)
    for flag, value in [
        ("--learning_rate", "4e-5"),
        ("--per_device_train_batch_size", "16"),
        ("--num_train_epochs", "5"),
        ("--lr_scheduler_type", "cosine"),
        ("--warmup_ratio", "0.1"),
    ]:
        assert sst2[sst2.index(flag) + 1] == value  # fmt: skip
    # glue_sane without --tasks: the GLUE folder's tasks without WNLI
    assert "wnli" not in suite.check_inputs(
        suite.SuiteArguments(models=[str(model)], output_dir=str(out), glue_dir=str(glue_dir), protocol="glue_sane")
    )


def test_model_card_gets_model_index(fake_runner, glue_dir, tmp_path):
    from huggingface_hub import ModelCard

    model, out = model_folder(tmp_path), tmp_path / "suite"
    argv = [str(model), "--glue_dir", str(glue_dir), "--tasks", "sst2", "cola", "--seeds", "1", "2", "3"]
    assert suite.main([*argv, "--output_dir", str(out), "--update_model_card"]) == 0
    card = ModelCard.load(model / "README.md")
    results = {(r.dataset_config, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results[("sst2", "accuracy")] == pytest.approx(fake_results("sst2", 2)["eval_accuracy"], abs=1e-4)
    assert results[("cola", "matthews_correlation")] == pytest.approx(
        fake_results("cola", 2)["eval_matthews_correlation"], abs=1e-4
    )
    assert "model-index" in (model / "README.md").read_text()


def test_parallel_cells_split_the_cpus_or_take_one_gpu_each():
    assert [e["OMP_NUM_THREADS"] for e in cells.worker_envs(2, {}, gpus=0, cpus=8)] == ["4", "4"]
    assert [e["OMP_NUM_THREADS"] for e in cells.worker_envs(3, {}, gpus=0, cpus=2)] == ["1", "1", "1"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in cells.worker_envs(3, {}, gpus=2)] == ["0", "1", "0"]


def test_refusals(glue_dir, tmp_path, capsys):
    model = model_folder(tmp_path)
    cases = [
        ([str(tmp_path / "nope"), "--glue_dir", str(glue_dir)], "no config.json"),
        ([str(model), "--glue_dir", str(glue_dir), "--tasks", "sst2", "--warm_start", "mnli"], "--warm_start mnli"),
        ([str(model), "--glue_dir", str(tmp_path / "none")], "--glue_dir"),
        ([str(model), "--ner_dir", str(tmp_path)], "no train.conll"),
    ]
    for argv, expected in cases:
        assert run_cli(suite.main, [*argv, "--output_dir", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # four finetune.glue child processes (~10 s each on 2 CPU cores)
def test_tiny_table_from_real_runs_and_a_cell_equals_a_plain_glue_run(tiny_bert, glue_dir, tmp_path):
    from finetune import glue

    out = tmp_path / "suite"
    flags = [
        "--max_train_steps",
        "2",
        "--per_device_train_batch_size",
        "2",
        "--learning_rate",
        "1e-3",
        "--max_seq_length",
        "32",
    ]
    argv = [str(tiny_bert), "--glue_dir", str(glue_dir), "--tasks", "sst2", "stsb", "--seeds", "1", "2"]
    assert suite.main([*argv, "--output_dir", str(out), "--", *flags]) == 0
    doc = json.loads((out / "results.json").read_text())
    s = doc["models"][tiny_bert.name]
    assert set(s["tasks"]) == {"sst2", "stsb"} and len(s["tasks"]["sst2"]["scores"]) == 2
    assert s["glue_score"] == pytest.approx((s["tasks"]["sst2"]["median"] + s["tasks"]["stsb"]["median"]) / 2)
    cell = json.loads((out / "runs" / tiny_bert.name / "sst2" / "seed-1" / "all_results.json").read_text())
    plain = tmp_path / "plain"
    args = ["--model_name_or_path", str(tiny_bert), "--task_name", "sst2", "--glue_dir", str(glue_dir), "--seed", "1"]
    assert glue.main([*args, "--output_dir", str(plain), "--report_to", "none", *flags]) == 0
    assert json.loads((plain / "all_results.json").read_text())["eval_accuracy"] == cell["eval_accuracy"]
    assert s["tasks"]["sst2"]["scores"][0] == cell["eval_accuracy"]


def test_parallel_2_gives_the_table_of_parallel_1(fake_runner, glue_dir, tmp_path):
    model = model_folder(tmp_path)
    argv = [str(model), "--glue_dir", str(glue_dir), "--tasks", "sst2", "mrpc", "cola", "--seeds", "1", "2"]
    assert suite.main([*argv, "--output_dir", str(tmp_path / "one")]) == 0
    assert suite.main([*argv, "--output_dir", str(tmp_path / "two"), "--parallel", "2"]) == 0
    one, two = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    assert one["models"] == two["models"]
    assert [r["seed"] for r in one["runs"]] == [r["seed"] for r in two["runs"]]  # table order, not finishing order
    assert (tmp_path / "one" / "results.md").read_text() == (tmp_path / "two" / "results.md").read_text()
    threads = {env.get("OMP_NUM_THREADS") for _, env in fake_runner[6:]}
    assert len(threads) == 1  # both workers got the same share of the CPUs


def test_help_names_each_protocol_and_its_source(capsys):
    with pytest.raises(SystemExit):
        suite.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "glue_sane: Cramming (Geiping & Goldstein 2023" in text and "10% warmup" in text
    assert "default: sesame-lm's finetune.glue defaults" in text


def test_grouped_bars_draw_each_value_and_each_seed(tmp_path):
    """cells.grouped_bars (the suite's and finetune.baselines' picture): one bar per (group, series) with a value, of
    height 100 x value, centred in its group; a dot per seed where a bar has several; nothing where the value is
    missing."""
    series = {"a": [(0.8, [0.79, 0.81]), None, (0.5, ())], "b": [(0.7, [0.7]), (None, []), (0.4, ())]}
    fig = cells.grouped_bars(tmp_path / "bars.png", ["sst2", "cola", "GLUE score"], series, "score x 100")
    assert (tmp_path / "bars.png").stat().st_size > 1000
    (ax,) = fig.axes
    bars = [(round(p.get_x() + p.get_width() / 2, 6), round(p.get_height(), 6)) for p in ax.patches]
    assert bars == [(-0.2, 80.0), (1.8, 50.0), (0.2, 70.0), (2.2, 40.0)]
    dots = [line.get_ydata().tolist() for line in ax.lines if line.get_linestyle() == "None"]
    assert dots == [pytest.approx([79.0, 81.0])]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["sst2", "cola", "GLUE score"]
