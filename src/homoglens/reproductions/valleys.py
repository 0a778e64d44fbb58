"""Compression valleys and attention sinks, layer by layer (Queipo-de-Llano et al. 2025).

One streamed pass reads, at every residual entry, the first token's norm, the median norm of
the other tokens and the matrix entropy of the raw token vectors
(:func:`~homoglens.profile.rank_metrics.raw_matrix_entropy`), and in every block Gu et al.'s sink
rate on key 0 (the sink reducer's attention jobs); a second pass does the same with the first
token's massive activations set to zero where they appear (Sun et al.'s ``set_zero`` at the
sites :func:`~homoglens.find_massive_sites` finds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.stats import estimate
from homoglens.core.types import BosPolicy, HookSpec, ModelInput
from homoglens.core.validate import (
    as_bool,
    as_float,
    as_int,
    check_key_eps,
    check_layers,
    positive_int,
    written_entry,
)
from homoglens.models.architectures import resid_hook_name
from homoglens.profile.rank_metrics import raw_matrix_entropy
from homoglens.reproductions.valleys_result import CompressionValleys, valley_entries
from homoglens.run.data import DataInput, TokenBatch, require_min_tokens
from homoglens.run.engine import Sums, provenance_of
from homoglens.run.entrance import Entrance, entrance
from homoglens.run.interventions import massive_activation_hooks
from homoglens.sinks.massive import given_or_found_sites
from homoglens.sinks.scores import sink_reducer

__all__ = ["compression_valleys"]

_READS = ("first_norm", "median_norm", "entropy")


def compression_valleys(
    model: ModelInput,
    data: DataInput,
    *,
    eps: float = 0.3,
    ablate: bool = True,
    ablation_layer: int | None = None,
    dims: Sequence[int] | int | None = None,
    layers: Sequence[int] | None = None,
    batch_size: int = 8,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> CompressionValleys:
    """The first token's norm spike, the compression valley and the attention sinks per layer,
    and the valley with the first token's massive activations ablated.

    Per window and residual entry l (0 = embeddings, l = output of block l - 1): the first
    token's norm ||x_0||, the median norm of the other real tokens (the lower median), their
    ratio, and the matrix entropy of the window's raw token vectors: the Shannon entropy of
    sigma_i^2 / sum sigma_j^2 over the singular values of the ``[T d_model]`` matrix (uncentred
    and without unit rows, so the first token's norm enters, as in the paper's Gram-matrix
    entropy; float64, from the smaller second moment:
    :func:`~homoglens.profile.rank_metrics.raw_matrix_entropy`), divided by log min(T, d_model) (the
    rank bound), in [0, 1]. Per block: the sink rate, the fraction of heads whose Gu et al.
    importance on key 0 (the mean attention of queries q >= 0 on key 0) exceeds ``eps``. With
    ``ablate``, a second pass sets the first token's massive dimensions to zero at the entry
    where they appear (``massive_activation_hooks(model, "zero", ...)``: found by Sun et al.'s
    rule with :func:`~homoglens.find_massive_sites` on ``data``, or given by ``ablation_layer``
    and ``dims``; ``dims=[]`` ablates nothing, the identity) and reads the same quantities.

    The headline numbers (block bootstrap over windows, :func:`homoglens.core.stats.estimate`): the
    valley entry v (lowest mean entropy among the middle entries 1..n_layers - 1 measured), the
    depth H[u] - H[v] (u: the highest mean entropy before v) and the recovery H_ablated[v] -
    H[v], the part of the valley the ablation removes.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: Windows, as for :func:`homogenization_profile` (each >= 2 tokens).
        eps: Gu et al.'s threshold on the importance, in (0, 1) (0.3 in their paper).
        ablate: Run the ablated pass.
        ablation_layer: Residual entry in [1, n_layers] whose first-token dims are zeroed
            (with ``dims``); default: found.
        dims: Residual dimensions zeroed at position 0 (with ``ablation_layer``).
        layers: Residual entries measured (default all ``n_layers + 1``).
        batch_size: Sequences per forward pass.
        n_boot: Bootstrap resamples of the intervals (>= 100 for a steady interval).
        ci: Interval coverage in (0, 1).
        seed: Bootstrap seed.
        attention_mask: For token input ``data``.
        bos: For text input.
        progress: Show progress bars.

    Returns:
        A :class:`CompressionValleys` (``to_pandas()``, ``plot()``, ``save()``).

    Raises:
        InvalidInputError: ``eps`` outside (0, 1); only one of ``ablation_layer`` / ``dims``;
            no massive activations found with ``ablate`` and no sites given (pass
            ``ablation_layer`` and ``dims``, or ``ablate=False``); bad layers, options or data.

    References:
        Queipo-de-Llano et al. 2025, "Attention Sinks and Compression Valleys in LLMs are Two
        Sides of the Same Coin", arXiv 2510.06477; Gu et al. 2024, arXiv 2410.10781 (sink
        rate); Sun et al. 2024, arXiv 2402.17762 (massive activations); Skean et al. 2025,
        arXiv 2502.02013 (matrix entropy).

    Examples:
        >>> from homoglens import compression_valleys, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> texts = ["Hello world, how are you", "Hi there, all is well"]
        >>> cv = compression_valleys(model, texts, ablation_layer=1, dims=[], progress=False)
        >>> tuple(cv.entropy.shape)
        (2, 3)
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    ablate = as_bool("ablate", ablate)
    _, eps = check_key_eps(0, eps, int(model.cfg.n_ctx))
    chosen = check_layers(layers, int(model.cfg.n_layers))
    n_boot = positive_int("n_boot", n_boot)
    ci = as_float("ci", ci, low=0.0, high=1.0)
    seed = as_int("seed", seed, low=0)
    if (ablation_layer is None) != (dims is None):
        raise InvalidInputError(
            f"ablation_layer={ablation_layer!r} and dims={dims!r}: give both, or neither to "
            "find them with Sun et al.'s rule (find_massive_sites)"
        )
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    require_min_tokens(batch, False)
    site = _site(call, batch, ablation_layer, dims, ablate)
    main = _valley_pass(call, batch, chosen, eps, [], "valleys")
    ablated = None
    if site is not None:
        hooks = (
            massive_activation_hooks(model, "zero", layer=site[0], dims=site[1], positions=0)
            if site[1]
            else []
        )
        ablated = _valley_pass(call, batch, chosen, eps, hooks, "ablated")
    headline = _headline(
        main["entropy"], ablated, chosen, int(model.cfg.n_layers), n_boot=n_boot, ci=ci, seed=seed
    )
    return CompressionValleys(
        layers=chosen,
        eps=eps,
        first_norm=main["first_norm"],
        median_norm=main["median_norm"],
        entropy=main["entropy"],
        sink_rate=main["sink_rate"],
        ablated_first_norm=None if ablated is None else ablated["first_norm"],
        ablated_median_norm=None if ablated is None else ablated["median_norm"],
        ablated_entropy=None if ablated is None else ablated["entropy"],
        ablated_sink_rate=None if ablated is None else ablated["sink_rate"],
        ablation_layer=-1 if site is None else site[0],
        ablation_dims=() if site is None else site[1],
        ablation_sites=_sites_note(site, ablation_layer),
        valley_layer=headline[0],
        peak_layer=headline[1],
        headline=headline[2],
        n_boot=n_boot,
        ci=ci,
        seed=seed,
        provenance=provenance_of(call.info, batch, chosen, False),
    )


def _sites_note(site: tuple[int, tuple[int, ...]] | None, given: int | None) -> str:
    """How the ablated sites came: ``"none"`` (no ablation), ``"given"`` or found."""
    if site is None:
        return "none"
    return "given" if given is not None else "found (find_massive_sites, Sun et al.'s rule)"


def _site(
    call: Entrance,
    batch: TokenBatch,
    layer: int | None,
    dims: Sequence[int] | int | None,
    ablate: bool,
) -> tuple[int, tuple[int, ...]] | None:
    """The ablated ``(entry, dims)`` at position 0: ``None`` without ablation; the given
    sites checked (``dims=[]``: an entry and no dims, the identity); else found on ``batch``
    by Sun et al.'s rule at position 0.

    Raises:
        InvalidInputError: bad sites; nothing found at position 0.
    """
    if not ablate:
        return None
    if layer is not None and isinstance(dims, Sequence) and not isinstance(dims, str):
        if len(dims) == 0:
            return written_entry("ablation_layer", layer, int(call.model.cfg.n_layers)), ()
    fix = "pass ablation_layer and dims to ablate chosen dimensions, or ablate=False"
    entry, chosen, positions, found = given_or_found_sites(
        call, batch, layer=layer, dims=dims, positions=None, fix=fix
    )
    if found and 0 not in positions:
        raise InvalidInputError(
            f"the massive activations found by Sun et al.'s rule sit at positions {positions}, "
            f"not on the first token (position 0); {fix}"
        )
    return entry, chosen


def _valley_pass(
    call: Entrance,
    batch: TokenBatch,
    chosen: tuple[int, ...],
    eps: float,
    hooks: list[HookSpec],
    desc: str,
) -> dict[str, torch.Tensor]:
    """One streamed pass with ``hooks`` attached: ``[batch layer]`` first-token norm,
    median-other norm and entropy at the entries ``chosen``, and ``[batch block]`` sink rate
    (float64, CPU, input order)."""
    reads = _residual_reducer(chosen)
    sinks, finish = sink_reducer(call.model, batch, 0, eps)
    call.stream(batch, [reads, sinks], desc=desc, extra_hooks=hooks)
    _, alpha = finish()  # [batch block head_index]
    out = {
        name: torch.stack([reads.row_values(f"{name}.{i}") for i in range(len(chosen))], 1)
        for name in _READS
    }
    out["sink_rate"] = (alpha > eps).to(torch.float64).mean(-1)
    return out


def _residual_reducer(chosen: tuple[int, ...]) -> Sums:
    """The reducer of the residual reads: per window and entry, rows ``first_norm.i``,
    ``median_norm.i`` and ``entropy.i`` (i: the index of the entry in ``chosen``)."""
    red = Sums(rows={f"{name}.{i}": () for name in _READS for i in range(len(chosen))})

    def make(i: int) -> Callable[[torch.Tensor, Any], None]:
        def hook(x: torch.Tensor, hook: Any) -> None:
            mask = red.batch["mask"][:, : x.shape[1]].to(torch.float64)
            x64 = x.detach().to(torch.float64)
            norms = x64.norm(dim=-1)  # [batch pos]
            others = norms[:, 1:].masked_fill(mask[:, 1:] == 0, math.nan)
            red.rows[f"first_norm.{i}"].append(norms[:, 0])
            red.rows[f"median_norm.{i}"].append(others.nanmedian(dim=1).values)
            red.rows[f"entropy.{i}"].append(raw_matrix_entropy(x64, mask))

        return hook

    red.add_hooks([(resid_hook_name(entry), make(i)) for i, entry in enumerate(chosen)])
    return red


def _headline(
    entropy: torch.Tensor,
    ablated: dict[str, torch.Tensor] | None,
    chosen: tuple[int, ...],
    n_layers: int,
    *,
    n_boot: int,
    ci: float,
    seed: int,
) -> tuple[int, int, torch.Tensor]:
    """The valley entry v, the peak entry u before it and ``[2 3]`` (depth H[u] - H[v],
    recovery H_ablated[v] - H[v]) x (value, low, high), over windows (NaN where undefined:
    no entry before v, no ablation, fewer than 4 windows)."""
    v, peak = valley_entries(entropy.mean(0), chosen, n_layers)
    u = v if peak is None else peak
    table = torch.full((2, 3), math.nan, dtype=torch.float64)
    rows: list[torch.Tensor | None] = [
        None if peak is None else entropy[:, u] - entropy[:, v],
        None if ablated is None else ablated["entropy"][:, v] - entropy[:, v],
    ]
    for r, values in enumerate(rows):
        if values is None:
            continue
        if len(values) < 2:
            table[r, 0] = float(values.mean())
            continue
        est = estimate([values[None]], n_boot=n_boot, ci=ci, seed=seed, sesoi=1e-3)
        table[r] = torch.tensor([est.value, est.ci_low, est.ci_high], dtype=torch.float64)
    return chosen[v], chosen[u], table
