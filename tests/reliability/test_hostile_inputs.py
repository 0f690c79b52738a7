"""Hostile inputs of issue 32 item 7: each refused with one clear line (or warned), nothing run or replaced."""

from __future__ import annotations

import gzip
import logging
import os
import random

import pytest

from core.errors import InputError, first_line


def test_a_fifo_or_a_device_as_train_file_is_refused_before_reading(tmp_path):
    from tokenizer.corpus import check_text_files

    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)  # opening it for reading would block: the check must not open it
    for path in (fifo, "/dev/zero"):
        with pytest.raises(InputError, match=r"^--train_file .*: not a regular file \(a pipe, a device"):
            check_text_files([path])


def test_first_line_keeps_the_reason_after_an_introduction_line():
    assert first_line(ValueError("validation failed for 'validate_architecture':\n  hidden_size (128) bad\nmore")) == (
        "validation failed for 'validate_architecture': hidden_size (128) bad"
    )
    assert first_line(ValueError("one line\nsecond")) == "one line" and first_line(ValueError()) == "ValueError"


@pytest.mark.parametrize(
    "field, value", [("num_hidden_layers", -3), ("hidden_size", 0), ("num_attention_heads", -1), ("vocab_size", 0)]
)
def test_a_config_with_a_nonpositive_size_is_refused_naming_the_field(field, value, tmp_path):
    import json

    from transformers import AutoConfig

    import modeling

    config = modeling.get_preset_config("bert-tiny").to_dict()
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception) as err:
        AutoConfig.from_pretrained(tmp_path)
    assert f"{field}={value}; expected a positive integer" in first_line(err.value)


def test_a_corrupt_deflate_stream_in_a_tsv_gz_is_reported_as_corrupt_gzip_not_as_utf8(tmp_path):
    from finetune.glue_data import read_table

    # garbage bytes first (what a damaged deflate stream decodes to), then a CRC that does not match: reading text
    # meets the bad UTF-8 before gzip's check, which used to make it "not valid UTF-8"
    body = b"sentence\tlabel\n\xff\xfe\x80 garbage\t1\n" + b"fine line\t0\n" * 2000
    data = bytearray(gzip.compress(body))
    data[-8] ^= 0xFF  # the CRC32 of the trailer
    bad = tmp_path / "train.tsv.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(InputError) as err:
        read_table(bad)
    assert str(err.value).startswith(f"{bad}: corrupt gzip data (BadGzipFile: CRC check failed")
    # damaged bytes inside the deflate stream: corrupt gzip as well, whatever zlib finds first
    rows = "sentence\tlabel\n" + "".join(f"{random.Random(i).random()} é ü\t1\n" for i in range(3000))
    data = gzip.compress(rows.encode())
    for k in range(6):
        damaged = bytearray(data)
        for i in random.Random(k).sample(range(40, len(data) - 40), 4):
            damaged[i] ^= 0xFF
        path = tmp_path / f"train{k}.tsv.gz"
        path.write_bytes(bytes(damaged))
        with pytest.raises(InputError, match=r"corrupt gzip data"):
            read_table(path)
    # an intact .gz whose text is not UTF-8 is still reported as such
    latin = tmp_path / "latin.tsv.gz"
    latin.write_bytes(gzip.compress("sentence\tlabel\ncaf\u00e9\t1\n".encode("latin-1")))
    with pytest.raises(InputError, match="not valid UTF-8"):
        read_table(latin)


def test_prepare_into_a_non_empty_folder_does_not_suggest_resuming(tmp_path):
    from core.files import check_output_dir_reuse

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    with pytest.raises(InputError) as err:
        check_output_dir_reuse(tmp_path / "out", False, False, can_resume=False)
    assert "--resume_from_checkpoint" not in str(err.value) and "--overwrite_output_dir" in str(err.value)
    with pytest.raises(InputError, match="--resume_from_checkpoint latest"):
        check_output_dir_reuse(tmp_path / "out", False, False)


def test_output_dir_equal_to_the_model_is_refused_and_train_equal_validation_warns(tmp_path, caplog):
    from finetune.arguments import check_output_is_not_the_model, warn_if_same_file

    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(InputError, match="is the --model_name_or_path folder"):
        check_output_is_not_the_model(str(model), str(tmp_path / "." / "model"))
    check_output_is_not_the_model(str(model), str(tmp_path / "other"))
    data = tmp_path / "train.tsv"
    data.write_text("a\n")
    (tmp_path / "dev.tsv").write_text("a\n")
    log = logging.getLogger("test")
    with caplog.at_level(logging.WARNING, logger="test"):
        assert warn_if_same_file([str(data)], str(tmp_path / "." / "train.tsv"), log)
        assert not warn_if_same_file([str(data)], str(tmp_path / "dev.tsv"), log)
    assert len(caplog.records) == 1 and "is also a --train_file" in caplog.records[0].getMessage()


def test_glue_refuses_output_dir_equal_to_the_model_with_overwrite(tmp_path, capsys):
    from core.errors import run_cli
    from finetune import glue

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = ["--model_name_or_path", str(model), "--train_file", str(tmp_path / "t.tsv"), "--output_dir", str(model)]
    assert run_cli(glue.main, [*args, "--overwrite_output_dir"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --output_dir") and "is the --model_name_or_path folder" in err
    assert (model / "config.json").read_text() == "{}"


def test_overwrite_refuses_an_input_inside_what_the_command_deletes(tmp_path, capsys):
    """Issue 49 item 3: ``--overwrite_output_dir`` deletes the earlier run's checkpoints (and ``pretrain`` its trained
    tokenizer): an input inside them, or an output folder that is the input, is refused before anything is deleted;
    inputs elsewhere in the folder are allowed (a run never deletes them)."""
    from core.errors import run_cli
    from core.files import check_sources_outside
    from finetune import glue
    from pretrain.cli import main as pretrain

    out = tmp_path / "out"
    step = out / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    (step / "config.json").write_text("{}")
    (out / "tokenizer").mkdir()
    (out / "notes.txt").write_text("mine\n")
    corpus = out / "corpus.txt"
    corpus.write_text("a b c\n")
    common = ["--output_dir", str(out), "--overwrite_output_dir"]
    cases = [
        (pretrain, ["--model_name_or_path", str(step), *common], "holds --model_name_or_path"),
        (pretrain, ["--tokenizer_name", str(out / "tokenizer"), "--train_file", str(corpus), *common], "tokenizer/"),
        (glue.main, ["--model_name_or_path", str(step), "--task_name", "sst2", *common], "in checkpoints/"),
    ]
    for main, argv, message in cases:
        assert run_cli(main, argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"error: --output_dir {out}: ") and message in err, err
        assert (step / "config.json").is_file() and (out / "tokenizer").is_dir()
    check_sources_outside(out, {"--train_file": [str(corpus)], "--x": "user/repo"}, replaced=("checkpoints",))
    with pytest.raises(InputError, match=r": is the --model_name_or_path folder; expected an output folder apart"):
        check_sources_outside(out, {"--model_name_or_path": str(tmp_path / "." / "out")}, replaced=())
    with pytest.raises(InputError, match=r": lies inside --source"):
        check_sources_outside(out / "sub", {"--source": str(out)})
    with pytest.raises(InputError, match=r": contains --source"):
        check_sources_outside(tmp_path, {"--source": str(out)})


def test_a_truncated_checkpoint_with_a_rewritten_manifest_is_one_error_line(toy_run, tmp_path):
    """The manifest check passes (it was rewritten to match the truncated file); the weights cannot be read: one
    InputError naming the checkpoint, not a SafetensorError traceback."""
    import json

    from training import checkpoint_files as ckpt

    out = tmp_path / "run"
    toy_run(out, steps=8)
    step = out / "checkpoints" / "step_4"
    weights = step / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    state = json.loads((step / ckpt.STATE_FILE).read_text())
    state[ckpt.MANIFEST_KEY] = ckpt.file_manifest(step)
    (step / ckpt.STATE_FILE).write_text(json.dumps(state))
    assert ckpt.verify_checkpoint(step) is None
    with pytest.raises(
        InputError, match=r"^--resume_from_checkpoint .*step_4: its weights cannot be read \(Safetensor"
    ):
        toy_run(out, steps=8, resume=str(step))
