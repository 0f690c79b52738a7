"""Document-aware packing (issue 22, item 2): the blocks' [CLS]/[SEP] convention and ``position_ids``, the whole
pipeline (pack -> collate -> model) against separate forward passes per document, no attention across a boundary,
the flag's resolution, prepared datasets with and without boundaries, and runs that use it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _launch import checkpoint_args
from _launch import corpus_args as _run_args
from datasets import Dataset, DatasetDict

from core.errors import run_cli
from pretrain import data
from pretrain.cli import main
from pretrain.collators import MLMCollator


def _tokenized(tokenizer, docs):
    texts = ["\n".join(d) for d in docs]
    raw = DatasetDict(
        {"train": Dataset.from_dict({"text": texts}), "validation": Dataset.from_dict({"text": texts[:2]})}
    )
    return data.tokenize_bert(raw, tokenizer)


def _pieces(positions: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every document piece of a row: a piece starts where the position is not the last one + 1."""
    starts = [t for t in range(len(positions)) if t == 0 or positions[t] != positions[t - 1] + 1]
    return list(zip(starts, [*starts[1:], len(positions)]))


def _error_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]


@pytest.fixture(scope="module")
def packed(bert_tokenizer, corpus_tools):
    """Documents of 1-10 words packed into 24-token blocks: many blocks hold several documents, many are cut."""
    docs = corpus_tools.random_documents(40, seed=11, lines=(1, 1), words=(1, 10))
    tokenized = _tokenized(bert_tokenizer, docs)
    return tokenized["train"], data.pack_blocks(
        tokenized, 24, bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id, document_positions=True
    )["train"]


def test_blocks_keep_every_document_apart_with_cls_at_position_0(bert_tokenizer, packed):
    documents, blocks = packed
    cls, sep = bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id
    assert [len(x) for x in blocks["input_ids"][:-1]] == [24] * (len(blocks) - 1), "full blocks: no padding"
    doc_of = [d for d, ids in enumerate(documents["input_ids"]) for _ in ids]  # the document of every token
    ends = {i for i in range(len(doc_of)) if i + 1 == len(doc_of) or doc_of[i + 1] != doc_of[i]}  # last tokens
    bodies, several, t = [], 0, 0
    for ids, pos, ws in zip(blocks["input_ids"], blocks["position_ids"], blocks["word_start"]):
        assert len(pos) == len(ids) == len(ws)
        pieces = _pieces(pos)
        several += len(pieces) > 2
        for start, end in pieces:
            piece = ids[start:end]
            assert piece[0] == cls and pos[start:end] == list(range(end - start)), "[CLS] at 0, then 1, 2, ..."
            assert ws[start] == 1 and (end - start == 1 or ws[start + 1] == 1), "a piece starts a word"
            assert cls not in piece[1:] and sep not in piece[1:-1], "one [CLS] per piece; [SEP] only at its end"
            body = [x for x in piece[1:] if x != sep]
            assert len({doc_of[t + i] for i in range(len(body))}) <= 1, "a piece holds one document"
            if body and (t + len(body) - 1) in ends:  # the document ends here: with its [SEP] unless the block is full
                assert piece[-1] == sep or end == len(ids)
            elif body:
                assert piece[-1] != sep and end == len(ids), "cut only by the block edge"
            bodies.extend(body)
            t += len(body)
    assert several > 3, "the fixture packs several documents per block"
    assert bodies == [x for ids in documents["input_ids"] for x in ids], "no token lost, none added, in order"


def test_the_collator_passes_position_ids_and_pads_them(bert_tokenizer, packed):
    _, blocks = packed
    collator = MLMCollator(bert_tokenizer, seed=0)
    full = collator(data.IndexedDataset(blocks).__getitems__([0, 1, 2]))
    assert set(full) == {"input_ids", "labels", "position_ids"}, "full blocks: no attention mask"
    assert full["position_ids"].tolist() == blocks["position_ids"][:3]
    special = torch.isin(torch.tensor(blocks["input_ids"][:3]), torch.tensor(bert_tokenizer.all_special_ids))
    assert (full["labels"][special] == -100).all(), "[CLS]/[SEP] are never predicted"
    last = len(blocks) - 1
    ragged = collator(data.IndexedDataset(blocks).__getitems__([0, last]))
    n = len(blocks["input_ids"][last])
    assert n < 24 and ragged["attention_mask"][1].tolist() == [1] * n + [0] * (24 - n)
    assert ragged["position_ids"][1].tolist() == blocks["position_ids"][last] + [0] * (24 - n)


def _model(attn: str, vocab: int):
    from transformers import AutoModelForMaskedLM

    import modeling

    torch.manual_seed(0)
    config = modeling.get_preset_config(
        "bert-tiny", vocab_size=vocab, num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128
    )
    return AutoModelForMaskedLM.from_config(config, attn_implementation=attn).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_pack_collate_model_equals_one_forward_pass_per_document(bert_tokenizer, packed, attn):
    """The acceptance test: every document piece of a packed, masked batch gets the logits it gets alone (its own
    forward pass, positions 0.., no mask), within 1e-5 in float32; padding rows included."""
    _, blocks = packed
    batch = MLMCollator(bert_tokenizer, seed=3)(data.IndexedDataset(blocks).__getitems__([0, 1, 2, len(blocks) - 1]))
    assert "attention_mask" in batch, "the last (short) block pads the batch"
    model = _model(attn, len(bert_tokenizer))
    with torch.no_grad():
        packed_logits = model(**batch).logits
        compared = 0
        for row in range(batch["input_ids"].shape[0]):
            keep = int(batch.get("attention_mask", torch.ones_like(batch["input_ids"]))[row].sum())
            for start, end in _pieces(batch["position_ids"][row, :keep].tolist()):
                alone = model(input_ids=batch["input_ids"][row : row + 1, start:end]).logits[0]
                torch.testing.assert_close(packed_logits[row, start:end], alone, rtol=0, atol=1e-5)
                compared += 1
        assert compared > 6
        # and the same batch without position_ids is not that (the check can fail)
        no_docs = model(**{k: v for k, v in batch.items() if k != "position_ids"}).logits
        assert (no_docs - packed_logits).abs().max() > 1e-3


def test_under_bf16_autocast_documents_stay_separate(bert_tokenizer, packed):
    """Under CPU bf16 autocast the packed batch matches the separate passes to bf16 rounding (measured: 2e-3 on
    logits up to 0.64, against 0.57 without position_ids), and changing one document changes nothing in the others
    (bitwise)."""
    _, blocks = packed
    batch = MLMCollator(bert_tokenizer, seed=4)(data.IndexedDataset(blocks).__getitems__([0, 1]))
    model = _model("sdpa", len(bert_tokenizer))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch).logits
        assert out.dtype == torch.bfloat16
        for row in range(2):
            for start, end in _pieces(batch["position_ids"][row].tolist()):
                alone = model(input_ids=batch["input_ids"][row : row + 1, start:end]).logits[0]
                torch.testing.assert_close(out[row, start:end].float(), alone.float(), rtol=0, atol=1e-2)
        no_docs = model(**{k: v for k, v in batch.items() if k != "position_ids"}).logits
        assert (no_docs.float() - out.float()).abs().max() > 0.1
        (start, end), *_ = _pieces(batch["position_ids"][0].tolist())
        other = batch["input_ids"].clone()
        other[0, end + 1 :] = bert_tokenizer.mask_token_id  # every later document of row 0 changed
        changed = model(**{**batch, "input_ids": other}).logits
        assert torch.equal(changed[0, start:end], out[0, start:end])
        assert not torch.equal(changed[0, end + 1 :], out[0, end + 1 :])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_no_token_attends_across_a_boundary(bert_tokenizer, packed, attn):
    """Gradients of every document's outputs reach no other document's inputs, and the eager attention probabilities
    across documents are exactly 0."""
    _, blocks = packed
    batch = MLMCollator(bert_tokenizer, seed=5)(data.IndexedDataset(blocks).__getitems__([0, 1]))
    model = _model(attn, len(bert_tokenizer))
    embeds = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    out = model.bert(inputs_embeds=embeds, position_ids=batch["position_ids"], output_attentions=attn == "eager")
    for row in range(2):
        for start, end in _pieces(batch["position_ids"][row].tolist()):
            (grad,) = torch.autograd.grad(out.last_hidden_state[row, start:end].sum(), embeds, retain_graph=True)
            outside = torch.ones(embeds.shape[:2], dtype=torch.bool)
            outside[row, start:end] = False
            assert grad[outside].abs().max() == 0, (row, start, end)
            assert grad[row, start:end].abs().max() > 0
    if attn == "eager":
        docs = torch.stack(
            [
                torch.tensor(sum(([i] * (e - s) for i, (s, e) in enumerate(_pieces(p.tolist()))), []))
                for p in batch["position_ids"]
            ]
        )
        across = docs[:, None, :, None] != docs[:, None, None, :]  # (B, 1, T, T)
        for probs in out.attentions:
            assert probs.masked_select(across.expand_as(probs)).abs().max() == 0


# -- the flag, prepared datasets and runs ---------------------------------------------------------------------------
def test_the_flag_resolves_per_objective_and_refuses_what_cannot_be():
    from core.errors import InputError
    from pretrain.cli import parse

    assert parse(["--train_file", "x.txt"]).corpus.document_masking is True, "on by default for mlm"
    assert parse([]).corpus.document_masking is True, "the demo job too"
    assert parse(["--train_file", "x.txt", "--document_masking", "false"]).corpus.document_masking is False
    assert parse(["--nsp"]).corpus.document_masking is False, "NSP pairs: one sequence per row"
    assert parse(["--model_type", "elmo"]).corpus.document_masking is False, "the BiLM: off"
    for argv, why in ((["--nsp"], "one sequence each"), (["--model_type", "elmo"], "state resets")):
        with pytest.raises(InputError, match=f"--document_masking true: not available .*{why}"):
            parse([*argv, "--document_masking", "true"])


def _prepare(args):
    from pretrain.prepare import main as prepare_main

    return run_cli(prepare_main, args)


def test_prepared_datasets_with_and_without_boundaries(corpus_dir, bert_tokenizer, tmp_path, fresh_state, capsys):
    """New prepared datasets store position_ids and say so in the manifest; an old one (no key, no column) still
    trains as before; asking for what a folder does not hold is refused with one error line."""
    from datasets import load_from_disk

    tok = tmp_path / "tok"
    bert_tokenizer.save_pretrained(tok)
    source = [
        "--train_file",
        str(corpus_dir / "train.txt"),
        "--validation_file",
        str(corpus_dir / "valid.txt.gz"),
        "--tokenizer_name",
        str(tok),
        "--max_seq_length",
        "32",
    ]
    new, old = tmp_path / "new", tmp_path / "old"
    assert _prepare([*source, "--output_dir", str(new)]) == 0
    assert _prepare([*source, "--document_masking", "false", "--output_dir", str(old)]) == 0
    assert json.loads((new / "manifest.json").read_text())["document_boundaries"] is True
    assert "position_ids" in load_from_disk(str(new / "train")).column_names
    assert "position_ids" not in load_from_disk(str(old / "train")).column_names
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["document_boundaries"]  # as written before the key existed
    (old / "manifest.json").write_text(json.dumps(manifest))
    common = ["--config_name", "bert-tiny", "--max_train_steps", "2", "--per_device_train_batch_size", "8"]
    runs = {}
    for name, folder, extra in (
        ("old", old, []),
        ("new", new, []),
        ("text-nodoc", None, ["--document_masking", "false"]),
    ):
        out = tmp_path / f"run-{name}"
        argv = [*(["--prepared_dataset", str(folder)] if folder else source), "--output_dir", str(out), *common, *extra]
        assert run_cli(main, argv) == 0
        runs[name] = out
        config = json.loads((out / "run_config.json").read_text())
        assert config["document_masking"] is (name == "new")
    old_weights, text_weights = ((runs[n] / "model.safetensors").read_bytes() for n in ("old", "text-nodoc"))
    assert old_weights == text_weights, "an old prepared dataset trains as today's packing from text"
    capsys.readouterr()
    for folder, flag, message in (
        (old, "true", "carry no document boundaries"),
        (new, "false", "carry document boundaries"),
    ):
        out = tmp_path / f"refused-{flag}"
        assert (
            run_cli(
                main, ["--prepared_dataset", str(folder), "--document_masking", flag, "--output_dir", str(out), *common]
            )
            == 2
        )
        lines = _error_lines(capsys)
        assert len(lines) == 1 and message in lines[0] and "pretrain.prepare" in lines[0], lines
        assert not out.exists()


def test_same_command_twice_and_resume_are_exact_with_document_masking(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state
):
    """Document masking on (the default): the same command gives bitwise the same weights, and a run resumed from
    its step-2 checkpoint ends with bitwise the weights of the uninterrupted run (dropout on)."""
    tok = tmp_path / "tok"
    bert_tokenizer.save_pretrained(tok)
    common = ["--tokenizer_name", str(tok), *checkpoint_args(4, 2), "--learning_rate", "2e-3"]
    a, b, resumed = tmp_path / "a", tmp_path / "b", tmp_path / "resumed"
    for out in (a, b):
        assert run_cli(main, _run_args(corpus_dir, out, *common)) == 0
    assert json.loads((a / "run_config.json").read_text())["document_masking"] is True
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    resumed.mkdir()
    shutil.copytree(a / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    assert run_cli(main, _run_args(corpus_dir, resumed, *common, "--resume_from_checkpoint", "latest")) == 0
    log_a, log_r = (json.loads((d / "trainer_log.json").read_text()) for d in (a, resumed))
    assert [r["train_loss"] for r in log_r] == [r["train_loss"] for r in log_a]  # steps 1-2 from the checkpoint
    assert (resumed / "model.safetensors").read_bytes() == (a / "model.safetensors").read_bytes()
    off = tmp_path / "off"
    assert run_cli(main, _run_args(corpus_dir, off, *common, "--document_masking", "false")) == 0
    assert (off / "model.safetensors").read_bytes() != (a / "model.safetensors").read_bytes(), "the check can fail"
