"""The commands themselves against the test Hub: ``pretrain --push_to_hub`` (SesameBert on ``main``, SesameElmo
on a branch of a private repo), ``finetune.glue`` loading its backbone by repo id + ``--revision`` and pushing
a classifier, and the users' side: loading by repo id / branch / tag / commit in a fresh ``HF_HOME`` where the
project's packages cannot be imported (``trust_remote_code=True``), a ``text-classification`` pipeline, the
model cards, refused tokens, and the offline cache once the server is gone.

Every command runs in a subprocess: ``huggingface_hub`` reads ``HF_ENDPOINT`` at import time.
References are computed in this process from the local output directories (``modeling`` importable).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _launch import corpus_args

pytestmark = pytest.mark.slow  # each command imports torch + transformers in a subprocess on 2 busy cores

ROOT = Path(__file__).resolve().parents[2]
WORDS = (
    "the senate adjourned after a long debate on budget it rained in afternoon and streets of city were wet "
    "elizabeth walked to house spoke with her sister about whale rose from sea sailors shouted lowered boats "
    "quick brown fox jumps over lazy dog near river bank"
).split()
TEXT = "the whale rose from the sea and the sailors shouted"
#: ``finetune.glue`` from the model the tests push to ``alice/cli-bert``.
GLUE_ON_CLI_BERT = ["finetune.glue", "--model_name_or_path", "alice/cli-bert"]

BLOCK = """
import sys
for name in ("modeling", "training", "tokenizer", "pretrain", "finetune"):
    sys.modules[name] = None  # sesame-lm must not be needed to load a pushed model
"""

#: Forward pass of a model + its tokenizer on TEXT: every tensor of the output, the input ids, tied or not.
FORWARD = """
import json, torch, transformers
def forward(auto, repo, **kw):
    model = getattr(transformers, auto).from_pretrained(repo, **kw).eval()
    tok = transformers.AutoTokenizer.from_pretrained(repo, **kw)
    enc = tok(TEXT, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc)
    try:  # MLM decoder tied to the word embeddings (SesameBert); ELMo has no such pair
        emb, dec = model.get_input_embeddings(), model.get_output_embeddings()
        tied = dec is not None and emb is not None and dec.weight.data_ptr() == emb.weight.data_ptr()
    except NotImplementedError:
        tied = None
    return {"inputs": {k: v.tolist() for k, v in enc.items()}, "tied": tied,
            "module": type(model).__module__.split(".")[0],
            "outputs": {k: v.tolist() for k, v in out.items() if torch.is_tensor(v)}}
"""


def _documents(n: int, seed: int) -> str:
    rng = random.Random(seed)
    docs = [
        "\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20))) + "." for _ in range(rng.randint(2, 5))
        )
        for _ in range(n)
    ]
    return "\n\n".join(docs) + "\n"


def _command(hub, args: list[str], home: Path, cwd: Path, token: str | None = None) -> subprocess.CompletedProcess:
    env = hub.env(home, token=token)  # token: HF_TOKEN
    env.update(HF_DATASETS_OFFLINE="1", HF_EVALUATE_OFFLINE="1", WANDB_MODE="offline", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _pretrain(hub, root: Path, out: Path, *extra: str, token: str | None = None) -> None:
    schedule = "--vocab_size 200 --max_train_steps 3 --eval_steps 3 --num_warmup_steps 1".split()
    args = corpus_args(root, out, *schedule, *extra, config=None, valid="valid.txt")
    proc = _command(hub, ["pretrain", *args], root / "push_home", root, token)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _local_forward(auto: str, path: Path) -> dict:
    import modeling  # noqa: F401  (registers the Auto classes)

    scope = {"TEXT": TEXT}
    exec(FORWARD, scope)
    return json.loads(json.dumps(scope["forward"](auto, str(path))))


@pytest.fixture(scope="module")
def runs(module_hub, tmp_path_factory):
    """Two real pretraining runs pushed by the command: SesameBert -> ``alice/cli-bert`` (``--hub_token``, public,
    main, tag ``v0``), SesameElmo -> ``alice/cli-elmo`` (``HF_TOKEN``, ``--hub_private_repo``, ``--hub_revision dev``,
    tag ``v1``)."""
    import modeling

    hub, root = module_hub, tmp_path_factory.mktemp("cli_runs")
    (root / "train.txt").write_text(_documents(40, 1))
    (root / "valid.txt").write_text(_documents(6, 2))
    modeling.get_preset_config(
        "elmo-small", cnn_filters=[[1, 8], [2, 8], [3, 16]], projection_dim=16, cell_size=32, num_layers=1
    ).save_pretrained(root / "elmo-config")
    W = hub.write_token
    _pretrain(
        hub,
        root,
        root / "bert",
        "--config_name",
        "bert-tiny",
        "--push_to_hub",
        "--hub_model_id",
        "alice/cli-bert",
        "--hub_token",
        W,
    )
    _pretrain(
        hub,
        root,
        root / "elmo",
        "--model_type",
        "elmo",
        "--config_name",
        str(root / "elmo-config"),
        "--push_to_hub",
        "--hub_model_id",
        "alice/cli-elmo",
        "--hub_private_repo",
        "--hub_revision",
        "dev",
        token=W,
    )  # the token from HF_TOKEN this time
    tags = hub.run(
        """
        import json
        from huggingface_hub import HfApi
        api = HfApi()
        api.create_tag("alice/cli-bert", tag="v0")
        api.create_tag("alice/cli-elmo", tag="v1", revision="dev")
        print(json.dumps({"ok": True}))
    """,
        root / "push_home",
        token=W,
    )
    assert tags["ok"]
    return root


#: ``run_cli(main, argv)`` of each command of ``CASES`` (``[module, argv]`` pairs, JSON) in one client process, as
#: ``python -m module argv`` runs it: ``{"results": [[exit status, stderr], ...]}``.
COMMANDS = """
import contextlib, importlib, io, json
from core.errors import run_cli
results = []
for module, argv in json.loads(CASES):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run_cli(importlib.import_module(module).main, argv)
    results.append([status, err.getvalue()])
print(json.dumps({"results": results}))
"""


def test_refused_tokens_and_missing_revision_exit_2_before_training(module_hub, runs, tmp_path):
    """Refused before anything is written, each with one ``error:`` line and exit status 2: no token, a token the
    hub refuses, a read-only token; a ``--revision`` the backbone's repo does not have. (The four commands run in
    one client process, ``run_cli`` as ``python -m`` calls it; the process exit status of a refused command is
    tests/reliability/test_catalogue.py's.)"""
    hub = module_hub
    (tmp_path / "train.txt").write_text(_documents(4, 3))
    (tmp_path / "train.tsv").write_text("sentence\tlabel\nthe whale rose\tpos\nthe dog sat\tneg\n")
    cases, outs = [], []
    for token, expected in ((None, "no token"), ("hf_wrong", "refused"), (hub.read_token, "read-only")):
        outs.append((tmp_path / f"out-{expected}", expected, "'alice/refused'"))
        push = ["--push_to_hub", "--hub_model_id", "alice/refused", *(["--hub_token", token] if token else [])]
        cases.append(["pretrain.cli", ["--train_file", str(tmp_path / "train.txt"), "--output_dir", str(outs[-1][0])]])
        cases[-1][1].extend(push)
    # a revision the repo does not have: one clear line, nothing written
    outs.append((tmp_path / "clf", "--revision no-such-branch", "alice/cli-bert"))
    glue = [*GLUE_ON_CLI_BERT[1:], "--revision", "no-such-branch", "--train_file", str(tmp_path / "train.tsv")]
    cases.append(["finetune.glue", [*glue, "--output_dir", str(outs[-1][0])]])
    # no HF_TOKEN, fresh HF_HOME: no stored login either
    code = f"CASES = {json.dumps(json.dumps(cases))}\n{COMMANDS}"
    results = hub.run(code, tmp_path / "home", cwd=tmp_path, timeout=300)["results"]
    assert len(results) == len(cases)
    for (status, stderr), (out, expected, repo) in zip(results, outs):
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert status == 2, stderr[-3000:]
        assert len(errors) == 1 and repo in errors[0] and expected in errors[0], errors
        assert "Traceback" not in stderr and not out.exists()  # refused before anything was written
    assert "alice/refused" not in hub.server.state.repos


def test_glue_loads_backbone_by_revision_and_pushes_a_classifier(module_hub, runs, tmp_path):
    hub, W = module_hub, module_hub.write_token
    rows = [(" ".join(random.Random(i).choice(WORDS) for _ in range(8)), "pos" if i % 2 else "neg") for i in range(12)]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    out = tmp_path / "clf"
    proc = _command(
        hub,
        [
            *GLUE_ON_CLI_BERT,
            "--config_name",
            "alice/cli-bert",
            "--tokenizer_name",
            "alice/cli-bert",
            "--revision",
            "v0",
            "--train_file",
            str(tmp_path / "train.tsv"),
            "--validation_file",
            str(tmp_path / "dev.tsv"),
            "--output_dir",
            str(out),
            "--max_seq_length",
            "32",
            "--per_device_train_batch_size",
            "4",
            "--max_train_steps",
            "2",
            "--learning_rate",
            "1e-3",
            "--push_to_hub",
            "--hub_model_id",
            "alice/cli-clf",
            "--hub_token",
            W,
        ],
        tmp_path / "glue_home",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the backbone came from the hub at the tag: the glue process's cache holds alice/cli-bert at v0's commit
    bert = hub.server.repo("alice/cli-bert")
    cache = tmp_path / "glue_home" / "hub" / "models--alice--cli-bert"
    assert (cache / "refs" / "v0").read_text() == bert.tags["v0"] == bert.branches["main"]

    from transformers import pipeline

    import modeling  # noqa: F401

    local = pipeline("text-classification", model=str(out))(TEXT)
    remote = hub.run(
        BLOCK
        + textwrap.dedent(f"""
        import json
        from transformers import pipeline
        from huggingface_hub import ModelCard
        clf = pipeline("text-classification", model="alice/cli-clf", trust_remote_code=True)
        card = ModelCard.load("alice/cli-clf").data
        print(json.dumps({{"pred": clf({TEXT!r}), "module": type(clf.model).__module__.split(".")[0],
                          "card": [card.pipeline_tag, card.base_model,
                                   {{r.metric_type: r.metric_value for r in card.eval_results}}]}}))
    """),
        tmp_path / "user_home",
    )
    assert remote["module"] == "transformers_modules"  # the pushed code, not the project's
    assert remote["pred"][0]["label"] == local[0]["label"] in ("neg", "pos")
    assert remote["pred"][0]["score"] == pytest.approx(local[0]["score"], abs=1e-6)
    results = json.loads((out / "all_results.json").read_text())
    expected = {k.removeprefix("eval_"): pytest.approx(v) for k, v in results.items() if k.startswith("eval_")}
    assert remote["card"] == ["text-classification", "alice/cli-bert", expected] and "accuracy" in expected
    clf = hub.server.repo("alice/cli-clf")
    files = set(clf.commits[clf.branches["main"]].files)
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "all_results.json"} <= files
    assert any(f.endswith(".py") for f in files) and not [f for f in files if f.endswith((".bin", ".pt"))]


def test_pretrained_models_by_repo_id_branch_tag_commit_private_and_offline(module_hub, runs, tmp_path):
    hub, root = module_hub, runs
    ref_bert = _local_forward("AutoModelForMaskedLM", root / "bert")
    ref_elmo = _local_forward("AutoModelForPreTraining", root / "elmo")
    elmo_repo = hub.server.repo("alice/cli-elmo")
    dev = elmo_repo.branches["dev"]
    assert elmo_repo.private and elmo_repo.tags["v1"] == dev and elmo_repo.branches["main"] != dev
    bert_files = set(
        hub.server.repo("alice/cli-bert").commits[hub.server.repo("alice/cli-bert").branches["main"]].files
    )
    assert not [f for f in bert_files if f.startswith("checkpoints/") or f.endswith((".bin", ".pt", ".pkl"))]
    assert hub.server.is_lfs("alice/cli-bert", "main", "model.safetensors")

    home = tmp_path / "user_home"  # fresh cache, no token in the environment
    code = (
        BLOCK
        + FORWARD
        + textwrap.dedent(f"""
    TEXT = {TEXT!r}
    R, BOB = {hub.read_token!r}, {hub.other_token!r}
    res = {{}}
    def refused(**kw):
        try:
            transformers.AutoConfig.from_pretrained("alice/cli-elmo", trust_remote_code=True, **kw)
            return "loaded"
        except Exception as err:
            return f"{{type(err).__name__}}: {{err}}"
    if not OFFLINE:  # before anything is cached
        res["anonymous"] = refused(revision="dev")
        res["bob"] = refused(revision="dev", token=BOB)
        res["main_has_no_model"] = refused(token=R)
    res["bert"] = forward("AutoModelForMaskedLM", "alice/cli-bert", trust_remote_code=True)
    for key, rev in (("branch", "dev"), ("tag", "v1"), ("sha", {dev!r})):
        res[key] = forward("AutoModelForPreTraining", "alice/cli-elmo", revision=rev, token=R, trust_remote_code=True)
    if not OFFLINE:
        from huggingface_hub import ModelCard
        card = ModelCard.load("alice/cli-bert")
        res["card"] = [card.data.pipeline_tag, card.data.library_name, card.data.tags,
                       {{r.metric_type: r.metric_value for r in card.data.eval_results}}, card.text]
        from huggingface_hub import hf_hub_download
        elmo_card = ModelCard(open(hf_hub_download("alice/cli-elmo", "README.md", revision="dev", token=R)).read())
        res["elmo_card"] = [elmo_card.data.pipeline_tag,
                            {{r.metric_type: r.metric_value for r in elmo_card.data.eval_results}}]
    print(json.dumps(res))
    """)
    )
    online = hub.run(code.replace("OFFLINE", "False"), home)
    assert online["bert"]["inputs"] == ref_bert["inputs"] and online["bert"]["outputs"] == ref_bert["outputs"]
    assert online["bert"]["tied"] and ref_bert["tied"] and online["bert"]["module"] == "transformers_modules"
    for key in ("branch", "tag", "sha"):
        assert online[key]["inputs"] == ref_elmo["inputs"] and online[key]["outputs"] == ref_elmo["outputs"], key
        assert online[key]["module"] == "transformers_modules"
    assert "char_ids" in ref_elmo["inputs"] and ref_elmo["outputs"]  # a real ELMo forward was compared
    for key in ("anonymous", "bob"):
        assert online[key].startswith("OSError") and "alice/cli-elmo" in online[key] and "token" in online[key], online[
            key
        ]
    # the branch was created from main, and main keeps no model (transformers 5 says so with a ValueError)
    assert "config.json" not in elmo_repo.commits[elmo_repo.branches["main"]].files
    assert "alice/cli-elmo" in online["main_has_no_model"] and "config.json" in online["main_has_no_model"]
    results = json.loads((root / "bert" / "all_results.json").read_text())
    tag, library, tags, metrics, text = online["card"]
    assert tag == "fill-mask" and library == "transformers" and "sesame-bert" in tags
    assert metrics["perplexity"] == pytest.approx(results["perplexity"]) and metrics["loss"] == pytest.approx(
        results["eval_loss"]
    )
    assert "bert-tiny" in text and "train.txt" in text and "alice/cli-bert" in text
    elmo_results = json.loads((root / "elmo" / "all_results.json").read_text())
    assert online["elmo_card"][0] == "feature-extraction"
    assert online["elmo_card"][1] == {
        k: pytest.approx(elmo_results[k]) for k in ("perplexity", "forward_perplexity", "backward_perplexity")
    } | {"loss": pytest.approx(elmo_results["eval_loss"])}

    # the hub goes away: the cache must do (remote code included)
    hub.server.stop()
    try:
        offline = hub.run(code.replace("OFFLINE", "True"), home, offline=True)
    finally:
        hub.server.start()
    for key in ("bert", "branch", "tag", "sha"):
        assert offline[key] == online[key], key
