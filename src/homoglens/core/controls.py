"""Negative and positive controls: activations from processes whose edge effects are known.

Each generator gives ``[batch pos d_model]`` float64 "residual vectors" of ``batch``
independent windows, to feed :meth:`homoglens.PositionalSimilarity.from_activations` and check
that a statistic reads 0 where nothing is planted and finds what is:

* ``"stationary"``: AR(1) over positions (rho 0.9) plus a +0.5 offset in every dimension
  (anisotropy): similarity falls with distance, no position is special. The naive edge excess
  reads about -0.035 (N 400, T 128, d 128), the matched excess and SP excess 0.
* ``"consecutive"``: consecutive windows cut from one long stationary series (the AR(1) of
  ``"stationary"`` plus a slow AR(1) component whose correlation spans about two windows):
  windows of one text, correlated with their neighbours; still no position is special, so
  every edge statistic's truth is 0 (the coverage simulation's block-correlated null).
* ``"positional_code"``: a stationary sinusoidal code of constant norm (the same at a
  position in every window) plus independent noise: SP is the same at every position.
* ``"random_walk"``: cumulative sums of independent steps from position 0, causal mixing
  with no positional preference: the matched excess reads first -0.30 / last +0.11.
* ``"uniform_causal"``: uniform causal attention over independent content (each position the
  mean of the content up to it, plus a little noise): again no positional preference, and
  again edge effects of either sign (first -0.21, last +0.06 at 96 x 64 x 32).
* ``"sink_causal"``: a causal mixer with a first-token sink set by the mask alone: every query
  puts a fixed share ``strength / (1 + strength)`` (default 0.5) of its attention on the first
  token's value and spreads the rest uniformly over its prefix; no position in any logit. A
  causal null: under the start-of-sequence contrast it reads SmolLM2's whole pattern (issue 51),
  against another draw of itself nothing.
* ``"first_key_bias"`` (positive control of a positional preference): causal attention whose
  logits add ``strength`` nats on the first ``edge_k`` keys (``biased_attention``'s ``"first"``
  kind), over independent content.
* ``"recency_bias"`` (positive control): causal attention whose logits add ``strength`` nats
  on the ``edge_k`` most recent keys (``"recent"``).
* ``"edge_common"`` (positive control of reading (b)): ``"stationary"`` windows whose first
  ``edge_k`` tokens get one common vector (the same in every window) of norm ``strength``
  times the typical token's: SP of the first edge rises.
* ``"last_pulled"`` (positive control of reading (a)): ``"stationary"`` windows whose last
  ``edge_k`` tokens are pulled toward their window's mean with weight ``strength``.

The random walk and uniform causal attention are the *causal nulls*: a decoder's causal mask
mixes a prefix whatever its positional encoding, so a claim about positional bias must be
judged against such a reference (docs/similarity.md, "Three readings").

References:
    Yusupov et al. 2025, arXiv 2508.17126 (the claims); Wu et al. 2025, arXiv 2502.01951 (the
    causal mask alone biases attention toward early positions); Barbero et al. 2024, arXiv
    2406.04267 (SP).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.validate import as_float, as_int

__all__ = ["CONTROLS", "PLANTS", "Control", "Plant", "control_activations", "planted"]

Control = Literal[
    "stationary",
    "consecutive",
    "positional_code",
    "random_walk",
    "uniform_causal",
    "sink_causal",
    "first_key_bias",
    "recency_bias",
    "edge_common",
    "last_pulled",
]
CONTROLS: tuple[str, ...] = get_args(Control)
"""The generators of :func:`control_activations`."""

Plant = Literal["first_key_bias", "recency_bias", "last_pulled", "edge_common"]
PLANTS: tuple[str, ...] = get_args(Plant)
"""The positional preferences :func:`planted` adds to any activations."""


def _strength(value: object) -> float:
    """A planted effect's size: a real number in [0, 1e6) (0: none planted)."""
    number = as_float("strength", value, low=-math.inf, high=1e6)
    if number < 0:
        raise InvalidInputError(f"strength={number} must be >= 0 (0: no effect planted)")
    return number


def _ar1(n: int, t: int, d: int, rho: float, gen: torch.Generator) -> torch.Tensor:
    """``[n t d]`` stationary AR(1) over positions with unit marginal variance."""
    noise = torch.randn(n, t, d, generator=gen, dtype=torch.float64, device="cpu")
    x = torch.empty_like(noise)
    x[:, 0] = noise[:, 0]
    scale = math.sqrt(1 - rho * rho)
    for i in range(1, t):
        x[:, i] = rho * x[:, i - 1] + scale * noise[:, i]
    return x


def _pattern(
    kind: str, t: int, k: int, strength: float
) -> Float[torch.Tensor, "query_pos key_pos"]:
    """The ``[query_pos key_pos]`` causal attention pattern of a generator: the sink mixer
    (``"sink_causal"``) or ``strength`` nats of logit bias on the first ``k`` keys / the ``k``
    most recent (``"first_key_bias"`` / ``"recency_bias"``; 0: uniform causal attention)."""
    here = {"dtype": torch.float64, "device": "cpu"}
    q = torch.arange(t, **here)[:, None]
    key = torch.arange(t, **here)[None, :]
    causal = key <= q
    if kind == "sink_causal":
        share = strength / (1 + strength)  # the sink's odds against the rest of the prefix
        pattern = (1 - share) * causal.to(torch.float64) / causal.sum(1, keepdim=True)
        pattern[:, 0] += share
        return pattern
    favoured = key < k if kind == "first_key_bias" else (key > q - k) & causal
    logits = torch.where(causal, strength * favoured.to(torch.float64), -math.inf)
    return torch.softmax(logits, dim=-1)


def _causal_attention(
    kind: str, n: int, t: int, d: int, k: int, strength: float, gen: torch.Generator
) -> Float[torch.Tensor, "batch pos d_model"]:
    """Independent content mixed by one ``[query_pos key_pos]`` causal attention pattern, plus
    a little noise (module docstring)."""
    here = {"dtype": torch.float64, "device": "cpu"}
    pattern = _pattern(kind, t, k, strength)
    content = torch.randn(n, t, d, generator=gen, **here)
    noise = torch.randn(n, t, d, generator=gen, **here)
    return pattern @ content + 0.05 * noise


def control_activations(
    kind: Control,
    n: int = 48,
    seq_len: int = 64,
    d_model: int = 32,
    *,
    edge_k: int = 8,
    strength: float = 1.0,
    seed: int = 0,
) -> Float[torch.Tensor, "batch pos d_model"]:
    """Activations of ``n`` windows (independent but for ``"consecutive"``) from a process with
    known edge effects.

    Args:
        kind: One of :data:`CONTROLS` (module docstring).
        n: Windows (>= 1).
        seq_len: Positions per window (>= 2).
        d_model: Dimensions (>= 1).
        edge_k: Positions per edge the positive controls act on.
        strength: Size of the planted effect (``"edge_common"``: norm of the common vector in
            units of a token's typical norm; ``"last_pulled"``: pull weight in [0, 1]; 0
            gives the stationary null), the sink's odds of ``"sink_causal"`` (its share is
            ``s / (1 + s)``), the logit bias of ``"first_key_bias"`` / ``"recency_bias"`` in
            nats (0: uniform causal attention).
        seed: Seed of the draws.

    Returns:
        ``[n seq_len d_model]`` float64 on the CPU.

    Raises:
        InvalidInputError: unknown ``kind`` or out-of-range sizes.
    """
    if kind not in CONTROLS:
        raise InvalidInputError(f"kind={kind!r} must be one of {list(CONTROLS)}")
    n, t = as_int("n", n, low=1), as_int("seq_len", seq_len, low=2)
    d, k = as_int("d_model", d_model, low=1), as_int("edge_k", edge_k, low=1, high=seq_len)
    strength = _strength(strength)
    gen = torch.Generator().manual_seed(as_int("seed", seed, low=0, high=2**63 - 1))
    if kind == "random_walk":
        steps = torch.randn(n, t, d, generator=gen, dtype=torch.float64, device="cpu")
        return steps.cumsum(1)
    if kind == "uniform_causal":
        content = torch.randn(n, t, d, generator=gen, dtype=torch.float64, device="cpu")
        counts = torch.arange(1, t + 1, dtype=torch.float64, device="cpu")[None, :, None]
        noise = torch.randn(n, t, d, generator=gen, dtype=torch.float64, device="cpu")
        return content.cumsum(1) / counts + 0.05 * noise
    if kind in ("sink_causal", "first_key_bias", "recency_bias"):
        return _causal_attention(kind, n, t, d, k, strength, gen)
    if kind == "positional_code":
        pos = torch.arange(t, dtype=torch.float64, device="cpu")[:, None]
        freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d))
        code = torch.zeros(t, d, dtype=torch.float64, device="cpu")
        code[:, 0::2] = torch.sin(pos * freq)
        code[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
        code = code / code.norm(dim=-1, keepdim=True) * math.sqrt(d)  # constant norm
        noise = torch.randn(n, t, d, generator=gen, dtype=torch.float64, device="cpu")
        return code[None] + noise
    if kind == "consecutive":
        fast = _ar1(1, n * t, d, 0.9, gen)[0]
        slow = _ar1(1, n * t, d, math.exp(-1.0 / (2 * t)), gen)[0]
        return (fast + slow + 0.5).reshape(n, t, d)
    x = _ar1(n, t, d, 0.9, gen) + 0.5
    if kind in ("edge_common", "last_pulled"):
        common = torch.randn(d, generator=gen, dtype=torch.float64, device="cpu")
        _move_edges(x, kind, strength, k, common)
    return x


def _move_edges(x: torch.Tensor, kind: str, strength: float, k: int, common: torch.Tensor) -> None:
    """Plant ``"last_pulled"`` or ``"edge_common"`` (direction ``common``) into ``x`` in place
    (module docstring)."""
    if kind == "last_pulled":
        if strength > 1:
            raise InvalidInputError(f"strength={strength} must lie in [0, 1] for last_pulled")
        mean = x.mean(1, keepdim=True)
        x[:, -k:] = (1 - strength) * x[:, -k:] + strength * mean
    else:
        typical = float(x.norm(dim=-1).mean())
        x[:, :k] += strength * typical * common / common.norm()


def planted(
    x: Float[torch.Tensor, "batch pos d_model"],
    kind: Plant,
    strength: float,
    *,
    edge_k: int = 8,
    seed: int = 0,
) -> Float[torch.Tensor, "batch pos d_model"]:
    """Activations ``x`` (of any generator, e.g. a causal null) with a positional preference
    planted on top; ``strength`` 0 plants none. The null suite's positive controls (issue 51):
    the same process with and without the preference is the model-matched null of the planted
    one.

    * ``"first_key_bias"`` / ``"recency_bias"``: one more causal attention step over ``x``
      whose logits add ``strength`` nats on the first ``edge_k`` keys / the ``edge_k`` most
      recent keys (``biased_attention``'s ``"first"`` / ``"recent"``); at 0 it is uniform causal
      attention (each position the mean of its prefix): mixing with no positional preference.
    * ``"last_pulled"``: the last ``edge_k`` tokens pulled toward their window's mean with
      weight ``strength`` in [0, 1] (a within-window pull at the last edge).
    * ``"edge_common"``: the first ``edge_k`` tokens moved by one common vector (the same in
      every window, drawn from ``seed``) of norm ``strength`` times the typical token's: edge
      tokens collapsing toward a shared direction.

    Args:
        x: ``[batch pos d_model]`` activations.
        kind: One of :data:`PLANTS`.
        strength: Size of the preference (nats, a pull weight, or a norm ratio), >= 0.
        edge_k: Positions the preference acts on.
        seed: Seed of ``"edge_common"``'s direction.

    Returns:
        A new ``[batch pos d_model]`` float64 tensor (``x`` is left as it was).

    Raises:
        InvalidInputError: unknown ``kind``, a bad shape, or out-of-range sizes.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (the edge claims the preferences stand for); Wu
        et al. 2025, arXiv 2502.01951 (causal attention's bias toward early keys); the null
        suite of issue 51 (docs/similarity.md, "The null suite").
    """
    if kind not in PLANTS:
        raise InvalidInputError(f"kind={kind!r} must be one of {list(PLANTS)}")
    if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.is_complex() or x.shape[1] < 2:
        raise InvalidInputError("x must be a real [batch pos d_model] tensor with pos >= 2")
    strength = _strength(strength)
    t = int(x.shape[1])
    k = as_int("edge_k", edge_k, low=1, high=t)
    x = x.detach().to(dtype=torch.float64, device="cpu").clone()
    if kind in ("first_key_bias", "recency_bias"):
        return _pattern(kind, t, k, strength) @ x
    gen = torch.Generator().manual_seed(as_int("seed", seed, low=0, high=2**63 - 1))
    _move_edges(x, kind, strength, k, torch.randn(int(x.shape[-1]), generator=gen,
                                                  dtype=torch.float64))  # fmt: skip
    return x
