"""Compare models that differ in their positional scheme on the same windows (claims C1-C3).

Every model reads the same token windows (they must share a tokenizer), so every statistic is
paired by window: across models (e.g. no positions minus learned) and across positional
ablations of one model (e.g. zeroed minus intact). Intervals come from a moving-block bootstrap
over windows (consecutive windows of one novel are correlated); with several training seeds per
variant (``group_by="variant"``) from a hierarchical bootstrap over seeds, then windows
(:mod:`homoglens.core.stats`). :meth:`ModelComparison.claims` turns the readings of claims C1-C3
into pre-declared, Holm-adjusted tests with a smallest effect size of interest
(:mod:`homoglens.core.claims`).

Per-window statistics (:data:`STATISTICS`; ``[batch]``, or ``[batch layer]`` over the layer axis):

* ``loss``: mean next-token cross-entropy (nats/token);
* ``icl``: in-context-learning score, loss of the last eighth of the window minus the second
  eighth (nats; models measured here; the induction loss, on repeated random tokens rather than
  on the windows, is in :meth:`ModelComparison.context_table`);
* ``mean_pairwise`` ``[batch layer]``: mean pairwise cosine of the window (raw);
* ``adjusted_last``: ``mean_pairwise`` at the last layer minus that layer's anisotropy baseline;
* ``homogenization`` ``[batch layer]``: mean off-diagonal ``W = M - C`` (centred: what a window's
  tokens share beyond what every window shares at those positions);
* ``matched_first`` / ``matched_last`` ``[batch layer]``: the distance-matched edge excess;
* ``naive_first`` / ``naive_last`` ``[batch layer]``: the naive edge excess (biased by distance);
* ``sp_first`` / ``sp_last`` ``[batch layer]``: same-position cross-input similarity of an edge
  minus the middle's; ``sp_mean`` ``[batch layer]``: SP averaged over positions (intact model
  only, always measured on uncentred vectors: centred by position SP is -1/(n-1) everywhere
  by construction, so ``centre`` applies to the other statistics only);
* ``sink_rate``: percentage of (layer, head) whose Gu et al. importance on key 0 exceeds eps
  (intact model only); ``sink_importance_top``: importance of the strongest key-0 head.

The ``C``-dependent statistics are jackknife pseudo-values (a second pass of
:func:`~homoglens.similarity.measure.positional_similarity`), whose mean over windows is the corpus
statistic exactly.

References:
    Yusupov et al. 2025, "Token Homogenization under Positional Bias", arXiv 2508.17126 (claims
    C1-C3; only the abstract is available, the metrics are homoglens' own).
    Ethayarajh 2019 (anisotropy). Gu et al. 2024, arXiv 2410.10781 (sinks).
    Kazemnejad et al. 2023, arXiv 2305.19466 (models without positional encodings still infer
    position from the causal mask).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from importlib.resources import files
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

import torch

from homoglens.ablation.measure import position_ablation_study
from homoglens.ablation.result import PositionAblationStudy
from homoglens.comparison.result import LAYER_STATISTICS, STATISTICS, ModelComparison
from homoglens.core.errors import InvalidInputError
from homoglens.core.stats import as_block
from homoglens.core.types import (
    Backend,
    Centring,
    GroupBy,
    HookedModel,
    ModelInput,
    PositionAblation,
)
from homoglens.core.validate import as_bool, as_float, as_int, check_key_eps, check_model
from homoglens.models.assets import SHIPPED_MODELS, shipped_model_folder
from homoglens.models.loading import load_model, model_info, model_lock
from homoglens.results.storage import read_saved
from homoglens.run.data import TokenBatch, corpus_windows, to_token_batch
from homoglens.run.entrance import entrance
from homoglens.run.interventions import ablated_positions
from homoglens.similarity.measure import positional_similarity
from homoglens.similarity.result import CROSS_INPUT_STATISTICS, PositionalSimilarity
from homoglens.sinks import sink_pass
from homoglens.sinks.result import SinkScores

if TYPE_CHECKING:
    pass


# The options of :func:`homoglens.comparison.measure.compare_models`: the models given, the
# numeric settings, and how labels group into variants (``group_by``) and which one has no
# positions (``no_positions``).

__all__ = ["ComparisonNumbers", "check_numbers", "named_models", "resolve_grouping"]


def named_models(
    models: Any, no_positions: Any, group_by: Any, centre: Any
) -> dict[str, HookedModel | str]:
    """``{label: model or name}`` of :func:`compare_models`' ``models`` (every model given as
    an object checked), after which ``no_positions``, ``group_by`` and ``centre`` are checked.

    Raises:
        InvalidInputError: not a list or mapping, empty or repeated names, a bad model or a bad
            ``no_positions`` / ``group_by`` / ``centre``.
    """
    if isinstance(models, str) or not isinstance(models, Mapping | Sequence):
        raise InvalidInputError(
            "models must be a list of names or a {label: model} mapping, "
            f"not {type(models).__name__}"
        )
    named = dict(models) if isinstance(models, Mapping) else {str(m): m for m in models}
    if not named or (not isinstance(models, Mapping) and len(named) != len(models)):
        raise InvalidInputError(f"models {list(models)} must be non-empty and unique")
    for m in named.values():
        if not isinstance(m, str | os.PathLike):
            check_model(m)
    if no_positions not in (None, "auto") and not isinstance(no_positions, str):
        raise InvalidInputError(f"no_positions={no_positions!r} must be a model label or None")
    if group_by not in (None, "auto", "variant"):
        raise InvalidInputError(f"group_by={group_by!r} must be None, 'auto' or 'variant'")
    if centre not in (None, "global", "position"):
        raise InvalidInputError(f"centre={centre!r} must be None, 'global' or 'position'")
    return named


class ComparisonNumbers(NamedTuple):
    """The checked numeric options of :func:`compare_models`."""

    n_seq: int | None
    seq_len: int | None
    edge_k: int
    batch_size: int
    n_boot: int
    block: int | Literal["auto"]
    ci: float
    sesoi: float | None
    loss_sesoi: float
    seed: int


def check_numbers(
    *,
    n_seq: Any,
    seq_len: Any,
    edge_k: Any,
    batch_size: Any,
    n_boot: Any,
    block: Any,
    ci: Any,
    sesoi: Any,
    loss_sesoi: Any,
    seed: Any,
) -> ComparisonNumbers:
    """Check the numeric options of :func:`compare_models`, in this order: ``n_seq``,
    ``edge_k``, ``seq_len`` (at least ``2 * edge_k + 2``), ``batch_size``, ``n_boot``,
    ``block``, ``ci``, ``sesoi``, ``loss_sesoi`` and ``seed``."""
    n_seq = None if n_seq is None else as_int("n_seq", n_seq, low=1)
    edge_k = as_int("edge_k", edge_k, low=1)
    seq_len = None if seq_len is None else as_int("seq_len", seq_len, low=2 * edge_k + 2)
    batch_size = as_int("batch_size", batch_size, low=1)
    n_boot = as_int("n_boot", n_boot, low=1)
    block = as_block(block)
    ci = as_float("ci", ci, low=0.0, high=1.0)
    sesoi = None if sesoi is None else as_float("sesoi", sesoi, low=0.0, high=1e9)
    loss_sesoi = as_float("loss_sesoi", loss_sesoi, low=0.0, high=1e9)
    seed = as_int("seed", seed, low=0, high=2**63 - 1)
    return ComparisonNumbers(
        n_seq, seq_len, edge_k, batch_size, n_boot, block, ci, sesoi, loss_sesoi, seed
    )


def _variant(label: str, record: Mapping[str, Any]) -> str:
    """A label's variant: the one ``training.json`` records (``-bos`` when trained with a
    BOS), else the label itself."""
    if not record.get("variant"):
        return label
    return str(record["variant"]) + ("-bos" if record.get("bos") else "")


def resolve_grouping(
    order: list[str],
    heldout: dict[str, Any],
    group_by: GroupBy | None | Literal["auto"],
    no_positions: str | None,
) -> tuple[dict[str, str], GroupBy | None, str | None]:
    """Each label's variant, ``group_by`` resolved (``"auto"``: ``"variant"`` when a variant
    has several labels) and ``no_positions`` resolved (``"auto"``: the one variant-``none``
    label or variant) or checked.

    Raises:
        InvalidInputError: ``no_positions`` names no label (or variant).
    """
    variants = {label: _variant(label, heldout.get(label, {})) for label in order}
    if group_by == "auto":
        counts: dict[str, int] = {}
        for v in variants.values():
            counts[v] = counts.get(v, 0) + 1
        group_by = "variant" if any(c > 1 for c in counts.values()) else None
    if no_positions == "auto":
        nope = [label for label in order if heldout.get(label, {}).get("variant") == "none"]
        if group_by == "variant":
            names = {variants[label] for label in nope}
            no_positions = names.pop() if len(names) == 1 else None
        else:
            no_positions = nope[0] if len(nope) == 1 else None
    elif no_positions is not None:
        allowed = set(variants.values()) if group_by == "variant" else set(order)
        if no_positions not in allowed:
            raise InvalidInputError(
                f"no_positions={no_positions!r} is not a model"
                + (" variant" if group_by == "variant" else " label")
                + f"; choose from {sorted(allowed)}"
            )
    return variants, group_by, no_positions


__all__ = ["REPLICATED_MODELS", "STATISTICS", "ModelComparison", "compare_models"]


REPLICATED_MODELS: tuple[str, ...] = tuple(
    f"homoglens/tiny-{variant}{suffix}"
    for variant in ("learned", "rotary", "none")
    for suffix in ("", "-s1", "-s2")
)
"""The controlled models over three training seeds each. Seed 0 ships with its weights; seeds 1
and 2 ship their per-window statistics on the held-out novel (``homoglens train --variant V
--seed S`` reproduces their weights bit for bit)."""

_REPLICATES = Path(str(files("homoglens") / "assets" / "replicates"))


def _training_record(name: str) -> dict[str, Any]:
    """What ``training.json`` beside a shipped or local model records (empty if none)."""
    folder = shipped_model_folder(name) if name in SHIPPED_MODELS else Path(name)
    path = folder / "training.json"
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    keep = ("heldout_loss", "heldout_unigram_entropy", "heldout", "heldout_tokens")
    out = {k: record[k] for k in keep if k in record}
    config = record.get("config", {})
    out.update(variant=config.get("variant"), seed=config.get("seed"), bos=config.get("bos", False))
    return out


def _window_statistics(
    study: PositionAblationStudy,
    similarity: Mapping[str, PositionalSimilarity],
    importance: torch.Tensor,
    eps: float,
    cross: PositionalSimilarity,
) -> dict[str, dict[str, torch.Tensor]]:
    """Every per-window statistic of one model, per mode; the cross-input readings
    (``sp_*``) of the intact model from ``cross``, measured on uncentred vectors."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for m, mode in enumerate(study.modes):
        sim = similarity[mode]
        pairwise = study.mean_pairwise[m].double()
        stats = {
            "loss": study.loss[m].double(),
            **({} if study.icl is None else {"icl": study.icl[m].double()}),
            "adjusted_last": pairwise[:, -1] - study.profiles[mode].baseline.double()[-1],
            "mean_pairwise": pairwise,
        }
        for stat in LAYER_STATISTICS[1:]:
            if stat not in CROSS_INPUT_STATISTICS:
                stats[stat] = sim.per_window(stat)
        if mode == "none":
            for stat in CROSS_INPUT_STATISTICS:
                stats[stat] = cross.per_window(stat)
            alpha = importance.double()
            stats["sink_rate"] = (alpha > eps).double().mean((1, 2)) * 100
            flat = alpha.flatten(1)
            stats["sink_importance_top"] = flat[:, int(flat.mean(0).argmax())]
        out[mode] = stats
    return out


def _shipped_statistics(
    name: str,
    *,
    modes: Sequence[str],
    edge_k: int,
    seed: int,
    window_index: list[int] | None,
    bos: bool,
    centre: str | None,
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """The shipped per-window statistics of a replicate whose weights are not shipped, for the
    held-out windows ``window_index`` of the default comparison.

    Raises:
        InvalidInputError: the comparison's settings differ from the ones the statistics were
            computed with (then train the model and pass its folder).
    """
    stem = name.split("/")[-1]
    meta, tensors = read_saved(_REPLICATES, stem)  # checks the sha256 the JSON records
    variant, s = stem.removeprefix("tiny-").rsplit("-s", 1)
    fix = (
        f"`homoglens train --variant {variant} --seed {s} --out models` reproduces its weights "
        f"bit for bit; then pass models/{stem}"
    )
    have = {key.split("/")[0] for key in tensors}
    problems = []
    if bos:
        problems.append("BOS windows")
    if meta["edge_k"] != edge_k:
        problems.append(f"edge_k={edge_k} (shipped: {meta['edge_k']})")
    if meta.get("centre") != centre:
        problems.append(f"centre={centre!r} (shipped: {meta.get('centre')!r})")
    if meta["seed"] != seed and "permute" in modes:
        problems.append(f"seed={seed} for 'permute' (shipped: {meta['seed']})")
    if not set(modes) <= have:
        problems.append(f"modes {sorted(set(modes) - have)} (shipped: {sorted(have)})")
    if window_index is None or max(window_index) >= meta["n_windows"]:
        problems.append("other windows than the held-out novel's 128-token windows")
    if problems:
        raise InvalidInputError(
            f"{name} ships only its per-window statistics for the default comparison; this one "
            f"asks for {', '.join(problems)}. {fix}"
        )
    idx = torch.tensor(window_index, device="cpu")
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, values in tensors.items():
        mode, stat = key.split("/")
        # SP readings shipped from centred vectors are 0 by construction: left out (the
        # cross-input rows then rest on the models measured here; scripts/replicates.py
        # rebuilds them uncentred)
        centred_sp = stat in CROSS_INPUT_STATISTICS and not meta.get("sp_uncentred", False)
        if mode in modes and not centred_sp:
            out.setdefault(mode, {})[stat] = values.double()[idx]
    return out, meta


def _is_statistics_only(name: Any) -> bool:
    if not isinstance(name, str) or name not in REPLICATED_MODELS or name in SHIPPED_MODELS:
        return False
    return (_REPLICATES / f"{name.split('/')[-1]}.json").is_file()


def compare_models(
    models: Mapping[str, ModelInput | str] | Sequence[str] = REPLICATED_MODELS,
    data: TokenBatch | str | os.PathLike[str] | None = None,
    *,
    n_seq: int | None = None,
    seq_len: int | None = None,
    modes: Sequence[str] = ("none", "zero", "permute"),
    no_positions: str | None = "auto",
    group_by: GroupBy | None | Literal["auto"] = "auto",
    centre: Centring | None = "position",
    backend: Backend = "auto",
    edge_k: int = 8,
    eps: float = 0.3,
    batch_size: int = 16,
    n_boot: int = 1000,
    ci: float = 0.95,
    block: int | Literal["auto"] = "auto",
    sesoi: float | None = None,
    loss_sesoi: float = 0.01,
    seed: int = 0,
    progress: bool = True,
) -> ModelComparison:
    """Measure several models side by side on the same windows, paired by window.

    For each model: a :func:`~homoglens.ablation.measure.position_ablation_study` (loss and raw
    homogenization per layer, intact and under each ablation in ``modes``), a
    :func:`~homoglens.similarity.measure.positional_similarity` per mode (centred homogenization,
    the matched and the naive edge excess, ``SP``; with pseudo-values) and attention-sink scores on
    key 0. Models named in :data:`REPLICATED_MODELS` whose weights are not shipped contribute
    their shipped per-window statistics instead (default data only). :meth:`ModelComparison.
    claims` then tests the readings of claims C1-C3.

    Args:
        models: Model names (``load_model`` names or folders; label = name) or ``{label: model
            or name}``. Default: :data:`REPLICATED_MODELS`, the three positional schemes over
            three training seeds each.
        data: ``None`` (default): the novel held out from the tiny models' training, tokenized
            as in training (:func:`homoglens.training.train.heldout_windows`; windows start with
            ``<|endoftext|>`` when the models were trained so); a corpus name or text file,
            cut into ``n_seq`` windows of ``seq_len`` tokens (no BOS); or a
            :class:`TokenBatch` of equal-length windows.
        n_seq: Windows (default: all 1365 windows of 128 tokens; 64 for a corpus).
        seq_len: Tokens per window (default: the smallest ``n_ctx`` of the models).
        modes: Positional ablations (``"none"`` is always run); each must suit every model.
        no_positions: The model trained without positions (``"auto"``: the one whose
            ``training.json`` says variant ``none``; ``None``: no such model).
        group_by: ``"variant"``: labels of one variant (``training.json``) are seeds of one
            model, and seeds are the unit of replication; ``None``: every label is a model;
            ``"auto"``: ``"variant"`` when some variant has several labels.
        centre: Centring of the positional-similarity statistics (``"position"``: subtract
            each position's corpus mean first, which removes what every window shares at a
            position, e.g. learned positional rows or a BOS direction, whose dilution of the
            cosines would otherwise bias the edge statistics; ``None``: none).
        backend: For models given by name.
        edge_k: Positions per edge (windows need ``2 * edge_k + 2`` counted positions).
        eps: Sink importance threshold (Gu et al.: 0.3).
        batch_size: Windows per forward pass.
        n_boot: Bootstrap resamples.
        ci: Interval coverage in (0, 1).
        block: Consecutive windows per bootstrap block: ``"auto"`` (from the windows'
            autocorrelation, :func:`homoglens.core.stats.auto_block`) or an integer.
        sesoi: Smallest effect size of interest for cosines (``None``: a tenth of each
            statistic's scale, :mod:`homoglens.core.claims`).
        loss_sesoi: Smallest effect size of interest for loss (nats/token).
        seed: Seed of the ``"permute"`` ablation and of the bootstrap.
        progress: Show progress bars.

    Returns:
        A :class:`ModelComparison`.

    Raises:
        InvalidInputError: no models, duplicate labels, models with different tokenizers,
            models trained with and without BOS together, an unknown ``no_positions``, windows
            of unequal length, shipped statistics asked for other settings, bad options.

    References:
        Yusupov et al. 2025, arXiv 2508.17126; Gu et al. 2024, arXiv 2410.10781;
        Saravanan et al. 2020, arXiv 2007.07797 (hierarchical bootstrap).

    Examples:
        >>> from homoglens import compare_models
        >>> result = compare_models(n_seq=8, n_boot=50, progress=False)  # doctest: +SKIP
        >>> result.claims()[["claim", "model", "primary", "verdict"]]  # doctest: +SKIP
    """
    if isinstance(models, Mapping):  # model objects wrapped; names and folders load later
        models = {
            k: m if isinstance(m, (str, PathLike)) else entrance(m).model for k, m in models.items()
        }
    progress = as_bool("progress", progress)
    named = named_models(models, no_positions, group_by, centre)
    numbers = check_numbers(
        n_seq=n_seq, seq_len=seq_len, edge_k=edge_k, batch_size=batch_size, n_boot=n_boot,
        block=block, ci=ci, sesoi=sesoi, loss_sesoi=loss_sesoi, seed=seed,
    )  # fmt: skip
    shipped_only, loaded, eps, records, bos = _load_models(named, backend, eps)
    batch, window_index = _comparison_windows(loaded, data, numbers, bos)
    measured = _measure_models(
        loaded, batch, numbers, modes=modes, centre=centre, eps=eps, progress=progress
    )
    heldout = dict(records)
    run_modes = list(measured.studies[next(iter(loaded))].modes)
    shipped, shipped_heldout = _shipped_rows(
        named, shipped_only, measured.layers, numbers, modes=run_modes,
        window_index=window_index, bos=bos, centre=centre,
    )  # fmt: skip
    statistics = {**measured.statistics, **shipped}
    heldout.update(shipped_heldout)
    order = list(named)
    variants, group_by, no_positions = resolve_grouping(order, heldout, group_by, no_positions)
    return ModelComparison(
        labels=tuple(order), statistics={label: statistics[label] for label in order},
        layers=tuple(measured.layers or ()), variants=variants,
        computed=tuple(label for label in order if label in loaded), studies=measured.studies,
        similarity=measured.similarity, sinks=measured.sinks, heldout=heldout,
        no_positions=no_positions, group_by=group_by, edge_k=numbers.edge_k, eps=eps,
        n_boot=numbers.n_boot, ci=numbers.ci, seed=numbers.seed, block=numbers.block,
        sesoi=numbers.sesoi, loss_sesoi=numbers.loss_sesoi,
        settings=_settings(batch, window_index, run_modes, centre, loaded, shipped_only),
    )  # fmt: skip


def _load_models(
    named: dict[str, HookedModel | str], backend: Backend, eps: Any
) -> tuple[list[str], dict[str, HookedModel], float, dict[str, dict[str, Any]], bool]:
    """The labels that ship only statistics, the other models loaded, ``eps`` checked, what
    each loaded model's ``training.json`` records, and whether the models were trained with a
    BOS at every window.

    Raises:
        InvalidInputError: no model with weights, models trained with and without BOS
            together, or models with different tokenizers.
    """
    shipped_only = [label for label, m in named.items() if _is_statistics_only(m)]
    loaded = {
        label: load_model(m, backend=backend) if isinstance(m, str | os.PathLike) else m
        for label, m in named.items()
        if label not in shipped_only
    }
    if not loaded:
        raise InvalidInputError(
            "every model given ships only statistics; add at least one model with weights "
            "(e.g. homoglens/tiny-learned) to define the windows"
        )
    _, eps = check_key_eps(0, eps, min(int(m.cfg.n_ctx) for m in loaded.values()))
    records = {label: _training_record(model_info(m).name) for label, m in loaded.items()}
    bos_flags = {bool(r.get("bos")) for r in records.values() if r}
    if len(bos_flags) > 1:
        raise InvalidInputError(
            "some models were trained with a BOS at every window and some without; they read "
            "different windows, so compare each group on its own"
        )
    bos = bos_flags.pop() if bos_flags else False
    first_label, first = next(iter(loaded.items()))
    vocab = first.tokenizer.get_vocab() if first.tokenizer is not None else None
    for label, m in loaded.items():
        if m.tokenizer is None or m.tokenizer.get_vocab() != vocab:
            raise InvalidInputError(
                f"model {label!r} has no tokenizer or another one than {first_label!r}; compare "
                "models that share a tokenizer, so that every model reads the same token ids"
            )
    return shipped_only, loaded, eps, records, bos


def _comparison_windows(
    loaded: dict[str, HookedModel], data: Any, numbers: ComparisonNumbers, bos: bool
) -> tuple[TokenBatch, list[int] | None]:
    """The windows every model reads (``data`` as :func:`compare_models` takes it, read with
    the first model's tokenizer) and, for the default held-out windows of 128 tokens, their
    indices among all of them (what shipped statistics are selected by; else ``None``).

    Raises:
        InvalidInputError: windows too short for ``edge_k``.
    """
    n_seq, seq_len, edge_k = numbers.n_seq, numbers.seq_len, numbers.edge_k
    first = next(iter(loaded.values()))
    width = seq_len or min(int(m.cfg.n_ctx) for m in loaded.values())
    window_index: list[int] | None = None
    if isinstance(data, TokenBatch):
        batch = data
    elif data is None:
        from homoglens.training.train import heldout_windows

        everything = heldout_windows(first.tokenizer, seq_len=width, bos=bos)
        available = len(everything)
        count = available if n_seq is None else n_seq
        batch = heldout_windows(first.tokenizer, n_seq=n_seq, seq_len=width, bos=bos)
        window_index = (torch.arange(count, device="cpu") * available // count).tolist()
        if width != 128:
            window_index = None
    else:
        batch = corpus_windows(first, data, n_seq=n_seq or 64, seq_len=width, bos="never")
    if int(batch.lengths.min()) < 2 * edge_k + 2 + int(bool(batch.bos)):
        raise InvalidInputError(
            f"windows of {int(batch.lengths.min())} tokens are too short for edge_k={edge_k}; "
            "use longer windows or a smaller edge_k"
        )
    return batch, window_index


class _Measured(NamedTuple):
    """What :func:`compare_models` measured on the loaded models, by label: per-window
    statistics, studies, intact similarity (last layer), sink scores; and the layer axis."""

    statistics: dict[str, dict[str, dict[str, torch.Tensor]]]
    studies: dict[str, PositionAblationStudy]
    similarity: dict[str, PositionalSimilarity]
    sinks: dict[str, SinkScores]
    layers: tuple[int, ...] | None


def _measure_models(
    loaded: dict[str, HookedModel],
    batch: TokenBatch,
    numbers: ComparisonNumbers,
    *,
    modes: Sequence[str],
    centre: Centring | None,
    eps: float,
    progress: bool,
) -> _Measured:
    """Measure every loaded model on ``batch``: a position-ablation study, a positional
    similarity per mode (and one on uncentred vectors for the cross-input readings when
    ``centre`` is set) and the sink scores on key 0.

    Raises:
        InvalidInputError: models of different depth.
    """
    seed, batch_size, edge_k = numbers.seed, numbers.batch_size, numbers.edge_k
    n_boot, ci = numbers.n_boot, numbers.ci
    first_label = next(iter(loaded))
    statistics, studies, similarity, sinks = {}, {}, {}, {}
    layers: tuple[int, ...] | None = None
    for label, m in loaded.items():
        batch_m = to_token_batch(m, batch)
        study = position_ablation_study(
            m, batch_m, modes=modes, seed=seed, batch_size=batch_size, n_boot=n_boot, ci=ci,
            exclude_first=bool(batch_m.bos), progress=progress,
        )  # fmt: skip
        per_mode = {}
        for mode in study.modes:
            options: dict[str, Any] = {"seed": seed} if mode == "permute" else {}
            # Held: the ablation's hooks are this call's own, not a user's (no foreign-hook
            # warning, none recorded; the mode labels the result).
            with model_lock(m), ablated_positions(m, cast(PositionAblation, mode), **options):
                per_mode[mode] = positional_similarity(
                    m, batch_m, edge_k=edge_k, centre=centre, pseudo_values=True,
                    batch_size=batch_size, progress=progress,
                )  # fmt: skip
        cross = per_mode["none"]
        if centre is not None:  # cross-input readings mean nothing on centred vectors
            cross = positional_similarity(
                m, batch_m, edge_k=edge_k, centre=None, pseudo_values=True,
                batch_size=batch_size, progress=progress,
            )  # fmt: skip
        scores, importance = sink_pass(m, batch_m, 0, eps, batch_size, None, "auto", progress)
        statistics[label] = _window_statistics(study, per_mode, importance, eps, cross)
        studies[label], sinks[label] = study, scores
        similarity[label] = per_mode["none"].sel([per_mode["none"].layers[-1]])
        if layers is not None and layers != study.layers:
            raise InvalidInputError(
                f"{label} has {len(study.layers)} layer entries and {first_label} "
                f"{len(layers)}; per-layer statistics need the same depth"
            )
        layers = study.layers
    return _Measured(statistics, studies, similarity, sinks, layers)


def _shipped_rows(
    named: dict[str, HookedModel | str],
    shipped_only: list[str],
    layers: tuple[int, ...] | None,
    numbers: ComparisonNumbers,
    *,
    modes: list[str],
    window_index: list[int] | None,
    bos: bool,
    centre: Centring | None,
) -> tuple[dict[str, dict[str, dict[str, torch.Tensor]]], dict[str, Any]]:
    """The shipped per-window statistics of the labels in ``shipped_only`` and what they
    record of held-out training, by label.

    Raises:
        InvalidInputError: shipped statistics asked for other settings, or with other layers.
    """
    statistics, heldout = {}, {}
    for label in shipped_only:
        stats, meta = _shipped_statistics(
            str(named[label]), modes=modes, edge_k=numbers.edge_k, seed=numbers.seed,
            window_index=window_index, bos=bos, centre=centre,
        )  # fmt: skip
        if tuple(meta["layers"]) != layers:
            raise InvalidInputError(f"{label}'s shipped statistics have other layers")
        statistics[label], heldout[label] = stats, meta["heldout"]
    return statistics, heldout


def _settings(
    batch: TokenBatch,
    window_index: list[int] | None,
    run_modes: list[str],
    centre: Centring | None,
    loaded: dict[str, HookedModel],
    shipped_only: list[str],
) -> dict[str, Any]:
    """How :func:`compare_models` ran: the ``settings`` of its :class:`ModelComparison`."""
    return {
        "data": batch.description,
        "window_index": window_index,
        "modes": run_modes,
        "centre": centre,
        "sp_uncentred": True,
        "backends": {label: model_info(m).backend for label, m in loaded.items()},
        "weights": {label: model_info(m).weights for label, m in loaded.items()},
        "shipped_statistics": shipped_only,
    }
