r"""The ``homoglens`` command.

homoglens profile --model smollm2-135m-instruct --corpus austen --n-seq 64 --seq-len 256 \\
        --out homoglens-report
homoglens ablate --modes none,zero,permute --out ablation-report
homoglens sinks --sink-top-k 4 --out sinks-report
homoglens patch --component head --metrics mean_pairwise,loss --out patching-report
homoglens compare --out comparison-report
homoglens bias --kind first --out bias-report
homoglens length --lengths 64,128,256,512 --out length-report
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from homoglens.cli.jobs import report_job, run_profile
from homoglens.cli.limits import given
from homoglens.cli.model_commands import compare, sweep, train
from homoglens.cli.options import (
    Group,
    choice,
    count,
    data_options,
    patch_options,
    profile_options,
    seed_option,
    sink_options,
    switch,
)
from homoglens.cli.sections import bias_job, patching_job, sinks_job
from homoglens.core.types import PatchComponent, PatchDirection, PatchMetric, PositionAblation

__all__ = ["main"]

_T = TypeVar("_T")


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="homoglens")
def main() -> None:
    """Measure token homogenization under positional bias on TransformerLens models."""


main.add_command(train)  # the commands over several models: homoglens.cli.model_commands
main.add_command(compare)
main.add_command(sweep)


@main.command()
@data_options
@profile_options
@switch(
    "--ablation/--no-ablation", "Add the positional-ablation section (the model's default modes)."
)
@switch(
    "--sinks/--no-sinks",
    "Add the attention-sink section (scores, massive activations, attribution).",
)
@sink_options
@switch(
    "--patching/--no-patching",
    "Add the patching section (restore the normal run into the position-ablated one).",
)
@patch_options(layer_step=10)
@switch(
    "--similarity/--no-similarity",
    "Add the position-resolved section (M / W matrices, matched edge excess, SP).",
)
@switch(
    "--bias/--no-bias",
    "Add the attention-bias section (first-key dose-response, b = -1 .. 1, on --bias-n-seq "
    "windows).",
)
@count("--bias-n-seq", 16, "Windows of the attention-bias section (5 passes over them).")
@switch(
    "--massive/--no-massive",
    "Add the massive-activation section (Sun et al.'s sites set to their mean or to zero: loss "
    "and homogenization).",
)
@count(
    "--massive-n-seq",
    16,
    "Windows measured by the massive-activation section (3 passes); the means come from up to "
    "8 other windows.",
)
def profile(
    ablation: bool,
    sinks: bool,
    patching: bool,
    similarity: bool,
    bias: bool,
    massive: bool,
    **opts: Any,
) -> None:
    """Profile homogenization on a corpus and write a report (HTML, PNG, safetensors, CSV).

    With --ablation (default) the report also compares the model's default positional
    ablations (learned: none, zero, permute, shift; rotary: none, zero, permute) on the same
    windows: homogenization by layer and next-token loss, with bootstrap CIs. With --sinks
    (default) it adds attention-sink scores, massive activations, and the attribution of
    homogenization to the sink heads (fast for all heads, exact for the top --sink-top-k on
    the first --sink-n-seq windows). With --patching (default) it adds a coarse activation
    patching sweep (residual stream of every --patch-layer-step-th block (default 10) x --patch-bins
    position bins, normal run restored into the 'zero'-ablated one, on --patch-n-seq windows);
    the full sweep is `homoglens patch`. With --similarity (default) it adds the
    position-resolved section: within- and cross-window similarity matrices of a late layer,
    the naive and the distance-matched edge excess with block-bootstrap intervals, and SP.
    With --bias (default) it adds a dose-response of attention biased toward the first key
    (b = -1, -0.25, 0, 0.25, 1 on the first --bias-n-seq windows): H_W, edges, loss and the
    manipulation checks, with the slope at zero; the full study is `homoglens bias`.
    With --massive (default) it finds the massive activations by Sun et al.'s rule and sets them
    to their mean (over other windows) or to zero: next-token loss and homogenization, paired.
    The report opens with a summary of the headline numbers and their intervals.
    """
    run_profile(
        opts,
        modes=[] if ablation else None,
        default_out="homoglens-report",
        ablation={"seed": 0, "shift": 1},
        sinks=sinks,
        patching=patching,
        similarity=similarity,
        bias=bias,
        massive=massive,
    )


def _floats(name: str, text: str) -> list[float]:
    return _separated(name, text, float, "numbers")


def _ints(name: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    return _separated(name, text, int, "integers")


def _separated(name: str, text: str, parse: Callable[[str], _T], what: str) -> list[_T]:
    """The comma-separated values of option ``name`` read by ``parse`` (``what`` they must be,
    for the message); none is an error."""
    try:
        values = [parse(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise click.BadParameter(f"{name} must be comma-separated {what} ({err})") from err
    if not values:
        raise click.BadParameter(f"{name} is empty")
    return values


@main.command()
@data_options
@choice(
    "--kind",
    ["first", "self", "recent", "alibi", "middle", "temperature"],
    "Bias direction phi (temperature: beta scales the scores).",
)
@click.option(
    "--strengths",
    default=None,
    help="Comma-separated b (beta for temperature); default -2,-1,-0.25,0,0.25,1,2 "
    "(temperature: 0.5,0.8,0.95,1,1.05,1.25,2).",
)
@count("--first-k", 1, "Keys counted as 'first'.")
@count("--window", 8, "Keys counted as 'recent'.")
@click.option("--layers", default=None, help="Comma-separated blocks to bias (default: all).")
@click.option("--heads", default=None, help="Comma-separated heads to bias (default: all).")
@switch(
    "--value-zero-first/--no-value-zero-first",
    "Also zero the first keys' value vectors in the biased heads (a control).",
    default=False,
)
@count("--gradient-windows", 0, "Windows differentiated at zero (forward-mode autograd).", min=0)
def bias(
    kind: str,
    strengths: str | None,
    first_k: int,
    window: int,
    layers: str | None,
    heads: str | None,
    value_zero_first: bool,
    gradient_windows: int,
    **opts: Any,
) -> None:
    """Dose-response of an attention bias toward (or away from) chosen keys: homogenization,
    edges, SP, loss and the manipulation checks at each strength, on the same windows, with the
    slope at zero; writes a report."""
    from homoglens.report import write_bias_report

    chosen = None if strengths is None else _floats("--strengths", strengths)
    options = {
        "kind": kind, "strengths": chosen, "first_k": first_k, "window": window,
        "layers": _ints("--layers", layers), "heads": _ints("--heads", heads),
        "value_zero_first": value_zero_first, "gradient_windows": gradient_windows,
    }  # fmt: skip
    opts["gradient_windows"] = gradient_windows
    report_job(
        opts,
        "homoglens-bias",
        lambda model, windows: bias_job(model, windows, opts, **options),
        write_bias_report,
        checks=("edge_k", "gradient_windows"),
    )


@main.command()
@data_options
@click.option(
    "--lengths",
    default="64,128,256",
    show_default=True,
    help="Comma-separated lengths T, ascending (the windows are cut at the longest; "
    "--seq-len is set to it).",
)
@click.option("--lags", default="1,4,16", show_default=True, help="Lags of M[p, p - lag].")
def length(lengths: str, lags: str, **opts: Any) -> None:
    """Similarity and attention over positions and sequence lengths, from one pass over windows
    of the longest length (each shorter length is a prefix); writes a report."""
    from homoglens.lengths.measure import length_study
    from homoglens.report import write_length_report

    chosen = _ints("--lengths", lengths) or []
    if given("seq_len") and opts["seq_len"] != max(chosen):
        raise click.BadParameter(
            f"--seq-len {opts['seq_len']} differs from the longest of --lengths ({max(chosen)}): "
            "the windows are cut at the longest length; leave --seq-len out, or add it to "
            "--lengths"
        )
    opts["seq_len"] = max(chosen)
    report_job(
        opts,
        "homoglens-length",
        lambda model, windows: length_study(
            model, windows, lengths=chosen, lags=_ints("--lags", lags) or [],
            edge_k=opts["edge_k"], batch_size=opts["batch_size"], progress=opts["progress"],
        ),
        write_length_report,
    )  # fmt: skip


@main.command()
@data_options
@sink_options
def sinks(**opts: Any) -> None:
    """Find attention sinks and massive activations, attribute homogenization to the sink
    heads (fast for all heads, exact for the top ones), and write a report."""
    from homoglens.report import write_sinks_report

    report_job(
        opts,
        "homoglens-sinks",
        lambda model, windows: sinks_job(model, windows, opts, required=True),
        write_sinks_report,
        checks=("edge_k", "sink_n_seq"),
    )


@main.command()
@data_options
@choice("--how", ["zero", "permute", "shift", "mean"], "Positional ablation of the ablated run.")
@choice(
    "--component",
    ["resid_pre", "resid_mid", "attn_out", "mlp_out", "head", "positions"],
    "What is patched: a residual-stream point or block output per position bin, the heads, "
    "or the positional information itself.",
)
@click.option(
    "--metrics",
    default="mean_pairwise,loss",
    show_default=True,
    help="Comma-separated from mean_pairwise,first_excess,last_excess,loss.",
)
@choice(
    "--direction",
    ["restore", "break"],
    "restore: normal activations into the ablated run; break: ablated into the normal run.",
)
@patch_options(layer_step=5)
def patch(
    how: PositionAblation,
    component: PatchComponent,
    metrics: str,
    direction: PatchDirection,
    **opts: Any,
) -> None:
    """Activation patching between the normal and the position-ablated run (layer x position
    bin, or layer x head), and a report with one heatmap per metric."""
    from homoglens.report import write_patching_report

    names = cast(
        "tuple[PatchMetric, ...]", tuple(m.strip() for m in metrics.split(",") if m.strip())
    )
    report_job(
        opts,
        "homoglens-patching",
        lambda model, windows: patching_job(
            model, windows, opts, how=how, component=component, metrics=names, direction=direction
        ),
        write_patching_report,
        checks=(
            "patch_n_seq",
            "patch_bins",
            *(("edge_k",) if {"first_excess", "last_excess"} & set(names) else ()),
        ),
    )


@main.command()
@data_options
@profile_options
@click.option(
    "--modes",
    default=None,
    help="Comma-separated ablations from none,zero,permute,shift,mean "
    "(default: the model's default modes).",
)
@click.option(
    "--positions", default=None, help="Comma-separated positions to ablate (default: all)."
)
@seed_option("Permutation seed.")
@click.option("--shift", type=int, default=1, show_default=True, help="Offset for 'shift'.")
def ablate(modes: str | None, positions: str | None, seed: int, shift: int, **opts: Any) -> None:
    """Run a positional-ablation study and write its report."""
    try:
        chosen = [m.strip() for m in modes.split(",") if m.strip()] if modes is not None else []
        if modes is not None and not chosen:
            raise click.BadParameter("--modes is empty; give e.g. --modes zero,permute")
        where = [int(p) for p in positions.split(",")] if positions else None
    except ValueError as err:
        raise click.BadParameter(f"--positions must be comma-separated ints ({err})") from err
    run_profile(
        opts,
        modes=chosen,
        default_out="homoglens-ablation",
        ablation={"seed": seed, "shift": shift, "positions": where},
    )
