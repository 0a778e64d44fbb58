#!/usr/bin/env bash
# README command 1: set up .venv and run the main job on the embedded defaults
# (SmolLM2-135M-Instruct on the Austen corpus, 64 windows x 256 tokens).
#   bash scripts/report.sh [extra `homoglens profile` options]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# The Jupyter kernel and widget progress bars (notebook) and plotly figures (plotly) come
# with it; no test/docs tools. HOMOGLENS_TORCH_INDEX=cpu: CPU torch (scripts/env.sh).
bash scripts/env.sh .venv "${HOMOGLENS_TL_VERSION:-4.3.0}" smollm2,notebook,plotly
exec .venv/bin/homoglens profile --model smollm2-135m-instruct --corpus austen \
  --n-seq 64 --seq-len 256 --out homoglens-report --overwrite "$@"
