#!/usr/bin/env bash
# README command 2: set up both environments and run the whole suite on each
# TransformerLens line: 4.3 (TransformerBridge) and 3.9 (HookedTransformer and bridge).
#   bash scripts/test.sh [extra pytest options]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
status=0
for pair in ".venv:4.3.0" ".venv-tl39:3.9.0"; do
  venv=${pair%%:*}; tl=${pair##*:}
  bash scripts/env.sh "$venv" "$tl" || { echo "[homoglens] setup of $venv failed" >&2; exit 1; }
  echo "=== transformer-lens $tl ($venv) ==="
  if [ "$venv" = ".venv" ]; then
    "$venv/bin/ruff" check src tests benchmarks tutorials || status=1
    "$venv/bin/ruff" format --check src tests benchmarks tutorials || status=1
  fi
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --doctest-modules src/homoglens tests "$@"
  rc=$?
  [ $rc -eq 0 ] || status=$rc
done
exit $status
