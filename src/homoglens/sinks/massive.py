"""Massive activations (Sun et al. 2024, arXiv 2402.17762): per token, the largest
``|x_d|`` of the residual stream over a median ``|x|``, either the token's own (over its d_model
entries) or the layer's (over every token and dimension of the sequence, Sun et al.'s
definition); and the corpus means that :func:`~homoglens.ablated_massive_activations` sets them
to.

Sun et al.'s reference code (locuslab/massive-activations): ``main_llm.py --exp2`` reads the
output of every decoder layer (``monkey_patch/modify_llama.py``: ``layer.feat``), and per
sequence takes the three largest |x| over all tokens and dimensions and ``torch.median`` of |x|
over all of them; their figure plots the means over sequences. ``main_llm.py --exp3`` with
``lib/hook.py`` sets the massive dimensions of the first token (and of the delimiter token that
carries them) to 0 (``set_zero``) or to their mean over a reference corpus (``set_mean``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import (
    MASSIVE_MEDIANS,
    BosPolicy,
    HookedModel,
    HookFn,
    MassiveMedian,
    ModelInput,
)
from homoglens.core.validate import as_float, require_finite
from homoglens.models.architectures import resid_hook_name
from homoglens.models.loading import model_info
from homoglens.run.data import DataInput, TokenBatch
from homoglens.run.engine import Sums, model_device, provenance_of
from homoglens.run.entrance import Entrance, entrance
from homoglens.run.interventions import massive_activation_sites
from homoglens.sinks.massive_result import MassiveActivations
from homoglens.sinks.maths import massive_sums

SUN_THRESHOLD = 1000.0
"""Sun et al.'s ratio rule: about 1000 x the median magnitude of the hidden state."""

SUN_MIN_MAGNITUDE = 100.0
"""Sun et al.'s magnitude rule: |x| > 100."""

LAYER_TOP_K = 3
"""How many of a layer's largest |x| are kept (Sun et al.'s ``--exp2`` plots the top 3)."""


def massive_activations(
    model: ModelInput,
    data: DataInput,
    *,
    median: MassiveMedian = "token",
    threshold: float | None = None,
    min_magnitude: float | None = None,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
    text_column: str = "text",
) -> MassiveActivations:
    """Find massive activations: per layer and token, max_d |x| over a median |x|.

    Streamed over the residual axis of :func:`homogenization_profile` (0 = embeddings,
    l = output of block l - 1, i.e. of Sun et al.'s decoder layer l); pads never count.
    The ratio of token t at layer l is max_d |x_{t,d}| / m, where m is

    * ``median="token"`` (default): median_d |x_{t,d}|, the token's own median over its
      d_model entries;
    * ``median="layer"`` (Sun et al.'s definition): the median of |x| over every real token
      and dimension of the sequence at layer l (``torch.median``: the lower middle value).

    Whatever ``median``, the result also holds Sun et al.'s layer-wise statistics
    (``layer_top``, ``layer_median``, ``layer_ratio``: their ``main_llm.py --exp2``). A token
    counts in ``dim_counts`` when its largest entry passes the magnitude rule: ratio >
    ``threshold`` and |x| > ``min_magnitude`` (Sun et al.: > 1000 x the median and > 100).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile` (a Hugging Face dataset too). For
            activations you already have, see :meth:`MassiveActivations.from_cache`.
        median: ``"token"`` or ``"layer"`` (see above); recorded in the result.
        threshold: Ratio above which a token's largest entry counts in ``dim_counts`` (> 1;
            default 100 for ``"token"``, Sun et al.'s 1000 for ``"layer"``).
        min_magnitude: Smallest |x| that counts, in model units (>= 0; default 0 for
            ``"token"``, Sun et al.'s 100 for ``"layer"``).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show a progress bar.
        text_column: The column that holds the text, for a Hugging Face dataset.

    Returns:
        :class:`MassiveActivations`.

    Raises:
        InvalidInputError: unknown ``median``, ``threshold`` <= 1, ``min_magnitude`` < 0, or
            bad data.

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762.

    Examples:
        >>> from homoglens import load_model, massive_activations
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> acts = massive_activations(model, ["Hello world", "Hi"], median="layer", progress=False)
        >>> acts.median, tuple(acts.ratio_mean.shape), tuple(acts.layer_top.shape)
        ('layer', (3, 3), (3, 3))
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    if not isinstance(median, str) or median not in MASSIVE_MEDIANS:
        raise InvalidInputError(f"median={median!r} must be one of {list(MASSIVE_MEDIANS)}")
    sun = median == "layer"
    if threshold is None:
        threshold = SUN_THRESHOLD if sun else 100.0
    if min_magnitude is None:
        min_magnitude = SUN_MIN_MAGNITUDE if sun else 0.0
    threshold = as_float("threshold", threshold, low=1.0, high=float("inf"))
    min_magnitude = as_float("min_magnitude", min_magnitude, low=-float("inf"), high=float("inf"))
    if min_magnitude < 0:
        raise InvalidInputError(f"min_magnitude={min_magnitude} must be >= 0 (0: no rule)")
    batch = call.batch(data, attention_mask=attention_mask, bos=bos, text_column=text_column)
    red, finish = massive_reducer(
        model, batch, threshold, median=median, min_magnitude=min_magnitude
    )
    call.stream(
        batch,
        [red],
        desc="massive activations",
    )
    return finish()


def massive_reducer(
    model: HookedModel,
    batch: TokenBatch,
    threshold: float,
    *,
    median: MassiveMedian = "token",
    min_magnitude: float = 0.0,
) -> tuple[Sums, Callable[[], MassiveActivations]]:
    """The reducer of :func:`massive_activations` (checked arguments) and the function that
    finishes it once the batches are streamed; to share a pass with other reducers."""
    info = model_info(model)
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    layers = tuple(range(n_layers + 1))
    device = model_device(model)
    n_pos = int(batch.lengths.max())
    f64 = {"dtype": torch.float64, "device": device}
    red = Sums(
        sums={
            "ratio_sum": torch.zeros(len(layers), n_pos, **f64),
            "top_sum": torch.zeros(len(layers), n_pos, **f64),
            "dim_counts": torch.zeros(len(layers), d_model, **f64),
            "layer_top_sum": torch.zeros(len(layers), LAYER_TOP_K, **f64),
            "layer_median_sum": torch.zeros(len(layers), **f64),
            "count": torch.zeros(n_pos, **f64),
            "n_seq": torch.zeros(1, **f64),
        },
        maxima={"ratio_max": torch.full((len(layers), n_pos), float("-inf"), **f64)},
    )
    acc, ratio_max = red.sums, red.maxima["ratio_max"]

    def make_hook(i: int) -> HookFn:
        def hook(resid: torch.Tensor, hook: Any) -> None:
            part = massive_sums(
                resid,
                red.batch["mask"],
                threshold=threshold,
                median=median,
                min_magnitude=min_magnitude,
                top_k=LAYER_TOP_K,
                where=hook.name,
            )
            width = int(part["count"].shape[0])
            for name in ("ratio_sum", "top_sum"):
                acc[name][i, :width] += part[name]
            ratio_max[i, :width] = torch.maximum(ratio_max[i, :width], part["ratio_max"])
            acc["dim_counts"][i] += part["dim_counts"]
            acc["layer_top_sum"][i] += part["layer_top_sum"]
            acc["layer_median_sum"][i : i + 1] += part["layer_median_sum"]
            if i == 0:
                acc["count"][:width] += part["count"]
                acc["n_seq"] += part["n_seq"]

        return hook

    red.add_hooks([(resid_hook_name(layer), make_hook(i)) for i, layer in enumerate(layers)])
    return red, functools.partial(
        _finish_massive, red, info, batch, layers, threshold, median, min_magnitude
    )


def _finish_massive(
    red: Sums,
    info: Any,
    batch: TokenBatch,
    layers: tuple[int, ...],
    threshold: float,
    median: MassiveMedian,
    min_magnitude: float,
) -> MassiveActivations:
    return MassiveActivations.from_sums(
        layers,
        {**red.sums, **red.maxima},
        threshold=threshold,
        n_sequences=len(batch),
        median=median,
        min_magnitude=min_magnitude,
        provenance=provenance_of(info, batch, layers, False),
    )


def massive_activation_means(
    model: ModelInput,
    data: DataInput,
    *,
    layer: int,
    dims: Sequence[int] | int,
    positions: Sequence[int] | int = 0,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> Float[torch.Tensor, "position dim"]:
    """Mean of the chosen residual dimensions at the chosen positions over a reference corpus:
    the values :func:`~homoglens.ablated_massive_activations` sets with ``how="mean"`` (Sun et
    al.'s ``set_mean``).

    Reads the output of decoder layer ``layer`` (``blocks.{layer-1}.hook_resid_post``); a
    sequence counts at a position only where it has a real token there.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: The reference corpus, as for :func:`homogenization_profile`.
        layer: Residual entry in [1, n_layers]: the output of block ``layer - 1`` (Sun et
            al.'s 1-indexed decoder layer ``layer``).
        dims: Residual dimensions (one int or a list; in [0, d_model), distinct).
        positions: Positions (one int or a list; in [0, n_ctx), distinct); default 0.
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show a progress bar.

    Returns:
        ``[len(positions) len(dims)]`` float32 means in the model's units, rows and columns in
        sorted ``positions`` / ``dims`` order.

    Raises:
        InvalidInputError: bad ``layer`` / ``dims`` / ``positions``, bad data, or a position
            where no sequence holds a real token.

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762.

    Examples:
        >>> from homoglens import load_model, massive_activation_means
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> means = massive_activation_means(model, ["Hello world", "Hi there"], layer=1,
        ...                                  dims=[0, 3], progress=False)
        >>> tuple(means.shape)
        (1, 2)
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    layer, chosen_dims, chosen_pos = massive_activation_sites(
        model, layer=layer, dims=dims, positions=positions
    )
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    device = model_device(model)
    f64 = {"dtype": torch.float64, "device": device}
    red = Sums(
        sums={
            "total": torch.zeros(len(chosen_pos), len(chosen_dims), **f64),
            "count": torch.zeros(len(chosen_pos), **f64),
        }
    )
    pos_index = torch.tensor(chosen_pos, device=device)
    dim_index = torch.tensor(chosen_dims, device=device)

    def hook(resid: torch.Tensor, hook: Any) -> None:
        inside = pos_index < resid.shape[1]
        pos = pos_index[inside]
        real = red.batch["mask"].bool()[:, pos].to(torch.float64)  # [batch n_pos]
        x = resid.detach()[:, pos][:, :, dim_index].to(torch.float64)  # [batch n_pos n_dim]
        require_finite(x[real.bool()], hook.name)
        red.sums["total"][inside] += (x * real[..., None]).sum(0)
        red.sums["count"][inside] += real.sum(0)

    red.add_hooks([(resid_hook_name(layer), hook)])
    call.stream(
        batch,
        [red],
        desc="massive means",
    )
    count = red.sums["count"]
    empty = [p for p, c in zip(chosen_pos, count.tolist(), strict=True) if c == 0]
    if empty:
        raise InvalidInputError(
            f"positions {empty} hold no real token in any sequence of the data; choose positions "
            "below the sequences' length, or give longer sequences"
        )
    return (red.sums["total"] / count[:, None]).float().cpu()


def find_massive_sites(
    model: ModelInput,
    data: DataInput,
    *,
    threshold: float = SUN_THRESHOLD,
    min_magnitude: float = SUN_MIN_MAGNITUDE,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """Where a model's massive activations sit: the ``(layer, dims, positions)`` that
    :func:`~homoglens.ablated_massive_activations` takes, found with Sun et al.'s rule.

    An entry x[p, d] of the output of decoder layer l passes when ``|x[p, d]| > threshold * m``
    and ``|x[p, d]| > min_magnitude``, m the median |x| over every real token and dimension of
    its sequence at that layer (Sun et al.'s layer median). ``layer`` is the first decoder layer
    (1-indexed, as in the paper) where some position passes in every sequence that reaches it;
    ``positions`` are those positions (column indices of right-padded rows; typically 0, the
    first token); ``dims`` the dimensions that pass at one of them in every such sequence.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: Reference windows, as for :func:`homogenization_profile` (a few suffice).
        threshold: Ratio to the layer median (Sun et al.: about 1000).
        min_magnitude: Smallest |x| in model units (Sun et al.: 100).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show a progress bar.

    Returns:
        ``(layer, dims, positions)`` with sorted tuples, or ``None`` when no layer has an entry
        that passes in every sequence (a model without massive activations, by this rule).

    Raises:
        InvalidInputError: bad data, ``threshold`` <= 1 or ``min_magnitude`` < 0.

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762
        (section 2: "about 1,000 times larger than the median", magnitudes above 100).

    Examples:
        >>> from homoglens import find_massive_sites, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> find_massive_sites(model, ["Hello world", "Hi there"], progress=False) is None
        True
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    threshold = as_float("threshold", threshold, low=1.0, high=math.inf)
    min_magnitude = as_float("min_magnitude", min_magnitude, low=-math.inf, high=math.inf)
    if min_magnitude < 0:
        raise InvalidInputError(f"min_magnitude={min_magnitude} must be >= 0 (0: no rule)")
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    return massive_sites_on(call, batch, threshold, min_magnitude)


def massive_sites_on(
    call: Entrance, batch: TokenBatch, threshold: float, min_magnitude: float
) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """:func:`find_massive_sites` on ``batch`` with its arguments checked: the search itself,
    for a measurement that already holds its :class:`~homoglens.run.entrance.Entrance`."""
    model = call.model
    device = model_device(model)
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    n_pos = int(batch.lengths.max())
    red = Sums(
        sums={
            "passing": torch.zeros(n_layers, n_pos, d_model, dtype=torch.float64, device=device),
            "count": torch.zeros(n_pos, dtype=torch.float64, device=device),
        }
    )

    def make(layer: int) -> HookFn:
        def hook(resid: torch.Tensor, hook: Any) -> None:
            a = resid.detach().abs().float()
            real = red.batch["mask"].bool()[:, : a.shape[1]]
            require_finite(a[real], hook.name, "residual-stream entries")
            medians = torch.stack([a[b][real[b]].median() for b in range(a.shape[0])])
            rule = torch.clamp(threshold * medians, min=min_magnitude)[:, None, None]
            passing = (a > rule) & real[..., None]
            red.sums["passing"][layer - 1, : a.shape[1]] += passing.sum(0, dtype=torch.float64)
            if layer == 1:
                red.sums["count"][: a.shape[1]] += real.sum(0, dtype=torch.float64)

        return hook

    red.add_hooks([(resid_hook_name(layer), make(layer)) for layer in range(1, n_layers + 1)])
    call.stream(
        batch,
        [red],
        desc="massive sites",
    )
    count = red.sums["count"].cpu()
    everywhere = (red.sums["passing"].cpu() == count[None, :, None]) & (count[None, :, None] > 0)
    for layer in range(1, n_layers + 1):
        here = everywhere[layer - 1]  # [pos d_model]
        positions = torch.nonzero(here.any(-1)).flatten().tolist()
        if positions:
            dims = torch.nonzero(here[positions].any(0)).flatten().tolist()
            return layer, tuple(dims), tuple(positions)
    return None


def given_or_found_sites(
    call: Entrance,
    found_on: TokenBatch,
    *,
    layer: int | None,
    dims: Sequence[int] | int | None,
    positions: Sequence[int] | int | None,
    fix: str,
) -> tuple[int, tuple[int, ...], tuple[int, ...], bool]:
    """The massive-activation sites an intervention acts on: ``layer``, ``dims`` and
    ``positions`` (default 0) checked
    (:func:`~homoglens.run.interventions.massive_activation_sites`) when ``layer`` is given, else
    found on ``found_on`` by Sun et al.'s rule (:func:`find_massive_sites`; ``positions`` default:
    the found ones).

    Returns:
        ``(layer, dims, positions, found)``: the sorted sites and whether they were found.

    Raises:
        InvalidInputError: bad sites, or none found (the message ends with ``fix``).
    """
    found = layer is None
    if layer is None:
        sites = massive_sites_on(call, found_on, SUN_THRESHOLD, SUN_MIN_MAGNITUDE)
        if sites is None:
            raise InvalidInputError(
                "no massive activations found by Sun et al.'s rule (|x| > 1000 x the layer "
                f"median and > 100 at one position of every window); {fix}"
            )
        layer, dims, found_positions = sites
        positions = found_positions if positions is None else positions
    checked = massive_activation_sites(
        call.model, layer=layer, dims=dims, positions=0 if positions is None else positions
    )
    return (*checked, found)
