"""Hub names with revision= / checkpoint_index= / checkpoint_value=, offline: a fake Hugging
Face cache holds two revisions of "EleutherAI/pythia-14m" (tiny random GPT-NeoX weights of two
seeds); the loaded weights show which revision TransformerLens read, and provenance records it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import BACKENDS
from homoglens import InvalidInputError, load_model
from homoglens.testing import tiny_model_folder

REPO = "EleutherAI/pythia-14m"


def _fake_hub(root: Path) -> Path:
    """A Hugging Face hub cache with revisions main (seed 0) and step1000 (seed 1)."""
    repo = root / ("models--" + REPO.replace("/", "--"))
    for revision, seed in (("main", 0), ("step1000", 1)):
        commit = f"{seed + 1:040x}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / revision).write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for file in tiny_model_folder("neox", seed=seed).iterdir():
            (snapshot / file.name).write_bytes(file.read_bytes())
    return root


_SCRIPT = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from homoglens import homogenization_profile, load_model
out = {}
for key, kwargs in [("main", {}), ("revision", {"revision": "step1000"}),
                    ("value", {"checkpoint_value": 1000})]:
    try:
        model = load_model(sys.argv[1], backend=sys.argv[2], **kwargs)
    except Exception as err:
        out[key] = {"error": f"{type(err).__name__}: {err}"[:400]}
        continue
    prof = homogenization_profile(model, "It is a truth universally acknowledged", progress=False)
    out[key] = {"w": float(model.W_E[0, 0]), "source": prof.provenance.model_source}
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_revisions_and_checkpoints_load_offline(tmp_path: Path, backend: str) -> None:
    cache = _fake_hub(tmp_path / "hub")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env["TRANSFORMERS_OFFLINE"] = "1"
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT, REPO, backend],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert "error" not in out["main"], out["main"]
    assert "error" not in out["revision"], out["revision"]
    assert out["revision"]["w"] != out["main"]["w"], "step1000 holds other weights than main"
    assert out["revision"]["source"] == "revision step1000"
    assert "error" not in out["value"], out["value"]
    assert out["value"]["w"] == out["revision"]["w"]
    assert out["value"]["source"] == "checkpoint_value 1000"


def test_versions_are_validated_before_anything_loads() -> None:
    folder = tiny_model_folder("neox")
    with pytest.raises(InvalidInputError, match="local folder"):
        load_model(folder, revision="step1000", backend=BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="one of revision="):
        load_model(REPO, revision="main", checkpoint_index=3)
    with pytest.raises(InvalidInputError, match="revision="):
        load_model(REPO, revision="  ")
    assert json.loads((folder / "config.json").read_text())["architectures"]


def test_a_checkpoint_of_a_model_without_checkpoints_is_a_bad_argument(tmp_path: Path) -> None:
    cache = _fake_hub(tmp_path / "hub")
    script = (
        "import sys\nfrom homoglens import InvalidInputError, load_model\n"
        "try:\n    load_model('gpt2', backend='bridge', checkpoint_index=0)\n"
        "except InvalidInputError as err:\n    print('typed', err)\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert "typed" in run.stdout and "checkpoint" in run.stdout, run.stdout + run.stderr[-1500:]
