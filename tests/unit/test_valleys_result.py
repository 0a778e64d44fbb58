"""compression_valleys: bad inputs refused with typed errors naming the fix; the result's
table, headline, repr, figure (both backends) and save/load."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import BACKENDS
from homoglens import CompressionValleys, InvalidInputError, compression_valleys

WINDOWS = torch.randint(5, 900, (5, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def model(get_model) -> Any:
    return get_model("llama", BACKENDS[-1])


@pytest.fixture(scope="module")
def result(model) -> CompressionValleys:
    return compression_valleys(
        model, WINDOWS, ablation_layer=1, dims=[0, 3], n_boot=100, progress=False
    )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"eps": 0.0}, "eps"),
        ({"eps": 1.0}, "eps"),
        ({"eps": 1.5}, "eps"),
        ({"eps": -0.1}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"eps": "0.3"}, "eps"),
        ({"ablation_layer": 1}, "give both"),
        ({"dims": [0]}, "give both"),
        ({"ablation_layer": 0, "dims": [0]}, "layer"),
        ({"ablation_layer": 0, "dims": []}, "ablation_layer"),
        ({"ablation_layer": 99, "dims": [0]}, "layer"),
        ({"ablation_layer": 1, "dims": [10_000]}, "dims"),
        ({"ablation_layer": 1, "dims": [0, 0]}, "dims"),
        ({"layers": [0, 0]}, "layers"),
        ({"layers": [99]}, "layers"),
        ({"batch_size": 0}, "batch_size"),
        ({"n_boot": 0}, "n_boot"),
        ({"ci": 1.0}, "ci"),
        ({"seed": -1}, "seed"),
        ({"ablate": "yes"}, "ablate"),
        ({"progress": 2}, "progress"),
    ],
)
def test_bad_options_are_refused(model, options: dict[str, Any], match: str) -> None:
    kwargs = {"ablate": False, "progress": False, **options}
    if "ablation_layer" in options or "dims" in options:
        kwargs.pop("ablate")
    with pytest.raises(InvalidInputError, match=match):
        compression_valleys(model, WINDOWS, **kwargs)


def test_one_token_windows_are_refused(model) -> None:
    with pytest.raises(InvalidInputError, match="fewer than 2 tokens"):
        compression_valleys(model, WINDOWS[:, :1], ablate=False, progress=False)


def test_no_massive_activation_found_names_the_fix(model) -> None:
    with pytest.raises(InvalidInputError, match="ablation_layer and dims"):
        compression_valleys(model, WINDOWS, progress=False)


def test_table_headline_repr_and_figures(result) -> None:
    table = result.to_pandas()
    assert list(table["layer"]) == list(result.layers)
    assert {"norm_ratio", "entropy", "sink_rate", "ablated_entropy"} <= set(table.columns)
    assert table["sink_rate"].isna().tolist() == [False, False, True]  # no block reads the last
    head = result.headline_table()
    assert list(head["statistic"]) == ["depth", "recovery"]
    assert "CompressionValleys(" in repr(result) and "valley_layer=" in repr(result)
    assert result.plot() is not None
    pytest.importorskip("plotly")
    assert len(result.plot(backend="plotly").data) == 6


def test_without_ablation_the_ablated_fields_are_none(model) -> None:
    cv = compression_valleys(model, WINDOWS, ablate=False, n_boot=100, progress=False)
    assert not cv.ablated and cv.ablation_layer == -1 and cv.ablation_sites == "none"
    assert bool(torch.isnan(cv.headline[1]).all())
    assert cv.plot() is not None


def test_save_and_load_round_trip(result, tmp_path: Path) -> None:
    loaded = CompressionValleys.load(result.save(tmp_path / "cv"))
    for f in dataclasses.fields(result):
        a, b = getattr(result, f.name), getattr(loaded, f.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, f.name


def test_inconsistent_fields_are_refused(result) -> None:
    with pytest.raises(ValueError, match="shape"):
        dataclasses.replace(result, entropy=result.entropy[:, :2])
    with pytest.raises(ValueError, match="all together"):
        dataclasses.replace(result, ablated_entropy=None)
