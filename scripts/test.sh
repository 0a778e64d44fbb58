#!/usr/bin/env bash
# README command 2 (what CI runs, .ci/run): set up both environments and run the tests.
#   - TransformerLens 4.3 (TransformerBridge), the default line: ruff (style, imports, Google
#     docstrings), pyright on src/ (pinned), every test and doctest, every tutorial notebook
#     (nbclient: each `.plot(` cell must show its figure; the executed notebooks go to
#     build/tutorials/), then `mkdocs build --strict`, which renders those executed notebooks
#     (they are executed once per run).
#   - TransformerLens 3.9 (HookedTransformer and its bridge): what differs between the lines
#     (`pytest --what-differs`: backends, hooks, positional ablations, oracles per family,
#     loading, doctests that load a model); tests/lines.py lists which tests run where and why.
# The suites run on every core (pytest-xdist, HOMOGLENS_TEST_WORKERS, default auto; one torch
# thread each, HOMOGLENS_TEST_THREADS); each phase prints its time, and a table of all of them
# closes the run. The layer contract is a test
# (tests/contracts/test_layers.py), and jaxtyping checks the shapes of every annotated homoglens
# function at run time under pytest.
#   bash scripts/test.sh [extra pytest options]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
status=0
workers=${HOMOGLENS_TEST_WORKERS:-auto}
# One torch thread per worker (and per notebook kernel): the workers already fill the cores, and
# two threads each on two cores oversubscribe them (torch's float64 eigenvalues slowed 30-fold on
# a busy machine, README "How long").
threads=${HOMOGLENS_TEST_THREADS:-1}
phases=()
start_all=$SECONDS

# timed LABEL COMMAND...: run COMMAND, print its time, remember it for the closing table; a
# failure sets the run's status and the rest goes on.
timed() {
  local label=$1 start=$SECONDS rc
  shift
  echo "=== $label ==="
  "$@"
  rc=$?
  phases+=("$(printf '%-44s %5d s  %s' "$label" $((SECONDS - start)) "$([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")")")
  echo "[homoglens] phase '$label': $((SECONDS - start)) s, exit $rc"
  [ $rc -eq 0 ] || status=$rc
  return $rc
}

# The interactive report is checked in a real headless browser (Playwright driving the system's
# Chromium, tests/cli/test_interactive_report.py; it skips without one). Best effort: as root
# with apt-get and no browser found, install Debian's chromium-headless-shell.
find_browser() {
  local browser=${HOMOGLENS_BROWSER:-} name
  for name in chromium-headless-shell chromium chromium-browser google-chrome google-chrome-stable; do
    [ -n "$browser" ] || browser=$(command -v "$name" || true)
  done
  if [ -z "$browser" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    timeout 300 sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y \
      -qq --no-install-recommends chromium-headless-shell' >/dev/null 2>&1 \
      || echo "[homoglens] could not install chromium-headless-shell: the browser check skips" >&2
  fi
  return 0
}

# The 3.9 environment is built in the background while the 4.3 line runs (pip waits on the
# network and the disk more than on the cores); its log is shown if it fails.
env39_log=$(mktemp)
build_env39() {
  bash scripts/env.sh .venv-tl39 3.9.0 >"$env39_log" 2>&1 &
  env39_pid=$!
}
wait_env39() {
  wait "$env39_pid" || { cat "$env39_log" >&2; echo "[homoglens] setup of .venv-tl39 failed" >&2; return 1; }
}

lint_and_types() {
  local rc=0
  .venv/bin/ruff check src tests benchmarks tutorials || rc=1
  .venv/bin/ruff format --check src tests benchmarks tutorials || rc=1
  .venv/bin/pyright --project pyproject.toml --pythonpath .venv/bin/python || rc=1
  return $rc
}

# Every model the suites load, built or converted once before the workers start (two workers
# would otherwise convert SmolLM2 side by side): the tiny model of each family and the embedded
# SmolLM2-135M-Instruct.
warm_models() {
  "$1/bin/python" - <<'EOF'
from homoglens.models.assets import embedded_model_folder
from homoglens.testing import TINY_ARCHS, tiny_model_folder

for arch in TINY_ARCHS:
    tiny_model_folder(arch)
print("[homoglens] models ready:", len(TINY_ARCHS), "tiny families and", embedded_model_folder().name)
EOF
}

suite() {  # suite VENV [pytest options]: the tests and doctests, on every core
  local venv=$1
  shift
  OMP_NUM_THREADS=$threads "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" \
    --dist worksteal \
    --durations=15 --doctest-modules src/homoglens tests "$@"
}

tutorials() {
  OMP_NUM_THREADS=$threads HOMOGLENS_RUN_TUTORIALS=1 .venv/bin/python -m pytest -q \
    -p no:cacheprovider -n "$workers" \
    --dist worksteal tests/docs/test_tutorials.py -k test_tutorial_runs_and_shows_its_figures
}

# After the tutorials: the site renders the notebooks that run executed (build/tutorials/,
# scripts/docs_hooks.py) instead of executing them again; each tutorial page must embed its
# figures.
docs_site() {
  local site rc=0 page
  site="$(mktemp -d)/site"
  NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet -d "$site" || rc=1
  for page in "$site"/tutorials/*/index.html; do
    grep -q "data:image/png" "$page" || { echo "[homoglens] $page shows no figure" >&2; rc=1; }
  done
  return $rc
}

timed "browser (headless Chromium)" find_browser
timed "environment .venv (transformer-lens 4.3.0)" bash scripts/env.sh .venv 4.3.0 \
  || { echo "[homoglens] setup of .venv failed" >&2; exit 1; }
build_env39
timed "ruff, ruff format, pyright (src/)" lint_and_types
timed "models (tiny families, SmolLM2)" warm_models .venv
timed "suite, transformer-lens 4.3: everything" suite .venv "$@"
timed "tutorials (nbclient, every .plot( cell)" tutorials
timed "docs (mkdocs build --strict)" docs_site
if timed "environment .venv-tl39 (transformer-lens 3.9.0)" wait_env39; then
  timed "suite, transformer-lens 3.9: what differs" suite .venv-tl39 --what-differs "$@"
fi

echo "=== phase times (total $((SECONDS - start_all)) s) ==="
printf '%s\n' "${phases[@]}"
exit $status
