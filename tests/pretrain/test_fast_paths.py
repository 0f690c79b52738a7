"""The GPU-speed paths of ``pretrain`` checked on the CPU (issue 30): DataLoader workers give the very batches and
weights of the main-process loader, and resume bitwise; ``--torch_compile`` with document masking, the sparse head
and gradient accumulation resumes bitwise against itself (each run with an empty dynamo cache, as in its own
process)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from _helpers import assert_saved_as_trained, compile_without_inductor
from _launch import corpus_args
from datasets import Dataset

from core.errors import InputError, run_cli
from pretrain import data
from pretrain.cli import main, parse
from pretrain.collators import MLMCollator
from training.data import make_train_dataloader, resolve_num_workers


def test_dataloader_num_workers_auto_and_refused_values(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert resolve_num_workers("auto", "cuda") == 4
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert resolve_num_workers("auto", "cuda") == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 8 GPU processes on the machine share its cores
    assert resolve_num_workers("auto", "cuda") == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert resolve_num_workers("auto", "cuda") == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert resolve_num_workers("auto", "cpu") == 0
    assert resolve_num_workers("auto", "cuda", stream=True) == 0, "a stream is read by one process"
    assert resolve_num_workers("3", "cpu") == 3 and resolve_num_workers(0, "cuda") == 0
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(InputError, match=f"--dataloader_num_workers {bad}: expected auto or an integer >= 0"):
            resolve_num_workers(bad, "cuda")
    assert parse(["--train_file", "x.txt"]).data.dataloader_num_workers == "auto"
    with pytest.raises(InputError, match="--dataloader_num_workers two"):
        parse(["--train_file", "x.txt", "--dataloader_num_workers", "two"])


def _batches(loader, epochs):
    out = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        loader.collate_fn.set_epoch(epoch)
        out += [dict(b) for b in loader]
    return out


def test_workers_give_the_batches_of_the_main_process(bert_tokenizer):
    """Packed blocks with position ids, 30% masking, whole-word masking: two workers and none give equal batches
    (order, masks, position ids) over two epochs, and the epochs differ (the check can fail)."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(21):
        lengths = [5, 9, 2]
        rows.append(
            dict(
                input_ids=torch.randint(5, len(bert_tokenizer), (16,), generator=g).tolist(),
                word_start=(torch.rand(16, generator=g) < 0.7).long().tolist(),
                position_ids=torch.cat([torch.arange(n) for n in lengths]).tolist(),
            )
        )
    dataset = data.IndexedDataset(Dataset.from_list(rows))
    runs = {}
    for workers in (0, 2):
        collator = MLMCollator(bert_tokenizer, mlm_probability=0.3, whole_word_mask=True, seed=7)
        loader = make_train_dataloader(dataset, 4, collator, seed=3, num_workers=workers)
        runs[workers] = _batches(loader, epochs=2)
    assert len(runs[0]) == len(runs[2]) == 12
    for a, b in zip(runs[0], runs[2]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(runs[0][0]["input_ids"], runs[0][6]["input_ids"]), "epoch 2 is another order / masks"


def _args(corpus_dir, tok, out, *extra):
    schedule = "--mlm_probability 0.3 --learning_rate 2e-3 --logging_steps 1 --checkpointing_steps 2"
    return corpus_args(corpus_dir, out, *schedule.split(), "--checkpoints_total_limit", "0", *extra, tokenizer=tok)


def _resume_from_step_2(corpus_dir, tok, run, resumed, *extra):
    """A run stopped after step 2 (its step-2 checkpoint, copied) and resumed with ``extra``."""
    resumed.mkdir()
    shutil.copytree(run / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    assert run_cli(main, _args(corpus_dir, tok, resumed, *extra, "--resume_from_checkpoint", "latest")) == 0


@pytest.mark.slow
def test_workers_train_and_resume_bitwise_like_the_main_process(corpus_dir, bert_tokenizer, tmp_path, fresh_state):
    """Document masking on, dropout on: 2 workers end with bitwise the weights of 0 workers, and a 2-worker run
    stopped after step 2 and resumed with 2 workers ends with them too."""
    tok = tmp_path / "tok"
    bert_tokenizer.save_pretrained(tok)
    steps = ["--max_train_steps", "4"]
    main_process, workers, resumed = tmp_path / "w0", tmp_path / "w2", tmp_path / "w2-resumed"
    assert run_cli(main, _args(corpus_dir, tok, main_process, *steps, "--dataloader_num_workers", "0")) == 0
    assert run_cli(main, _args(corpus_dir, tok, workers, *steps, "--dataloader_num_workers", "2")) == 0
    assert json.loads((workers / "run_config.json").read_text())["document_masking"] is True
    weights = (main_process / "model.safetensors").read_bytes()
    assert (workers / "model.safetensors").read_bytes() == weights
    _resume_from_step_2(corpus_dir, tok, workers, resumed, *steps, "--dataloader_num_workers", "2")
    assert (resumed / "model.safetensors").read_bytes() == weights
    logs = [json.loads((d / "trainer_log.json").read_text()) for d in (main_process, resumed)]
    assert [r["train_loss"] for r in logs[1]] == [r["train_loss"] for r in logs[0]]


@pytest.mark.parametrize("preset", ["bert-tiny", "modernbert-tiny"])
def test_compiled_run_saves_the_trained_model(corpus_dir, bert_tokenizer, tmp_path, fresh_state, monkeypatch, preset):
    """``--torch_compile``: the saved ``model.safetensors`` has the model's own keys (not the compiled wrapper's
    ``_orig_mod.`` ones) and ``from_pretrained`` gives the trained weights; the run trained compiled (dynamo handed
    the model's graphs to the compiler) and evaluated (the eager module the compiled one wraps, at steps 0, 1 and 2).
    Also for a ModernBERT-class config (rope, GeGLU, local layers in a 16-token window on 32-token blocks)."""
    import modeling
    from modeling import SesameBertForMaskedLM

    torch._dynamo.reset()  # graphs cached by an earlier test would not reach this test's compiler
    graphs = compile_without_inductor(monkeypatch)
    tok, out, config = tmp_path / "tok", tmp_path / "compiled", tmp_path / "config"
    bert_tokenizer.save_pretrained(tok)
    window = {"local_attention": 16} if "modern" in preset else {}
    modeling.get_preset_config(preset, **window).save_pretrained(config)
    compiled = ["--max_train_steps", "2", "--torch_compile", "true", "--config_name", str(config)]
    argv = _args(corpus_dir, tok, out, *compiled)
    assert run_cli(main, argv) == 0
    assert json.loads((out / "run_config.json").read_text())["torch_compile"] is True
    assert any(n.op in ("call_module", "call_function") for g in graphs for n in g.graph.nodes), graphs
    history = json.loads((out / "eval_history.json").read_text())
    assert [e["step"] for e in history] == [0, 1, 2] and all(math.isfinite(e["eval_loss"]) for e in history), history
    assert history[-1]["eval_loss"] == json.loads((out / "all_results.json").read_text())["eval_loss"]
    assert_saved_as_trained(out, out / "checkpoints" / "step_2", SesameBertForMaskedLM)


@pytest.mark.slow
def test_torch_compile_resumes_bitwise_against_itself(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, seeded_single_thread
):
    """``--torch_compile`` with document masking, 30% masking on the sparse head (a different number of masked rows
    every micro-batch), gradient accumulation 2, dropout and checkpoints: a compiled run stopped after step 2 and
    resumed ends with bitwise the weights and losses of the uninterrupted compiled run. Against the eager run the
    losses agree within 2% only: inductor draws its own dropout masks.

    Each run starts with an empty dynamo cache, as a run in its own process does: dynamo keys its graphs on the
    model's code, not on the model object, so a second run in one process (and this test after other compiled tests)
    would otherwise reuse graphs compiled for earlier shapes -- static ones where a fresh run compiles dynamic ones,
    whose kernels may round differently (seen in the full suite: the key bias, whose gradient is zero in exact
    arithmetic and rounding noise in floats, which Adam scales up to about the learning rate).

    On one CPU thread (``seeded_single_thread``): with several, inductor splits a reduction by the size it knows, and
    the resumed run's first graph (static shapes for step 3's masked-row count) and the uninterrupted run's (dynamic
    after its first recompile) round differently in the last bit (measured: one byte of the weights with 2 threads;
    docs/pretraining.md, "--torch_compile")."""
    tok = tmp_path / "tok"
    bert_tokenizer.save_pretrained(tok)
    common = ["--max_train_steps", "4", "--gradient_accumulation_steps", "2", "--torch_compile", "true"]
    run, resumed, eager = tmp_path / "compiled", tmp_path / "compiled-resumed", tmp_path / "eager"
    torch._dynamo.reset()
    assert run_cli(main, _args(corpus_dir, tok, run, *common)) == 0
    config = json.loads((run / "run_config.json").read_text())
    assert config["torch_compile"] is True and config["document_masking"] is True
    torch._dynamo.reset()
    _resume_from_step_2(corpus_dir, tok, run, resumed, *common)
    assert (resumed / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()
    logs = [json.loads((d / "trainer_log.json").read_text()) for d in (run, resumed)]
    assert [r["train_loss"] for r in logs[1]] == [r["train_loss"] for r in logs[0]]
    torch._dynamo.reset()
    assert run_cli(main, _args(corpus_dir, tok, eager, *common[:-2])) == 0
    eager_log = json.loads((eager / "trainer_log.json").read_text())
    for a, b in zip(logs[0], eager_log):
        assert abs(a["train_loss"] - b["train_loss"]) < 2e-2 * abs(b["train_loss"])
