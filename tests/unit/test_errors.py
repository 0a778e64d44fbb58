"""``errors.warn_user``: a homoglens warning points at the user's line, however deep inside
homoglens the shared check that raises it is reached."""

from __future__ import annotations

import warnings

import torch

from homoglens import attention_bias_study, positional_similarity
from homoglens.core.errors import warn_user


def test_warn_user_skips_every_homoglens_frame(get_model) -> None:
    model = get_model("llama", "bridge")
    tokens = torch.randint(0, 1000, (6, 20), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attention_bias_study(
            model, tokens, kind="first", strengths=[-1, 0, 1], edge_k=2, gradient_windows=50,
            bos=True, block=4, progress=False,
        )  # fmt: skip
        positional_similarity(model, tokens, bos=True, edge_k=2, progress=False)
    ours = [w for w in caught if str(w.message).startswith("homoglens:")]
    said = {str(w.message).split(" ")[1] for w in ours}
    assert {"bos=True", "block=4", "gradient_windows=50"} <= said, said
    assert all(w.filename == __file__ for w in ours), [(w.filename, w.lineno) for w in ours]


def test_warn_user_from_outside_points_at_its_caller() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_user("homoglens: a test warning")
    assert caught[0].filename == __file__ and caught[0].category is UserWarning
