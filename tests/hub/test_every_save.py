"""``pretrain --hub_strategy every_save`` (a commit per checkpoint) and ``pretrain --revision`` (continue from a
tag of a hub repo) against the test Hub; the commands run in subprocesses (``HF_ENDPOINT`` is read at import)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
from _launch import corpus_args, pretrain_command
from safetensors.torch import load_file

pytestmark = pytest.mark.slow  # three short pretraining runs in subprocesses

ROOT = Path(__file__).resolve().parents[2]
WORDS = (
    "the senate adjourned after a long debate on budget it rained in afternoon and streets of city were wet "
    "elizabeth walked to house spoke with her sister about whale rose from sea sailors shouted"
).split()


def _documents(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return (
        "\n\n".join(
            "\n".join(
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))) + "." for _ in range(rng.randint(2, 4))
            )
            for _ in range(n)
        )
        + "\n"
    )


def _pretrain(hub, root: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = hub.env(root / "home")
    env.update(HF_DATASETS_OFFLINE="1", WANDB_MODE="offline", OMP_NUM_THREADS="1")
    args = corpus_args(root, out, "--num_warmup_steps", "1", *extra, config=None, valid="valid.txt")
    cmd = [*pretrain_command(1), *args]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def every_save_run(module_hub, tmp_path_factory):
    """``pretrain`` with a checkpoint every 2 of 4 steps, each pushed to ``alice/every`` (``every_save``)."""
    hub, root = module_hub, tmp_path_factory.mktemp("every_save")
    (root / "train.txt").write_text(_documents(40, 1))
    (root / "valid.txt").write_text(_documents(6, 2))
    proc = _pretrain(
        hub,
        root,
        root / "run",
        "--config_name",
        "bert-tiny",
        "--vocab_size",
        "200",
        "--checkpointing_steps",
        "2",
        "--checkpoints_total_limit",
        "0",
        "--max_train_steps",
        "4",
        "--push_to_hub",
        "--hub_model_id",
        "alice/every",
        "--hub_token",
        hub.write_token,
        "--hub_strategy",
        "every_save",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    hub.run(
        """
        import json
        from huggingface_hub import HfApi
        api = HfApi()
        mid = [c.commit_id for c in api.list_repo_commits("alice/every") if c.title == "Training in progress (step 2)"]
        if mid:
            api.create_tag("alice/every", tag="v-step2", revision=mid[0])
        print(json.dumps({"mid": mid}))
    """,
        root / "client_home",
        token=hub.write_token,
    )
    return root


def _weights(path: Path) -> dict:
    return {k: v.double() for k, v in load_file(str(path)).items()}


def test_every_save_commits_each_checkpoint_and_the_final_model(module_hub, every_save_run):
    hub, root = module_hub, every_save_run
    assert not (root / "run" / ".hub-staging").exists()
    res = hub.run(
        """
        import json, torch
        from huggingface_hub import HfApi
        from safetensors.torch import save_file
        from transformers import AutoModelForMaskedLM, AutoTokenizer
        api = HfApi()
        commits = api.list_repo_commits("alice/every")  # newest first
        titles = [c.title for c in commits]
        mid = next(c.commit_id for c in commits if c.title == "Training in progress (step 2)")
        files = sorted(api.list_repo_files("alice/every", revision=mid))
        model = AutoModelForMaskedLM.from_pretrained("alice/every", revision=mid, trust_remote_code=True)
        tok = AutoTokenizer.from_pretrained("alice/every", revision=mid, trust_remote_code=True)
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, "mid.safetensors")
        print(json.dumps({"titles": titles, "files": files, "vocab": len(tok), "mid": mid}))
    """,
        root / "client_home",
        token=hub.write_token,
    )
    titles = res["titles"]
    assert titles[0].startswith("pretrain: bert"), titles  # the final push, last
    assert titles.count("Training in progress (step 2)") == 1
    assert not [t for t in titles if "step 4" in t and "progress" in t]  # the last step is the final push only
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(res["files"])
    assert not [f for f in res["files"] if f.startswith((".hub-staging", "checkpoints/"))]
    assert res["vocab"] <= 200
    # the model at the intermediate commit is the step-2 checkpoint's model
    pushed = _weights(module_hub.tmp_path / "mid.safetensors")
    ckpt = _weights(root / "run" / "checkpoints" / "step_2" / "model.safetensors")
    common = set(pushed) & set(ckpt)
    assert len(common) >= len(ckpt) - 1
    assert max(float((pushed[k] - ckpt[k]).abs().max()) for k in common) == 0.0
    final = _weights(root / "run" / "model.safetensors")
    assert max(float((final[k] - ckpt[k]).abs().max()) for k in common if k in final) > 1e-4


def test_revision_loads_the_tagged_weights_and_config_errors_name_it(module_hub, every_save_run):
    hub, root = module_hub, every_save_run
    # a near-zero learning rate: the weights after one step are the starting weights
    proc = _pretrain(
        hub,
        root,
        root / "cont",
        "--model_name_or_path",
        "alice/every",
        "--tokenizer_name",
        "alice/every",
        "--revision",
        "v-step2",
        "--max_train_steps",
        "1",
        "--learning_rate",
        "1e-20",
        "--weight_decay",
        "0",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    started = _weights(root / "cont" / "model.safetensors")
    ckpt = _weights(root / "run" / "checkpoints" / "step_2" / "model.safetensors")
    final = _weights(root / "run" / "model.safetensors")
    common = set(started) & set(ckpt) & set(final)
    assert len(common) >= len(ckpt) - 1
    assert max(float((started[k] - ckpt[k]).abs().max()) for k in common) < 1e-6
    assert max(float((started[k] - final[k]).abs().max()) for k in common) > 1e-4

    bad = _pretrain(
        hub,
        root,
        root / "bad",
        "--tokenizer_name",
        "alice/every",
        "--revision",
        "v-step2",
        "--config_name",
        "alice/no-such-config",
        "--max_train_steps",
        "1",
    )
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "--config_name alice/no-such-config (--revision v-step2): not a preset, a config file" in bad.stderr, (
        bad.stderr[-2000:]
    )
    assert "expected a preset (bert-base" in bad.stderr and "a config path or a hub repo id" in bad.stderr
    assert not (root / "bad" / "model.safetensors").exists()


def test_a_failed_mid_training_push_warns_and_training_goes_on(hub, tmp_path):
    """``HubPusher.push_checkpoint``: a commit that loses its connection gives a warning naming the repo and
    step (no exception), the staging folder is removed, and the next save pushes."""
    hub.server.state.drop_commits["alice/flaky"] = 1  # the first commit to alice/flaky loses its connection
    res = hub.run(
        f"""
        import json, logging, os
        from transformers import BertConfig, BertForMaskedLM
        from training.hub import HubPusher
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())
        logging.getLogger("training.hub").addHandler(Keep())
        model = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=32, max_position_embeddings=16))
        pusher = HubPusher("alice/flaky", token={hub.write_token!r}, strategy="every_save")
        first = pusher.push_checkpoint("run", 2, model, model_card=lambda folder: "---\\nlicense: mit\\n---\\ncard\\n")
        staged_after_failure = os.path.exists("run/.hub-staging")
        second = pusher.push_checkpoint("run", 4, model)
        from huggingface_hub import HfApi
        titles = [c.title for c in HfApi().list_repo_commits("alice/flaky")]
        print(json.dumps({{"first": first, "second": second is not None, "records": records, "titles": titles,
                          "staged": staged_after_failure or os.path.exists("run/.hub-staging")}}))
    """,
        tmp_path / "home",
        token=hub.write_token,
    )
    assert res["first"] is None and res["second"]
    assert not res["staged"]
    warning = [r for r in res["records"] if "failed" in r]
    assert len(warning) == 1 and "step 2" in warning[0] and "'alice/flaky'" in warning[0], res["records"]
    assert "Training in progress (step 4)" in res["titles"]
    assert "Training in progress (step 2)" not in res["titles"]
