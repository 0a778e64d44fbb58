"""The ``homoglens`` commands over several models rather than one model's windows: ``train``
(the small models that differ only in their positional scheme), ``compare`` (models on the same
windows, with the pre-declared claims) and ``sweep`` (one model's training checkpoints). The
group :func:`homoglens.cli.commands.main` adds them."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, cast

import click

from homoglens.cli.jobs import check_interactive
from homoglens.cli.options import (
    BACKEND,
    INTERACTIVE,
    Command,
    block_option,
    choice,
    count,
    group,
    output_options,
    seed_option,
    switch,
)
from homoglens.cli.output import check_output, cli_errors, data_inputs, model_inputs
from homoglens.core.types import Centring, GroupBy

__all__ = ["compare", "sweep", "train"]


@click.command(cls=Command)
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
    from homoglens.training.train import (
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


@click.command(cls=Command)
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
    from homoglens.comparison.measure import REPLICATED_MODELS, compare_models
    from homoglens.models.assets import SHIPPED_MODELS, staged_output
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
    for row in claims[claims["primary"]].itertuples():
        click.echo(
            f"{row.claim} {row.verdict:>12}  p_holm={row.p_holm:.3g}  {row.model}: {row.test}",
            err=True,
        )
    click.echo(f"wrote {folder / 'report.html'} in {time.perf_counter() - start:.1f} s")


@click.command(cls=Command)
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
    from homoglens.models.assets import SHIPPED_MODELS, checkpoint_folders, staged_output
    from homoglens.models.loading import load_model
    from homoglens.run.data import corpus_windows
    from homoglens.training.sweeps import SWEEP_MEASURES, over_checkpoints

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
    frame = result.to_pandas()
    table = frame[frame["layer"].isna()].pivot(index="step", columns="metric", values="value")
    click.echo(table.to_string(float_format=lambda v: f"{v:.4g}"), err=True)
    click.echo(f"wrote {folder} in {time.perf_counter() - start:.1f} s")
