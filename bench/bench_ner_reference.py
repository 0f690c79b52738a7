"""The reference for ``finetune.ner``: the same NER recipe through transformers alone, as its ``run_ner.py`` does it.

    python bench/bench_ner_reference.py --model_name_or_path HF_BERT_DIR --train_file train.conll \\
        --validation_file dev.conll --seed 1 --output_dir D [--learning_rate 1e-4] [--num_train_epochs 3] \\
        [--per_device_train_batch_size 32] [--max_seq_length 128] [--weight_decay 0.01]

transformers' ``AutoModelForTokenClassification`` and ``Trainer`` (AdamW, linear decay without warmup, gradient
clipping at 1.0, weight decay without biases and LayerNorm weights: the schedule of ``finetune.ner``'s defaults),
words tokenized with ``is_split_into_words`` and each word's label on its first sub-token (``word_ids()``, the
``run_ner.py`` way; longer sentences are truncated, as ``run_ner.py`` does -- WNUT-17's fit in 128 sub-tokens),
entity-level micro F1 with seqeval on the words. The CoNLL files are read by a few lines of its own (tag last,
empty or whitespace-only lines end a sentence, ``-DOCSTART-`` skipped), not by ``finetune.ner_data``. Writes
``D/results.json`` (``eval_f1``, ``eval_precision``, ``eval_recall``, ``eval_accuracy``, the recipe) and prints it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _script_env  # noqa: F401  (offline, project root on sys.path)


def read(path: str) -> list[tuple[list[str], list[str]]]:
    """``(words, tags)`` per sentence of a CoNLL file (the tag is the last column)."""
    sentences, words, tags = [], [], []
    for line in Path(path).read_text(encoding="utf-8").splitlines() + [""]:
        if not line.strip() or line.split()[0] == "-DOCSTART-":
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        columns = line.split("\t") if "\t" in line else line.split()
        words.append(columns[0].strip())
        tags.append(columns[-1].strip())
    return sentences


def main() -> dict:
    import numpy as np
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("--model_name_or_path", "--train_file", "--validation_file", "--output_dir"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--num_train_epochs", type=float, default=3.0)
    parser.add_argument("--per_device_train_batch_size", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    args = parser.parse_args()

    train, dev = read(args.train_file), read(args.validation_file)
    labels = sorted({t for _, tags in train for t in tags})
    label2id = {t: i for i, t in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)

    def encode(sentences):
        rows = []
        for words, tags in sentences:
            enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=args.max_seq_length)
            previous, ids = None, []
            for w in enc.word_ids():
                ids.append(-100 if w is None or w == previous else label2id[tags[w]])
                previous = w
            rows.append({**enc, "labels": ids})
        return rows

    set_seed(args.seed)
    model = AutoModelForTokenClassification.from_pretrained(
        args.model_name_or_path, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label2id
    )
    training = TrainingArguments(
        output_dir=str(Path(args.output_dir) / "trainer"),
        learning_rate=args.learning_rate,
        num_train_epochs=args.num_train_epochs,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=64,
        weight_decay=args.weight_decay,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_grad_norm=1.0,
        seed=args.seed,
        save_strategy="no",
        report_to=[],
        logging_steps=50,
        use_cpu=True,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=encode(train),
        data_collator=DataCollatorForTokenClassification(tokenizer),
    )
    trainer.train()
    encoded = encode(dev)
    logits = trainer.predict(encoded).predictions
    gold, predicted, kept = [], [], []
    for (words, tags), row, scores in zip(dev, encoded, logits):
        best = np.argmax(scores, -1)
        pred = [labels[best[p]] for p, label in enumerate(row["labels"]) if label != -100]
        kept.append(len(pred))
        pred += ["O"] * (len(words) - len(pred))  # words cut by truncation (none on WNUT-17)
        gold.append(tags), predicted.append(pred)
    report = {
        "eval_f1": f1_score(gold, predicted),
        "eval_precision": precision_score(gold, predicted),
        "eval_recall": recall_score(gold, predicted),
        "eval_accuracy": accuracy_score(gold, predicted),
        "truncated_sentences": sum(
            1 for (w, _), r in zip(dev, encoded) if sum(x != -100 for x in r["labels"]) < len(w)
        ),
        "recipe": vars(args),
    }
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    _script_env.write_report(str(Path(args.output_dir) / "results.json"), report)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
