"""The ``homoglens`` command.

    homoglens profile --model smollm2-135m-instruct --corpus austen --n-seq 64 --seq-len 256 \\
        --out homoglens-report
    homoglens ablate --modes none,zero,permute --out ablation-report
    homoglens sinks --sink-top-k 4 --out sinks-report
    homoglens patch --component head --metrics mean_pairwise,loss --out patching-report
    homoglens compare --out comparison-report
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from homoglens.errors import HomoglensError

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="homoglens")
def main() -> None:
    """Measure token homogenization under positional bias on TransformerLens models."""


def _data_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every command that profiles a model on a corpus."""
    options = [
        click.option(
            "--model",
            default="smollm2-135m-instruct",
            show_default=True,
            help="Embedded model name, local Hugging Face folder, or TL model name.",
        ),
        click.option(
            "--backend",
            type=click.Choice(["auto", "hooked", "bridge"]),
            default="auto",
            show_default=True,
            help="HookedTransformer (TL < 4) or TransformerBridge.",
        ),
        click.option("--corpus", default="austen", show_default=True, help="Vendored corpus name."),
        click.option(
            "--text",
            "text_file",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=None,
            help="Use this UTF-8 text file instead of --corpus.",
        ),
        click.option(
            "--n-seq",
            type=click.IntRange(min=1),
            default=64,
            show_default=True,
            help="Number of token windows.",
        ),
        click.option(
            "--seq-len",
            type=click.IntRange(min=2),
            default=256,
            show_default=True,
            help="Tokens per window (a BOS counts inside it).",
        ),
        click.option(
            "--bos",
            type=click.Choice(["auto", "always", "never"]),
            default="auto",
            show_default=True,
            help="BOS at position 0 ('auto': the model's default).",
        ),
        click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True),
        click.option(
            "--process-weights",
            is_flag=True,
            help="Apply TransformerLens weight processing (changes every cosine).",
        ),
        click.option("--device", default=None, help="Torch device (default: cuda if available)."),
        click.option(
            "--edge-k",
            type=click.IntRange(min=1),
            default=8,
            show_default=True,
            help="Positions per edge in the edge-versus-middle tables.",
        ),
        click.option(
            "--out",
            type=click.Path(path_type=Path),
            default=None,
            help="Output folder (must be empty or absent).",
        ),
        click.option(
            "--overwrite", is_flag=True, help="Replace the contents of a non-empty --out."
        ),
        click.option("--progress/--no-progress", default=True, show_default=True),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def _profile_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the homogenization profile."""
    options = [
        click.option(
            "--exclude-first", is_flag=True, help="Leave position 0 out of every statistic."
        ),
        click.option(
            "--effective-rank/--no-effective-rank",
            default=True,
            show_default=True,
            help="Also compute the effective rank per layer.",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def _sink_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the attention-sink analysis."""
    options = [
        click.option(
            "--sink-top-k",
            type=click.IntRange(min=1),
            default=3,
            show_default=True,
            help="Sink heads (by mass) for the exact attribution.",
        ),
        click.option(
            "--sink-n-seq",
            type=click.IntRange(min=1),
            default=16,
            show_default=True,
            help="Windows used by the sink attributions (each costs several passes).",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def _patch_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the positional patching sweep."""
    options = [
        click.option(
            "--patch-n-seq",
            type=click.IntRange(min=1),
            default=4,
            show_default=True,
            help="Windows used by the patching sweep (each cell is a forward pass over them).",
        ),
        click.option(
            "--patch-bins",
            type=click.IntRange(min=1),
            default=8,
            show_default=True,
            help="Position bins of the patching sweep.",
        ),
        click.option(
            "--patch-layer-step",
            type=click.IntRange(min=1),
            default=3,
            show_default=True,
            help="Patch every k-th block (and the last).",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def _patching(
    model: Any,
    windows: Any,
    opts: dict[str, Any],
    *,
    how: str = "zero",
    component: str = "resid_pre",
    metrics: tuple[str, ...] = ("mean_pairwise", "loss"),
    direction: str = "restore",
) -> Any:
    from homoglens.architectures import architecture_of
    from homoglens.patching import positional_patching

    n_layers = int(model.cfg.n_layers)
    layers = sorted(set(range(0, n_layers, opts["patch_layer_step"])) | {n_layers - 1})
    if component == "positions":  # one pass per block: cheap, so every block
        learned = architecture_of(model).positional == "learned_absolute"
        layers = [0] if learned else list(range(n_layers))
    subset = windows[: opts["patch_n_seq"]]
    shortest = int(subset.lengths.min())
    bins = min(opts["patch_bins"], shortest)
    edge_k = min(opts["edge_k"], (shortest - 2) // 2)
    if edge_k < 1 and any(m in ("first_excess", "last_excess") for m in metrics):
        raise click.BadParameter(f"windows of {shortest} tokens are too short for edge metrics")
    cells = {"head": int(model.cfg.n_heads), "positions": 1}.get(component, bins)
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


def _os_error(err: OSError) -> str:
    where = f" ({err.filename})" if getattr(err, "filename", None) else ""
    return (
        f"could not write the output{where}: {err.strerror or err}; free some space or choose "
        "another --out (nothing was left half-written)"
    )


def _init_distributed(opts: dict[str, Any]) -> None:
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


def _load(opts: dict[str, Any]) -> tuple[Any, Any]:
    """Load the model and cut the corpus windows the options ask for."""
    from homoglens.data import corpus_windows
    from homoglens.models import load_model

    _init_distributed(opts)

    if opts["device"] is not None:
        from homoglens.models import _check_device

        _check_device(opts["device"])
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


def _sinks(model: Any, windows: Any, opts: dict[str, Any], *, required: bool) -> Any:
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


def _similarity(model: Any, windows: Any, opts: dict[str, Any]) -> Any:
    """The position-resolved section (centred by position, with pseudo-values: three passes);
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
        centre="position",
        pseudo_values=True,
        batch_size=opts["batch_size"],
        progress=opts["progress"],
    )


def _run(
    opts: dict[str, Any],
    *,
    modes: list[str] | None,
    default_out: str,
    ablation: dict[str, Any],
    sinks: bool = False,
    patching: bool = False,
    similarity: bool = False,
) -> None:
    from homoglens.profile import homogenization_profile
    from homoglens.report import check_output_dir, staged_output, write_profile_report
    from homoglens.studies import default_ablation_modes, position_ablation_study

    try:
        folder = check_output_dir(opts["out"] or Path(default_out), overwrite=opts["overwrite"])
        start = time.perf_counter()
        model, windows = _load(opts)
        common = {
            "batch_size": opts["batch_size"],
            "exclude_first": opts["exclude_first"],
            "effective_rank": opts["effective_rank"],
            "progress": opts["progress"],
        }
        study = None
        if modes is None:
            profile = homogenization_profile(model, windows, **common)
        else:
            study = position_ablation_study(
                model, windows, modes=modes or default_ablation_modes(model), **ablation, **common
            )
            profile = study.profiles["none"]
        sim = _similarity(model, windows, opts) if similarity else None
        analysis = _sinks(model, windows, opts, required=False) if sinks else None
        patched = (
            [
                _patching(model, windows, opts),
                _patching(model, windows, opts, component="positions"),
            ]
            if patching
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
            )
        report = folder / "report.html"
    except HomoglensError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:  # a full disk, a read-only folder: say so, no traceback
        raise click.ClickException(_os_error(err)) from err
    click.echo(repr(study if study is not None else profile), err=True)
    click.echo(f"wrote {report} in {time.perf_counter() - start:.1f} s")


@main.command()
@_data_options
@_profile_options
@click.option(
    "--ablation/--no-ablation",
    default=True,
    show_default=True,
    help="Add the positional-ablation section (the model's default modes).",
)
@click.option(
    "--sinks/--no-sinks",
    default=True,
    show_default=True,
    help="Add the attention-sink section (scores, massive activations, attribution).",
)
@_sink_options
@click.option(
    "--patching/--no-patching",
    default=True,
    show_default=True,
    help="Add the patching section (restore the normal run into the position-ablated one).",
)
@_patch_options
@click.option(
    "--similarity/--no-similarity",
    default=True,
    show_default=True,
    help="Add the position-resolved section (M / W matrices, matched edge excess, SP).",
)
def profile(ablation: bool, sinks: bool, patching: bool, similarity: bool, **opts: Any) -> None:
    """Profile homogenization on a corpus and write a report (HTML, PNG, safetensors, CSV).

    With --ablation (default) the report also compares the model's default positional
    ablations (learned: none, zero, permute, shift; rotary: none, zero, permute) on the same
    windows: homogenization by layer and next-token loss, with bootstrap CIs. With --sinks
    (default) it adds attention-sink scores, massive activations, and the attribution of
    homogenization to the sink heads (fast for all heads, exact for the top --sink-top-k on
    the first --sink-n-seq windows). With --patching (default) it adds a coarse activation
    patching sweep (residual stream of every --patch-layer-step-th block x --patch-bins
    position bins, normal run restored into the 'zero'-ablated one, on --patch-n-seq windows);
    the full sweep is `homoglens patch`. With --similarity (default) it adds the
    position-resolved section: within- and cross-window similarity matrices of a late layer,
    the naive and the distance-matched edge excess with block-bootstrap intervals, and SP.
    """
    _run(
        opts,
        modes=[] if ablation else None,
        default_out="homoglens-report",
        ablation={"seed": 0, "shift": 1},
        sinks=sinks,
        patching=patching,
        similarity=similarity,
    )


@main.command()
@_data_options
@_sink_options
def sinks(**opts: Any) -> None:
    """Find attention sinks and massive activations, attribute homogenization to the sink
    heads (fast for all heads, exact for the top ones), and write a report."""
    from homoglens.report import check_output_dir, staged_output, write_sinks_report

    try:
        folder = check_output_dir(
            opts["out"] or Path("homoglens-sinks"), overwrite=opts["overwrite"]
        )
        start = time.perf_counter()
        model, windows = _load(opts)
        analysis = _sinks(model, windows, opts, required=True)
        with staged_output(folder) as tmp:
            write_sinks_report(analysis, tmp)
    except HomoglensError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:  # a full disk, a read-only folder: say so, no traceback
        raise click.ClickException(_os_error(err)) from err
    click.echo(repr(analysis), err=True)
    click.echo(f"wrote {folder / 'report.html'} in {time.perf_counter() - start:.1f} s")


@main.command()
@_data_options
@click.option(
    "--how",
    type=click.Choice(["zero", "permute", "shift", "mean"]),
    default="zero",
    show_default=True,
    help="Positional ablation of the ablated run.",
)
@click.option(
    "--component",
    type=click.Choice(["resid_pre", "resid_mid", "attn_out", "mlp_out", "head", "positions"]),
    default="resid_pre",
    show_default=True,
)
@click.option(
    "--metrics",
    default="mean_pairwise,loss",
    show_default=True,
    help="Comma-separated from mean_pairwise,first_excess,last_excess,loss.",
)
@click.option(
    "--direction", type=click.Choice(["restore", "break"]), default="restore", show_default=True
)
@_patch_options
def patch(how: str, component: str, metrics: str, direction: str, **opts: Any) -> None:
    """Activation patching between the normal and the position-ablated run (layer x position
    bin, or layer x head), and a report with one heatmap per metric."""
    from homoglens.report import check_output_dir, staged_output, write_patching_report

    names = tuple(m.strip() for m in metrics.split(",") if m.strip())
    try:
        folder = check_output_dir(
            opts["out"] or Path("homoglens-patching"), overwrite=opts["overwrite"]
        )
        start = time.perf_counter()
        model, windows = _load(opts)
        result = _patching(
            model, windows, opts, how=how, component=component, metrics=names, direction=direction
        )
        with staged_output(folder) as tmp:
            write_patching_report(result, tmp)
    except HomoglensError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:  # a full disk, a read-only folder: say so, no traceback
        raise click.ClickException(_os_error(err)) from err
    click.echo(repr(result), err=True)
    click.echo(f"wrote {folder / 'report.html'} in {time.perf_counter() - start:.1f} s")


@main.command()
@_data_options
@_profile_options
@click.option(
    "--modes",
    default=None,
    help="Comma-separated ablations from none,zero,permute,shift,mean "
    "(default: the model's default modes).",
)
@click.option(
    "--positions", default=None, help="Comma-separated positions to ablate (default: all)."
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**63 - 1),
    default=0,
    show_default=True,
    help="Permutation seed.",
)
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
    _run(
        opts,
        modes=chosen,
        default_out="homoglens-ablation",
        ablation={"seed": seed, "shift": shift, "positions": where},
    )


@main.command()
@click.option(
    "--variant",
    type=click.Choice(["learned", "rotary", "none", "all"]),
    default="all",
    show_default=True,
    help="Positional scheme (all: the three, one after the other).",
)
@click.option("--steps", type=click.IntRange(min=1), default=3000, show_default=True)
@click.option("--n-layers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--d-model", type=click.IntRange(min=8), default=128, show_default=True)
@click.option("--n-heads", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--n-ctx", type=click.IntRange(min=8), default=128, show_default=True)
@click.option("--vocab-size", type=click.IntRange(min=260), default=4096, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of initialisation and data order (one training seed = one replicate).",
)
@click.option(
    "--bos/--no-bos",
    default=False,
    show_default=True,
    help="Start every training window with <|endoftext|> (a fixed first token, where sinks form).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("homoglens-models"),
    show_default=True,
    help="Parent folder; each run goes into tiny-<variant>[-bos][-s<seed>]/.",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
def train(variant: str, out: Path, progress: bool, **sizes: Any) -> None:
    """Train small causal LMs on Austen (Sense and Sensibility held out) that differ only in
    their positional scheme: learned (GPT-2), rotary (GPT-NeoX, sequential), none (GPT-2, no
    positions). Deterministic from --seed; each folder is a standard Hugging Face model."""
    from homoglens.results import prepare_folder
    from homoglens.training import POSITIONAL_VARIANTS, TrainingConfig, train_model

    existed = True
    try:
        variants = POSITIONAL_VARIANTS if variant == "all" else (variant,)
        configs = [TrainingConfig(variant=v, **sizes) for v in variants]  # bad sizes: no folder
        existed = out.exists()
        prepare_folder(out)  # a file in the way is an error before any training
        for config in configs:
            record = train_model(config, out / config.name, progress=progress)
            click.echo(
                f"{config.name}: held-out loss {record['heldout_loss']:.3f} nats/token "
                f"(unigram entropy {record['heldout_unigram_entropy']:.3f}) in "
                f"{record['wall_seconds']:.0f} s -> {out / config.name}"
            )
    except HomoglensError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:  # a full disk, a read-only folder: say so, no traceback
        raise click.ClickException(_os_error(err)) from err
    finally:  # a run that failed or was interrupted leaves no empty folder it made
        if not existed and out.is_dir() and not any(out.iterdir()):
            out.rmdir()


@main.command()
@click.option(
    "--models",
    default=None,
    help="Comma-separated model names or folders sharing one tokenizer (default: the three "
    "positional schemes over three training seeds each; --bos: the BOS-trained models).",
)
@click.option(
    "--bos",
    is_flag=True,
    help="Compare the shipped BOS-trained models (one seed each) on windows that start with "
    "<|endoftext|>.",
)
@click.option(
    "--group-by",
    type=click.Choice(["auto", "variant", "none"]),
    default="auto",
    show_default=True,
    help="variant: labels of one positional scheme are seeds of one model (auto: when some "
    "scheme has several).",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "hooked", "bridge"]),
    default="auto",
    show_default=True,
    help="HookedTransformer (TL < 4) or TransformerBridge.",
)
@click.option(
    "--corpus",
    default=None,
    help="Corpus name or text file (default: the held-out novel tokenized as in training).",
)
@click.option(
    "--n-seq",
    type=click.IntRange(min=1),
    default=None,
    help="Windows (default: every window of the held-out novel; 64 for a corpus).",
)
@click.option("--seq-len", type=click.IntRange(min=2), default=None, help="Default: n_ctx.")
@click.option(
    "--modes", default="none,zero,permute", show_default=True, help="Positional ablations."
)
@click.option("--edge-k", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--centre",
    type=click.Choice(["position", "global", "none"]),
    default="position",
    show_default=True,
    help="Corpus centring of the positional-similarity statistics.",
)
@click.option("--eps", type=float, default=0.3, show_default=True, help="Sink threshold.")
@click.option("--n-boot", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option(
    "--block",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Consecutive windows per bootstrap block.",
)
@click.option(
    "--sesoi",
    type=click.FloatRange(min=0, min_open=True),
    default=0.01,
    show_default=True,
    help="Smallest effect size of interest (cosine).",
)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("homoglens-comparison"),
    show_default=True,
    help="Output folder (must be empty or absent).",
)
@click.option("--overwrite", is_flag=True, help="Replace the contents of a non-empty --out.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def compare(
    models: str | None,
    bos: bool,
    group_by: str,
    centre: str,
    corpus: str | None,
    modes: str,
    out: Path,
    overwrite: bool,
    **opts: Any,
) -> None:
    """Compare models that differ in their positional scheme (default: the shipped tiny models,
    three training seeds per scheme) on the same windows: loss, homogenization, edges, sinks,
    ablations, and claims C1-C3 as pre-declared, Holm-adjusted tests."""
    from homoglens.comparison import REPLICATED_MODELS, compare_models
    from homoglens.models import SHIPPED_MODELS
    from homoglens.report import check_output_dir, staged_output, write_comparison_report

    if models is None:
        default = [m for m in SHIPPED_MODELS if m.endswith("-bos")] if bos else REPLICATED_MODELS
        names = list(default)
    else:
        names = [m.strip() for m in models.split(",") if m.strip()]
    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    if not names or not chosen:
        raise click.BadParameter("--models and --modes must name at least one entry each")
    try:
        folder = check_output_dir(out, overwrite=overwrite)
        start = time.perf_counter()
        result = compare_models(
            names,
            corpus,
            modes=chosen,
            group_by=None if group_by == "none" else group_by,  # type: ignore[arg-type]
            centre=None if centre == "none" else centre,  # type: ignore[arg-type]
            **opts,
        )
        with staged_output(folder) as tmp:
            write_comparison_report(result, tmp)
    except HomoglensError as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:  # a full disk, a read-only folder: say so, no traceback
        raise click.ClickException(_os_error(err)) from err
    with warnings.catch_warnings():  # the report already warned about the same table
        warnings.simplefilter("ignore")
        claims = result.claims()
    click.echo(repr(result), err=True)
    for row in claims[claims["primary"]].itertuples():
        click.echo(
            f"{row.claim} {row.verdict:>12}  p_holm={row.p_holm:.3g}  {row.model}: {row.test}",
            err=True,
        )
    click.echo(f"wrote {folder / 'report.html'} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":  # pragma: no cover
    main()
