#!/usr/bin/env bash
# README command 2: set up both environments and run the whole suite on each
# TransformerLens line: 4.3 (TransformerBridge) and 3.9 (HookedTransformer and bridge).
# On the default line (4.3) it also lints (ruff: style, imports, Google docstrings), type-checks
# src/ (pyright, pinned), executes every tutorial notebook (nbclient: each `.plot(` cell must show
# its figure; the executed notebooks go to build/tutorials/) and then builds the docs site with
# `mkdocs build --strict`, which renders those executed notebooks with their outputs. The layer contract is a test
# (tests/contracts/test_layers.py), and jaxtyping checks the shapes of every annotated homoglens
# function at run time under pytest.
#   bash scripts/test.sh [extra pytest options]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
status=0
# The interactive report is checked in a real headless browser (Playwright driving the system's
# Chromium, tests/cli/test_interactive_report.py; it skips without one). Best effort: as root
# with apt-get and no browser found, install Debian's chromium-headless-shell.
browser=${HOMOGLENS_BROWSER:-}
for name in chromium-headless-shell chromium chromium-browser google-chrome google-chrome-stable; do
  [ -n "$browser" ] || browser=$(command -v "$name" || true)
done
if [ -z "$browser" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  timeout 300 sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends chromium-headless-shell' >/dev/null 2>&1 \
    || echo "[homoglens] could not install chromium-headless-shell: the browser check skips" >&2
fi
for pair in ".venv:4.3.0" ".venv-tl39:3.9.0"; do
  venv=${pair%%:*}; tl=${pair##*:}
  bash scripts/env.sh "$venv" "$tl" || { echo "[homoglens] setup of $venv failed" >&2; exit 1; }
  echo "=== transformer-lens $tl ($venv) ==="
  if [ "$venv" = ".venv" ]; then
    "$venv/bin/ruff" check src tests benchmarks tutorials || status=1
    "$venv/bin/ruff" format --check src tests benchmarks tutorials || status=1
    echo "=== pyright (src/) ==="
    "$venv/bin/pyright" --project pyproject.toml --pythonpath "$venv/bin/python" || status=1
  fi
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --doctest-modules src/homoglens tests "$@"
  rc=$?
  [ $rc -eq 0 ] || status=$rc
  if [ "$venv" = ".venv" ]; then
    echo "=== tutorials (nbclient: every .plot( cell shows its figure) and docs (mkdocs --strict) ==="
    start=$SECONDS
    HOMOGLENS_RUN_TUTORIALS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
      tests/docs/test_tutorials.py -k test_tutorial_runs_and_shows_its_figures || status=1
    echo "[homoglens] tutorials ran in $((SECONDS - start)) s"
    # After the tutorials: the site renders the notebooks that run executed (build/tutorials/,
    # scripts/docs_hooks.py) instead of executing them again; each tutorial page must embed its
    # figures.
    site="$(mktemp -d)/site"
    NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --quiet -d "$site" || status=1
    for page in "$site"/tutorials/*/index.html; do
      grep -q "data:image/png" "$page" \
        || { echo "[homoglens] $page shows no figure" >&2; status=1; }
    done
  fi
done
exit $status
