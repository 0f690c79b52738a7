"""Time to quality: held-out MLM quality per second and per token, ours (``python -m pretrain`` recipes) against
transformers' ``BertForMaskedLM`` trained the ``run_mlm`` way, then what the pretraining buys on GLUE dev.

    python bench/bench_time_to_quality.py --train_file F [F ...] --validation_file F --glue_dir DIR \\
        --budget_minutes M [--budget_tokens N] [--model_shape bert-tiny] [--tasks sst2 mrpc stsb cola] [--seeds 3] \\
        [--baselines_results results.json] [--recipes NAME ...] [--recipe_flags NAME='--flag v ...'] --output_dir D \\
        [--preprocessing_num_workers N] [--mixed_precision no|bf16] [--plan_only]

The command only: the bench is the package ``bench/ttq`` beside it (what runs, the protocol and the outputs: its
docstring, ``bench/ttq/__init__.py``; the arguments and the phases in order: ``ttq.cli``). The reference child process
is this file again, ``bench_time_to_quality.py _reference ...`` (``ttq.reference``).
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/: the ttq package (sys.path[0] already when run as a script; not when this file is loaded by path)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ttq.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
