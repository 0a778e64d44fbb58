"""What the ``homoglens`` commands run: load the model and windows, run the measurements
the options ask for, and write the report (typed errors become one-line CLI errors).

The checks of ``--out`` live in :mod:`homoglens.cli.output`, the option limits in
:mod:`homoglens.cli.limits`, and the measurement of each report section in
:mod:`homoglens.cli.sections`."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
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

    from homoglens.core.errors import DistributedError

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


@contextlib.contextmanager
def collected_notes() -> Iterator[None]:
    """Hold back the warnings of a command's measurements and report (a bootstrap block lowered
    for a few windows, an interval left out for no spread, ...) and print each distinct one
    once at the end as a one-line ``note:`` on stderr, without the source path and line a
    plain warning shows; they are notes on the run's own defaults, not errors of the user's.
    Nothing is printed when the body raises (its error says what went wrong)."""
    with warnings.catch_warnings(record=True) as caught:
        yield
    seen: set[str] = set()
    for item in caught:
        text = str(item.message).removeprefix("homoglens: ")
        if text not in seen:
            seen.add(text)
            click.echo(f"note: {text}", err=True)


def _clock(seconds: float) -> str:
    """``seconds`` as ``m:ss`` (or ``h:mm:ss``)."""
    minutes, sec = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}" if hours else f"{minutes}:{sec:02d}"


class SectionClock:
    """The overall progress of the profile command: one stderr line as each section starts
    (``[k/n] name, elapsed, about ... left``), the time left estimated from the sections done
    so far, each weighed by its forward passes over windows (a rough cost model).

    Args:
        plan: ``(section, weight)`` in the order they run; the weight is the section's
            sequence-passes (windows x passes over them).
        start: ``time.perf_counter()`` at the command's start (elapsed counts from it).
        show: Whether to print (``--progress``).
    """

    def __init__(self, plan: list[tuple[str, float]], start: float, *, show: bool) -> None:
        self.plan = dict(plan)
        self.order = [name for name, _ in plan]
        self.start = start
        self.show = show
        self.spent = 0.0  # seconds inside the sections done
        self.done = 0.0  # their weight

    def begin(self, section: str) -> None:
        """Print the overall line of ``section`` (a section outside the plan prints nothing)."""
        if not self.show or section not in self.plan:
            return
        k = self.order.index(section) + 1
        elapsed = _clock(time.perf_counter() - self.start)
        line = f"[{k}/{len(self.order)}] {section}: {elapsed} elapsed"
        left = sum(self.plan[name] for name in self.order[k - 1 :])
        if self.done > 0 and self.spent > 0:
            line += f", about {_clock(self.spent / self.done * left)} left"
        else:
            line += " (time left known after this section)"
        click.echo(line, err=True)

    def end(self, section: str, seconds: float) -> None:
        """Record that ``section`` took ``seconds``."""
        if section in self.plan:
            self.spent += seconds
            self.done += self.plan[section]


def section_plan(
    opts: dict[str, Any],
    model: Any,
    n_windows: int,
    *,
    first: str,
    n_modes: int,
    sections: dict[str, bool],
) -> list[tuple[str, float]]:
    """The sections :func:`run_profile` will run, each with its rough cost in sequence-passes
    (for :class:`SectionClock`): ``first`` (the profile, ``n_modes`` passes), then the optional
    ones ``sections`` turns on, in :func:`_profile_sections`' order."""
    n = float(n_windows)
    n_layers = int(model.cfg.n_layers)
    blocks = len(set(range(0, n_layers, max(1, int(opts.get("patch_layer_step") or 1)))))
    bins = int(opts.get("patch_bins") or 1)
    patch_n = min(n, float(opts.get("patch_n_seq") or n))
    bias_n = min(n, float(opts.get("bias_n_seq") or n))
    massive_n = min(n, float(opts.get("massive_n_seq") or n))
    plan = [(first, n * max(1, n_modes))]
    if sections["similarity"]:
        plan += [("similarity", 2 * n), ("readings", 6 * n), ("standardized", 2 * n),
                 ("dimensions dropped", 3 * n)]  # fmt: skip
    if sections["bias"]:
        plan.append(("attention bias", 10 * bias_n))
    if sections["sinks"]:
        plan.append(("sinks", 2 * n))
    if sections["massive"]:
        plan.append(("massive activations", 3 * massive_n + 16))
    if sections["patching"]:
        plan.append(("patching", (blocks * (bins + 1) + 4) * patch_n))
    plan.append(("report", n))  # figures, tables and their bootstrap intervals
    return plan


def load_job(opts: dict[str, Any]) -> tuple[Any, Any]:
    """Load the model and cut the corpus windows the options ask for."""
    from homoglens.models.loading import load_model
    from homoglens.run.data import corpus_windows

    init_distributed(opts)

    if opts["device"] is not None:
        from homoglens.core.validate import check_device

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
        from homoglens.results.plotting_plotly import require_plotly

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
    from homoglens.models.assets import staged_output

    given_out = opts["out"] or Path(default_out)
    with cli_errors(given_out):
        folder = check_output(given_out, data_inputs(opts), overwrite=opts["overwrite"])
        check_options(opts, checks)
        check_interactive(opts["interactive"])
        start = time.perf_counter()
        model, windows = load_job(opts)
        with collected_notes():
            result = measure(model, windows)
            with staged_output(folder) as tmp:
                write(result, tmp, interactive=opts["interactive"])
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
    from homoglens.ablation.measure import default_ablation_modes, position_ablation_study
    from homoglens.models.architectures import find_architecture, hf_architecture_of
    from homoglens.models.assets import staged_output
    from homoglens.profile.measure import homogenization_profile
    from homoglens.report import write_profile_report

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
            clock.begin(section)
            begin = time.perf_counter()
            out = job()
            timings[section] = time.perf_counter() - begin
            clock.end(section, timings[section])
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
        chosen = (modes or default_ablation_modes(model)) if modes is not None else ["none"]
        first = "profile" if modes is None else "profile + ablations"
        plan = section_plan(
            opts, model, len(windows), first=first, n_modes=len(chosen),
            sections={"similarity": similarity, "bias": bias, "sinks": sinks, "massive": massive,
                      "patching": patching and knows_positions},
        )  # fmt: skip
        clock = SectionClock(plan, start, show=bool(opts["progress"]))
        with collected_notes():  # said once each, at the end, without source paths
            if modes is None:
                profile = timed("profile", lambda: homogenization_profile(model, windows, **common))
            else:
                study = timed(
                    first,
                    lambda: position_ablation_study(
                        model, windows, modes=chosen, **ablation, **common
                    ),
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
            clock.begin("report")
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
