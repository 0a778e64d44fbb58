"""One entrance for every call (issue 52): every public measurement starts with
``homoglens.run.entrance.entrance``, which wraps the model input and checks the shared options
once; no measurement wraps a model itself or re-derives which windows its rank holds. The source
rules are read with ``ast``; the entrance itself is checked on a tiny model."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from homoglens.core.distributed import shard_bounds
from homoglens.core.errors import InvalidInputError
from homoglens.run.entrance import Entrance, entrance

SRC = Path(__file__).resolve().parents[2] / "src" / "homoglens"

# The one place each is called: the model wrapped (the loader wraps what it loads), the shard.
ALLOWED = {
    "as_hooked": {"run/entrance.py", "models/loading.py", "models/objects.py"},
    "shard_bounds": {"run/engine.py", "core/distributed.py"},
}


def _calls(name: str) -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if called == name and where not in ALLOWED[name]:
                    found.append(f"{where}:{node.lineno}")
    return found


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_only_the_entrance_wraps_models_and_only_the_engine_shards(name: str) -> None:
    assert not _calls(name), f"{name}() called outside {sorted(ALLOWED[name])}: {_calls(name)}"


def test_the_entrance_wraps_once_and_checks_the_shared_options(
    get_model: Callable[[str, str], Any],
) -> None:
    hooked_gpt2 = get_model("gpt2", "bridge")
    call = entrance(hooked_gpt2, batch_size=3, progress=False)
    assert isinstance(call, Entrance)
    assert call.model is hooked_gpt2  # a TransformerLens model is used as it is
    assert (call.batch_size, call.progress) == (3, False)
    assert call.info is call.info  # the model's state is read once per call
    with pytest.raises(InvalidInputError, match="batch_size"):
        entrance(hooked_gpt2, batch_size=0)
    with pytest.raises(InvalidInputError, match="progress"):
        entrance(hooked_gpt2, progress="no")
    with pytest.raises(InvalidInputError):
        entrance("gpt2")  # a name is not a model: load_model() makes one


def test_the_entrance_builds_the_batch_and_knows_the_shard(
    get_model: Callable[[str, str], Any],
) -> None:
    hooked_gpt2 = get_model("gpt2", "bridge")
    call = entrance(hooked_gpt2, progress=False)
    batch = call.batch(torch.randint(0, 1000, (5, 12)))
    assert tuple(batch.tokens.shape) == (5, 12)
    assert call.shard(5) == shard_bounds(5, 1)[0] == (0, 5)  # no process group: every window
    assert call.bos_id == hooked_gpt2.tokenizer.bos_token_id
