#!/usr/bin/env bash
# The GPU check of issue 40 (--modern: issue 50's) in one 10-minute slot: see bench/gpu_check.py (phases, timeouts,
# OUT/summary.json).
#   bash bench/gpu_check.sh [--modern] --plan | [--modern] [--smoke] DATA [OUT]
exec "${PYTHON:-python}" "$(dirname "$0")/gpu_check.py" "$@"
