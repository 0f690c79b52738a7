"""Round trip through the real clients: ``training.hub.push_output_dir`` pushes, ``transformers`` loads.

A tiny ``transformers`` BERT (MLM head tied to the word embeddings) and its tokenizer are saved here, a tiny
SesameBertForMaskedLM (``save_pretrained`` writes its code and ``auto_map``), and a model whose code exists
only in its directory; a client process pushes them (main, a branch,
a tag, a private repo), a second one with a fresh ``HF_HOME`` -- where ``import modeling`` fails -- loads them
by repo id (the last with ``trust_remote_code=True``) and must reproduce the saved outputs exactly; after the
server stops, a third one loads them from the cache with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import json

import pytest
import torch
from _tiny import tiny_bert_kwargs

WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "whale",
    "rose",
    "from",
    "sea",
    "a",
    "fox",
    "##es",
    ".",
    "boats",
    "sailors",
]
TEXT = "the whale rose from the sea . the sailors"


def _save_model(path, seed, sesame=False):
    """transformers' BERT (or, with ``sesame``, SesameBert: code saved next to the weights) + tokenizer."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    torch.manual_seed(seed)
    kwargs = tiny_bert_kwargs(len(WORDS), 32, width=16)
    if sesame:
        from modeling import SesameBertConfig, SesameBertForMaskedLM

        model = SesameBertForMaskedLM(SesameBertConfig(**kwargs)).eval()
    else:
        model = BertForMaskedLM(BertConfig(**kwargs)).eval()
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "checkpoints" / "step_5").mkdir(parents=True)  # must not be pushed
    (path / "checkpoints" / "step_5" / "optimizer.bin").write_bytes(b"\0" * 64)
    (path / "all_results.json").write_text(json.dumps({"train_loss": 2.5, "eval_loss": 2.25, "perplexity": 9.49}))
    ids = tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    return ids["input_ids"][0].tolist(), logits[0].tolist()


CONFIGURATION_TINY = """
from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny-remote"

    def __init__(self, vocab_size=16, hidden_size=8, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        super().__init__(**kwargs)
"""

MODELING_TINY = """
import torch
from transformers import PreTrainedModel

from .configuration_tiny import TinyConfig


class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.emb = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids):
        return torch.tanh(self.emb(input_ids))
"""


def _save_classifier(path):
    """A SesameBert sentence classifier (labels neg/pos) + tokenizer; returns the expected pipeline answer."""
    from transformers import BertTokenizer

    from modeling import SesameBertConfig, SesameBertForSequenceClassification

    torch.manual_seed(4)
    config = SesameBertConfig(
        **tiny_bert_kwargs(
            len(WORDS),
            32,
            width=16,
            layers=1,
            num_labels=2,
            id2label={0: "neg", 1: "pos"},
            label2id={"neg": 0, "pos": 1},
        )
    )
    model = SesameBertForSequenceClassification(config).eval()
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    with torch.no_grad():
        probs = model(**tokenizer(TEXT, return_tensors="pt")).logits[0].softmax(-1)
    return {"label": config.id2label[int(probs.argmax())], "score": float(probs.max())}


def _save_remote_code_model(path):
    """A model whose code only exists in its directory (``auto_map``): loadable only with trust_remote_code."""
    from safetensors.torch import save_file

    path.mkdir()
    (path / "configuration_tiny.py").write_text(CONFIGURATION_TINY)
    (path / "modeling_tiny.py").write_text(MODELING_TINY)
    weight = torch.randn(16, 8, generator=torch.Generator().manual_seed(3))
    save_file({"emb.weight": weight}, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "tiny-remote",
                "vocab_size": 16,
                "hidden_size": 8,
                "architectures": ["TinyModel"],
                "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"},
            }
        )
    )
    return torch.tanh(weight[[1, 2, 3]]).tolist()


LOAD = """
    import sys
    for name in ("modeling", "training", "tokenizer", "pretrain", "finetune"):
        sys.modules[name] = None  # sesame-lm must not be needed to load a pushed model
    import json, torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    ref = json.load(open("ref.json"))
    res = {}
    def check(key, repo, **kw):
        model = AutoModelForMaskedLM.from_pretrained(repo, **kw).eval()
        tok = AutoTokenizer.from_pretrained(repo, **kw)
        ids = tok(ref["text"], return_tensors="pt")
        with torch.no_grad():
            logits = model(**ids).logits[0]
        tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        res[key] = {"ids_equal": ids["input_ids"][0].tolist() == ref["ids"],
                    "same_as": [n for n in ("a", "b", "sesame") if torch.equal(logits, torch.tensor(ref[n]))],
                    "tied": tied, "module": type(model).__module__.split(".")[0]}
    def check_remote_code(key, repo):
        from transformers import AutoModel
        model = AutoModel.from_pretrained(repo, trust_remote_code=True)
        with torch.no_grad():
            out = model(torch.tensor([1, 2, 3]))
        res[key] = [type(model).__name__, torch.equal(out, torch.tensor(ref["remote"]))]
"""


@pytest.mark.slow  # two client processes that import torch + transformers: ~30 s on 2 busy cores
def test_push_load_revisions_private_offline(hub, tmp_path):
    ids_a, logits_a = _save_model(tmp_path / "model_a", seed=0)
    ids_b, logits_b = _save_model(tmp_path / "model_b", seed=1)
    assert ids_a == ids_b and logits_a != logits_b
    _, logits_sesame = _save_model(tmp_path / "sesame", seed=2, sesame=True)
    remote = _save_remote_code_model(tmp_path / "remote_code")
    classified = _save_classifier(tmp_path / "classifier")
    (tmp_path / "ref.json").write_text(
        json.dumps(
            {"text": TEXT, "ids": ids_a, "a": logits_a, "b": logits_b, "sesame": logits_sesame, "remote": remote}
        )
    )

    pushed = hub.run(
        """
        import json
        from huggingface_hub import HfApi
        from training.hub import push_output_dir
        from training.model_card import render_model_card, results_from_dir
        card = render_model_card(model_type="bert", repo_id="alice/tiny-bert", preset="tiny", task="fill-mask",
                                 training_data="six test sentences", hyperparameters={"learning_rate": 1e-3},
                                 results=results_from_dir("model_a"), license="apache-2.0")
        c1 = push_output_dir("model_a", "alice/tiny-bert", model_card=card, commit_message="Upload model (step 10)")
        HfApi().create_tag("alice/tiny-bert", tag="v1", revision=c1.oid)
        c2 = push_output_dir("model_b", "alice/tiny-bert", revision="dev", commit_message="Upload model (step 20)")
        c3 = push_output_dir("model_a", "alice/private-bert", private=True)
        push_output_dir("remote_code", "alice/remote-code")
        push_output_dir("sesame", "alice/sesame-bert")
        push_output_dir("classifier", "alice/sesame-clf")
        print(json.dumps({"c1": c1.oid, "c2": c2.oid, "c3": c3.oid, "url": str(c1)}))
    """,
        tmp_path / "push_home",
        token=hub.write_token,
        cwd=tmp_path,
    )

    main = hub.server.repo("alice/tiny-bert")
    assert main.branches == {"main": pushed["c1"], "dev": pushed["c2"]} and main.tags == {"v1": pushed["c1"]}
    assert pushed["url"] == f"{hub.url}/alice/tiny-bert/commit/{pushed['c1']}"
    files = set(main.commits[pushed["c1"]].files)
    assert files == {
        ".gitattributes",
        "README.md",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "all_results.json",
    }  # no checkpoints/, no *.bin
    assert hub.server.is_lfs("alice/tiny-bert", "main", "model.safetensors")
    assert main.commits[pushed["c1"]].title == "Upload model (step 10)"
    assert hub.server.repo("alice/private-bert").private

    home = tmp_path / "load_home"  # fresh cache, no token in the environment
    loaded = hub.run(
        LOAD
        + f"""
    check("main", "alice/tiny-bert")
    check("branch", "alice/tiny-bert", revision="dev")
    check("tag", "alice/tiny-bert", revision="v1")
    check("sha", "alice/tiny-bert", revision={pushed["c2"]!r})
    for key, kw in (("private_anon", {{}}), ("private_wrong", {{"token": "hf_wrong"}})):
        try:
            AutoModelForMaskedLM.from_pretrained("alice/private-bert", **kw)
            res[key] = "loaded"
        except OSError as err:
            res[key] = str(err)
    check("private_token", "alice/private-bert", token={hub.read_token!r})
    check_remote_code("remote_code", "alice/remote-code")
    check("sesame", "alice/sesame-bert", trust_remote_code=True)
    from transformers import pipeline
    fill = pipeline("fill-mask", model="alice/sesame-bert", trust_remote_code=True)
    res["fill_mask"] = [p["token_str"] for p in fill("the whale [MASK] from the sea", top_k=3)]
    res["classify"] = pipeline("text-classification", model="alice/sesame-clf", trust_remote_code=True)(ref["text"])
    from huggingface_hub import ModelCard
    card = ModelCard.load("alice/tiny-bert")
    res["card"] = {{"tags": card.data.tags, "library": card.data.library_name, "license": card.data.license,
                   "metrics": {{r.metric_type: r.metric_value for r in card.data.eval_results}}}}
    print(json.dumps(res))
    """,
        home,
        cwd=tmp_path,
    )

    assert loaded["main"] == {"ids_equal": True, "same_as": ["a"], "tied": True, "module": "transformers"}
    # SesameBert through auto_map + the pushed code, with the project's packages blocked; decoder stays tied
    assert loaded["sesame"] == {
        "ids_equal": True,
        "same_as": ["sesame"],
        "tied": True,
        "module": "transformers_modules",
    }
    assert len(loaded["fill_mask"]) == 3 and set(loaded["fill_mask"]) <= set(WORDS)
    (got,) = loaded["classify"]  # pipeline by repo id, remote code: the classifier's own answer
    assert got["label"] == classified["label"] and got["score"] == pytest.approx(classified["score"], abs=1e-6)
    assert loaded["branch"]["same_as"] == ["b"] and loaded["sha"]["same_as"] == ["b"]
    assert loaded["tag"]["same_as"] == ["a"]
    assert loaded["private_token"]["same_as"] == ["a"]
    assert loaded["remote_code"] == ["TinyModel", True]
    assert "alice/private-bert" in loaded["private_anon"] and "token" in loaded["private_anon"]
    assert "Invalid credentials in Authorization header" in loaded["private_wrong"]
    assert loaded["card"] == {
        "tags": ["sesame-lm", "bert", "fill-mask", "trust-remote-code"],
        "library": "transformers",
        "license": "apache-2.0",
        "metrics": {"loss": 2.25, "perplexity": 9.49},
    }

    hub.server.stop()  # the hub is gone: the cache must do
    offline = hub.run(
        LOAD
        + """
    check("main", "alice/tiny-bert")
    check("branch", "alice/tiny-bert", revision="dev")
    check_remote_code("remote_code", "alice/remote-code")
    check("sesame", "alice/sesame-bert", trust_remote_code=True)
    print(json.dumps(res))
    """,
        home,
        offline=True,
        cwd=tmp_path,
    )
    assert offline["remote_code"] == ["TinyModel", True] and offline["sesame"]["same_as"] == ["sesame"]
    assert offline["main"]["same_as"] == ["a"] and offline["branch"]["same_as"] == ["b"]
    assert offline["main"]["ids_equal"] and offline["main"]["tied"]
