#!/usr/bin/env bash
# On a machine with a CUDA GPU: the `cuda` test suite (every public measurement in bfloat16 and
# float16) and the GPU benchmark (benchmarks/gpu.py), results into $OUT (default ./gpu-out).
# Offline machines: put the wheels of what the machine lacks in .whl/ first (docs/performance.md,
# "On a GPU"); they are installed into a temporary folder, homoglens runs from src/.
#   OUT=gpu-out bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
python=${PYTHON:-python3}
if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
  site=$(mktemp -d)
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
  export PYTHONPATH="$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
export HOMOGLENS_CACHE=${HOMOGLENS_CACHE:-$(mktemp -d)}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
start=$SECONDS
timeout "${BENCH_S:-330}" "$python" benchmarks/gpu.py --json "$out/gpu.json" \
  --deadline "${DEADLINE:-300}" ${BENCH_ARGS:-} > "$out/gpu.log" 2>&1
echo "benchmark rc $? in $((SECONDS - start)) s" >> "$out/gpu.log"
start=$SECONDS
timeout "${SUITE_S:-200}" "$python" -m pytest -q -p no:cacheprovider -m cuda --maxfail=10 \
  tests/cuda > "$out/cuda.txt" 2>&1
echo "suite rc $? in $((SECONDS - start)) s" >> "$out/cuda.txt"
tail -3 "$out/cuda.txt"; tail -2 "$out/gpu.log"
