"""``training.hub`` against the test Hub: what is pushed, branches, and the errors users see."""

from __future__ import annotations

import hashlib

import pytest
from huggingface_hub import ModelCard

from core.arguments import parse_arguments
from core.errors import InputError
from training.hub import HubArguments, default_repo_id, validate_hub_arguments
from training.model_card import render_model_card

CARD = dict(
    model_type="sesame-bert",
    repo_id="alice/m",
    preset="bert-tiny",
    training_data="tiny.txt",
    hyperparameters={"learning_rate": 0.001},
    results={"eval_loss": 2.0, "perplexity": 7.39},
)


def _output_dir(path, weights=b"W" * 3000, sharded=False):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "sesame-bert"}')
    if sharded:
        (path / "model-00001-of-00002.safetensors").write_bytes(weights[:1500])
        (path / "model-00002-of-00002.safetensors").write_bytes(weights[1500:])
        (path / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    else:
        (path / "model.safetensors").write_bytes(weights)
    (path / "modeling_sesame_bert.py").write_text("# model code for trust_remote_code\n")
    (path / "pytorch_model.bin").write_bytes(b"pickle")  # never pushed
    (path / "checkpoints" / "step_2").mkdir(parents=True, exist_ok=True)
    (path / "checkpoints" / "step_2" / "model.safetensors").write_bytes(b"ckpt")
    return path


def test_push_files_branches_strategy_and_errors(hub, tmp_path):
    _output_dir(tmp_path / "run")
    _output_dir(tmp_path / "run_sharded", weights=b"V" * 3000, sharded=True)
    hub.server.state.drop_commits["alice/flaky"] = 1  # the first commit to alice/flaky loses its connection
    out = hub.run(
        f"""
        import argparse, json
        from huggingface_hub import HfApi
        from core.errors import InputError
        from core.arguments import parse_arguments
        from training.hub import HubArguments, HubPusher, push_output_dir, validate_hub_arguments
        W, R, BOB = {hub.write_token!r}, {hub.read_token!r}, {hub.other_token!r}
        res = {{}}
        def outcome(key, fn):
            try:
                res[key] = ["ok", str(fn())]
            except InputError as err:
                res[key] = ["InputError", str(err)]

        # no token anywhere (HF_TOKEN unset, fresh HF_HOME)
        outcome("no_token", lambda: push_output_dir("run", "alice/m"))
        outcome("wrong_token", lambda: push_output_dir("run", "alice/m", token="hf_wrong"))
        from training.model_card import render_model_card
        card = render_model_card(**{CARD!r})
        c1 = push_output_dir("run", "alice/m", token=W, commit_message="Upload model (step 2)", model_card=card)
        res["c1"] = c1.oid
        info = HfApi().model_info("alice/m")  # the Hub parses the card's metadata (cardData, tags)
        res["card_data"] = [info.card_data.to_dict(), info.tags, info.pipeline_tag]
        outcome("read_only", lambda: push_output_dir("run", "alice/m", token=R))
        outcome("other_user", lambda: push_output_dir("run", "alice/m", token=BOB))
        HfApi(token=W).create_tag("alice/m", tag="v1")
        outcome("to_tag", lambda: push_output_dir("run", "alice/m", token=W, revision="v1"))
        # sharded weights replace model.safetensors in one commit, on a new branch
        c2 = push_output_dir("run_sharded", "alice/m", token=W, revision="exp/shards")
        res["c2"] = c2.oid
        # every_save through HubPusher built from the CLI flags
        def parse(argv):
            return parse_arguments([HubArguments], argv, prog="t", description="")[0]
        args = validate_hub_arguments(parse(["--push_to_hub", "--hub_token", W, "--hub_strategy", "every_save",
                                             "--hub_private_repo"]), "run")
        pusher = HubPusher.from_arguments(args)
        res["derived_id"] = args.hub_model_id
        res["prepared"] = pusher.prepare()
        res["progress"] = pusher.push("run", step=5, final=False).oid
        res["every_save"] = pusher.should_push_on_save
        for key, argv in (("validate_read_only", ["--hub_token", R]), ("validate_wrong", ["--hub_token", "hf_x"]),
                          ("validate_tag_sha", ["--hub_token", W, "--hub_revision", "a" * 40]),
                          ("validate_namespace", ["--hub_token", BOB, "--hub_model_id", "alice/x"])):
            a = parse(["--push_to_hub", *argv])
            outcome(key, lambda: validate_hub_arguments(a, "run"))
        outcome("interrupted", lambda: push_output_dir("run", "alice/flaky", token=W))
        res["retry"] = push_output_dir("run", "alice/flaky", token=W).oid
        print(json.dumps(res))
    """,
        tmp_path / "home",
        cwd=tmp_path,
    )

    assert out["no_token"][0] == "InputError" and "no token" in out["no_token"][1]
    assert "'alice/m'" in out["no_token"][1] and "--hub_token" in out["no_token"][1]
    assert out["wrong_token"][0] == "InputError" and "refused" in out["wrong_token"][1]
    assert out["read_only"][0] == "InputError" and "read-only" in out["read_only"][1]
    assert out["other_user"][0] == "InputError" and "no write access" in out["other_user"][1]
    assert "'alice/m'" in out["other_user"][1]
    assert out["to_tag"][0] == "InputError" and "'v1' is a tag" in out["to_tag"][1]
    for key in ("validate_read_only", "validate_wrong", "validate_tag_sha", "validate_namespace"):
        assert out[key][0] == "InputError", (key, out[key])
    assert "user 'bob' cannot push to the namespace 'alice'" in out["validate_namespace"][1]
    assert "--hub_revision" in out["validate_tag_sha"][1]

    repo = hub.server.repo("alice/m")
    main = repo.commits[repo.branches["main"]]
    assert repo.branches["main"] == out["c1"] and main.title == "Upload model (step 2)"
    # safetensors + config + model code; no pickles, no checkpoints
    assert set(main.files) == {
        ".gitattributes",
        "config.json",
        "model.safetensors",
        "modeling_sesame_bert.py",
        "README.md",
    }
    card = render_model_card(**CARD)
    assert main.files["README.md"].data.decode() == card  # the card arrives byte for byte
    card_data, tags, pipeline_tag = out["card_data"]
    assert card_data == ModelCard(card).data.to_dict() and pipeline_tag == "fill-mask"
    assert tags[0] == "transformers" and "sesame-bert" in tags
    shards = repo.commits[repo.branches["exp/shards"]]
    assert shards.parent == out["c1"] and repo.branches["exp/shards"] == out["c2"]
    assert "model.safetensors" not in shards.files  # stale single-file weights deleted in the same commit
    assert {"model-00001-of-00002.safetensors", "model.safetensors.index.json"} <= set(shards.files)

    derived = hub.server.repo("alice/run")
    assert out["derived_id"] == "alice/run" and derived.private
    assert derived.commits[out["progress"]].title == "Training in progress (step 5)"
    assert out["prepared"] == derived.commits[out["progress"]].parent and out["every_save"] is True

    # the interrupted push committed nothing and says which commit the remote keeps; the retry works
    flaky = hub.server.repo("alice/flaky")
    initial = [c for c in flaky.commits.values() if c.parent is None][0]
    assert out["interrupted"][0] == "InputError"
    assert f"last complete commit {initial.oid}" in out["interrupted"][1]
    assert flaky.commits[out["retry"]].parent == initial.oid and flaky.branches["main"] == out["retry"]
    sha = hashlib.sha256(b"W" * 3000).hexdigest()
    assert len([p for m, p in hub.server.state.requests if m == "PUT" and sha in p]) == 1  # uploaded once


def test_validate_hub_args_offline():
    def parse(argv):
        return parse_arguments([HubArguments], argv, prog="t", description="")[0]

    args = validate_hub_arguments(parse([]), "out", check_remote=False)  # no --push_to_hub: nothing to check
    assert args.hub_model_id is None and args.hub_strategy == "end"
    for argv, flag in (
        (["--push_to_hub"], "--hub_model_id"),
        (["--push_to_hub", "--hub_model_id", "a/b", "--hub_revision", "../x"], "--hub_revision"),
        (["--push_to_hub", "--hub_model_id", "a/b--c"], "--hub_model_id"),
    ):
        with pytest.raises(InputError, match=flag):
            validate_hub_arguments(parse(argv), "out", check_remote=False)
    args = validate_hub_arguments(
        parse(["--push_to_hub", "--hub_model_id", "alice/x", "--hub_revision", "run-2"]), "out", check_remote=False
    )
    assert args.hub_model_id == "alice/x"
    assert default_repo_id("/tmp/runs/my run!", "alice") == "alice/my-run"


def test_push_without_xet_support_says_how_to_fix(hub, tmp_path):
    """huggingface_hub 2.x uploads large files through Xet when hf_xet is installed; this server has no Xet."""
    pytest.importorskip("hf_xet")
    _output_dir(tmp_path / "run")
    out = hub.run(
        """
        import json
        from core.errors import InputError
        from training.hub import push_output_dir
        try:
            push_output_dir("run", "alice/m")
            print(json.dumps({"error": None}))
        except InputError as err:
            print(json.dumps({"error": str(err)}))
    """,
        tmp_path / "home",
        token=hub.write_token,
        cwd=tmp_path,
        xet=True,
    )
    assert "HF_HUB_DISABLE_XET=1" in out["error"] and "nothing was committed" in out["error"]
    repo = hub.server.repo("alice/m")
    assert list(repo.commits) == [repo.branches["main"]]  # only the initial commit


def test_every_save_hook_gathers_on_every_rank_and_pushes_on_the_main_one():
    """The shared ``--hub_strategy every_save`` hook of pretrain / glue / squad: None for 'end' or no pusher;
    otherwise ``get_state_dict`` on every rank (FSDP gathers there) and a push from the main process only."""
    from types import SimpleNamespace

    from training.hub import HubPusher, every_save_hook

    def card(folder):
        return "card"

    assert every_save_hook(None, "out", tokenizer="tok", model_card=card) is None
    assert every_save_hook(HubPusher("alice/m", strategy="end"), "out", tokenizer="tok", model_card=card) is None

    pushes, gathers = [], []

    class Pusher(HubPusher):
        def push_checkpoint(self, output_dir, step, model, tokenizer=None, state_dict=None, model_card=None):
            pushes.append((output_dir, step, model, tokenizer, state_dict, callable(model_card)))

    hook = every_save_hook(Pusher("alice/m", strategy="every_save"), "out", tokenizer="tok", model_card=card)
    for rank in (0, 1):
        acc = SimpleNamespace(
            is_main_process=rank == 0, get_state_dict=lambda m, r=rank: gathers.append((r, m)) or {"w": r}
        )
        hook(SimpleNamespace(accelerator=acc, eager_model="wrapped", unwrapped_model="model"), 4)
    assert gathers == [(0, "wrapped"), (1, "wrapped")], "the prepared eager module's state (not a compiled wrapper's)"
    assert pushes == [("out", 4, "model", "tok", {"w": 0}, True)]
