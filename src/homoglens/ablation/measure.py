"""Controlled experiments that run a model several ways on the same sequences."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch
from jaxtyping import Int

from homoglens.ablation.result import PositionAblationStudy
from homoglens.core.errors import InvalidInputError
from homoglens.core.types import (
    POSITION_ABLATIONS,
    BosPolicy,
    HookedModel,
    HookSpec,
    ModelInput,
    PositionAblation,
)
from homoglens.core.validate import as_bool, as_float, as_int, check_layers, int_list
from homoglens.models.architectures import architecture_of
from homoglens.profile.measure import profile_pass
from homoglens.run.data import DataInput, TokenBatch, require_min_tokens, to_token_batch
from homoglens.run.data.batch import tokenizer_bos
from homoglens.run.engine import Sums, provenance_of, stream
from homoglens.run.entrance import Entrance, entrance
from homoglens.run.interventions import (
    massive_activation_hooks,
    position_ablation_hooks,
)
from homoglens.run.losses import induction_loss, induction_tokens, next_token_nll
from homoglens.sinks.massive import given_or_found_sites

__all__ = ["default_ablation_modes", "massive_ablation_study", "position_ablation_study"]


def default_ablation_modes(model: HookedModel) -> tuple[str, ...]:
    """``none, zero, permute, shift`` for learned absolute models; ``none, zero, permute`` for
    rotary and ALiBi ones (a shift of every position changes nothing when attention depends
    only on i - j).

    Raises:
        UnsupportedArchitectureError: a family outside the architecture table.
    """
    if architecture_of(model).positional == "learned_absolute":
        return ("none", "zero", "permute", "shift")
    return ("none", "zero", "permute")


def position_ablation_study(
    model: ModelInput,
    data: DataInput,
    *,
    modes: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    seed: int = 0,
    shift: int = 1,
    batch_size: int = 8,
    exclude_first: bool = False,
    effective_rank: bool = False,
    n_boot: int = 1000,
    ci: float = 0.95,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> PositionAblationStudy:
    """Measure homogenization and next-token loss with positional information ablated.

    Runs the same sequences once per mode (one forward pass per batch and mode), reducing the
    residual stream in hooks as :func:`homogenization_profile` does and computing the mean
    next-token cross-entropy of each sequence and its in-context-learning score (loss of the
    last eighth minus the second eighth of its tokens); and per mode one more pass over 8
    repeated random-token sequences (BOS + r + r, 32 tokens each half) for the induction loss
    on the second repeat (C3c: what removing positions costs tasks that need context). Results
    are paired by sequence, so differences to the unablated model (``"none"``) get bootstrap
    confidence intervals over sequences.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        modes: Ablations to run, a name or a list of names (see
            :func:`position_ablation_hooks`); ``"none"`` is always run first. Default:
            :func:`default_ablation_modes`.
        layers: Entries of the residual axis to measure (default all).
        positions: Restrict every ablation to these positions.
        seed: Seed of the ``"permute"`` permutation and of the bootstrap.
        shift: Offset of the ``"shift"`` mode (sequences must fit: T - 1 + shift < n_ctx).
        batch_size: Sequences per forward pass.
        exclude_first: Leave position 0 out of every homogenization statistic.
        effective_rank: Also compute effective ranks (costly).
        n_boot: Bootstrap resamples for the confidence intervals.
        ci: Interval coverage in (0, 1).
        attention_mask: For token input, as in :func:`homogenization_profile`.
        bos: For text input, as in :func:`homogenization_profile`.
        progress: Show progress bars.

    Returns:
        A :class:`~homoglens.PositionAblationStudy`.

    Raises:
        InvalidInputError: bad modes (e.g. ``"mean"`` on a rotary model), data or options.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (claim C3); Kazemnejad et al. 2023,
        arXiv 2305.19466 (NoPE models still infer position from the causal mask); Olsson et al.
        2022, arXiv 2209.11895 (in-context-learning score, induction on repeated tokens).
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    info = call.info
    chosen_modes = _check_modes(model, modes)
    options = _study_options(
        model, layers, ci=ci, n_boot=n_boot, batch_size=call.batch_size, seed=seed, shift=shift,
        exclude_first=exclude_first, effective_rank=effective_rank,
    )  # fmt: skip
    ci, n_boot, _, seed, shift, exclude_first, effective_rank, chosen = options
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    require_min_tokens(batch, exclude_first)
    # Run sequences grouped by length, so that "permute" and "mean" act on each sequence's own
    # positions (a padded batch would hand short sequences positions they do not have); the
    # per-sequence results are put back in input order below.
    order = torch.sort(batch.lengths, stable=True).indices
    inverse = torch.argsort(order)
    batch = batch[order]
    # Build every mode's hooks first, so a bad option fails before any forward pass.
    ablation_options: dict[str, dict[str, Any]] = {
        "permute": {"seed": seed},
        "shift": {"shift": shift},
    }
    hooks = {
        mode: position_ablation_hooks(
            model,
            cast(PositionAblation, mode),  # checked against POSITION_ABLATIONS above
            positions=positions,
            **ablation_options.get(mode, {}),
        )
        for mode in chosen_modes
    }
    _check_reach(model, chosen_modes, positions, shift, int(batch.lengths.max()))
    tables = _paired_passes(
        model, batch, hooks, options, inverse, info=info, progress=call.progress
    )
    settings: dict[str, Any] = {"seed": seed}
    if "shift" in chosen_modes:
        settings["shift"] = shift
    if positions is not None:
        settings["positions"] = [as_int("positions", p) for p in positions]
    settings.update(data=batch.description, exclude_first=exclude_first)
    return PositionAblationStudy(
        modes=tuple(chosen_modes), **tables, settings=settings, n_boot=n_boot, ci=ci, seed=seed
    )


def massive_ablation_study(
    model: ModelInput,
    data: DataInput,
    *,
    reference: DataInput | None = None,
    layer: int | None = None,
    dims: Sequence[int] | int | None = None,
    positions: Sequence[int] | int | None = None,
    layers: Sequence[int] | None = None,
    batch_size: int = 8,
    exclude_first: bool = False,
    effective_rank: bool = False,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    reference_attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> PositionAblationStudy:
    """Homogenization and next-token loss with the massive activations set to their mean or to
    zero (Sun et al.'s ``set_mean`` / ``set_zero``), paired by sequence with the unhooked model.

    Three passes over the same sequences, ``"none"``, ``"mean"`` and ``"zero"``, each a profile
    with per-sequence loss (the modes of a :class:`PositionAblationStudy`: ``loss_table()``,
    ``layer_table()``, ``context_table()``, ``plot()``). The hooks sit at the output of decoder
    layer ``layer`` (``blocks.{layer-1}.hook_resid_post``) and write x[p, d] for every p in
    ``positions`` and d in ``dims`` (see :func:`~homoglens.ablated_massive_activations`); the
    means come from ``reference``. Without ``layer`` and ``dims`` the sites are found on
    ``reference`` by Sun et al.'s rule (:func:`~homoglens.find_massive_sites`). Sun et al.
    report the mean leaves perplexity unchanged and zero destroys the model; the study also
    shows what each does to homogenization (the first token's outlier direction enters every
    cosine).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: The measured sequences, as for :func:`homogenization_profile`.
        reference: The corpus of the means (and of the site search); default ``data`` itself
            (in-sample means; give disjoint windows for Sun et al.'s setting).
        layer: Residual entry in [1, n_layers] (the output of block ``layer - 1``: Sun et al.'s
            1-indexed decoder layer); with ``dims``.
        dims: Residual dimensions in [0, d_model); with ``layer``.
        positions: Column positions (default: the ones found, or 0 when ``layer`` is given).
        layers: Residual-axis entries measured (default all).
        batch_size: Sequences per forward pass.
        exclude_first: Leave position 0 out of the homogenization statistics (the loss keeps
            it).
        effective_rank: Also compute effective ranks.
        n_boot: Bootstrap resamples (over sequences) of the intervals.
        ci: Interval coverage in (0, 1).
        seed: Bootstrap seed.
        attention_mask: For token input ``data``.
        reference_attention_mask: For token input ``reference`` (pads never enter the means).
        bos: For text input.
        progress: Show progress bars.

    Returns:
        A :class:`PositionAblationStudy` with modes ``("none", "mean", "zero")`` and
        ``settings`` recording the intervention, layer, dims, positions and whether the sites
        were found or given.

    Raises:
        InvalidInputError: only one of ``layer`` / ``dims`` given; no massive activations found
            (pass ``layer`` and ``dims``); a site position that no window of ``data`` reaches
            (the ablation would change nothing); bad sites, options or data.

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762
        (section 3, ``main_llm.py --exp3``).

    Examples:
        >>> from homoglens import load_model, massive_ablation_study
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> texts = ["Hello world, how are you", "Hi there, all is well"]
        >>> study = massive_ablation_study(model, texts, layer=1, dims=[0, 3], progress=False)
        >>> study.modes
        ('none', 'mean', 'zero')
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    info = call.info
    options = _study_options(
        model, layers, ci=ci, n_boot=n_boot, batch_size=call.batch_size, seed=seed,
        exclude_first=exclude_first, effective_rank=effective_rank,
    )  # fmt: skip
    ci, n_boot, _, seed, _, exclude_first, effective_rank, chosen = options
    batch, ref = _massive_batches(
        model, data, reference, layer, dims, attention_mask=attention_mask,
        reference_attention_mask=reference_attention_mask, bos=bos, exclude_first=exclude_first,
    )  # fmt: skip
    layer, site_dims, site_pos, found = _massive_sites(call, batch, ref, layer, dims, positions)
    hooks = _massive_hooks(model, ref, layer, site_dims, site_pos, call.batch_size, call.progress)
    order = torch.sort(batch.lengths, stable=True).indices
    tables = _paired_passes(
        model, batch[order], hooks, options, torch.argsort(order), info=info, progress=call.progress
    )
    settings: dict[str, Any] = {
        "intervention": "massive activations (Sun et al. set_mean / set_zero)",
        "layer": layer,
        "dims": list(site_dims),
        "positions": list(site_pos),
        "sites": found,
        "reference": "data" if reference is None else ref.description,
        "data": batch.description,
        "exclude_first": exclude_first,
    }
    return PositionAblationStudy(
        modes=("none", "mean", "zero"), **tables, settings=settings, n_boot=n_boot, ci=ci,
        seed=seed,
    )  # fmt: skip


class _StudyOptions(NamedTuple):
    """The checked options shared by :func:`position_ablation_study` and
    :func:`massive_ablation_study` (``layers``: the residual entries measured)."""

    ci: float
    n_boot: int
    batch_size: int
    seed: int
    shift: int
    exclude_first: bool
    effective_rank: bool
    layers: tuple[int, ...]

    def pass_options(self) -> dict[str, Any]:
        """The keyword options of :func:`~homoglens.profile.measure.profile_pass` these hold:
        ``batch_size``, ``exclude_first`` and ``effective_rank``."""
        return {
            "batch_size": self.batch_size,
            "exclude_first": self.exclude_first,
            "effective_rank": self.effective_rank,
        }


def _study_options(
    model: HookedModel,
    layers: Sequence[int] | None,
    *,
    ci: float,
    n_boot: int,
    batch_size: int,
    seed: int,
    exclude_first: bool,
    effective_rank: bool,
    shift: int = 0,
) -> _StudyOptions:
    """Check the options both studies share, in this order: ``ci``, ``n_boot``,
    ``batch_size``, ``seed``, ``shift`` (the ``"shift"`` ablation's offset; 0 for the massive
    study, which has none), ``exclude_first``, ``effective_rank`` and ``layers``."""
    ci = as_float("ci", ci, low=0.0, high=1.0)
    n_boot = as_int("n_boot", n_boot, low=1)
    batch_size = as_int("batch_size", batch_size, low=1)
    seed = as_int("seed", seed, low=0, high=2**63 - 1)
    shift = as_int("shift", shift)
    exclude_first = as_bool("exclude_first", exclude_first)
    effective_rank = as_bool("effective_rank", effective_rank)
    chosen = check_layers(layers, int(model.cfg.n_layers))
    return _StudyOptions(ci, n_boot, batch_size, seed, shift, exclude_first, effective_rank, chosen)


def _check_modes(model: HookedModel, modes: Sequence[str] | None) -> list[str]:
    """The ablation modes of :func:`position_ablation_study`: ``modes`` (a name or names;
    default :func:`default_ablation_modes`) checked, ``"none"`` first, without repeats."""
    if isinstance(modes, str):  # one mode, not its characters
        modes = [modes]
    chosen_modes = list(default_ablation_modes(model) if modes is None else modes)
    unknown = [m for m in chosen_modes if m not in POSITION_ABLATIONS]
    if unknown or not chosen_modes:
        raise InvalidInputError(
            f"modes {unknown or chosen_modes} must be from {list(POSITION_ABLATIONS)}"
        )
    return ["none"] + [m for m in dict.fromkeys(chosen_modes) if m != "none"]


def _check_reach(
    model: HookedModel,
    chosen_modes: list[str],
    positions: Sequence[int] | None,
    shift: int,
    longest: int,
) -> None:
    """Reject ablated ``positions`` beyond every window (``longest`` tokens) and a ``"shift"``
    that moves the last position outside ``n_ctx``; warn (at the study's caller) when
    ``shift=0``."""
    given = (
        ()
        if positions is None
        else int_list("positions", positions, 0, int(model.cfg.n_ctx), "the model's positions")
    )
    beyond = sorted(p for p in given if p >= longest)
    if beyond:
        raise InvalidInputError(
            f"positions {beyond} lie beyond every window of the data (longest: {longest} "
            "tokens), so ablating them would change nothing; give positions below the windows' "
            "length, or longer windows"
        )
    if "shift" in chosen_modes and shift == 0:
        warnings.warn(
            "homoglens: shift=0 moves no position; the 'shift' row equals 'none' (give a "
            "nonzero shift=)",
            UserWarning,
            stacklevel=3,
        )
    if "shift" in chosen_modes and positions is None:
        last = longest - 1
        if not 0 <= last + shift < int(model.cfg.n_ctx):
            raise InvalidInputError(
                f"shift={shift} moves position {last} to {last + shift}, outside "
                f"n_ctx={model.cfg.n_ctx}; use shorter sequences or a smaller shift"
            )


def _massive_batches(
    model: HookedModel,
    data: DataInput,
    reference: DataInput | None,
    layer: int | None,
    dims: Sequence[int] | int | None,
    *,
    attention_mask: torch.Tensor | None,
    reference_attention_mask: torch.Tensor | None,
    bos: BosPolicy | bool,
    exclude_first: bool,
) -> tuple[TokenBatch, TokenBatch]:
    """The measured windows and the reference windows of :func:`massive_ablation_study`
    (``data`` itself when ``reference`` is ``None``), after checking that ``layer`` and
    ``dims`` come together."""
    if (layer is None) != (dims is None):
        raise InvalidInputError(
            f"layer={layer!r} and dims={dims!r}: give both, or neither to find them with Sun et "
            "al.'s rule (find_massive_sites)"
        )
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    require_min_tokens(batch, exclude_first)
    ref = (
        batch
        if reference is None
        else to_token_batch(model, reference, attention_mask=reference_attention_mask, bos=bos)
    )
    return batch, ref


def _massive_hooks(
    model: HookedModel,
    ref: TokenBatch,
    layer: int,
    site_dims: tuple[int, ...],
    site_pos: tuple[int, ...],
    batch_size: int,
    progress: bool,
) -> dict[str, list[HookSpec]]:
    """The hooks of each mode of :func:`massive_ablation_study`: none, the sites set to their
    means over ``ref``, and the sites set to zero."""
    from homoglens.sinks.massive import massive_activation_means

    means = massive_activation_means(
        model, ref, layer=layer, dims=site_dims, positions=site_pos, batch_size=batch_size,
        progress=progress,
    )  # fmt: skip
    sites_kw: dict[str, Any] = {"layer": layer, "dims": site_dims, "positions": site_pos}
    return {
        "none": [],
        "mean": massive_activation_hooks(model, "mean", means=means, **sites_kw),
        "zero": massive_activation_hooks(model, "zero", **sites_kw),
    }


def _massive_sites(
    call: Entrance,
    batch: TokenBatch,
    ref: TokenBatch,
    layer: int | None,
    dims: Sequence[int] | int | None,
    positions: Sequence[int] | int | None,
) -> tuple[int, tuple[int, ...], tuple[int, ...], str]:
    """The sites of :func:`massive_ablation_study`: ``layer``, ``dims`` and ``positions``
    checked, or found on ``ref`` by Sun et al.'s rule when ``layer`` is ``None``; with how
    they came (``"given"`` or found) and a check that some window of ``batch`` reaches them."""
    layer, site_dims, site_pos, found = given_or_found_sites(
        call, ref, layer=layer, dims=dims, positions=positions,
        fix="pass layer and dims to ablate chosen sites",
    )  # fmt: skip
    longest = int(batch.lengths.max())
    if max(site_pos) >= longest:
        raise InvalidInputError(
            f"positions {[p for p in site_pos if p >= longest]} lie beyond every window of the "
            f"data (longest: {longest} tokens), so the ablation would change nothing; give "
            "longer windows or positions below their length"
        )
    return layer, site_dims, site_pos, "found (find_massive_sites)" if found else "given"


def _paired_passes(
    model: HookedModel,
    batch: TokenBatch,
    hooks: dict[str, list[HookSpec]],
    options: _StudyOptions,
    inverse: torch.Tensor,
    *,
    info: Any,
    progress: bool,
) -> dict[str, Any]:
    """One profile pass with loss per mode (``hooks[mode]`` attached) over the same sequences,
    and the induction loss on repeated random tokens: the fields of a
    :class:`PositionAblationStudy` other than its settings (rows back in input order via
    ``inverse``). The passes measure ``options.layers`` with ``options``' batch size,
    ``exclude_first`` and ``effective_rank``; ``options.seed`` draws the induction tokens."""
    chosen, exclude_first, seed = options.layers, options.exclude_first, options.seed
    n_pos = int(batch.lengths.max())
    profiles, loss, pairwise, others, icl, induction = {}, [], [], [], [], []
    half = max(2, min(32, (int(model.cfg.n_ctx) - 1) // 2))
    bos_id = tokenizer_bos(model)
    repeated = to_token_batch(  # the inputs and the targets of the induction loss
        model,
        induction_tokens(
            int(model.cfg.d_vocab), half=half, bos=bos_id if batch.bos else None, seed=seed
        ),
    )
    for mode, mode_hooks in hooks.items():
        run = profile_pass(
            model,
            batch,
            chosen,
            **options.pass_options(),
            progress=progress,
            extra_hooks=mode_hooks,
            per_sequence=True,
            loss=True,
            desc="profile (no ablation)" if mode == "none" else f"ablation {mode}",
            uniform_length=True,
        )
        prov = provenance_of(info, batch, chosen, exclude_first)
        profiles[mode] = run.accumulator.profile(chosen, prov)
        loss.append(torch.cat(run.seq_loss).double()[inverse])
        icl.append(torch.cat(run.seq_icl).double()[inverse])
        reducer = _InductionLoss(half)
        stream(
            model,
            repeated,
            [reducer],
            batch_size=len(repeated),
            desc=f"induction {mode}",
            progress=False,
            extra_hooks=mode_hooks,
        )
        induction.append(reducer.row_values("induction"))
        pairwise.append(torch.cat(run.seq_mean_pairwise)[inverse])
        others.append(
            torch.cat(
                [
                    torch.nn.functional.pad(t, (0, n_pos - t.shape[-1]), value=float("nan"))
                    for t in run.seq_to_others
                ]
            )[inverse]
        )
    return {
        "profiles": profiles,
        "loss": torch.stack(loss).float(),
        "icl": torch.stack(icl),
        "induction_loss": torch.stack(induction),
        "mean_pairwise": torch.stack(pairwise),
        "to_others": torch.stack(others),
    }


class _InductionLoss(Sums):
    """A reducer of one streamed pass over :func:`~homoglens.run.losses.induction_tokens`
    sequences to the logits: each sequence's induction loss (:func:`induction_loss` of its
    :func:`next_token_nll`, float64), kept as the per-sequence rows ``"induction"``."""

    needs_logits = True

    def __init__(self, half: int) -> None:
        super().__init__(rows={"induction": ()})
        self.half = half

    def logits(self, logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        """Keep the batch's induction losses (every token is real: ``mask`` is all ones)."""
        self.rows["induction"].append(induction_loss(next_token_nll(logits, tokens), self.half))
