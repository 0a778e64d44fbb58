"""What the ``homoglens`` commands run: load the model and windows, run the measurements
the options ask for, and write the report (typed errors become one-line CLI errors).

The checks of ``--out`` live in :mod:`homoglens.cli.output`, the option limits in
:mod:`homoglens.cli.limits`, and the measurement of each report section in
:mod:`homoglens.cli.sections`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from homoglens.cli.limits import check_options, fit
from homoglens.cli.output import check_output, cli_errors, data_inputs
from homoglens.cli.sections import (
    bias_job,
    massive_job,
    patching_job,
    readings_job,
    similarity_job,
    sinks_job,
)

DROP_DIMS = 3
"""Dimensions of largest mean square the report's C1 correction zeroes in each layer (the
massive / rogue ones: a handful carry them, Timkey & van Schijndel 2021, Sun et al. 2024)."""


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
    checks: Iterable[str] = (),
) -> None:
    """One measurement command: check ``--out`` (never an input, writable) and the options
    ``checks`` (:func:`check_options`), load the model and windows, ``measure`` them, ``write``
    the report into a staged folder (interactive with ``--interactive``), and print the result
    and the time."""
    from homoglens.assets import staged_output

    given_out = opts["out"] or Path(default_out)
    with cli_errors(given_out):
        folder = check_output(given_out, data_inputs(opts), overwrite=opts["overwrite"])
        check_options(opts, checks)
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
    from homoglens.report import write_profile_report
    from homoglens.studies import default_ablation_modes, position_ablation_study

    given_out = opts["out"] or Path(default_out)
    with cli_errors(given_out):
        folder = check_output(given_out, data_inputs(opts), overwrite=opts["overwrite"])
        sections = {
            "sink_n_seq": sinks,
            "patch_n_seq": patching,
            "patch_bins": patching,
            "bias_n_seq": bias,
            "massive_n_seq": massive,
        }
        check_options(opts, ["edge_k", *(name for name, on in sections.items() if on)])
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
        counted = int((profile.count > 0).sum())
        if (counted - 1) // 2 >= 1:  # as the report's edge-versus-middle table cuts it
            fit(
                opts, "edge_k", (counted - 1) // 2,
                f"{counted} counted positions allow at most {(counted - 1) // 2} per edge",
                "the edge-versus-middle table", required=False,
            )  # fmt: skip
        found = _profile_sections(
            model, windows, opts, timed, sinks=sinks, patching=patching and knows_positions,
            similarity=similarity, bias=bias, massive=massive,
        )  # fmt: skip
        with staged_output(folder) as tmp:
            write_profile_report(
                profile,
                tmp,
                edge_k=opts["edge_k"],
                study=study,
                **found,
                interactive=opts["interactive"],
            )
        report = folder / "report.html"
        timings["report"] = time.perf_counter() - start - sum(timings.values())
    click.echo(repr(study if study is not None else profile), err=True)
    click.echo(
        "time by section: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()), err=True
    )
    click.echo(f"wrote {report} in {time.perf_counter() - start:.1f} s")


def _profile_sections(
    model: Any,
    windows: Any,
    opts: dict[str, Any],
    timed: Callable[[str, Callable[[], Any]], Any],
    *,
    sinks: bool,
    patching: bool,
    similarity: bool,
    bias: bool,
    massive: bool,
) -> dict[str, Any]:
    """The optional sections of the profile report, each measured (and timed by ``timed``)
    when its option is on, in this order: the position-resolved similarity, the calibrated
    readings, the standardised and the dimensions-dropped similarity, the attention bias, the
    sinks, the massive activations and the two patching sweeps; returned as the keyword
    arguments of :func:`~homoglens.report.write_profile_report` they fill (``None`` when off)."""
    sim = timed("similarity", lambda: similarity_job(model, windows, opts)) if similarity else None
    readings = timed("readings", lambda: readings_job(model, windows, opts)) if similarity else None
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
        timed("sinks", lambda: sinks_job(model, windows, opts, required=False)) if sinks else None
    )
    massive_study = (
        timed("massive activations", lambda: massive_job(model, windows, opts)) if massive else None
    )
    patched = (
        timed(
            "patching",
            lambda: [
                patching_job(model, windows, opts),
                patching_job(model, windows, opts, component="positions"),
            ],
        )
        if patching
        else None
    )
    return {
        "sinks": analysis,
        "patching": patched,
        "similarity": sim,
        "bias": biased,
        "massive": massive_study,
        "readings": readings,
        "standardized": standardized,
        "dims_dropped": dims_dropped,
    }
