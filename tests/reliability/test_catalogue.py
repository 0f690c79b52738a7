"""The bad-input catalogue: every command refuses bad input with exit status 2, exactly one ``error:`` line
naming the thing and what was expected, no traceback, and nothing partial written (``--output_dir`` absent
or unchanged). In-process through ``core.errors.run_cli`` (fast); a few cases also as real subprocesses to
prove the exit status.

Commands: ``python -m tokenizer train``, ``pretrain``, ``finetune.glue``, ``finetune.squad`` (through its CLI)
and the hub flags (``--push_to_hub``, offline)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import asset_args

from core.errors import run_cli

ROOT = Path(__file__).resolve().parents[2]


# -- fixtures written per case --------------------------------------------------------------------------------
def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
    return path


def _sst(path: Path, rows: list[tuple[str, str]], header: str = "sentence,label") -> Path:
    return _write(path, header + "\n" + "".join(f"{s},{label}\n" for s, label in rows))


GOOD_ROWS = [("a fine film", "1"), ("a dull film", "0"), ("great acting", "1"), ("boring plot", "0")]


def _squad(path: Path, context: str = "the senate adjourned after a long debate.", answer_start: int = 4) -> Path:
    doc = {
        "version": "1.1",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": context,
                        "qas": [
                            {
                                "id": "q1",
                                "question": "who adjourned?",
                                "answers": [{"text": "senate", "answer_start": answer_start}],
                            }
                        ],
                    }
                ],
            }
        ],
    }
    return _write(path, json.dumps(doc))


def _no_weights_model(tmp: Path, assets: Path) -> Path:
    d = tmp / "no-weights"
    d.mkdir()
    for f in (assets / "tiny-model").iterdir():
        if not f.name.endswith(".safetensors"):
            (d / f.name).write_bytes(f.read_bytes())
    return d


def _truncated_gz(path: Path, source: Path) -> Path:
    import gzip

    data = gzip.compress(source.read_bytes() * 4)
    return _write(path, data[: len(data) // 2])


def _truncated_weights(tmp: Path, assets: Path) -> Path:
    import shutil

    d = tmp / "truncated"
    shutil.copytree(assets / "tiny-model", d)
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return d


# -- the cases: (name, command, argv builder, pattern the error line must match) --------------------------------
def tok(tmp, a, *extra):
    return ["train", "--model_type", "bert", "--vocab_size", "100", "--output_dir", str(tmp / "out"), *extra]


def weights_only(tmp, model_dir):
    """A copy of ``model_dir`` with its config and weights but no tokenizer."""
    import shutil

    out = tmp / "weights-only"
    out.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, out / name)
    return str(out)


def _config(tmp: Path, config) -> Path:
    """``config`` (a ``PretrainedConfig``) saved as ``tmp/cfg/config.json``; returns the folder."""
    config.save_pretrained(tmp / "cfg")
    return tmp / "cfg"


def _bad_dropout_config(tmp: Path) -> Path:
    """bert-tiny with ``hidden_dropout_prob: 2.0`` (the config class refuses it, so it is written as JSON)."""
    import modeling

    config = modeling.get_preset_config("bert-tiny", max_position_embeddings=64).to_dict()
    _write(tmp / "cfg" / "config.json", json.dumps({**config, "hidden_dropout_prob": 2.0}))
    return tmp / "cfg"


def _elmo_small_chars(tmp: Path, a: Path) -> list[str]:
    """pretrain --model_type elmo with an ELMo word tokenizer and a micro BiLM config of char_vocab_size 100."""
    from _tiny import micro_bilm_kwargs

    from modeling.elmo import SesameElmoConfig
    from tokenizer.elmo_training import train_elmo_tokenizer

    train_elmo_tokenizer([a / "train.txt"], vocab_size=80, output_dir=tmp / "elmotok")
    cfg = _config(tmp, SesameElmoConfig(vocab_size=80, char_vocab_size=100, **micro_bilm_kwargs()))
    return pre(tmp, a, "--model_type", "elmo", "--tokenizer_name", str(tmp / "elmotok"), "--config_name", str(cfg))


def pre(tmp, a, *extra):
    return asset_args(a, tmp / "out", "--max_train_steps", "2", *extra)


def _finetune(tmp, a, train, valid, *extra):
    """Arguments of a fine-tuning command: the tiny model, the ``train`` and ``valid`` files, batches of 2, one step,
    the output folder ``tmp/out``; then ``extra``."""
    files = ["--train_file", str(train), "--validation_file", str(valid)]
    steps = ["--per_device_train_batch_size", "2", "--max_train_steps", "1"]
    return ["--model_name_or_path", str(a / "tiny-model"), *files, *steps, "--output_dir", str(tmp / "out"), *extra]


def glue(tmp, a, *extra, train=None, valid=None):
    train = train or _sst(tmp / "train.csv", GOOD_ROWS)
    valid = valid or _sst(tmp / "valid.csv", GOOD_ROWS)
    return _finetune(tmp, a, train, valid, "--max_seq_length", "32", *extra)


#: A good JSON-lines record of a single-sentence task, and one of label 0.
OK_JSON, BAD_LABEL_JSON = '{"sentence": "ok", "label": 1}\n', '{"sentence": "bad", "label": 0}\n'


def glue_jsonl(tmp, a, name: str, train: str, valid: str = OK_JSON):
    """:func:`glue` arguments of JSON-lines files: ``name`` holding ``train``, ``v.jsonl`` holding ``valid``."""
    return glue(tmp, a, train=_write(tmp / name, train), valid=_write(tmp / "v.jsonl", valid))


def squad(tmp, a, *extra, train=None):
    train = train or _squad(tmp / "train.json")
    return _finetune(tmp, a, train, train, "--max_seq_length", "48", "--doc_stride", "16", *extra)


CASES = [
    # tokenizer trainer
    (
        "tokenizer: missing corpus",
        "tokenizer",
        lambda t, a: tok(t, a, "--train_file", str(t / "nope.txt")),
        r"nope\.txt.*(not found|no such|does not exist)",
    ),
    (
        "tokenizer: empty corpus",
        "tokenizer",
        lambda t, a: tok(t, a, "--train_file", str(_write(t / "empty.txt", ""))),
        r"empty\.txt.*empty",
    ),
    (
        "tokenizer: undecodable corpus",
        "tokenizer",
        lambda t, a: tok(t, a, "--train_file", str(_write(t / "latin1.txt", "caf\xe9 na\xefve\n".encode("latin-1")))),
        r"latin1\.txt.*UTF-8",
    ),
    (
        "tokenizer: corrupt gzip",
        "tokenizer",
        lambda t, a: tok(t, a, "--train_file", str(_write(t / "bad.txt.gz", b"\x1f\x8b not really gzip"))),
        r"bad\.txt\.gz",
    ),
    (
        "tokenizer: unsupported compression",
        "tokenizer",
        lambda t, a: tok(t, a, "--train_file", str(_write(t / "c.txt.bz2", b"BZh91AY"))),
        r"c\.txt\.bz2.*expected",
    ),
    (
        "tokenizer: vocab_size 0",
        "tokenizer",
        lambda t, a: [
            "train",
            "--model_type",
            "bert",
            "--vocab_size",
            "0",
            "--output_dir",
            str(t / "out"),
            "--train_file",
            str(a / "train.txt"),
        ],
        r"--vocab_size 0.*expected",
    ),
    (
        "tokenizer: output_dir is a file",
        "tokenizer",
        lambda t, a: tok(t, a, "--train_file", str(a / "train.txt")) if _write(t / "out", "x") else None,
        r"--output_dir .*out.*file.*expected a directory",
    ),
    # pretrain
    (
        "pretrain: missing train file",
        "pretrain",
        lambda t, a: pre(t, a, "--train_file", str(t / "nope.txt")),
        r"--train_file.*nope\.txt",
    ),
    (
        "pretrain: empty train file",
        "pretrain",
        lambda t, a: pre(t, a, "--train_file", str(_write(t / "empty.txt", "\n\n"))),
        r"--train_file.*empty\.txt.*(empty|expected)",
    ),
    (
        "pretrain: undecodable train file",
        "pretrain",
        lambda t, a: pre(t, a, "--train_file", str(_write(t / "bin.txt", b"\xff\xfe\x00\x81\x82 text"))),
        r"bin\.txt.*UTF-8",
    ),
    (
        "pretrain: missing validation file",
        "pretrain",
        lambda t, a: pre(t, a, "--validation_file", str(t / "nope-valid.txt")),
        r"--validation_file.*nope-valid\.txt",
    ),
    # issue 43: text with nothing to predict (only special tokens) gave eval_loss 0, perplexity 1 and exit 0
    (
        "pretrain: validation file of special tokens only",
        "pretrain",
        lambda t, a: pre(
            t, a, "--validation_file", str(_write(t / "specials.txt", "[MASK] [SEP]\n\n[CLS] [PAD]\n" * 40))
        ),
        r"^error: --validation_file .*specials\.txt: no token to predict in its \d+ validation block",
    ),
    (
        "pretrain: training file of special tokens only",
        "pretrain",
        lambda t, a: pre(t, a, "--train_file", str(_write(t / "specials.txt", "[MASK] [SEP]\n\n[UNK] [MASK]\n" * 400))),
        r"^error: --train_file .*specials\.txt: no token to predict in its \d+ training block",
    ),
    (
        "pretrain: hidden_dropout_prob 2.0 in the config",
        "pretrain",
        lambda t, a: pre(t, a, "--config_name", str(_bad_dropout_config(t))),
        r"^error: --config_name .*cfg.*hidden_dropout_prob=2\.0; expected a probability in \[0, 1\)",
    ),
    (
        "pretrain: elmo config whose char_vocab_size does not fit the tokenizer",
        "pretrain",
        _elmo_small_chars,
        r"^error: the model config's char_vocab_size 100: --tokenizer_name .*elmotok writes character ids 0\.\.261; "
        r"expected char_vocab_size >= 262",
    ),
    (
        "pretrain: gradient accumulation 0",
        "pretrain",
        lambda t, a: pre(t, a, "--gradient_accumulation_steps", "0"),
        r"--gradient_accumulation_steps 0: expected",
    ),
    (
        "pretrain: max_seq_length beyond positions",
        "pretrain",
        lambda t, a: pre(t, a, "--config_name", str(a / "bert-tiny-config"), "--max_seq_length", "128"),
        r"--max_seq_length 128: exceeds the model's max_position_embeddings 64",
    ),
    (
        "pretrain: unknown config preset",
        "pretrain",
        lambda t, a: pre(t, a, "--config_name", "bert-gigantic"),
        r"--config_name bert-gigantic: not a preset, .*expected a preset",
    ),
    (
        "pretrain: tokenizer not found",
        "pretrain",
        lambda t, a: pre(t, a, "--tokenizer_name", str(t / "no-tokenizer")),
        r"--tokenizer_name .*no-tokenizer",
    ),
    (
        "pretrain: tokenizer other than the model's",
        "pretrain",
        lambda t, a: pre(
            t, a, "--tokenizer_name", str(a / "wordpiece-big"), "--model_name_or_path", str(a / "tiny-model")
        ),
        r"--tokenizer_name.*differs from the tokenizer saved with --model_name_or_path",
    ),
    (
        "pretrain: tokenizer larger than the model's vocabulary",
        "pretrain",
        lambda t, a: pre(
            t,
            a,
            "--tokenizer_name",
            str(a / "wordpiece-big"),
            "--model_name_or_path",
            weights_only(t, a / "tiny-model"),
        ),
        r"--tokenizer_name.*tokens but the model's vocab_size is",
    ),
    (
        "pretrain: model directory without weights",
        "pretrain",
        lambda t, a: pre(t, a, "--model_name_or_path", str(_no_weights_model(t, a))),
        r"--model_name_or_path .*no-weights",
    ),
    (
        "pretrain: nsp with elmo",
        "pretrain",
        lambda t, a: pre(t, a, "--model_type", "elmo", "--nsp"),
        r"--nsp: .*expected --model_type bert \(got elmo\)",
    ),
    (
        "pretrain: resume from a missing checkpoint",
        "pretrain",
        lambda t, a: pre(t, a, "--resume_from_checkpoint", str(t / "ckpt")),
        r"--resume_from_checkpoint .*ckpt: no such folder",
    ),
    (
        "pretrain: output_dir is a file",
        "pretrain",
        lambda t, a: pre(t, a) if _write(t / "out", "x") else None,
        r"--output_dir .*out: is an existing file; expected a directory",
    ),
    (
        "pretrain: output_dir below a file",
        "pretrain",
        lambda t, a: pre(t, a, "--output_dir", str(_write(t / "afile", "x") / "out")),
        r"--output_dir .*afile/out: .*afile is an existing file",
    ),
    (
        "hub: push without a token",
        "pretrain",
        lambda t, a: pre(t, a, "--push_to_hub", "--hub_model_id", "me/tiny"),
        r"(token|log ?in)",
    ),
    (
        "hub: invalid revision",
        "pretrain",
        lambda t, a: pre(t, a, "--push_to_hub", "--hub_model_id", "me/tiny", "--hub_revision", "../main"),
        r"--hub_revision '\.\./main': expected a branch name",
    ),
    # finetune.glue
    (
        "glue: unknown task",
        "glue",
        lambda t, a: glue(t, a, "--task_name", "sst3"),
        r"--task_name.*sst3.*expected one of",
    ),
    ("glue: missing train file", "glue", lambda t, a: glue(t, a, train=t / "nope.csv"), r"nope\.csv: file not found"),
    (
        "glue: empty train file",
        "glue",
        lambda t, a: glue(t, a, train=_write(t / "empty.csv", "")),
        r"empty\.csv: the file is empty; expected a csv",
    ),
    (
        "glue: undecodable train file",
        "glue",
        lambda t, a: glue(t, a, train=_write(t / "latin.csv", "sentence,label\ncaf\xe9,1\n".encode("latin-1"))),
        r"latin\.csv: not valid UTF-8",
    ),
    (
        "glue: malformed json",
        "glue",
        lambda t, a: glue_jsonl(t, a, "bad.jsonl", OK_JSON + '{"sentence": \n'),
        r"bad\.jsonl: malformed JSON on line 2",
    ),
    (
        "glue: missing label column",
        "glue",
        lambda t, a: glue(t, a, train=_sst(t / "nolabel.csv", GOOD_ROWS, header="sentence,score")),
        r"nolabel\.csv.*(label|column)",
    ),
    (
        "glue: wrong text column",
        "glue",
        lambda t, a: glue(t, a, "--sentence1_key", "review"),
        r"(missing column|review)",
    ),
    (
        "glue: labels outside the task's label set",
        "glue",
        lambda t, a: glue(t, a, "--task_name", "sst2", train=_sst(t / "sst.csv", GOOD_ROWS + [("meh", "maybe")])),
        r"sst\.csv.*label\(s\) outside the label set",
    ),
    (
        "glue: unsupported file type",
        "glue",
        lambda t, a: glue(t, a, train=_write(t / "train.xlsx", b"PK")),
        r"train\.xlsx: unsupported file extension",
    ),
    (
        "glue: model not found",
        "glue",
        lambda t, a: glue(t, a, "--model_name_or_path", str(t / "no-model")),
        r"--model_name_or_path .*no-model",
    ),
    (
        "glue: model directory without weights",
        "glue",
        lambda t, a: glue(t, a, "--model_name_or_path", str(_no_weights_model(t, a))),
        r"--model_name_or_path .*no-weights.*weights",
    ),
    (
        "glue: max_seq_length beyond positions",
        "glue",
        lambda t, a: glue(t, a, "--max_seq_length", "128"),
        r"--max_seq_length 128: .*max_position_embeddings 64",
    ),
    (
        "glue: tokenizer larger than the model's vocabulary",
        "glue",
        lambda t, a: glue(t, a, "--tokenizer_name", str(a / "wordpiece-big")),
        r"--tokenizer_name .*wordpiece-big.*vocab",
    ),
    (
        "glue: glue_dir missing",
        "glue",
        lambda t, a: [
            "--model_name_or_path",
            str(a / "tiny-model"),
            "--task_name",
            "sst2",
            "--glue_dir",
            str(t / "glue"),
            "--output_dir",
            str(t / "out"),
        ],
        r"--glue_dir .*glue: not a directory",
    ),
    (
        "glue: output_dir is a file",
        "glue",
        lambda t, a: glue(t, a) if _write(t / "out", "x") else None,
        r"--output_dir .*out: is an existing file",
    ),
    # finetune.squad (CLI only)
    ("squad: missing train file", "squad", lambda t, a: squad(t, a, train=t / "nope.json"), r"nope\.json"),
    (
        "squad: malformed json",
        "squad",
        lambda t, a: squad(t, a, train=_write(t / "bad.json", '{"data": [')),
        r"bad\.json",
    ),
    (
        "squad: not SQuAD format",
        "squad",
        lambda t, a: squad(t, a, train=_write(t / "list.json", "[1, 2, 3]")),
        r"list\.json",
    ),
    (
        "squad: negative doc_stride",
        "squad",
        lambda t, a: squad(t, a, "--doc_stride", "-1"),
        r"--doc_stride -1: expected an integer >= 0",
    ),
    (
        "squad: no data",
        "squad",
        lambda t, a: ["--model_name_or_path", str(a / "tiny-model"), "--output_dir", str(t / "out")],
        r"no data given",
    ),
    # issue 23: faults that gave tracebacks or silently wrong results
    (
        "pretrain: corrupt gzip train file",
        "pretrain",
        lambda t, a: pre(t, a, "--train_file", str(_write(t / "bad.txt.gz", b"\x1f\x8b not really gzip"))),
        r"bad\.txt\.gz",
    ),
    (
        "pretrain: truncated gzip train file",
        "pretrain",
        lambda t, a: pre(t, a, "--train_file", str(_truncated_gz(t / "cut.txt.gz", a / "train.txt"))),
        r"cut\.txt\.gz",
    ),
    (
        "pretrain: elmo with a WordPiece tokenizer",
        "pretrain",
        lambda t, a: pre(t, a, "--model_type", "elmo", "--config_name", "elmo-small"),
        r"--tokenizer_name .*wordpiece.*model family",
    ),
    (
        "glue: truncated model.safetensors",
        "glue",
        lambda t, a: glue(t, a, "--model_name_or_path", str(_truncated_weights(t, a))),
        r"--model_name_or_path .*truncated",
    ),
    (
        "glue: corrupt gzip train file",
        "glue",
        lambda t, a: glue(t, a, train=_write(t / "bad.csv.gz", b"\x1f\x8b not really gzip")),
        r"bad\.csv\.gz",
    ),
    (
        "glue: empty label cell",
        "glue",
        lambda t, a: glue(t, a, train=_sst(t / "gap.csv", GOOD_ROWS + [("no label here", "")])),
        r"gap\.csv.*label",
    ),
    (
        "glue: JSON record without the label key",
        "glue",
        lambda t, a: glue_jsonl(t, a, "nokey.jsonl", OK_JSON + '{"sentence": "no key"}\n', OK_JSON + BAD_LABEL_JSON),
        r"nokey\.jsonl.*label",
    ),
    (
        "squad: model directory without weights",
        "squad",
        lambda t, a: squad(t, a, "--model_name_or_path", str(_no_weights_model(t, a)), "--max_query_length", "16"),
        r"--model_name_or_path .*no-weights",
    ),
    (
        "squad: truncated model.safetensors",
        "squad",
        lambda t, a: squad(t, a, "--model_name_or_path", str(_truncated_weights(t, a)), "--max_query_length", "16"),
        r"--model_name_or_path .*truncated",
    ),
    (
        "squad: corrupt gzip train file",
        "squad",
        lambda t, a: squad(t, a, train=_write(t / "bad.json.gz", b"\x1f\x8b not really gzip")),
        r"bad\.json\.gz",
    ),
]


def _training_refusals(command: str, build, rate: str, shown: str) -> list[tuple]:
    """The refusals of a training command's optimizer settings: a batch size of 0; a negative learning rate
    (``--learning_rate=rate``, named back as ``shown``, a regular expression)."""
    batch = r"--per_device_train_batch_size 0: expected an integer >= 1"
    return [
        (f"{command}: batch size 0", command, lambda t, a: build(t, a, "--per_device_train_batch_size", "0"), batch),
        (
            f"{command}: negative learning rate",
            command,
            lambda t, a: build(t, a, f"--learning_rate={rate}"),
            rf"--learning_rate {shown}: expected a positive",
        ),
    ]


CASES += _training_refusals("pretrain", pre, "-1e-3", r"-0\.001") + _training_refusals("glue", glue, "-2e-5", r"-2e-05")


def _main(command):
    if command == "tokenizer":
        from tokenizer.__main__ import main
    elif command == "pretrain":
        from pretrain.cli import main
    elif command == "glue":
        from finetune.glue import main
    else:
        from finetune.squad import main
    return main


def _snapshot(path: Path):
    if not path.exists():
        return None
    if path.is_file():
        return ("file", path.read_bytes())
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*"))


@pytest.fixture
def clean_env(monkeypatch, tmp_path_factory):
    """A fresh accelerate state, no hub token (neither in the environment nor a stored one), no SESAME_DEBUG."""
    import huggingface_hub.constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SESAME_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    no_token = str(tmp_path_factory.mktemp("hf") / "token")
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", no_token)
    monkeypatch.setattr(huggingface_hub.constants, "HF_STORED_TOKENS_PATH", no_token + "s")
    clean_env_reset()
    yield
    clean_env_reset()


@pytest.mark.parametrize("name,command,build,pattern", CASES, ids=[c[0] for c in CASES])
def test_refused_with_one_clear_error_line(name, command, build, pattern, assets, tmp_path, capsys, clean_env):
    argv = build(tmp_path, assets)
    out = Path(argv[argv.index("--output_dir") + 1])
    before = _snapshot(out)
    status = run_cli(_main(command), argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    assert re.search(pattern, lines[0]), lines[0]
    assert "expected" in lines[0] or "pass " in lines[0] or "give " in lines[0], f"says what was expected: {lines[0]}"
    assert "Traceback" not in err
    assert _snapshot(out) == before, f"{out} was changed"
    assert not list(out.parent.glob(f".{out.name}.tmp-*")), "a temporary output folder was left behind"


def test_resume_with_a_different_model_config_is_refused(assets, tmp_path, capsys, clean_env):
    from pretrain.cli import main

    argv = pre(tmp_path, assets, "--checkpointing_steps", "1")
    assert run_cli(main, argv) == 0
    out = tmp_path / "out"
    before = _snapshot(out)
    clean_env_reset()
    status = run_cli(main, pre(tmp_path, assets, "--config_name", "bert-mini", "--resume_from_checkpoint", "latest"))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(lines) == 1, err[-3000:]
    assert re.search(
        r"--resume_from_checkpoint .*step_2: the model config differs from the checkpoint's \(hidden_size 128 -> "
        r"256; .*expected the checkpoint's model config",
        lines[0],
    )
    assert "Traceback" not in err
    assert _snapshot(out) == before


def clean_env_reset():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_debug_shows_the_traceback(assets, tmp_path, clean_env):
    from core.errors import InputError
    from tokenizer.__main__ import main

    with pytest.raises(InputError, match="nope.txt"):
        run_cli(main, tok(tmp_path, assets, "--train_file", str(tmp_path / "nope.txt"), "--debug"))


SUBPROCESS_CASES = [
    ("tokenizer", ["-m", "tokenizer"], lambda t, a: tok(t, a, "--train_file", str(_write(t / "empty.txt", "")))),
    ("pretrain", ["-m", "pretrain"], lambda t, a: pre(t, a, "--per_device_train_batch_size", "0")),
    ("glue", ["-m", "finetune.glue"], lambda t, a: glue(t, a, "--task_name", "sst3")),
]


@pytest.mark.parametrize("name,module,build", SUBPROCESS_CASES, ids=[c[0] for c in SUBPROCESS_CASES])
def test_real_exit_status_in_a_subprocess(name, module, build, assets, tmp_path):
    argv = build(tmp_path, assets)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("SESAME_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, *module, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_ctrl_c_while_training_a_tokenizer_writes_nothing(assets, tmp_path, monkeypatch, capsys):
    import tokenizer.wordpiece
    from core.files import atomic_output_dir
    from tokenizer.__main__ import main

    def interrupted(files, vocab_size, output_dir, **kwargs):
        with atomic_output_dir(output_dir) as tmp:
            (tmp / "vocab.txt").write_text("[PAD]\n")  # half-way through saving
            raise KeyboardInterrupt

    monkeypatch.setattr(tokenizer.wordpiece, "train_wordpiece_tokenizer", interrupted)
    assert run_cli(main, tok(tmp_path, assets, "--train_file", str(assets / "train.txt"))) == 130
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "interrupted" in lines[0]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
