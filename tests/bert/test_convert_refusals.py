"""A conversion never writes weights the source does not hold, and never deletes what it did not write (issue 49).

* A ModernBERT / EuroBERT / BERT folder whose weights miss one layer, carry another family's weights or one tensor of
  another shape is refused with one line naming the first keys, and nothing is written: transformers would fill the
  gaps with random values and the old check compared the result with that same completed model.
* Independently of that report, every converted tensor is compared with the tensor read from the source's files
  (``check_copied``): a conversion that drops or alters a tensor fails even when the loading report is silent.
* ``--overwrite_output_dir`` replaces the files a conversion writes and keeps every other file; an output folder that
  is, holds or lies inside the source is refused, both left intact.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from core.errors import run_cli
from modeling.bert import convert as convert_module
from modeling.bert.convert import convert, main
from modeling.bert.sources import modernbert

SIZES = dict(
    hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48, max_position_embeddings=64
)
TOKENS = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3)
CONFIGS = {
    "modernbert": dict(SIZES, **TOKENS, local_attention=8, cls_token_id=2, sep_token_id=3),
    "eurobert": dict(SIZES, **TOKENS, num_key_value_heads=2, mask_token_id=4),
}
PREFIX = {"modernbert": "ModernBert", "eurobert": "EuroBert"}
OTHER = {"modernbert": "eurobert", "eurobert": "modernbert"}


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def _save(family: str, folder, tokenizer, head: str = "ForMaskedLM"):
    config = getattr(transformers, f"{PREFIX[family]}Config")(**CONFIGS[family], vocab_size=len(tokenizer))
    model = getattr(transformers, f"{PREFIX[family]}{head}")(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def _rewrite(folder, change):
    """Replace ``folder/model.safetensors`` by ``change(tensors)``."""
    tensors = load_file(folder / "model.safetensors")
    save_file(change(tensors), folder / "model.safetensors", metadata={"format": "pt"})


def _refused(capsys, argv) -> str:
    assert run_cli(main, argv) == 2, argv
    return capsys.readouterr().err.strip().splitlines()[-1]


def _nothing_written(tmp_path, target):
    assert not target.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_incomplete_or_foreign_weights_are_refused_before_anything_is_written(tmp_path, tokenizer, capsys, family):
    source = tmp_path / "source"
    _save(family, source, tokenizer)
    _save(OTHER[family], tmp_path / "other", tokenizer)
    target = tmp_path / "never"
    argv = ["--source", str(source), "--output_dir", str(target)]

    pristine = load_file(source / "model.safetensors")
    _rewrite(source, lambda t: {k: v for k, v in t.items() if ".layers.2." not in k})  # layer 2 is gone
    err = _refused(capsys, argv)
    assert err.startswith(f"error: --source {source}: the weights do not match its config:"), err
    assert "missing tensors (model.layers.2." in err and "nothing was written" in err, err
    _nothing_written(tmp_path, target)

    shutil.copy(tmp_path / "other" / "model.safetensors", source / "model.safetensors")  # the other family's
    err = _refused(capsys, argv)
    assert "missing tensors (" in err and "unexpected tensors (" in err, err
    _nothing_written(tmp_path, target)

    wide = next(
        k for k in sorted(pristine) if k.endswith("mlp.Wo.weight" if family == "modernbert" else "down_proj.weight")
    )
    _rewrite(source, lambda t: {**pristine, wide: torch.zeros(pristine[wide].shape[0], 5)})
    err = _refused(capsys, argv)
    assert f"1 tensors of another shape ({wide} ({pristine[wide].shape[0]}, 5) for" in err, err
    _nothing_written(tmp_path, target)

    _rewrite(source, lambda t: pristine)  # the complete folder converts exactly, and back
    assert run_cli(main, argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["initialized"] == [] and report["initialized_parameters"] == []
    assert max(report["max_abs_diff"].values()) <= 1e-5
    back = tmp_path / "back"
    assert run_cli(main, ["--source", str(target), "--to", family, "--output_dir", str(back)]) == 0
    assert max(json.loads(capsys.readouterr().out)["max_abs_diff"].values()) <= 1e-5
    assert all(torch.equal(load_file(back / "model.safetensors")[k], v) for k, v in pristine.items())


def test_a_sesame_source_with_missing_tensors_is_refused_with_to(tmp_path, tokenizer, capsys):
    """``--to``: the SesameBert folder's weights are checked the same way."""
    _save("modernbert", tmp_path / "source", tokenizer)
    assert run_cli(main, ["--source", str(tmp_path / "source"), "--output_dir", str(tmp_path / "ours")]) == 0
    capsys.readouterr()
    _rewrite(tmp_path / "ours", lambda t: {k: v for k, v in t.items() if ".layer.1." not in k})
    err = _refused(
        capsys, ["--source", str(tmp_path / "ours"), "--to", "modernbert", "--output_dir", str(tmp_path / "x")]
    )
    assert "missing tensors (bert.encoder.layer.1." in err, err
    assert not (tmp_path / "x").exists()


def test_bert_without_a_layer_or_with_a_foreign_head_is_refused(hf_bert_dir, tmp_path, capsys):
    """The BERT path initialises only the heads a BERT checkpoint may lack (MLM, NSP, pooler); a missing encoder
    layer or a head it has no place for is refused."""
    target = tmp_path / "never"
    argv = ["--source", str(hf_bert_dir), "--output_dir", str(target)]
    pristine = load_file(hf_bert_dir / "model.safetensors")
    _rewrite(hf_bert_dir, lambda t: {k: v for k, v in t.items() if ".layer.1." not in k})
    err = _refused(capsys, argv)
    assert "missing tensors (bert.encoder.layer.1." in err, err
    _rewrite(hf_bert_dir, lambda t: {**pristine, "classifier.weight": torch.zeros(2, 32)})
    err = _refused(capsys, argv)
    assert "1 unexpected tensors (classifier.weight)" in err, err
    assert not target.exists()


def test_the_files_are_the_reference_not_the_loaded_model(tmp_path, tokenizer, monkeypatch):
    """With the loading report silenced, a source without layer 2 still cannot convert: the converted layer-2
    tensors come from nowhere in the files (``check_copied``); and a conversion that alters one tensor is caught."""
    source = tmp_path / "source"
    _save("modernbert", source, tokenizer)
    complete = load_file(source / "model.safetensors")
    _rewrite(source, lambda t: {k: v for k, v in t.items() if ".layers.2." not in k})
    monkeypatch.setattr(convert_module, "refuse_incomplete", lambda *a, **k: None)
    with pytest.raises(RuntimeError, match=r"do not come from the source: \['bert.encoder.layer.2"):
        convert(source, tmp_path / "a")
    monkeypatch.undo()

    _rewrite(source, lambda t: complete)
    real = modernbert.to_sesame

    def altered(model):
        ours = real(model)
        with torch.no_grad():
            ours.bert.encoder.layer[1].ffn.fc2.weight[0, 0] += 1e-3
        return ours

    monkeypatch.setattr(modernbert, "to_sesame", altered)
    with pytest.raises(RuntimeError, match="bert.encoder.layer.1.ffn.fc2.weight: differs"):
        convert(source, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_overwrite_never_deletes_what_the_conversion_did_not_write(tmp_path, tokenizer, capsys):
    model = tmp_path / "model"
    _save("modernbert", model, tokenizer)
    project = tmp_path / "p"
    project.mkdir()
    shutil.copytree(model, project / "model")
    (project / "notes.txt").write_text("mine\n")
    before = sorted(p.relative_to(project) for p in project.rglob("*"))

    # an output folder that holds the source, is it, or lies inside it: refused, nothing touched
    for output in (project, project / "model", project / "model" / "sub"):
        argv = ["--source", str(project / "model"), "--output_dir", str(output), "--overwrite_output_dir"]
        err = _refused(capsys, argv)
        assert err.startswith(f"error: --output_dir {output}: ") and "--source" in err, err
    assert sorted(p.relative_to(project) for p in project.rglob("*")) == before
    assert (project / "notes.txt").read_text() == "mine\n"

    # an earlier conversion's folder plus a file of the user's: the conversion's files replaced, the user's kept
    out = tmp_path / "out"
    assert run_cli(main, ["--source", str(model), "--output_dir", str(out)]) == 0
    assert (out / "modeling_sesame_bert.py").is_file()
    (out / "notes.txt").write_text("mine\n")
    (out / "runs").mkdir()
    capsys.readouterr()
    err = _refused(
        capsys, ["--source", str(out), "--to", "modernbert", "--output_dir", str(out), "--overwrite_output_dir"]
    )
    assert "is the --source folder" in err, err
    sesame = tmp_path / "sesame"
    shutil.copytree(out, sesame)
    argv = ["--source", str(sesame), "--to", "modernbert", "--output_dir", str(out), "--overwrite_output_dir"]
    assert run_cli(main, argv) == 0
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "runs").is_dir()
    assert not list(out.glob("*sesame_bert*.py"))  # the earlier conversion's code is not the new model's
    assert json.loads((out / "config.json").read_text())["model_type"] == "modernbert"
    reference = load_file(model / "model.safetensors")
    assert all(torch.equal(load_file(out / "model.safetensors")[k], v) for k, v in reference.items())
