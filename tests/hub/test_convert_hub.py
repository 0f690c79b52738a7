"""``python -m modeling.bert.convert --source REPO [--revision R]`` for every source family (issue 49 item 2): a
ModernBERT and a EuroBERT repo, a SesameBert repo with ``--to``, and a branch, on the test hub, convert to exactly what
the same folders give locally.

The client runs in one subprocess (``huggingface_hub`` reads ``HF_ENDPOINT`` at import time); the local references
are converted in this process.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from modeling.bert.convert import convert

pytestmark = pytest.mark.slow  # a client process imports torch + transformers

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + "the whale rose from sea and sailors shouted".split()
MODERN = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, local_attention=4)
EURO = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=24)


def _save(folder, family: str, seed: int) -> None:
    from transformers import BertTokenizer

    torch.manual_seed(seed)
    ids = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, vocab_size=len(WORDS), max_position_embeddings=32)
    if family == "modernbert":
        model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**MODERN, **ids))
    else:
        config = transformers.EuroBertConfig(**EURO, **ids, num_labels=3, classifier_pooling="mean")
        model = transformers.EuroBertForSequenceClassification(config)
    model.save_pretrained(folder)
    BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(folder)


def test_hub_sources_convert_as_their_folders(hub, tmp_path):
    local = tmp_path / "local"
    _save(local / "modern", "modernbert", seed=0)
    _save(local / "modern-v2", "modernbert", seed=1)
    _save(local / "euro", "eurobert", seed=2)
    references = {
        "modern": convert(local / "modern", tmp_path / "ref" / "modern"),
        "modern-v2": convert(local / "modern-v2", tmp_path / "ref" / "modern-v2"),
        "euro": convert(local / "euro", tmp_path / "ref" / "euro"),
    }
    references["sesame"] = convert(tmp_path / "ref" / "modern", tmp_path / "ref" / "sesame", to="modernbert")

    out = tmp_path / "hub"
    reports = hub.run(
        f"""
        import json
        from huggingface_hub import HfApi
        from modeling.bert.convert import convert
        api = HfApi()
        for name, folder in (("modern", "local/modern"), ("euro", "local/euro"), ("sesame", "ref/modern")):
            api.create_repo(f"alice/{{name}}")
            api.upload_folder(repo_id=f"alice/{{name}}", folder_path=f"{tmp_path}/{{folder}}")
        api.create_branch("alice/modern", branch="v2")
        api.upload_folder(repo_id="alice/modern", folder_path="{tmp_path}/local/modern-v2", revision="v2")
        out = "{out}"
        reports = {{
            "modern": convert("alice/modern", f"{{out}}/modern"),
            "modern-v2": convert("alice/modern", f"{{out}}/modern-v2", revision="v2"),
            "euro": convert("alice/euro", f"{{out}}/euro"),
            "sesame": convert("alice/sesame", f"{{out}}/sesame", to="modernbert"),
        }}
        from core.errors import InputError
        try:
            convert("alice/modern", f"{{out}}/never", revision="no-such-branch")
        except InputError as err:
            reports["refused"] = str(err)
        print(json.dumps(reports))
        """,
        tmp_path / "hf-home",
        token=hub.write_token,
    )
    refused = reports.pop("refused")
    assert refused.startswith("--source alice/modern (--revision no-such-branch): cannot be downloaded"), refused
    assert not (out / "never").exists()
    for name, reference in references.items():
        report = reports[name]
        assert report["source"] == ("alice/modern" if name.startswith("modern") else f"alice/{name}")
        assert report["revision"] == ("v2" if name == "modern-v2" else None)
        for key in ("architecture", "converted_to", "initialized", "max_abs_diff"):
            assert report[key] == reference[key], (name, key)
        ours, theirs = (
            load_file(out / name / "model.safetensors"),
            load_file(tmp_path / "ref" / name / "model.safetensors"),
        )
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), name
        config = json.loads((out / name / "config.json").read_text())
        assert config == json.loads((tmp_path / "ref" / name / "config.json").read_text()), name
    # the branch is another model than main
    main, branch = load_file(out / "modern" / "model.safetensors"), load_file(out / "modern-v2" / "model.safetensors")
    assert not torch.equal(
        main["bert.embeddings.word_embeddings.weight"], branch["bert.embeddings.word_embeddings.weight"]
    )
