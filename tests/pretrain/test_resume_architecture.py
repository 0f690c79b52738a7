"""A resume refuses another architecture of the same shapes (issue 49, item 4): a modernbert-tiny run checkpointed at
step 2, resumed with a config whose ``local_attention``, local rotary base (``rope_parameters``) or ``hidden_act``
changed (every tensor keeps its shape, so the weights would load), exits 2 with one line naming the field and both
values, before a step is trained; another dropout is refused too unless ``--allow_dropout_change``, which warns and
continues."""

from __future__ import annotations

import json
import logging

import pytest
from _helpers import reset_accelerate_state
from _launch import checkpoint_args
from _launch import corpus_args as _run_args

from core.errors import run_cli
from pretrain.cli import main

#: (field, the run's value, the resumed run's value): each keeps every tensor's shape (geglu -> swiglu: the same fc1)
#: modernbert-tiny's rotary bases, and the same with another local base (named by its dotted name when refused)
ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 160000.0}}
ROPE |= {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
LOCAL = dict(ROPE, sliding_attention={"rope_type": "default", "rope_theta": 20000.0})
CHANGES = [("local_attention", 16, 8), ("rope_parameters", ROPE, LOCAL), ("hidden_act", "geglu", "swiglu")]


@pytest.fixture(scope="module")
def checkpointed(corpus_dir, bert_tokenizer, tmp_path_factory):
    """``(root, common arguments)`` of a 4-step modernbert-tiny run (window 16) with checkpoints at steps 2 and 4,
    whose step-4 checkpoint is removed (a resume then has steps left to train)."""
    import shutil

    import modeling

    root = tmp_path_factory.mktemp("resume-architecture")
    tok = root / "tok"
    bert_tokenizer.save_pretrained(tok)
    modeling.get_preset_config("modernbert-tiny", local_attention=16).save_pretrained(root / "preset")
    common = ["--tokenizer_name", str(tok), *checkpoint_args(4, 2), "--learning_rate", "2e-3"]
    reset_accelerate_state()
    assert run_cli(main, _run_args(corpus_dir, root / "run", *common, config=str(root / "preset"))) == 0
    reset_accelerate_state()
    shutil.rmtree(root / "run" / "checkpoints" / "step_4")
    return root, common


def _resume_with(root, corpus_dir, common, name: str, **fields) -> list[str]:
    config = json.loads((root / "preset" / "config.json").read_text())
    config.update(fields)
    (root / name).mkdir()
    (root / name / "config.json").write_text(json.dumps(config))
    return _run_args(corpus_dir, root / "run", *common, "--resume_from_checkpoint", "latest", config=str(root / name))


def _state(root) -> str:
    return (root / "run" / "checkpoints" / "step_2" / "trainer_state.json").read_text()


@pytest.mark.parametrize("field, old, new", CHANGES, ids=[c[0] for c in CHANGES])
def test_resume_with_another_architecture_of_the_same_shapes_is_refused_naming_the_field(
    checkpointed, corpus_dir, capsys, fresh_state, field, old, new
):
    root, common = checkpointed
    recorded = json.loads(_state(root))["model_config"]
    assert recorded[field] == old
    before = sorted(p.name for p in (root / "run" / "checkpoints").iterdir())
    capsys.readouterr()
    assert run_cli(main, _resume_with(root, corpus_dir, common, f"changed-{field}", **{field: new})) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "the model config differs from the checkpoint's" in lines[0], lines[0]
    named = f"{field} {json.dumps(old)} -> {json.dumps(new)}"
    if field == "rope_parameters":
        named = "rope_parameters.sliding_attention.rope_theta 10000.0 -> 20000.0"
    assert named in lines[0], lines[0]
    assert sorted(p.name for p in (root / "run" / "checkpoints").iterdir()) == before, "nothing trained on"


def test_another_dropout_is_refused_unless_allow_dropout_change_which_warns_and_trains_on(
    checkpointed, corpus_dir, capsys, caplog, fresh_state
):
    root, common = checkpointed
    argv = _resume_with(root, corpus_dir, common, "dropout", hidden_dropout_prob=0.1)
    capsys.readouterr()
    assert run_cli(main, argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "hidden_dropout_prob 0.0 -> 0.1" in lines[0], lines
    assert "--allow_dropout_change" in lines[0]
    reset_accelerate_state()
    with caplog.at_level(logging.WARNING):
        assert run_cli(main, [*argv, "--allow_dropout_change"]) == 0
    assert any("hidden_dropout_prob 0.0 -> 0.1" in r.getMessage() for r in caplog.records)
    assert json.loads((root / "run" / "config.json").read_text())["hidden_dropout_prob"] == 0.1
    assert (root / "run" / "checkpoints" / "step_4").is_dir()


def test_a_checkpoint_recorded_by_an_earlier_version_resumes(checkpointed, corpus_dir, capsys, fresh_state, tmp_path):
    """A checkpoint whose ``model_config`` names transformers 4's fields (``rope_theta``, ``local_rope_theta``, as main
    703f97b recorded them) is read through the config class: the same model resumes and trains on; another global
    base in the record is still refused, by its new name."""
    import shutil

    root, common = checkpointed
    for name, theta in (("same", 160000.0), ("other", 20000.0)):
        run = tmp_path / name
        shutil.copytree(root / "run", run)
        shutil.rmtree(run / "checkpoints" / "step_4", ignore_errors=True)  # (a test above trains on to step 4)
        state_file = run / "checkpoints" / "step_2" / "trainer_state.json"
        state = json.loads(state_file.read_text())
        rope = state["model_config"].pop("rope_parameters")
        assert rope == ROPE  # the record this version writes, rewritten as the earlier version wrote it
        state["model_config"].update(rope_theta=theta, local_rope_theta=rope["sliding_attention"]["rope_theta"])
        state_file.write_text(json.dumps(state))
        argv = _run_args(corpus_dir, run, *common, "--resume_from_checkpoint", "latest", config=str(root / "preset"))
        capsys.readouterr()
        reset_accelerate_state()
        if name == "same":
            assert run_cli(main, argv) == 0
            assert (run / "checkpoints" / "step_4").is_dir()
        else:
            assert run_cli(main, argv) == 2
            assert "rope_parameters.full_attention.rope_theta 20000.0 -> 160000.0" in capsys.readouterr().err
