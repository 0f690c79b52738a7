"""``pretrain --config_name modernbert-tiny`` (issue 41): a ModernBERT-class SesameBert (rope, GeGLU, local layers in
a window shorter than the blocks, packed documents) trains, a resumed run ends bitwise where the uninterrupted one
does, and the folder loads with the Auto classes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _launch import checkpoint_args
from _launch import corpus_args as _run_args

from core.errors import run_cli
from pretrain.cli import main


def test_modernbert_tiny_trains_resumes_bitwise_and_loads(corpus_dir, bert_tokenizer, tmp_path, fresh_state):
    from transformers import AutoModelForMaskedLM

    import modeling  # noqa: F401  (registers the Auto classes)

    tok, preset = tmp_path / "tok", tmp_path / "preset"
    bert_tokenizer.save_pretrained(tok)
    # the preset with a 16-token window, so that on 32-token blocks the local layers do not see whole blocks
    modeling.get_preset_config("modernbert-tiny", local_attention=16).save_pretrained(preset)
    common = ["--tokenizer_name", str(tok), *checkpoint_args(4, 2), "--learning_rate", "2e-3"]
    a, resumed = tmp_path / "a", tmp_path / "resumed"
    assert run_cli(main, _run_args(corpus_dir, a, *common, config=str(preset))) == 0
    config = json.loads((a / "config.json").read_text())
    assert config["position_embedding_type"] == "rope" and config["hidden_act"] == "geglu"
    assert config["local_attention"] == 16 and config["layer_types"] == ["full_attention", *["sliding_attention"] * 2]
    resumed.mkdir()
    shutil.copytree(a / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    argv = _run_args(corpus_dir, resumed, *common, "--resume_from_checkpoint", "latest", config=str(preset))
    assert run_cli(main, argv) == 0
    assert (a / "model.safetensors").read_bytes() == (resumed / "model.safetensors").read_bytes()

    model = AutoModelForMaskedLM.from_pretrained(a).eval()
    assert type(model).__name__ == "SesameBertForMaskedLM"
    batch = bert_tokenizer(["the senate adjourned after a long debate"], return_tensors="pt")
    # the trained folder in transformers' ModernBERT format (python -m modeling.bert.convert --to modernbert)
    from transformers import ModernBertForMaskedLM

    from modeling.bert import convert

    argv = ["--source", str(a), "--to", "modernbert", "--output_dir", str(tmp_path / "modernbert")]
    assert run_cli(convert.main, argv) == 0
    reference = ModernBertForMaskedLM.from_pretrained(tmp_path / "modernbert").eval()
    assert reference.config.cls_token_id == bert_tokenizer.cls_token_id  # from the tokenizer, not ModernBERT's
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
        assert logits.isfinite().all()
        assert (reference(input_ids=batch["input_ids"]).logits - logits).abs().max() <= 1e-5


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(local_attention=63), "local_attention=63"),
        (dict(local_attention=16384), "max_position_embeddings (8192)"),
        (dict(num_key_value_heads=3), "multiple of num_key_value_heads"),
        (dict(head_dim=65), "even head dimension"),
        (dict(hidden_act="reglu"), "hidden_act='reglu'"),
    ],
)
def test_bad_modern_configs_are_refused_with_one_line(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, capsys, fields, message
):
    """``pretrain --config_name DIR`` with a config.json the config's validators refuse: exit 2, one ``error:`` line
    that names the field, nothing written."""
    import modeling

    tok, bad, out = tmp_path / "tok", tmp_path / "bad", tmp_path / "out"
    bert_tokenizer.save_pretrained(tok)
    bad.mkdir()
    settings = modeling.get_preset_config("modernbert-tiny").to_dict()
    (bad / "config.json").write_text(json.dumps({**settings, **fields}))
    assert run_cli(main, _run_args(corpus_dir, out, "--tokenizer_name", str(tok), config=str(bad))) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and message in lines[0] and "--config_name" in lines[0], lines
    assert not (out / "model.safetensors").exists()


#: (id, context, question, answer): SQuAD v1.1 questions in the corpus' words; each answer occurs once.
QUESTIONS = [
    ("q1", "the whale rose from the sea and sailors lowered boats .", "what rose from the sea ?", "whale"),
    ("q2", "the whale rose from the sea and sailors lowered boats .", "who lowered boats ?", "sailors"),
    ("q3", "it rained in afternoon and streets of city were wet .", "when it rained ?", "afternoon"),
    ("q4", "the senate adjourned after a long debate on budget .", "who adjourned ?", "senate"),
]


def test_modernbert_tiny_fine_tunes_with_glue_and_squad(corpus_dir, bert_tokenizer, tmp_path, fresh_state):
    """The acceptance of issue 41: what ``pretrain --config_name modernbert-tiny`` saves fine-tunes with
    ``finetune.glue`` (SST-2 layout, train + eval + predict) and ``finetune.squad``, keeping its architecture; the
    SQuAD fine-tune learns its four questions (exact match 100: the rotary, GeGLU, local-window backbone with the
    QA head trains, and post-processing maps its spans back to the text)."""
    from transformers import AutoTokenizer

    import modeling
    from finetune import glue, squad

    tok, preset, pretrained = tmp_path / "tok", tmp_path / "preset", tmp_path / "pretrained"
    bert_tokenizer.save_pretrained(tok)
    modeling.get_preset_config("modernbert-tiny", local_attention=16).save_pretrained(preset)
    argv = _run_args(corpus_dir, pretrained, "--tokenizer_name", str(tok), "--max_train_steps", "2", config=str(preset))
    assert run_cli(main, argv) == 0

    sentences = sorted({q[1] for q in QUESTIONS})
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    for split in ("train", "dev", "test"):
        rows = [f"{i}\t{s}" if split == "test" else f"{s}\t{i % 2}" for i, s in enumerate(sentences)]
        head = "index\tsentence" if split == "test" else "sentence\tlabel"
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text("\n".join([head, *rows]) + "\n")
    sst2 = tmp_path / "sst2"
    flags = ["--max_seq_length", "32", "--per_device_train_batch_size", "2", "--max_train_steps", "3"]
    argv = ["--model_name_or_path", str(pretrained), "--task_name", "sst2", "--glue_dir", str(tmp_path / "glue")]
    splits = ["--do_train", "--do_eval", "--do_predict"]
    assert run_cli(glue.main, [*argv, "--output_dir", str(sst2), *flags, *splits]) == 0
    results = json.loads((sst2 / "all_results.json").read_text())
    assert results["global_step"] == 3
    # the evaluation and the predictions are the saved fine-tuned model's: recomputed here from its files
    fine_tuned = modeling.SesameBertForSequenceClassification.from_pretrained(sst2).eval()
    encoded = AutoTokenizer.from_pretrained(sst2)(sentences, padding=True, truncation=True, max_length=32)
    with torch.no_grad():
        logits = fine_tuned(**{k: torch.tensor(v) for k, v in encoded.items()}).logits
    predicted = logits.argmax(-1).tolist()
    accuracy = sum(p == i % 2 for i, p in enumerate(predicted)) / len(sentences)
    assert results["eval_accuracy"] == pytest.approx(accuracy), (results, predicted)
    rows = [line.split("\t") for line in (sst2 / "SST-2.tsv").read_text().splitlines()[1:]]
    assert [int(label) for _, label in rows] == predicted
    config = json.loads((sst2 / "config.json").read_text())
    assert config["architectures"] == ["SesameBertForSequenceClassification"]
    assert (config["position_embedding_type"], config["hidden_act"], config["local_attention"]) == ("rope", "geglu", 16)

    document = {
        "version": "1.1",
        "data": [
            {
                "title": qid,
                "paragraphs": [
                    {
                        "context": context,
                        "qas": [{"id": qid, "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}],
                    }
                ],
            }
            for qid, context, q, a in QUESTIONS
        ],
    }
    data, qa = tmp_path / "squad.json", tmp_path / "qa"
    data.write_text(json.dumps(document))
    argv = ["--model_name_or_path", str(pretrained), "--train_file", str(data), "--validation_file", str(data)]
    window = ["--max_seq_length", "32", "--doc_stride", "8", "--max_query_length", "12"]
    schedule = ["--learning_rate", "3e-3", "--max_train_steps", "40", "--num_warmup_steps", "4"]
    assert run_cli(squad.main, [*argv, "--output_dir", str(qa), *window, *schedule]) == 0
    predictions = json.loads((qa / "predictions.json").read_text())
    assert predictions == {qid: a for qid, _, _, a in QUESTIONS}
    assert json.loads((qa / "config.json").read_text())["architectures"] == ["SesameBertForQuestionAnswering"]
