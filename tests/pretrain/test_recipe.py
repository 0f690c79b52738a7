"""``pretrain --recipe FILE`` (issue 52): the shipped recipes read as documented, bad recipes are refused with one line
naming the file and the field (nothing written), and the acceptance run: the three-phase demo recipe as one command on
the CPU, stopped by SIGTERM in phase 2 and run again -- phase 1 is skipped, phase 2 resumes from its own checkpoint,
phase 3 runs, and the test hub has one branch per phase, each loading with ``from_pretrained(revision=...)``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch import QUIET, corpus_args, hub_env

from core.errors import InputError, run_cli
from pretrain.cli import main, parse
from pretrain.recipe import load_recipe, phase_commands, split_recipe

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_alice_write_0123456789"  # the hub_url fixture's (conftest)


def _known() -> set[str]:
    from pretrain.cli import known_flags

    return known_flags()


def test_shipped_recipes_are_modernberts_three_phases(corpus_dir, tmp_path):
    """recipes/modernbert.yaml: stable at 1,024 (global base 10k, 30% masking, StableAdamW + decoupled wd, batch-size
    warmup), ext at 8,192 with base 160k, a 1-sqrt decay; shares of ModernBERT's 1.719T + 250B + 50B tokens. Both
    recipes resolve into pretrain runs that continue with the same optimizer settings, and --max_train_tokens B gives
    each phase round(share x B) tokens."""
    budget, phases = load_recipe(ROOT / "recipes" / "modernbert.yaml", _known())
    assert budget == 2_019_000_000_000 and [p.name for p in phases] == ["stable", "ext", "decay"]
    assert [round(p.share * budget / 1e9) for p in phases] == [1719, 250, 50]
    for name in ("modernbert.yaml", "demo.yaml"):
        data = corpus_args(corpus_dir, tmp_path / name, config=None)
        out, commands = phase_commands(
            ROOT / "recipes" / name, [*data, "--max_train_tokens", "1000000"], parse, _known()
        )
        assert out == str(tmp_path / name)
        plans = [parse(args) for _, args in commands]
        assert [p.model.rope_theta for p in plans] == [10000, 160000, 160000]
        assert plans[0].corpus.max_seq_length < plans[1].corpus.max_seq_length == plans[2].corpus.max_seq_length
        assert [p.training.lr_scheduler_type for p in plans] == ["constant_with_warmup", "constant", "decay_1sqrt"]
        assert plans[0].training.batch_size_warmup_tokens and plans[0].masking.mlm_probability == 0.3
        assert {(p.training.optim, p.training.decoupled_weight_decay, p.training.learning_rate) for p in plans} == {
            ("stable_adamw", True, plans[0].training.learning_rate)
        }
        shares = [phase.share for phase, _ in commands]
        assert [p.budget.max_train_tokens for p in plans] == [round(s * 1_000_000) for s in shares]
        assert [p.training.output_dir for p in plans] == [str(tmp_path / name / ph.name) for ph, _ in commands]
    modern = [parse(args) for _, args in phase_commands(ROOT / "recipes" / "modernbert.yaml", data, parse, _known())[1]]
    assert [p.corpus.max_seq_length for p in modern] == [1024, 8192, 8192]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("phases: [", r"not YAML"),
        ("- 1\n- 2\n", r"a list; expected a mapping"),
        ("phase: []\n", r"unknown key 'phase'; expected max_train_tokens, flags, phases"),
        ("phases: []\n", r"phases \[\]; expected a non-empty list"),
        ("phases:\n  - name: a\n    flag: {}\n", r"phases\[0\]: unknown key 'flag'"),
        ("phases:\n  - name: a\n    flags: {max_seq_lenght: 64}\n", r"flags.max_seq_lenght: not a pretrain"),
        ("flags: {output_dir: x}\nphases:\n  - name: a\n", r"flags.output_dir: set by --recipe for each phase"),
        ("phases:\n  - name: a\n  - name: a\n", r"phases\[1\].name: \"a\"; expected a unique name"),
        ("phases:\n  - name: a\n    share: 1.5\n", r"phases\[0\].share: 1.5; expected a share"),
        ("phases:\n  - name: a\n    share: 0.5\n", r"phases have a share and there is no token budget"),
        ("phases:\n  - name: a\n    flags: {max_seq_length: [1, {}]}\n", r"max_seq_length: .*expected a value"),
        ("phases:\n  - name: a\n    flags: {max_seq_length: 0}\n", r"phase a: --max_seq_length 0: expected"),
    ],
)
def test_bad_recipe_is_one_error_line_naming_file_and_field(corpus_dir, tmp_path, capsys, text, expected):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    out = tmp_path / "out"
    assert run_cli(main, [*corpus_args(corpus_dir, out), "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --recipe {recipe}"), err
    assert re.search(expected, err[0]), err[0]
    assert not out.exists()


def test_runner_flags_on_the_command_and_a_missing_file_are_refused(corpus_dir, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("phases:\n  - name: a\n")
    with pytest.raises(InputError, match="--hub_revision is set by the recipe for each phase"):
        main([*corpus_args(corpus_dir, tmp_path / "o"), "--recipe", str(recipe), "--hub_revision", "x"])
    with pytest.raises(InputError, match="--push_to_hub without --hub_model_id"):
        main([*corpus_args(corpus_dir, tmp_path / "o"), "--recipe", str(recipe), "--push_to_hub"])
    with pytest.raises(InputError, match=r"--recipe .*missing.yaml: cannot be read"):
        main([*corpus_args(corpus_dir, tmp_path / "o"), "--recipe", str(tmp_path / "missing.yaml")])
    assert not (tmp_path / "o").exists()


LOAD_REVISIONS = """
import json, sys
import torch
import modeling  # noqa: F401  (registers SesameBert with the Auto classes)
from huggingface_hub import HfApi
from transformers import AutoModelForMaskedLM
token, out = sys.argv[1], sys.argv[2]
refs = HfApi(token=token).list_repo_refs("alice/phases")
result = {"branches": sorted(b.name for b in refs.branches)}
for name in ("stable", "ext", "decay"):
    model = AutoModelForMaskedLM.from_pretrained("alice/phases", revision=name, token=token)
    local = AutoModelForMaskedLM.from_pretrained(f"{out}/{name}")
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), local.state_dict().values()))
    result[name] = {"rope_theta": model.config.rope_parameters["full_attention"]["rope_theta"], "same_as_local": same}
print(json.dumps(result))
"""


@pytest.mark.slow
def test_demo_recipe_stopped_in_phase_two_resumes_and_pushes_each_phase(corpus_dir, bert_tokenizer, hub_url, tmp_path):
    """Acceptance (issue 52): recipes/demo.yaml (scaled down by --max_train_tokens) as one command with
    --push_to_hub; SIGTERM once phase 2 (ext) has started -> exit 143, phase 1 recorded as finished, phase 2 has a
    checkpoint, phase 3 not started. The same command again: phase 1 skipped, phase 2 resumed from its checkpoint,
    phase 3 run; the hub has the branches stable, ext and decay, each loading with from_pretrained(revision=...) with
    its phase's rotary base and bitwise the phase's local model."""
    bert_tokenizer.save_pretrained(tmp_path / "tok")
    out = tmp_path / "demo"
    push = ["--push_to_hub", "--hub_model_id", "alice/phases", "--hub_token", TOKEN]
    args = corpus_args(corpus_dir, out, "--tokenizer_name", str(tmp_path / "tok"), "--max_train_tokens", "60000")
    cmd = [sys.executable, "-m", "pretrain", "--recipe", str(ROOT / "recipes" / "demo.yaml"), *args, *push]
    env = hub_env(hub_url, tmp_path / "hf", **QUIET)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if "a new phase from" in line and "training.loop" in line:  # phase 2 starts its steps
                proc.send_signal(signal.SIGTERM)
                break
        _, rest = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(seen) + rest
    assert proc.returncode == 143, err[-3000:]
    state = json.loads((out / "recipe_state.json").read_text())
    assert list(state["finished"]) == ["stable"], err[-3000:]
    stopped = sorted((out / "ext" / "checkpoints").glob("step_*"))
    assert stopped and not (out / "ext" / "all_results.json").exists() and not (out / "decay").exists()

    started = time.time()
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "phase 1/3 stable: finished" in again.stderr and "phase 2/3 ext: resumes inside the phase" in again.stderr
    assert f"resumed from {out / 'ext' / 'checkpoints'}" in again.stderr, again.stderr[-3000:]
    assert list(json.loads((out / "recipe_state.json").read_text())["finished"]) == ["stable", "ext", "decay"]
    ext_steps = json.loads((out / "ext" / "trainer_log.json").read_text())
    assert ext_steps, "the resumed phase logged its steps"
    assert time.time() - started < 600

    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_REVISIONS, TOKEN, str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    result = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert {"stable", "ext", "decay"} <= set(result["branches"])
    assert [result[n]["rope_theta"] for n in ("stable", "ext", "decay")] == [10000, 160000, 160000]
    assert all(result[n]["same_as_local"] for n in ("stable", "ext", "decay"))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_recipe_under_accelerate_launch_with_two_processes(corpus_dir, bert_tokenizer, tmp_path):
    """``accelerate launch`` (2 CPU processes) runs every phase in one process group (kept from phase to phase:
    training.accelerator.keep_process_group); each later phase starts from the previous phase's last checkpoint."""
    from _launch import run_pretrain

    bert_tokenizer.save_pretrained(tmp_path / "tok")
    out = tmp_path / "two"
    args = corpus_args(corpus_dir, out, "--tokenizer_name", str(tmp_path / "tok"), "--max_train_tokens", "40000")
    run_pretrain(2, ["--recipe", str(ROOT / "recipes" / "demo.yaml"), *args])
    finished = json.loads((out / "recipe_state.json").read_text())["finished"]
    assert list(finished) == ["stable", "ext", "decay"]
    for before, after in (("stable", "ext"), ("ext", "decay")):
        assert Path(finished[before]["checkpoint"]).parent == out / before / "checkpoints"
        settings = json.loads((out / after / "run_config.json").read_text())
        assert settings["continue_from_checkpoint"] == finished[before]["checkpoint"]
    rope = json.loads((out / "decay" / "config.json").read_text())["rope_parameters"]
    assert (rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"]) == (160000, 10000)


def _documented_pretrain_commands(marker: str) -> list[list[str]]:
    """The ``pretrain`` commands of the pretraining page, ``docs/pretraining.md`` (shell-split, after ``pretrain``), in
    the bash blocks that contain ``marker``."""
    import shlex

    text = (ROOT / "docs" / "pretraining.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        if marker not in block:
            continue
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "pretrain" in words:
                commands.append(words[words.index("pretrain") + 1 :])
    return commands


def test_readme_phase_commands_resolve(monkeypatch):
    """The --recipe commands of docs/pretraining.md resolve into their phases (the shipped recipes, the flags as
    written), and its context-extension commands parse with the documented base and lengths."""
    monkeypatch.chdir(ROOT)
    recipes = _documented_pretrain_commands("--recipe recipes/")
    assert len(recipes) == 2
    for argv in recipes:
        recipe, rest = split_recipe(argv)
        out, commands = phase_commands(recipe, rest, parse, _known())
        assert [phase.name for phase, _ in commands] == ["stable", "ext", "decay"] and out.startswith("outputs/")
    stable, ext = _documented_pretrain_commands("--rope_theta 160000 --max_seq_length 512")
    monkeypatch.setattr(
        "training.checkpoint_files.check_checkpoint_path", lambda *a, **k: None
    )  # no such checkpoint here
    assert (parse(stable).model.rope_theta, parse(stable).corpus.max_seq_length) == (10000, 128)
    assert (parse(ext).model.rope_theta, parse(ext).corpus.max_seq_length) == (160000, 512)
