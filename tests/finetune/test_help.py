"""finetune.glue / finetune.squad --help: one default per flag, and the default the script really uses."""

from __future__ import annotations

import re

import pytest

from finetune import glue, ner, squad


def _entries(parser, monkeypatch) -> dict[str, str]:
    """Flag -> its help entry (the flag's line and the indented lines that continue it), on a wide terminal."""
    monkeypatch.setenv("COLUMNS", "2000")
    entries, flag = {}, None
    for line in parser.format_help().splitlines():
        match = re.match(r"^  (--?\w[\w-]*)", line)
        if match:
            flag = match.group(1)
            entries[flag] = line
        elif flag and line.startswith("    "):
            entries[flag] += " " + line.strip()
        else:
            flag = None
    return entries


@pytest.mark.parametrize("module", [glue, squad, ner], ids=["glue", "squad", "ner"])
def test_help_shows_one_default_per_flag(module, monkeypatch):
    entries = _entries(module.build_parser(), monkeypatch)
    assert len(entries) > 40
    doubled = {flag: line for flag, line in entries.items() if line.lower().count("default") > 1}
    assert not doubled, doubled


@pytest.mark.parametrize("module, lr, batch", [(glue, "2e-05", "32"), (squad, "3e-05", "12")], ids=["glue", "squad"])
def test_help_shows_the_defaults_the_script_uses(module, lr, batch, monkeypatch):
    entries = _entries(module.build_parser(), monkeypatch)
    args = module.build_parser().parse_args(["--model_name_or_path", "m"])
    # the learning rate is resolved from the backbone (issue 32): its help gives the rule, BERT-base's rate in it
    assert args.learning_rate is None and args.per_device_train_batch_size == int(batch)
    assert f"hidden size >= 768 {float(lr):g}" in entries["--learning_rate"] and "1e-4" in entries["--learning_rate"]
    assert f"(default: {batch})" in entries["--per_device_train_batch_size"]
    assert (
        "(default: 128)" in entries["--doc_stride"]
        if module is squad
        else "(default: 128)" in entries["--max_seq_length"]
    )
    assert "default" not in entries["--do_train"].lower() or entries["--do_train"].lower().count("default") == 1


def test_a_negation_flag_says_what_it_stands_for_and_works(monkeypatch):
    """HfArgumentParser adds --no_group_by_length for the field group_by_length (default True): its help names the
    flag it negates instead of repeating that flag's help, and it still sets the field to False."""
    parser = glue.build_parser()
    entries = _entries(parser, monkeypatch)
    assert entries["--no_group_by_length"].split(None, 1)[1] == "the same as --group_by_length false"
    assert "(default: True)" in entries["--group_by_length"]
    parse = lambda *argv: parser.parse_args(["--model_name_or_path", "m", *argv]).group_by_length
    assert parse() is True
    assert parse("--no_group_by_length") is False
    assert parse("--group_by_length", "false") is False
