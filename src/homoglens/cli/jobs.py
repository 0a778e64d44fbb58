"""What the ``homoglens`` commands run: load the model and windows, run the measurements
the options ask for, and write the report (typed errors become one-line CLI errors)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from homoglens.errors import HomoglensError
from homoglens.types import PatchComponent, PatchDirection, PatchMetric, PositionAblation

DROP_DIMS = 3
"""Dimensions of largest mean square the report's C1 correction zeroes in each layer (the
massive / rogue ones: a handful carry them, Timkey & van Schijndel 2021, Sun et al. 2024)."""


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
    from homoglens.architectures import architecture_of
    from homoglens.patching import positional_patching

    n_layers = int(model.cfg.n_layers)
    layers = sorted(set(range(0, n_layers, opts["patch_layer_step"])) | {n_layers - 1})
    if component == "positions" and architecture_of(model).positional == "learned_absolute":
        layers = [0]  # the embedding is the one place position enters
    subset = windows[: opts["patch_n_seq"]]
    shortest = int(subset.lengths.min())
    bins = min(opts["patch_bins"], shortest)
    edge_k = min(opts["edge_k"], (shortest - 2) // 2)
    if edge_k < 1 and any(m in ("first_excess", "last_excess") for m in metrics):
        raise click.BadParameter(f"windows of {shortest} tokens are too short for edge metrics")
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


def os_error_message(err: OSError) -> str:
    """A one-line CLI error for a failed write (full disk, read-only folder)."""
    where = f" ({err.filename})" if getattr(err, "filename", None) else ""
    return (
        f"could not write the output{where}: {err.strerror or err}; free some space or choose "
        "another --out (nothing was left half-written)"
    )


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn typed homoglens errors and failed writes into one-line CLI errors (no traceback)."""
    try:
        yield
    except HomoglensError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:  # a full disk, a read-only folder
        raise click.ClickException(os_error_message(err)) from err


def init_distributed(opts: dict[str, Any]) -> None:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1): join the process group (NCCL on GPUs, gloo on
    CPU) and put this rank's model on ``cuda:LOCAL_RANK``; profiles, sink scores and ablation
    studies then shard the windows by rank, and only rank 0 writes the report."""
    import os

    import torch

    from homoglens.errors import DistributedError

    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise DistributedError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number; launch with torchrun, "
            "or unset WORLD_SIZE to run on one process"
        ) from None
    if size <= 1 or torch.distributed.is_initialized():
        return
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise DistributedError(
            f"WORLD_SIZE={size} but {', '.join(missing)} not set: launch with "
            f"`torchrun --nproc-per-node {size} -m homoglens.cli ...` (it sets them), or unset "
            "WORLD_SIZE to run on one process"
        )
    device = opts.get("device")
    cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    try:
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    except (RuntimeError, ValueError) as err:
        raise DistributedError(
            f"could not join the process group ({str(err)[:200]}); check the torchrun launch"
        ) from None
    if cuda and device is None:
        opts["device"] = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"


def load_job(opts: dict[str, Any]) -> tuple[Any, Any]:
    """Load the model and cut the corpus windows the options ask for."""
    from homoglens.data import corpus_windows
    from homoglens.models import load_model

    init_distributed(opts)

    if opts["device"] is not None:
        from homoglens.validate import check_device

        check_device(opts["device"])
    click.echo(f"loading {opts['model']} ({opts['backend']} backend) ...", err=True)
    model = load_model(
        opts["model"],
        backend=opts["backend"],
        device=opts["device"],
        process_weights=opts["process_weights"],
    )
    source = opts["text_file"] if opts["text_file"] is not None else opts["corpus"]
    windows = corpus_windows(
        model, source, n_seq=opts["n_seq"], seq_len=opts["seq_len"], bos=opts["bos"]
    )
    return model, windows


def sinks_job(model: Any, windows: Any, opts: dict[str, Any], *, required: bool) -> Any:
    """The sink analysis; ``None`` (with a warning) when the windows are too short for it and
    it is only a section of the profile report."""
    from homoglens.sinks import sink_analysis

    shortest = int(windows.lengths.min())
    edge_k = min(opts["edge_k"], (shortest - 2) // 2)  # as the profile's edge table does
    if edge_k < 1:
        message = (
            f"windows of {shortest} tokens are too short for the sink attribution; use "
            "--seq-len 4 or more"
        )
        if required:
            raise click.BadParameter(message)
        click.echo(f"warning: {message}; the report has no sinks section", err=True)
        return None
    return sink_analysis(
        model,
        windows,
        top_k=opts["sink_top_k"],
        edge_k=edge_k,
        attribution_n_seq=opts["sink_n_seq"],
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
    from homoglens.similarity import positional_similarity

    lengths = windows.lengths
    counted = int(lengths.min()) - int(bool(windows.bos))
    edge_k = min(opts["edge_k"], (counted - 2) // 2)
    if int(lengths.min()) != int(lengths.max()) or edge_k < 1:
        click.echo(
            "warning: the position-resolved section needs equal windows of at least 4 counted "
            "tokens; the report has none",
            err=True,
        )
        return None
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
    """The three readings of C2 against the causal null (the same tokens after a prefix of half
    the window, :func:`~homoglens.calibrated_readings`); ``None`` with a warning when the windows
    are unequal, padded or too short for the edges."""
    from homoglens.calibration import calibrated_readings

    lengths = windows.lengths
    width = int(lengths.min()) - int(bool(windows.bos))
    offset = width // 2
    edge_k = min(opts["edge_k"], (width - offset - 2) // 2)
    if int(lengths.min()) != int(lengths.max()) or edge_k < 1 or len(windows) < 4:
        click.echo(
            "warning: the calibrated readings need at least 4 equal windows of 8 counted tokens; "
            "the report has none",
            err=True,
        )
        return None
    return calibrated_readings(
        model, windows, reference="offset", offset=offset, edge_k=edge_k,
        batch_size=opts["batch_size"], progress=opts["progress"],
    )  # fmt: skip


def bias_job(model: Any, windows: Any, opts: dict[str, Any], **bias: Any) -> Any:
    """The attention-bias dose-response on the first ``--bias-n-seq`` windows (equal length);
    ``None`` with a warning when they are too few or too short for the edges (a section)."""
    from homoglens.bias import attention_bias_study

    n = min(len(windows), opts.get("bias_n_seq") or len(windows))
    part = windows[:n]
    counted = int(part.lengths.min()) - int(bool(part.bos))
    edge_k = min(opts["edge_k"], (counted - 2) // 2)
    required = bias.pop("required", True)
    if n < 2 or int(part.lengths.min()) != int(part.lengths.max()) or edge_k < 1:
        message = "the attention-bias study needs at least 2 equal windows of 4 counted tokens"
        if required:
            raise click.BadParameter(message)
        click.echo(f"warning: {message}; the report has no attention-bias section", err=True)
        return None
    return attention_bias_study(
        model, part, edge_k=edge_k, batch_size=opts["batch_size"], progress=opts["progress"],
        **bias,
    )  # fmt: skip


def massive_job(model: Any, windows: Any, opts: dict[str, Any]) -> Any:
    """The massive-activation section: sites found on (and means taken over) up to 8 reference
    windows, measured on up to ``--massive-n-seq`` others; ``None`` with a warning when there
    are too few windows or no massive activations by Sun et al.'s rule."""
    from homoglens.errors import InvalidInputError
    from homoglens.studies import massive_ablation_study

    n_ref = min(8, len(windows) // 3)
    n = min(len(windows) - n_ref, opts.get("massive_n_seq") or len(windows))
    if n_ref < 1 or n < 2:
        click.echo(
            "warning: the massive-activation section needs at least 3 windows; the report has none",
            err=True,
        )
        return None
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


def check_interactive(interactive: bool) -> None:
    """With ``--interactive``, fail before any work when plotly is missing.

    Raises:
        MissingDependencyError: plotly is not installed (the message says how to install it).
    """
    if interactive:
        from homoglens.plotting_plotly import require_plotly

        require_plotly()


def report_job(
    opts: dict[str, Any],
    default_out: str,
    measure: Callable[[Any, Any], Any],
    write: Callable[..., object],
) -> None:
    """One measurement command: check ``--out``, load the model and windows, ``measure`` them,
    ``write`` the report into a staged folder (interactive with ``--interactive``), and print
    the result and the time."""
    from homoglens.assets import staged_output
    from homoglens.report import check_output_dir

    with cli_errors():
        folder = check_output_dir(opts["out"] or Path(default_out), overwrite=opts["overwrite"])
        check_interactive(opts["interactive"])
        start = time.perf_counter()
        model, windows = load_job(opts)
        result = measure(model, windows)
        with staged_output(folder) as tmp:
            write(result, tmp, interactive=opts["interactive"])
    click.echo(repr(result), err=True)
    click.echo(f"wrote {folder / 'report.html'} in {time.perf_counter() - start:.1f} s")


def run_profile(
    opts: dict[str, Any],
    *,
    modes: list[str] | None,
    default_out: str,
    ablation: dict[str, Any],
    sinks: bool = False,
    patching: bool = False,
    similarity: bool = False,
    bias: bool = False,
    massive: bool = False,
) -> None:
    """The profile / ablate commands: load, measure what the options ask for, write the
    report into a staged folder, and report the time (typed errors become CLI errors)."""
    from homoglens.architectures import find_architecture, hf_architecture_of
    from homoglens.assets import staged_output
    from homoglens.profile import homogenization_profile
    from homoglens.report import check_output_dir, write_profile_report
    from homoglens.studies import default_ablation_modes, position_ablation_study

    with cli_errors():
        folder = check_output_dir(opts["out"] or Path(default_out), overwrite=opts["overwrite"])
        check_interactive(opts["interactive"])
        start = time.perf_counter()
        model, windows = load_job(opts)
        common = {
            "batch_size": opts["batch_size"],
            "exclude_first": opts["exclude_first"],
            "effective_rank": opts["effective_rank"],
            "progress": opts["progress"],
        }
        timings: dict[str, float] = {}

        def timed(section: str, job: Callable[[], Any]) -> Any:
            begin = time.perf_counter()
            out = job()
            timings[section] = time.perf_counter() - begin
            return out

        timings["load"] = time.perf_counter() - start
        knows_positions = find_architecture(hf_architecture_of(model)) is not None
        if not knows_positions and (modes == [] or patching):
            click.echo(
                f"note: {hf_architecture_of(model)} is not in the architecture table, so the "
                "positional ablations and the patching between normal and position-ablated runs "
                "are left out (the profile, similarity and sinks need no table row)",
                err=True,
            )
            modes = None if modes == [] else modes
        study = None
        if modes is None:
            profile = timed("profile", lambda: homogenization_profile(model, windows, **common))
        else:
            chosen = modes or default_ablation_modes(model)
            study = timed(
                "profile + ablations",
                lambda: position_ablation_study(model, windows, modes=chosen, **ablation, **common),
            )
            profile = study.profiles["none"]
        sim = (
            timed("similarity", lambda: similarity_job(model, windows, opts))
            if similarity
            else None
        )
        readings = (
            timed("readings", lambda: readings_job(model, windows, opts)) if similarity else None
        )
        standardized = (
            timed("standardized", lambda: similarity_job(model, windows, opts, standardize=True))
            if similarity
            else None
        )
        dims_dropped = (
            timed(
                "dimensions dropped",
                lambda: similarity_job(model, windows, opts, drop_dims=DROP_DIMS),
            )
            if similarity
            else None
        )
        biased = (
            timed("attention bias", lambda: bias_job(
                model, windows, opts, kind="first", strengths=(-1.0, -0.25, 0.0, 0.25, 1.0),
                required=False,
            ))
            if bias
            else None
        )  # fmt: skip
        analysis = (
            timed("sinks", lambda: sinks_job(model, windows, opts, required=False))
            if sinks
            else None
        )
        massive_study = (
            timed("massive activations", lambda: massive_job(model, windows, opts))
            if massive
            else None
        )
        patched = (
            timed(
                "patching",
                lambda: [
                    patching_job(model, windows, opts),
                    patching_job(model, windows, opts, component="positions"),
                ],
            )
            if patching and knows_positions
            else None
        )
        with staged_output(folder) as tmp:
            write_profile_report(
                profile,
                tmp,
                edge_k=opts["edge_k"],
                study=study,
                sinks=analysis,
                patching=patched,
                similarity=sim,
                bias=biased,
                massive=massive_study,
                readings=readings,
                standardized=standardized,
                dims_dropped=dims_dropped,
                interactive=opts["interactive"],
            )
        report = folder / "report.html"
        timings["report"] = time.perf_counter() - start - sum(timings.values())
    click.echo(repr(study if study is not None else profile), err=True)
    click.echo(
        "time by section: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()), err=True
    )
    click.echo(f"wrote {report} in {time.perf_counter() - start:.1f} s")
