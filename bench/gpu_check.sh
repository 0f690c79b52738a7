#!/usr/bin/env bash
# The acceptance figures of issue 30 on one GPU, in one script (about 8 minutes on an H100; bench/README: Benchmarks):
#
#   0. first, python -m pytest -m gpu (the CUDA tests): a failing CUDA path stops the script before the benches.
#   1. bench/bench_gpu_mlm.py: the model's own step (SesameBert eager and compiled; bert-base S128 B256 bf16, the
#      recipe's 30% masking) -- the reference of the ratios;
#   2. pretrain on a prepared corpus at the same shape with the default recipe: document masking on, off, and on
#      with --torch_compile; tokens/s of the loop = the median of trainer_log.json's per-interval tokens_per_second
#      after the first interval (compilation and warm-up fall there; all_results.json's session average is printed
#      too), then the ratios loop / bench and on / off;
#
# Usage (from the repository root, environment active):
#   bash bench/gpu_check.sh DATA_DIR [OUT_DIR]        # DATA_DIR: *.txt.gz files (e.g. /work/shared/data/corpus)
#   bash bench/gpu_check.sh --smoke DATA_DIR [OUT]    # the same logic at bert-tiny S32 B8 on the CPU (minutes)
# Writes OUT_DIR/summary.json (default OUT_DIR: outputs/gpu_check) and prints it.
set -euo pipefail

SMOKE=0
if [[ "${1:-}" == "--smoke" ]]; then
    SMOKE=1
    shift
fi
DATA=${1:?usage: bash bench/gpu_check.sh [--smoke] DATA_DIR [OUT_DIR]}
OUT=${2:-outputs/gpu_check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false

if [[ $SMOKE == 1 ]]; then
    CONFIG=bert-tiny SEQ=32 BATCH=8 STEPS=12 LOGGING=3 VOCAB=2000 PRECISION=no TRAIN_CAP=400
    BENCH_ARGS=(--device cpu --config_name bert-tiny --seq_len 32 --batch_size 8 --vocab_size 2000 --steps 3
        --warmup 1 --mixed_precision no --peak_flops 1e12 --threads 1 --compile eager)
    FILES=$(ls "$DATA"/*.txt* | grep -v validation | head -1)
else
    CONFIG=bert-base SEQ=128 BATCH=256 STEPS=100 LOGGING=20 VOCAB=30000 PRECISION=bf16 TRAIN_CAP=40000
    BENCH_ARGS=(--config_name bert-base --seq_len 128 --batch_size 256 --vocab_size 30000 --steps 15 --warmup 5)
    FILES=$(ls "$DATA"/*.txt.gz | grep -v validation)
fi
VALID=$(ls "$DATA"/validation.txt* 2>/dev/null | head -1 || true)
VALID_ARGS=()
[[ -n "$VALID" ]] && VALID_ARGS=(--validation_file "$VALID")

step() { echo "== $(date +%T) $*"; }

if [[ $SMOKE == 0 ]]; then  # first: if the device's torch rejects a CUDA path, stop after seconds, not minutes
    step "pytest -m gpu"
    python -m pytest -q -m gpu -x 2>&1 | tail -n 15
fi

step "bench_gpu_mlm (SesameBert eager and compiled, mlm_probability 0.3)"
python bench/bench_gpu_mlm.py "${BENCH_ARGS[@]}" --mlm_probability 0.3 --output "$OUT/bench_gpu_mlm.json" | tail -n 8

step "prepare the corpus twice (with and without document boundaries; one tokenizer)"
for masking in true false; do
    prep="$OUT/prepared-$masking"
    if [[ ! -f "$prep/manifest.json" ]]; then
        tok_args=(--vocab_size "$VOCAB")
        [[ $masking == false ]] && tok_args=(--tokenizer_name "$OUT/prepared-true/tokenizer")
        # shellcheck disable=SC2086
        python -m pretrain.prepare --train_file $FILES "${VALID_ARGS[@]}" "${tok_args[@]}" --max_seq_length "$SEQ" \
            --document_masking "$masking" --preprocessing_num_workers "$(nproc)" --output_dir "$prep" | tail -n 2
    fi
done

run_pretrain() {  # name, document masking (true/false), extra flags...
    local name=$1 masking=$2
    shift 2
    rm -rf "${OUT:?}/run-$name"
    step "pretrain $name"
    python -m pretrain --prepared_dataset "$OUT/prepared-$masking" --config_name "$CONFIG" \
        --per_device_train_batch_size "$BATCH" --max_train_steps "$STEPS" --logging_steps "$LOGGING" \
        --max_train_samples "$TRAIN_CAP" --max_eval_samples 64 --mixed_precision "$PRECISION" \
        --checkpoints_total_limit 1 --output_dir "$OUT/run-$name" "$@" 2>&1 | grep -E "INFO|error" | tail -n 4
}
run_pretrain masking-on true
run_pretrain masking-off false
run_pretrain masking-on-compiled true --torch_compile true

step "summary"
python - "$OUT" <<'EOF'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
bench = json.loads((out / "bench_gpu_mlm.json").read_text())["tokens_per_s"]
eager, compiled = bench["sesame eager"], bench.get("sesame compiled")
runs = {}
for name in ("masking-on", "masking-off", "masking-on-compiled"):
    log = json.loads((out / f"run-{name}" / "trainer_log.json").read_text())
    rates = [r["tokens_per_second"] for r in log[1:] if "tokens_per_second" in r]
    results = json.loads((out / f"run-{name}" / "all_results.json").read_text())
    runs[name] = {"median_interval_tokens_per_s": statistics.median(rates) if rates else None,
                  "session_tokens_per_s": results["train_tokens_per_second"]}
on, off, comp = (runs[n]["median_interval_tokens_per_s"] for n in ("masking-on", "masking-off", "masking-on-compiled"))
summary = {
    "bench_tokens_per_s": bench,
    "runs": runs,
    "loop_over_eager_bench (target >= 0.9)": on / eager,
    "compiled_loop_over_compiled_bench (target >= 0.9)": comp / compiled if compiled else None,
    "masking_on_over_off (target >= 0.95)": on / off,
}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF

step "done"
