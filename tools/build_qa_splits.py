"""Build the span-QA acceptance data of issue 7 from ``shared/data/qa``: training mix and held-out evaluation.

Evaluation questions come from whole ``squadshifts_new_wiki`` articles that are kept out of training (the
articles are shuffled with seed 1 and taken until they hold at least ``--eval_pool`` questions; then
``--eval_questions`` of those are sampled with seed 2), so no paragraph of the evaluation set is seen in
training. The training mix (seed 0) samples the other ``new_wiki`` articles and the other QA files.
v2-style copies of both add unanswerable questions: half of the questions paired with a paragraph of
another article (:func:`finetune.squad_data.make_unanswerable`).

Usage::

    python tools/build_qa_splits.py ../shared/data/qa qa-splits

writes ``train_mix.json.gz``, ``new_wiki_eval.json.gz``, ``train_mix_v2.json.gz`` and
``new_wiki_eval_v2.json.gz`` (SQuAD layout) into the output folder. Deterministic for the same inputs.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from core.errors import InputError, add_debug_argument, run_cli
from finetune.squad_data import load_squad_file, make_unanswerable, write_squad_json

#: Questions sampled from each source file for the training mix, besides the new_wiki training articles.
TRAIN_MIX = {
    "squadshifts_nyt": 1500,
    "squadshifts_reddit": 500,
    "squadshifts_amazon": 500,
    "quoref": 300,
    "nq_counterfactual": 500,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("qa_dir", type=Path, help="folder with the squadshifts_*, quoref and nq_counterfactual files")
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--eval_pool", type=int, default=900, help="held-out new_wiki questions (whole articles)")
    parser.add_argument("--eval_questions", type=int, default=300)
    parser.add_argument("--train_new_wiki", type=int, default=2500, help="new_wiki questions in the training mix")
    add_debug_argument(parser)
    args = parser.parse_args(argv)

    def load(name: str) -> list[dict]:
        path = args.qa_dir / f"{name}.json.gz"
        if not path.is_file():
            raise InputError(f"{path}: not found; expected the SQuAD-format QA files of shared/data/qa")
        return load_squad_file(path, version_2_with_negative=False)[0].to_list()

    wiki = load("squadshifts_new_wiki")
    titles = sorted({row["title"] for row in wiki})
    random.Random(1).shuffle(titles)
    held, pool = set(), 0
    for title in titles:
        if pool >= args.eval_pool:
            break
        held.add(title)
        pool += sum(row["title"] == title for row in wiki)
    held_rows = [row for row in wiki if row["title"] in held]
    if len(held_rows) < args.eval_questions:
        raise InputError(f"--eval_questions {args.eval_questions}: only {len(held_rows)} held-out questions")
    evaluation = random.Random(2).sample(held_rows, args.eval_questions)

    rng = random.Random(0)
    train = rng.sample([row for row in wiki if row["title"] not in held], args.train_new_wiki)
    for name, count in TRAIN_MIX.items():
        train += rng.sample(load(name), count)
    rng.shuffle(train)
    assert not {r["context"] for r in train} & {r["context"] for r in evaluation}

    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    write_squad_json(train, out / "train_mix.json.gz", version="1.1")
    write_squad_json(evaluation, out / "new_wiki_eval.json.gz", version="1.1")
    write_squad_json(make_unanswerable(train, fraction=0.5, seed=0), out / "train_mix_v2.json.gz")
    write_squad_json(make_unanswerable(evaluation, fraction=0.5, seed=0), out / "new_wiki_eval_v2.json.gz")
    print(
        f"held-out articles: {', '.join(sorted(held))} ({len(held_rows)} questions); "
        f"evaluation {len(evaluation)}, training {len(train)} questions -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
