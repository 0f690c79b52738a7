"""The CUDA set (``python -m pytest -m gpu``; skipped without a GPU): a bf16 training step for every head of both
families, the ELMo pipelines on ``cuda`` (the SesameBert pipeline tests, ``tests/bert/test_pipelines.py``, run on
``cuda:0`` by themselves where there is one), cuDNN's LSTM against the fused CPU kernel in float32, 30 pretraining
steps and a tiny fine-tuning run on ``cuda``."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from precision.cases import BERT_CASES, ELMO_CASES, NO_DROPOUT  # tests/ is on sys.path (pyproject's pythonpath)
from precision.conftest import BERT_TINY, ELMO_TINY, bert_batch, elmo_batch

import modeling  # noqa: F401  (registers the Auto classes)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture
def cuda() -> torch.device:
    return torch.device("cuda")


def _model(family: str, case: str):
    from modeling import SesameBertConfig
    from modeling.elmo import SesameElmoConfig

    if family == "bert":
        cls, overrides, labels = BERT_CASES[case]
        config, batch = SesameBertConfig(**{**BERT_TINY, **NO_DROPOUT, **overrides}), bert_batch()
    else:
        cls, overrides, labels = ELMO_CASES[case]
        config, batch = SesameElmoConfig(**{**ELMO_TINY, **overrides}), elmo_batch()
    torch.manual_seed(0)
    return cls(config).train(), {**batch, **labels(batch)}


@pytest.mark.parametrize("family,case", [("bert", c) for c in BERT_CASES] + [("elmo", c) for c in ELMO_CASES])
def test_bf16_training_step_of_every_head(family, case, cuda):
    """Forward under CUDA bf16 autocast, backward, fused AdamW step: finite loss and gradients, every trained
    parameter moved, float32 master weights kept."""
    model, batch = _model(family, case)
    model.to(cuda)
    batch = {k: v.to(cuda) for k, v in batch.items()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name
    optimizer.step()
    trained = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.any()}
    moved = {n for n in trained if not torch.equal(dict(model.named_parameters())[n], before[n])}
    assert trained and moved == trained, sorted(trained - moved)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_elmo_pipelines_on_cuda(cuda, tiny_corpus, tmp_path):
    """The ELMo family through pipelines on ``cuda:0`` (feature-extraction, text-classification), checked against
    the model on that device, and the same logits as on the CPU (float32)."""
    from transformers import pipeline

    from modeling.elmo import SesameElmoConfig, SesameElmoForSequenceClassification, SesameElmoModel
    from tokenizer.elmo_training import train_elmo_tokenizer

    tok = train_elmo_tokenizer([tiny_corpus], vocab_size=200, output_dir=tmp_path / "tok")
    config = SesameElmoConfig(**{**ELMO_TINY, "vocab_size": len(tok), "num_labels": 2})
    torch.manual_seed(0)
    encoder, clf = SesameElmoModel(config).eval(), SesameElmoForSequenceClassification(config).eval()
    text = "The whale rose from the sea."
    with torch.no_grad():
        on_cpu = clf(**tok(text, return_tensors="pt")).logits
    features = torch.tensor(pipeline("feature-extraction", model=encoder, tokenizer=tok, device=0)(text))
    scores = pipeline("text-classification", model=clf, tokenizer=tok, top_k=None, device=0)([text])[0]
    assert encoder.device.type == clf.device.type == "cuda"
    with torch.no_grad():
        expected = encoder(**tok(text, return_tensors="pt").to(cuda)).last_hidden_state.cpu()
        probs = clf(**tok(text, return_tensors="pt").to(cuda)).logits.softmax(-1)[0].cpu()
    torch.testing.assert_close(features, expected, rtol=0, atol=1e-5)
    for s in scores:
        assert abs(s["score"] - probs[clf.config.label2id[s["label"]]].item()) < 1e-5
    torch.testing.assert_close(probs, on_cpu.softmax(-1)[0], rtol=1e-4, atol=1e-4)


def test_cudnn_lstm_matches_the_fused_cpu_kernel(cuda, no_tf32):
    """Same parameters, float32: the BiLM on the CPU (BiLSTMProjectionFunction) and on CUDA (cuDNN nn.LSTM) give the
    same layer outputs and parameter gradients within 1e-5."""
    from modeling.elmo import SesameElmoConfig, SesameElmoModel
    from modeling.elmo.lstm_elmo import fused_lstm_applies

    torch.manual_seed(0)
    cpu_model = SesameElmoModel(SesameElmoConfig(**ELMO_TINY, fused_cpu_lstm=True)).train()
    cuda_model = copy.deepcopy(cpu_model).to(cuda)
    batch = elmo_batch()
    assert fused_lstm_applies(cpu_model.config, torch.zeros(1))
    weight = torch.randn(3, 7, 2 * ELMO_TINY["projection_dim"], generator=torch.Generator().manual_seed(1))
    outs = {}
    for name, model, device in (("cpu", cpu_model, "cpu"), ("cuda", cuda_model, cuda)):
        hidden = model(batch["char_ids"].to(device), attention_mask=batch["attention_mask"].to(device)).hidden_states
        sum(((h * weight.to(device)) ** 2).sum() for h in hidden[1:]).backward()
        outs[name] = (
            [h.detach().cpu() for h in hidden],
            {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None},
        )
    for a, b in zip(outs["cpu"][0], outs["cuda"][0]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    lstm_grads = [n for n in outs["cpu"][1] if "rnn" in n]
    assert lstm_grads and outs["cpu"][1].keys() == outs["cuda"][1].keys()
    for n, g in outs["cpu"][1].items():
        torch.testing.assert_close(outs["cuda"][1][n], g, rtol=1e-5, atol=1e-5, msg=n)


def test_30_pretraining_steps_on_cuda_in_bf16(tiny_corpus, tmp_path, fresh_state):
    from core.errors import run_cli
    from pretrain.cli import main

    allocated = torch.cuda.memory_allocated()  # tensors of earlier tests may still be alive
    torch.cuda.reset_peak_memory_stats()
    out = tmp_path / "pretrain"
    args = [
        "--train_file",
        str(tiny_corpus),
        "--output_dir",
        str(out),
        "--config_name",
        "bert-tiny",
        "--vocab_size",
        "300",
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "8",
        "--max_train_steps",
        "30",
        "--mixed_precision",
        "bf16",
        "--logging_steps",
        "1",
    ]
    assert run_cli(main, args) == 0
    assert torch.cuda.max_memory_allocated() > allocated, "the run used the GPU"
    log = json.loads((out / "trainer_log.json").read_text())
    losses = [r["train_loss"] for r in log]
    assert len(losses) == 30 and all(map(torch.isfinite, map(torch.tensor, losses)))
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, "the MLM loss goes down"


def test_tiny_glue_fine_tuning_on_cuda(tmp_path, fresh_state):
    from bert.conftest import make_tokenizer

    from finetune import glue
    from modeling import SesameBertConfig, SesameBertModel

    tok = make_tokenizer()
    model_dir = tmp_path / "tiny-bert"
    torch.manual_seed(0)
    SesameBertModel(SesameBertConfig(**{**BERT_TINY, "vocab_size": len(tok)})).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    sst = tmp_path / "glue" / "SST-2"
    sst.mkdir(parents=True)
    rows = [("a good film", 1), ("a bad movie", 0), ("the story is good", 1), ("what a bad story", 0)] * 4
    for split in ("train", "dev"):
        (sst / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows), encoding="utf-8"
        )
    allocated = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = tmp_path / "sst2"
    assert (
        glue.main(
            [
                "--model_name_or_path",
                str(model_dir),
                "--task_name",
                "sst2",
                "--glue_dir",
                str(tmp_path / "glue"),
                "--output_dir",
                str(out),
                "--max_seq_length",
                "16",
                "--per_device_train_batch_size",
                "4",
                "--learning_rate",
                "1e-3",
                "--num_train_epochs",
                "3",
                "--mixed_precision",
                "bf16",
            ]
        )
        == 0
    )
    assert torch.cuda.max_memory_allocated() > allocated, "the run used the GPU"
    results = json.loads((out / "all_results.json").read_text())
    assert results["global_step"] == 12 and 0.0 <= results["eval_accuracy"] <= 1.0
