"""What the ``homoglens`` commands run: load the model and windows, run the measurements
the options ask for, and write the report (typed errors become one-line CLI errors)."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
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


_CAUSES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: (
        "no space is left on that disk",
        "free some space there, or choose an --out on another disk",
    ),
    getattr(errno, "EDQUOT", -1): (
        "your disk quota there is used up",
        "free some space, or choose an --out on another disk",
    ),
    errno.EACCES: (
        "permission denied",
        "choose an --out in a folder you can write to, or give yourself write permission there",
    ),
    errno.EPERM: (
        "the operation is not permitted there",
        "choose an --out in an ordinary folder you can write to",
    ),
    errno.EROFS: ("the file system is read-only", "choose an --out on a writable disk"),
    errno.ENOENT: (
        "a folder on the path is missing, or the file system (such as /proc or /sys) does not "
        "allow creating files there",
        "choose an --out in an ordinary folder on disk",
    ),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "choose another --out"),
    errno.ENAMETOOLONG: ("the path is too long", "choose a shorter --out"),
    errno.EMFILE: (
        "this process has too many open files",
        "raise the open-file limit (ulimit -n) and run again",
    ),
    errno.EIO: (
        "the disk reported an input/output error",
        "check the disk (dmesg, fsck), or choose an --out on another disk",
    ),
}
"""What an ``errno`` of a failed write means, and how to fix it."""


def _is_output(path: str, out: Path | None) -> bool:
    """Whether ``path`` is ``out``, inside it, one of the folders above it (made for it), or one
    of its staged, probe or backup siblings (``.<out>.partial-*``, ``<out>.homoglens-backup-*``)."""
    if out is None:
        return False
    target = Path(path).expanduser().absolute()
    folder = Path(out).expanduser().absolute()
    if target == folder or folder in target.parents or target in folder.parents:
        return True
    if folder.parent not in target.parents:
        return False
    sibling = target.relative_to(folder.parent).parts[0]
    return sibling.lstrip(".").startswith(f"{folder.name}.")


def os_error_message(err: OSError, out: Path | None = None) -> str:
    """A one-line CLI error for a failed file operation: what failed (from ``errno``: no space,
    permission, read-only file system, ...), on which path, and how to fix it.

    Args:
        err: The error.
        out: The command's output folder: an error on it (or on its staged sibling) is a failed
            write of the output; any other is a failed read or write of that path.
    """
    name = errno.errorcode.get(err.errno or 0)
    detail = err.strerror or str(err)
    if name is not None:
        detail = f"{detail}, {name}"
    cause, fix = _CAUSES.get(err.errno or 0, ("", "choose another --out, or check that path"))
    cause = f"{cause} ({detail})" if cause else detail
    filename = getattr(err, "filename", None)
    if filename is None:
        return f"a file operation failed: {cause}; {fix}"
    if "homoglens-backup-" in str(filename):  # staged_output could not move it back
        return f"could not replace the output: {err.strerror or err}"
    if _is_output(str(filename), out):
        return (
            f"could not write the output ({filename}): {cause}; {fix} (nothing of this run is "
            "left behind; an existing --out is as it was)"
        )
    return f"could not read or write {filename}: {cause}; check that path and its permissions"


@contextlib.contextmanager
def cli_errors(out: Path | None = None) -> Iterator[None]:
    """Turn typed homoglens errors and failed file operations into one-line CLI errors (no
    traceback); ``out``, the output folder, tells failed writes of the output apart."""
    try:
        yield
    except HomoglensError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:  # a full disk, a read-only folder, no permission
        raise click.ClickException(os_error_message(err, out)) from err


def probe_output(folder: Path) -> None:
    """Fail now, before any work, when ``folder`` could not be written: create and remove a
    scratch folder in the nearest existing folder above it (where the staged output and its
    parents will be made). Nothing is left behind.

    Raises:
        OSError: that folder refuses new entries (no permission, read-only, /proc, no space).
    """
    from homoglens.distributed import is_main_process

    if not is_main_process():
        return
    base = Path(folder).expanduser().absolute().parent
    while not base.exists() and base != base.parent:
        base = base.parent
    try:
        scratch = tempfile.mkdtemp(prefix=f".{Path(folder).name}.probe-", dir=base)
    except OSError as err:
        if err.filename is None or "probe-" in str(err.filename):
            err.filename = str(folder)
        raise
    os.rmdir(scratch)


def model_inputs(name: str, option: str) -> list[tuple[str, Path]]:
    """The folders a ``--model``-like value reads: a local folder, a shipped model's folder in
    the package, the cache of converted embedded models, or the Hugging Face cache for a Hub
    name; each with the words that name it in an error."""
    from homoglens.assets import (
        EMBEDDED_MODELS,
        SHIPPED_MODELS,
        TRAINED_NAME,
        cache_dir,
        shipped_model_folder,
    )

    if name in SHIPPED_MODELS:
        try:
            return [(f"the shipped model {name} ({option})", shipped_model_folder(name))]
        except HomoglensError:  # the load says what is missing
            return []
    if name in EMBEDDED_MODELS:
        return [(f"the cache of converted models ({option} {name})", cache_dir() / "models")]
    path = Path(name).expanduser()
    if os.path.lexists(path):
        return [(f"the model folder given by {option}", path)]
    if TRAINED_NAME.fullmatch(name):  # a replicate's statistics, inside the package
        return []
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1:
        return []  # a missing folder: the load says so
    from huggingface_hub import constants

    return [(f"the Hugging Face cache ({option} {name})", Path(constants.HF_HUB_CACHE))]


def data_inputs(opts: dict[str, Any]) -> list[tuple[str, Path]]:
    """The files and folders the data options read: ``--model``, ``--text``, a ``--corpus``
    that is a path."""
    from homoglens.data import CORPORA

    found = model_inputs(opts["model"], "--model") if opts.get("model") else []
    if opts.get("text_file") is not None:
        found.append(("the text file given by --text", Path(opts["text_file"])))
    corpus = opts.get("corpus")
    if corpus is not None and corpus not in CORPORA and os.path.lexists(Path(corpus)):
        found.append(("the corpus given by --corpus", Path(corpus).expanduser()))
    return found


def check_out_is_no_input(folder: Path, inputs: Iterable[tuple[str, Path]]) -> None:
    """Refuse an ``--out`` that is, holds or is inside an input of the command (compared as
    resolved paths, symbolic links followed), before anything is written or deleted.

    Raises:
        InvalidInputError: ``folder`` and an input overlap; the message names both.
    """
    from homoglens.errors import InvalidInputError

    out = Path(folder).expanduser().resolve()
    for what, path in inputs:
        source = Path(path).expanduser().resolve()
        same = out == source or (out.exists() and source.exists() and os.path.samefile(out, source))
        if same:
            relation, harm = "is", "--overwrite would delete it"
        elif out in source.parents:
            relation, harm = "holds", "--overwrite would delete it"
        elif source in out.parents:
            relation, harm = "is inside", "the report would be written among its files"
        else:
            continue
        raise InvalidInputError(
            f"--out {str(folder)!r} {relation} {what} ({source}); {harm}. Choose an --out "
            "outside every input of the command"
        )


def check_output(out: Path, inputs: Iterable[tuple[str, Path]], *, overwrite: bool) -> Path:
    """Before any work, in this order: refuse an ``--out`` that overlaps an input (first, as
    no option lifts it: a model folder given as ``--out`` is said to be one, not merely "not
    empty"), then check the folder itself (:func:`~homoglens.report.check_output_dir`: a file,
    a protected folder, a non-empty one without ``--overwrite``), then that the output can be
    created where it goes (:func:`probe_output`).

    Returns:
        The output folder (``out`` with ``~`` expanded).

    Raises:
        InvalidInputError: ``out`` is, holds or is inside an input; or ``check_output_dir``
            refuses it.
        OSError: the folder that will hold ``out`` refuses new entries.
    """
    from homoglens.report import check_output_dir

    check_out_is_no_input(out, inputs)
    folder = check_output_dir(out, overwrite=overwrite)
    probe_output(folder)
    return folder


def given(name: str) -> bool:
    """Whether the user set the option ``name`` (on the command line or in the environment)
    rather than leaving its default; outside a click command, True."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return True
    source = ctx.get_parameter_source(name)
    return source not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def flag(name: str) -> str:
    """The command-line spelling of option ``name``: ``edge_k`` -> ``--edge-k``."""
    return "--" + name.replace("_", "-")


def fit(
    opts: dict[str, Any],
    name: str,
    limit: int,
    reason: str,
    section: str,
    *,
    required: bool = True,
    other: str = "",
) -> int:
    """The value of option ``name``, or ``limit`` when it is larger: refused when the user set
    it and ``section`` is what the command measures (``required``; the message gives the range
    and ``reason``), else said on stderr (once per message).

    Args:
        opts: The command's options.
        name: The option (``edge_k``).
        limit: The largest value that can be honoured here (>= 1).
        reason: Why, e.g. "windows of 16 tokens allow at most 7 positions per edge".
        section: What uses the value ("the sink attribution").
        required: Whether ``section`` is the command's measurement (False: a section of the
            profile report, which uses ``limit`` and says so).
        other: The other fix the refusal offers ("a longer --seq-len").

    Raises:
        InvalidInputError: the user set ``name`` above ``limit`` and ``required``.
    """
    from homoglens.errors import InvalidInputError

    value = int(opts[name])
    if value <= limit:
        return value
    chosen = given(name)
    if chosen and required:
        raise InvalidInputError(
            f"{flag(name)} {value} cannot be honoured: {reason}; give {flag(name)} between 1 "
            f"and {limit}" + (f", or {other}" if other else "")
        )
    note = (
        f"note: {section} uses {flag(name)} {limit}, not "
        f"{'the' if chosen else 'its default'} {value}: {reason}"
    )
    notes: set[str] = opts.setdefault("_notes", set())
    if note not in notes:
        notes.add(note)
        click.echo(note, err=True)
    return limit


def edge_limit(length: int, what: str = "tokens") -> tuple[int, str]:
    """The largest edge_k that windows of ``length`` ``what`` allow (2 middle positions), and
    the reason, for :func:`fit`."""
    limit = (length - 2) // 2
    return limit, (
        f"windows of {length} {what} allow at most {limit} positions per edge (and a middle of 2)"
    )


def check_options(opts: dict[str, Any], names: Iterable[str]) -> None:
    """Refuse, before any work, the options ``names`` the user set to values the command's
    windows cannot honour (``--edge-k`` over ``(--seq-len - 2) // 2``, ``--patch-bins`` over
    ``--seq-len``, a ``--*-n-seq`` over ``--n-seq``); defaults that do not fit are said on
    stderr where they are used.

    Raises:
        InvalidInputError: an option set above what the windows allow (the range is named).
    """
    n_seq, seq_len = int(opts["n_seq"]), int(opts["seq_len"])
    windows = (n_seq, f"there are {n_seq} windows (--n-seq)", "a larger --n-seq")
    n_ref = min(8, n_seq // 3)
    limits = {
        "edge_k": (*edge_limit(seq_len), "a longer --seq-len"),
        "patch_bins": (seq_len, f"windows have {seq_len} positions", "a longer --seq-len"),
        "patch_n_seq": windows,
        "sink_n_seq": windows,
        "bias_n_seq": windows,
        "gradient_windows": windows,
        "massive_n_seq": (
            n_seq - n_ref,
            f"{n_ref} of the {n_seq} windows (--n-seq) give the means, so {n_seq - n_ref} are "
            "left to measure",
            "a larger --n-seq",
        ),
    }
    for name in names:
        limit, reason, other = limits[name]
        if limit >= 1 and given(name):
            fit(opts, name, limit, reason, "", other=other)


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
    from homoglens.similarity import positional_similarity

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
    """The three readings of C2 against the causal null (the same tokens after a prefix of half
    the window, :func:`~homoglens.calibrated_readings`); ``None`` with a warning when the windows
    are unequal, padded or too short for the edges."""
    from homoglens.calibration import calibrated_readings

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
    return calibrated_readings(
        model, windows, reference="offset", offset=offset, edge_k=edge_k,
        batch_size=opts["batch_size"], progress=opts["progress"],
    )  # fmt: skip


def bias_job(model: Any, windows: Any, opts: dict[str, Any], **bias: Any) -> Any:
    """The attention-bias dose-response on the first ``--bias-n-seq`` windows (equal length);
    ``None`` with a warning when they are too few or too short for the edges (a section)."""
    from homoglens.bias import attention_bias_study

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
    from homoglens.errors import InvalidInputError
    from homoglens.studies import massive_ablation_study

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
