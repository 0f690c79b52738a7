"""transformers 5's config names (issue 53, item 5): a SesameBertConfig carries ``rope_parameters`` (one entry per
layer type) and ``layer_types`` as transformers 5's configs do; a config.json saved by an earlier version (with
transformers 4's ``rope_theta``, ``local_rope_theta`` and ``global_attn_every_n_layers``) loads into the same config,
weights and outputs.

``fixtures/main-703f97b-<preset>.json`` are the config.json files that the project at main 703f97b saved for the
``bert-tiny`` and ``modernbert-tiny`` presets (vocab_size 100); ``fixtures/main-703f97b-hidden.safetensors`` holds that
version's :func:`hidden` of each (written by :func:`write_reference` in that version's environment:
``cd tests/bert && python -c "import test_config_names as t; t.write_reference()"``).
"""

import json
import zlib
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file, save_file

from modeling.bert import MODERN_PRESETS, PRESETS, SesameBertConfig, SesameBertModel

FIXTURES = Path(__file__).parent / "fixtures"
OLD = "main-703f97b"
NAMES = ("bert-tiny", "modernbert-tiny")
#: transformers 4's names, which configs of earlier versions carry and this one reads but does not write
OLD_NAMES = ("rope_theta", "local_rope_theta", "global_attn_every_n_layers")
#: modernbert-tiny's rotary embeddings and layers (ModernBERT's bases, every third layer global)
MODERN_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 160000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
}
MODERN_LAYERS = ["full_attention", "sliding_attention", "sliding_attention"]


def preset(name: str) -> SesameBertConfig:
    cls, fields = {**PRESETS, **MODERN_PRESETS}[name]
    return cls(**fields, vocab_size=100)


def hidden(config: SesameBertConfig) -> torch.Tensor:
    """The first 8 features of the last hidden states (2, 80, 8) float32 of a ``SesameBertModel`` of ``config`` whose
    every parameter is drawn from N(0, 0.05^2) with a generator seeded by the CRC-32 of its name (so the weights do not
    depend on the order the modules are built in), for two rows of 80 tokens, the second with 30 padding tokens:
    longer than modernbert-tiny's 64-token window, so the local layers see part of the row."""
    model = SesameBertModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode()))) * 0.05)
        input_ids = torch.randint(1, 100, (2, 80), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(input_ids)
        mask[1, 50:] = 0
        return model(input_ids=input_ids, attention_mask=mask).last_hidden_state[..., :8].contiguous()


def write_reference() -> None:
    """Write the fixtures (run in the environment of the version they record)."""
    import tempfile

    FIXTURES.mkdir(exist_ok=True)
    for name in NAMES:
        with tempfile.TemporaryDirectory() as folder:
            preset(name).save_pretrained(folder)  # what a run writes
            (FIXTURES / f"{OLD}-{name}.json").write_text((Path(folder) / "config.json").read_text())
    save_file({name: hidden(preset(name)) for name in NAMES}, FIXTURES / f"{OLD}-hidden.safetensors")


def old_config(name: str) -> SesameBertConfig:
    return SesameBertConfig.from_pretrained(FIXTURES / f"{OLD}-{name}.json")


def test_the_fixtures_carry_the_old_names():
    """The check can fail: the fixtures are the old files (transformers 4's names, no ``rope_parameters``)."""
    for name in NAMES:
        saved = json.loads((FIXTURES / f"{OLD}-{name}.json").read_text())
        assert set(OLD_NAMES) <= set(saved) and "rope_parameters" not in saved
    assert json.loads((FIXTURES / f"{OLD}-modernbert-tiny.json").read_text())["global_attn_every_n_layers"] == 3


@pytest.mark.parametrize("name", NAMES)
def test_an_old_config_loads_into_the_new_names(name):
    """The old file gives the preset's config of today, with transformers 5's names only: ModernBERT's two bases and
    its layer pattern; BERT without rotary fields (``None``, as it has no rotary positions or local layers)."""
    config, new = old_config(name), preset(name)
    assert config.to_diff_dict() | {"auto_map": None} == new.to_diff_dict() | {"auto_map": None}
    saved = config.to_dict()
    assert not set(OLD_NAMES) & set(saved)
    if name == "modernbert-tiny":
        assert (saved["rope_parameters"], saved["layer_types"]) == (MODERN_ROPE, MODERN_LAYERS)
    else:
        assert (saved["rope_parameters"], saved["layer_types"]) == (None, None)


@pytest.mark.parametrize("name", NAMES)
def test_an_old_config_gives_the_same_weights_and_outputs(name):
    """From the old file and from today's preset: the same weights from the same seed, identical outputs (also under
    bf16 autocast), and the outputs the old version computed (its fixture)."""
    models = []
    for config in (old_config(name), preset(name)):
        torch.manual_seed(7)
        models.append(SesameBertModel(config).eval())
    old, new = (m.state_dict() for m in models)
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)
    ids = torch.randint(1, 100, (2, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = [m(input_ids=ids).last_hidden_state for m in models]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = [m(input_ids=ids).last_hidden_state for m in models]
    assert torch.equal(*full) and torch.equal(*low) and not torch.equal(low[0], full[0])  # (autocast acted)
    reference = load_file(FIXTURES / f"{OLD}-hidden.safetensors")[name]
    mine = hidden(old_config(name))
    assert torch.equal(mine, hidden(preset(name)))
    torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)


def test_the_global_base_and_the_layer_types_reach_the_model():
    """A property that the outputs above depend on the new fields: another global base or another layer pattern gives
    other hidden states (rows longer than the window)."""
    base = hidden(preset("modernbert-tiny"))
    rope = dict(MODERN_ROPE, full_attention={"rope_type": "default", "rope_theta": 10000.0})
    assert not torch.allclose(
        base, hidden(SesameBertConfig(**{**preset("modernbert-tiny").to_dict(), "rope_parameters": rope}))
    )
    layers = ["full_attention"] * 3
    assert not torch.allclose(
        base, hidden(SesameBertConfig(**{**preset("modernbert-tiny").to_dict(), "layer_types": layers}))
    )


@pytest.mark.parametrize("name", NAMES)
def test_a_saved_config_round_trips(tmp_path, name):
    """A config saved now holds transformers 5's names (none of the old ones) and loads back equal."""
    preset(name).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not set(OLD_NAMES) & set(saved) and {"rope_parameters", "layer_types"} <= set(saved)
    assert SesameBertConfig.from_pretrained(tmp_path).to_dict() == preset(name).to_dict() | {
        "auto_map": saved["auto_map"]
    }


def test_a_missing_layer_type_entry_takes_the_global_one():
    """As the old ``local_rope_theta: null`` did: the local layers then rotate with the global base."""
    config = SesameBertConfig(
        **{**preset("modernbert-tiny").to_dict(), "rope_parameters": {"full_attention": {"rope_theta": 5e4}}}
    )
    entry = {"rope_type": "default", "rope_theta": 5e4}
    assert config.rope_parameters == {"full_attention": entry, "sliding_attention": entry}
    old = SesameBertConfig(**{**preset("modernbert-tiny").to_dict(), "rope_parameters": None, "rope_theta": 5e4})
    assert old.rope_parameters == config.rope_parameters


def test_a_rotary_config_without_bases_has_base_10000_for_its_layer_types():
    """As the old ``rope_theta`` default: an all-global rotary config gets one entry, nested by layer type (not read as
    a flat dict by transformers' rotary validation, which would add a top-level ``rope_type``)."""
    config = SesameBertConfig(position_embedding_type="rope")
    assert config.rope_parameters == {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    local = SesameBertConfig(position_embedding_type="rope", num_hidden_layers=2, global_attn_every_n_layers=2)
    assert local.rope_parameters == dict.fromkeys(MODERN_LAYERS[:2], {"rope_type": "default", "rope_theta": 10000.0})


#: (fields over modernbert-tiny's, the words of the refusal): one ValueError naming the field
BAD = [
    (dict(layer_types=MODERN_LAYERS[:2]), "layer_types=['full_attention', 'sliding_attention']; expected 3 entries"),
    (dict(layer_types=["full_attention", "global", "global"]), "layer_types=['full_attention', 'global', 'global']"),
    (dict(rope_theta=10000.0), "disagrees with rope_theta=10000.0"),
    (dict(rope_parameters=None, rope_theta=160000.0, local_rope_theta=0.5), "local_rope_theta=0.5; expected a finite"),
    (dict(rope_parameters={"sliding_attention": {"rope_theta": 1e4}}), "expected an entry"),
    (dict(rope_parameters={**MODERN_ROPE, "chunked_attention": {"rope_theta": 1e4}}), "for each of full_attention"),
    (
        dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}),
        "rope_parameters['full_attention']",
    ),
    (
        dict(rope_parameters={"full_attention": {"rope_theta": 1.0}}),
        'expected {"rope_type": "default", "rope_theta": a finite base > 1}',
    ),
    (dict(global_attn_every_n_layers=3), "layer_types and global_attn_every_n_layers are both set"),
    (dict(layer_types=None, global_attn_every_n_layers=0), "global_attn_every_n_layers=0; expected a positive integer"),
]


@pytest.mark.parametrize("fields, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_inconsistent_fields_are_refused_naming_the_field(fields, message):
    with pytest.raises((StrictDataclassClassValidationError, ValueError)) as info:
        SesameBertConfig(**{**preset("modernbert-tiny").to_dict(), **fields})
    assert message in str(info.value.__cause__ or info.value), info.value


def test_a_config_file_whose_old_and_new_names_disagree_is_one_error_line(tmp_path, tokenizer, capsys):
    """Through a command (``modeling.bert.convert``, which loads the folder with ``from_pretrained``): exit 2, one
    ``error:`` line naming both, nothing written."""
    from core.errors import run_cli
    from modeling.bert import convert

    folder = tmp_path / "both"
    folder.mkdir()
    saved = {**preset("modernbert-tiny").to_dict(), "rope_theta": 10000.0, "architectures": ["SesameBertForMaskedLM"]}
    (folder / "config.json").write_text(json.dumps(saved))
    tokenizer.save_pretrained(folder)
    argv = ["--source", str(folder), "--to", "modernbert", "--output_dir", str(tmp_path / "out")]
    assert run_cli(convert.main, argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-1].startswith("error: --source") and "disagrees with rope_theta=10000.0" in lines[-1], lines[-1]
    assert not (tmp_path / "out").exists()
