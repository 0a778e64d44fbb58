"""Unit tests of homoglens.core.types: each mode vocabulary is its ``Literal``'s values, once."""

from __future__ import annotations

from typing import get_args

import pytest

from homoglens.core import types


@pytest.mark.parametrize(
    ("values", "alias"),
    [
        (types.POSITION_ABLATIONS, types.PositionAblation),
        (types.RESIDUAL_SITES, types.ResidualSite),
        (types.PATCH_COMPONENTS, types.PatchComponent),
        (types.PATCH_METRICS, types.PatchMetric),
        (types.ATTRIBUTION_METRICS, types.AttributionMetric),
        (types.SPACES, types.SimilaritySpace),
    ],
)
def test_vocabularies_are_their_literals(values, alias) -> None:
    assert values == get_args(alias)
    assert len(set(values)) == len(values)


def test_centres_add_no_centring() -> None:
    assert types.CENTRES == (None, *get_args(types.Centring))


def test_every_public_module_re_exports_the_one_vocabulary() -> None:
    import homoglens
    from homoglens import sinks
    from homoglens.patching import measure as patching
    from homoglens.run import interventions
    from homoglens.similarity import measure as similarity

    assert homoglens.POSITION_ABLATIONS is types.POSITION_ABLATIONS
    assert interventions.POSITION_ABLATIONS is types.POSITION_ABLATIONS
    assert patching.PATCH_COMPONENTS is types.PATCH_COMPONENTS
    assert sinks.ATTRIBUTION_METRICS is types.ATTRIBUTION_METRICS
    assert similarity.SPACES is types.SPACES
