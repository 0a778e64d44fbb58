"""The measurement jobs of the ``homoglens`` commands, one per report section (patching, sinks,
position-resolved similarity, calibrated readings, attention bias, massive activations): each
fits the options to the windows and runs its measurement."""

from __future__ import annotations

from typing import Any

import click

from homoglens.cli.limits import edge_limit, fit
from homoglens.core.types import PatchComponent, PatchDirection, PatchMetric, PositionAblation


def patching_job(
    model: Any,
    windows: Any,
    opts: dict[str, Any],
    *,
    how: PositionAblation = "zero",
    component: PatchComponent = "resid_pre",
    metrics: tuple[PatchMetric, ...] = ("mean_pairwise", "loss"),
    direction: PatchDirection = "restore",
) -> Any:
    """The report's patching sweep: every ``--patch-layer-step``-th block, on the first
    ``--patch-n-seq`` windows, at most 16 sequences (and logits) per forward pass."""
    from homoglens.models.architectures import architecture_of
    from homoglens.patching.measure import positional_patching

    n_layers = int(model.cfg.n_layers)
    layers = sorted(set(range(0, n_layers, opts["patch_layer_step"])) | {n_layers - 1})
    if component == "positions" and architecture_of(model).positional == "learned_absolute":
        layers = [0]  # the embedding is the one place position enters
    section = "the patching sweep"
    n = fit(opts, "patch_n_seq", len(windows), f"there are {len(windows)} windows", section)
    subset = windows[:n]
    shortest = int(subset.lengths.min())
    bins = fit(opts, "patch_bins", shortest, f"windows have {shortest} positions", section)
    limit, reason = edge_limit(shortest)
    edge_k = min(opts["edge_k"], limit)  # unused without edge metrics
    if any(m in ("first_excess", "last_excess") for m in metrics):
        if limit < 1:
            raise click.BadParameter(f"windows of {shortest} tokens are too short for edge metrics")
        edge_k = fit(opts, "edge_k", limit, reason, section, other="a longer --seq-len")
    cells = {"head": int(model.cfg.n_heads), "positions": 1}.get(component) or int(bins)
    click.echo(
        f"patching sweep: {len(layers)} blocks x {cells} cells on {len(subset)} windows "
        f"(about {len(layers) * cells + 2} forward passes over them)",
        err=True,
    )
    return positional_patching(
        model,
        subset,
        how=how,
        component=component,
        metric=list(metrics),
        direction=direction,
        layers=layers,
        bins=bins,
        edge_k=max(edge_k, 1),
        batch_size=opts["batch_size"],
        cell_batch=max(1, 16 // opts["batch_size"]),  # <= 16 sequences (and logits) per pass
        progress=opts["progress"],
    )


def sinks_job(model: Any, windows: Any, opts: dict[str, Any], *, required: bool) -> Any:
    """The sink analysis; ``None`` (with a warning) when the windows are too short for it and
    it is only a section of the profile report."""
    from homoglens.sinks import sink_analysis

    shortest = int(windows.lengths.min())
    limit, reason = edge_limit(shortest)
    if limit < 1:
        message = (
            f"windows of {shortest} tokens are too short for the sink attribution; use "
            "--seq-len 4 or more"
        )
        if required:
            raise click.BadParameter(message)
        click.echo(f"warning: {message}; the report has no sinks section", err=True)
        return None
    section = "the sink attribution"
    heads = int(model.cfg.n_layers) * int(model.cfg.n_heads)
    top_k = fit(opts, "sink_top_k", heads, f"the model has {heads} attention heads", section)
    n_seq = fit(opts, "sink_n_seq", len(windows), f"there are {len(windows)} windows", section)
    edge_k = fit(
        opts, "edge_k", limit, reason, section, required=required, other="a longer --seq-len"
    )
    return sink_analysis(
        model,
        windows,
        top_k=top_k,
        edge_k=edge_k,
        attribution_n_seq=n_seq,
        batch_size=opts["batch_size"],
        progress=opts["progress"],
    )


def similarity_job(
    model: Any,
    windows: Any,
    opts: dict[str, Any],
    *,
    standardize: bool = False,
    drop_dims: int = 0,
) -> Any:
    """The position-resolved section (uncentred, with pseudo-values: two passes), or with
    ``standardize`` the C1 correction (globally centred and standardised, no pseudo-values:
    two passes), or with ``drop_dims`` the C1 correction without the ``drop_dims`` dimensions
    of largest energy (uncentred, with pseudo-values: three passes);
    ``None`` with a warning when the windows are of unequal length or too short for the
    edges."""
    from homoglens.similarity.measure import positional_similarity

    lengths = windows.lengths
    counted = int(lengths.min()) - int(bool(windows.bos))
    limit, reason = edge_limit(counted, "counted tokens (BOS left out)")
    if int(lengths.min()) != int(lengths.max()) or limit < 1:
        click.echo(
            "warning: the position-resolved section needs equal windows of at least 4 counted "
            "tokens; the report has none",
            err=True,
        )
        return None
    section = "the position-resolved section"
    edge_k = fit(opts, "edge_k", limit, reason, section, required=False)
    return positional_similarity(
        model,
        windows,
        edge_k=edge_k,
        centre="global" if standardize else None,  # SP means nothing on centred vectors
        standardize=standardize,
        pseudo_values=not standardize,
        drop_dims=min(drop_dims, int(model.cfg.d_model) - 1),
        batch_size=opts["batch_size"],
        progress=opts["progress"],
    )


def readings_job(model: Any, windows: Any, opts: dict[str, Any]) -> Any:
    """The three readings of C2 under two designs (:func:`~homoglens.calibrated_readings`): the
    start-of-sequence contrast (the same tokens after a prefix of half the window; descriptive,
    not a causal null) and the positional attribution against the model-matched causal null (the
    model on the same windows with its positions removed, with the null's loss cost; left out,
    with a warning, for a model that has no positions to remove). A list of the readings, or
    ``None`` with a warning when the windows are unequal, padded or too short for the edges."""
    from homoglens.core.errors import InvalidInputError, UnsupportedArchitectureError
    from homoglens.similarity.calibration import calibrated_readings

    lengths = windows.lengths
    width = int(lengths.min()) - int(bool(windows.bos))
    offset = width // 2
    limit = (width - offset - 2) // 2
    if int(lengths.min()) != int(lengths.max()) or limit < 1 or len(windows) < 4:
        click.echo(
            "warning: the calibrated readings need at least 4 equal windows of 8 counted tokens; "
            "the report has none",
            err=True,
        )
        return None
    reason = (
        f"they read the last {width - offset} of {width} counted tokens (after a prefix of "
        f"{offset}), which allow at most {limit} positions per edge"
    )
    edge_k = fit(opts, "edge_k", limit, reason, "the calibrated-readings section", required=False)
    common = {"edge_k": edge_k, "batch_size": opts["batch_size"], "progress": opts["progress"]}
    readings = [calibrated_readings(model, windows, reference="offset", offset=offset, **common)]
    try:  # refused before any pass for a model with no positions (or outside the table)
        null = calibrated_readings(model, windows, reference="no_positions", **common)
    except (InvalidInputError, UnsupportedArchitectureError) as err:
        click.echo(f"warning: the report has no positional attribution: {err}", err=True)
        return readings
    return [*readings, null]


def bias_job(model: Any, windows: Any, opts: dict[str, Any], **bias: Any) -> Any:
    """The attention-bias dose-response on the first ``--bias-n-seq`` windows (equal length);
    ``None`` with a warning when they are too few or too short for the edges (a section)."""
    from homoglens.bias.measure import attention_bias_study

    required = bias.pop("required", True)
    section = "the attention-bias study"
    n = len(windows)
    if "bias_n_seq" in opts:
        n = fit(opts, "bias_n_seq", n, f"there are {n} windows", section)
    part = windows[:n]
    counted = int(part.lengths.min()) - int(bool(part.bos))
    limit, reason = edge_limit(counted, "counted tokens (BOS left out)")
    if n < 2 or int(part.lengths.min()) != int(part.lengths.max()) or limit < 1:
        message = "the attention-bias study needs at least 2 equal windows of 4 counted tokens"
        if required:
            raise click.BadParameter(message)
        click.echo(f"warning: {message}; the report has no attention-bias section", err=True)
        return None
    edge_k = fit(
        opts, "edge_k", limit, reason, section, required=required, other="a longer --seq-len"
    )
    return attention_bias_study(
        model, part, edge_k=edge_k, batch_size=opts["batch_size"], progress=opts["progress"],
        **bias,
    )  # fmt: skip


def massive_job(model: Any, windows: Any, opts: dict[str, Any]) -> Any:
    """The massive-activation section: sites found on (and means taken over) up to 8 reference
    windows, measured on up to ``--massive-n-seq`` others; ``None`` with a warning when there
    are too few windows or no massive activations by Sun et al.'s rule."""
    from homoglens.ablation.measure import massive_ablation_study
    from homoglens.core.errors import InvalidInputError

    n_ref = min(8, len(windows) // 3)
    n = len(windows) - n_ref
    if n_ref < 1 or n < 2:
        click.echo(
            "warning: the massive-activation section needs at least 3 windows; the report has none",
            err=True,
        )
        return None
    if "massive_n_seq" in opts:
        reason = f"{n_ref} of the {len(windows)} windows give the means, so {n} are left to measure"
        n = fit(opts, "massive_n_seq", n, reason, "the massive-activation section")
    try:
        return massive_ablation_study(
            model, windows[n_ref : n_ref + n], reference=windows[:n_ref],
            batch_size=opts["batch_size"], progress=opts["progress"],
        )  # fmt: skip
    except InvalidInputError as err:
        if "no massive activations" not in str(err):
            raise
        click.echo(
            "note: no massive activations found by Sun et al.'s rule on the reference windows; "
            "the report has no massive-activation section (massive_ablation_study(model, data, "
            "layer=..., dims=...) ablates chosen sites from Python)",
            err=True,
        )
        return None
