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

import time
import warnings
from pathlib import Path
from typing import Any, cast

import click

from homoglens.cli.jobs import (
    bias_job,
    check_interactive,
    check_output,
    cli_errors,
    data_inputs,
    given,
    model_inputs,
    patching_job,
    report_job,
    run_profile,
    sinks_job,
)
from homoglens.cli.options import (
    BACKEND,
    INTERACTIVE,
    Group,
    block_option,
    choice,
    count,
    data_options,
    group,
    output_options,
    patch_options,
    profile_options,
    seed_option,
    sink_options,
    switch,
)
from homoglens.types import (
    Centring,
    GroupBy,
    PatchComponent,
    PatchDirection,
    PatchMetric,
    PositionAblation,
)

__all__ = ["main"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="homoglens")
def main() -> None:
    """Measure token homogenization under positional bias on TransformerLens models."""


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
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise click.BadParameter(f"{name} must be comma-separated numbers ({err})") from err
    if not values:
        raise click.BadParameter(f"{name} is empty")
    return values


def _ints(name: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise click.BadParameter(f"{name} must be comma-separated integers ({err})") from err
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
    from homoglens.lengths import length_study
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


@main.command()
@choice(
    "--variant",
    ["all", "learned", "rotary", "none"],
    "Positional scheme (all: the three, one after the other).",
)
@count("--steps", 3000, "Optimizer steps.")
@count("--n-layers", 4, "Transformer blocks.")
@count("--d-model", 128, "Residual stream width (d_model).", min=8)
@count("--n-heads", 4, "Attention heads per block (must divide --d-model).")
@count(  # the upper bounds are training.MAX_N_CTX and MAX_VOCAB_SIZE (import-free here)
    "--n-ctx", 128, "Context length (tokens per training window).", min=8, max=4096
)
@count("--vocab-size", 4096, "BPE vocabulary trained on the training novels.", min=260, max=65536)
@count("--batch-size", 16, "Training windows per optimizer step.")
@count(
    "--seed", 0, "Seed of initialisation and data order (one training seed = one replicate).", min=0
)
@switch(
    "--bos/--no-bos",
    "Start every training window with <|endoftext|> (a fixed first token, where sinks form).",
    default=False,
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("homoglens-models"),
    show_default=True,
    help="Parent folder; each run goes into tiny-<variant>[-bos][-s<seed>]/.",
)
@count(
    "--save-every",
    0,
    "Also keep a checkpoint every N steps and one of the initialisation, in "
    "<run>/checkpoints/step<N>/ (0: none).",
    min=0,
)
@click.option(
    "--save-steps",
    default=None,
    metavar="N,N,...",
    help="Also keep checkpoints after exactly these steps (e.g. log-spaced: 0,30,100,300,1000).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an older run of the same name in --out (refused without it).",
)
@switch("--progress/--no-progress", "Show progress bars on stderr.")
def train(
    variant: str,
    out: Path,
    progress: bool,
    save_every: int,
    save_steps: str | None,
    overwrite: bool,
    **sizes: Any,
) -> None:
    """Train small causal LMs on Austen (Sense and Sensibility held out) that differ only in
    their positional scheme: learned (GPT-2), rotary (GPT-NeoX, sequential), none (GPT-2, no
    positions). Deterministic from --seed; each folder is a standard Hugging Face model."""
    from homoglens.results import prepare_folder
    from homoglens.training import (
        POSITIONAL_VARIANTS,
        TrainingConfig,
        checkpoint_steps,
        train_model,
    )

    existed = True
    try:
        with cli_errors():
            variants = POSITIONAL_VARIANTS if variant == "all" else (variant,)
            configs = [TrainingConfig(variant=v, **sizes) for v in variants]  # bad sizes
            try:
                steps = [int(v) for v in (save_steps or "").split(",") if v.strip()]
            except ValueError as err:
                raise click.BadParameter(
                    f"--save-steps must be comma-separated step numbers ({err})"
                ) from err
            checkpoint_steps(configs[0].steps, save_every, steps)  # bad steps, before training
            older = [c.name for c in configs if (out / c.name).exists()]
            if older and not overwrite:  # a run folder is replaced whole: never without a word
                raise click.UsageError(
                    f"{out} already holds {', '.join(older)}; pass --overwrite to replace "
                    "(the older run is kept until the new one is saved), or choose another --out"
                )
            existed = out.exists()
            prepare_folder(out)  # a file in the way is an error before any training
            for config in configs:
                record = train_model(
                    config,
                    out / config.name,
                    overwrite=overwrite,
                    save_every=save_every,
                    save_steps=steps,
                    progress=progress,
                )
                click.echo(
                    f"{config.name}: held-out loss {record['heldout_loss']:.3f} nats/token "
                    f"(unigram entropy {record['heldout_unigram_entropy']:.3f}) in "
                    f"{record['wall_seconds']:.0f} s -> {out / config.name}"
                )
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
@choice(
    "--group-by",
    ["auto", "variant", "none"],
    "variant: labels of one positional scheme are seeds of one model (auto: when some "
    "scheme has several).",
)
@BACKEND
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
@count("--edge-k", 8, "Positions per edge in the edge-versus-middle tables.")
@choice(
    "--centre",
    ["position", "global", "none"],
    "Corpus centring of the positional-similarity statistics.",
)
@click.option("--eps", type=float, default=0.3, show_default=True, help="Sink threshold.")
@count("--n-boot", 1000, "Bootstrap resamples.")
@block_option()
@click.option(
    "--sesoi",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Smallest effect size of interest (cosine); default: a tenth of each statistic's scale.",
)
@seed_option("Bootstrap seed.")
@count("--batch-size", 16, "Windows per forward pass (memory, not results).")
@group(*output_options(Path("homoglens-comparison")))
@INTERACTIVE
@switch("--progress/--no-progress", "Show progress bars on stderr.")
def compare(
    models: str | None,
    bos: bool,
    group_by: str,
    centre: str,
    corpus: str | None,
    modes: str,
    out: Path,
    overwrite: bool,
    interactive: bool,
    **opts: Any,
) -> None:
    """Compare models that differ in their positional scheme (default: the shipped tiny models,
    three training seeds per scheme) on the same windows: loss, homogenization, edges, sinks,
    ablations, and claims C1-C3 as pre-declared, Holm-adjusted tests."""
    from homoglens.assets import SHIPPED_MODELS, staged_output
    from homoglens.comparison import REPLICATED_MODELS, compare_models
    from homoglens.report import write_comparison_report

    if models is None:
        default = [m for m in SHIPPED_MODELS if m.endswith("-bos")] if bos else REPLICATED_MODELS
        names = list(default)
    else:
        names = [m.strip() for m in models.split(",") if m.strip()]
    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    if not names or not chosen:
        raise click.BadParameter("--models and --modes must name at least one entry each")
    with cli_errors(out):
        inputs = [found for name in names for found in model_inputs(name, "--models")]
        folder = check_output(out, [*inputs, *data_inputs({"corpus": corpus})], overwrite=overwrite)
        check_interactive(interactive)
        start = time.perf_counter()
        result = compare_models(
            names,
            corpus,
            modes=chosen,
            group_by=None if group_by == "none" else cast(GroupBy, group_by),
            centre=None if centre == "none" else cast(Centring, centre),
            **opts,
        )
        with staged_output(folder) as tmp:
            write_comparison_report(result, tmp, interactive=interactive)
    with warnings.catch_warnings():  # the report's claims() already gave these of this table
        for message in (
            r"\d+ windows are too few for an interval",  # stats.estimate: --n-seq below 4
            r"homoglens: block=\d+ makes fewer than 4 blocks",  # stats.estimate: --block too long
            "the C2 and C3 rows compare retrained models",  # claims.claims_table: one seed each
        ):
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        claims = result.claims()
    click.echo(repr(result), err=True)
    for row in claims[claims["primary"]].itertuples():
        click.echo(
            f"{row.claim} {row.verdict:>12}  p_holm={row.p_holm:.3g}  {row.model}: {row.test}",
            err=True,
        )
    click.echo(f"wrote {folder / 'report.html'} in {time.perf_counter() - start:.1f} s")


@main.command()
@click.option(
    "--checkpoints",
    default="homoglens/tiny-rotary-bos",
    show_default=True,
    help="A run folder written by `homoglens train --save-every` (or --save-steps), a shipped "
    "model with checkpoints, or comma-separated model folders; with --hub-model, "
    "comma-separated revisions (step1000,...) or TransformerLens checkpoint indices.",
)
@click.option(
    "--hub-model",
    default=None,
    help="A Hub model whose training checkpoints --checkpoints names (EleutherAI/pythia-70m).",
)
@click.option(
    "--measure",
    default="homogenization,sinks,loss",
    show_default=True,
    help="Comma-separated measurements: homogenization, sinks, loss.",
)
@BACKEND
@click.option("--corpus", default="austen", show_default=True, help="Vendored corpus name.")
@click.option(
    "--text",
    "text_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Use this UTF-8 text file instead of --corpus.",
)
@count("--n-seq", 32, "Number of token windows (the same for every checkpoint).")
@count("--seq-len", 128, "Tokens per window (a BOS counts inside it).", min=2)
@choice("--bos", ["auto", "always", "never"], "BOS at position 0 ('auto': the model's default).")
@count("--batch-size", 8, "Windows per forward pass (memory and speed, not results).")
@click.option("--device", default=None, help="Torch device (default: cuda if available).")
@group(*output_options(Path("homoglens-sweep")))
@switch("--progress/--no-progress", "Show progress bars on stderr.")
def sweep(
    checkpoints: str,
    hub_model: str | None,
    measure: str,
    out: Path,
    overwrite: bool,
    progress: bool,
    **opts: Any,
) -> None:
    """Measure the same windows at each training checkpoint of one model (sink rate,
    homogenization, loss against the training step); writes sweep.csv, sweep.png and the
    result (CheckpointSweep.load)."""
    from homoglens.assets import SHIPPED_MODELS, checkpoint_folders, staged_output
    from homoglens.data import corpus_windows
    from homoglens.models import load_model
    from homoglens.sweeps import SWEEP_MEASURES, over_checkpoints

    names = [m.strip() for m in measure.split(",") if m.strip()]
    items = [c.strip() for c in checkpoints.split(",") if c.strip()]
    if not names or not items:
        raise click.BadParameter("--measure and --checkpoints must name at least one entry each")
    unknown = [n for n in names if n not in SWEEP_MEASURES]
    if unknown:  # before --out, the models and the windows are checked
        raise click.BadParameter(
            f"--measure {', '.join(unknown)} unknown; give one or more of "
            f"{','.join(SWEEP_MEASURES)}"
        )
    with cli_errors(out):
        sources = (
            [("--hub-model", hub_model)] if hub_model else [("--checkpoints", i) for i in items]
        )
        inputs = [found for option, name in sources for found in model_inputs(name, option)]
        folder = check_output(out, [*inputs, *data_inputs(opts)], overwrite=overwrite)
        start = time.perf_counter()
        plan: Any
        if hub_model is not None:
            plan = [int(i) if i.lstrip("-").isdigit() else i for i in items]
            first = load_model(
                hub_model,
                backend=opts["backend"],
                device=opts["device"],
                **(
                    {"checkpoint_index": plan[0]}
                    if isinstance(plan[0], int)
                    else {"revision": plan[0]}
                ),
            )
        else:
            run = items[0] in SHIPPED_MODELS or (Path(items[0]) / "checkpoints").is_dir()
            plan = items[0] if len(items) == 1 and run else items
            firsts = checkpoint_folders(plan) if isinstance(plan, str) else items
            first = load_model(firsts[0], backend=opts["backend"], device=opts["device"])
        source = opts["text_file"] if opts["text_file"] is not None else opts["corpus"]
        windows = corpus_windows(
            first, source, n_seq=opts["n_seq"], seq_len=opts["seq_len"], bos=opts["bos"]
        )
        del first
        result = over_checkpoints(
            names,
            plan,
            windows,
            model=hub_model,
            backend=opts["backend"],
            device=opts["device"],
            batch_size=opts["batch_size"],
            progress=progress,
        )
        with staged_output(folder) as tmp:
            result.save(tmp)
            result.to_pandas().to_csv(tmp / "sweep.csv", index=False)
            result.plot().savefig(tmp / "sweep.png", dpi=120)
    click.echo(repr(result), err=True)
    frame = result.to_pandas()
    table = frame[frame["layer"].isna()].pivot(index="step", columns="metric", values="value")
    click.echo(table.to_string(float_format=lambda v: f"{v:.4g}"), err=True)
    click.echo(f"wrote {folder} in {time.perf_counter() - start:.1f} s")
