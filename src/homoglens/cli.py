"""The ``homoglens`` command.

    homoglens profile --model smollm2-135m-instruct --corpus austen --n-seq 64 --seq-len 256 \\
        --out homoglens-report
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from homoglens.errors import HomoglensError

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="homoglens")
def main() -> None:
    """Measure token homogenization under positional bias on TransformerLens models."""


@main.command()
@click.option(
    "--model",
    default="smollm2-135m-instruct",
    show_default=True,
    help="Embedded model name, local Hugging Face folder, or TransformerLens name.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "hooked", "bridge"]),
    default="auto",
    show_default=True,
    help="HookedTransformer (TL < 4) or TransformerBridge.",
)
@click.option("--corpus", default="austen", show_default=True, help="Vendored corpus name.")
@click.option(
    "--text",
    "text_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Use this UTF-8 text file instead of --corpus.",
)
@click.option(
    "--n-seq",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Number of token windows.",
)
@click.option(
    "--seq-len",
    type=click.IntRange(min=2),
    default=256,
    show_default=True,
    help="Tokens per window (a BOS counts inside it).",
)
@click.option(
    "--bos",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="BOS at position 0 ('auto': the model's default).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--exclude-first", is_flag=True, help="Leave position 0 out of every statistic.")
@click.option(
    "--effective-rank/--no-effective-rank",
    default=True,
    show_default=True,
    help="Also compute the effective rank per layer.",
)
@click.option(
    "--process-weights",
    is_flag=True,
    help="Apply TransformerLens weight processing (changes every cosine).",
)
@click.option("--device", default=None, help="Torch device (default: cuda if available).")
@click.option(
    "--edge-k",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Positions per edge in the edge-versus-middle table.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("homoglens-report"),
    show_default=True,
    help="Output folder (must be empty or absent).",
)
@click.option("--overwrite", is_flag=True, help="Replace the contents of a non-empty --out.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def profile(
    model: str,
    backend: str,
    corpus: str,
    text_file: Path | None,
    n_seq: int,
    seq_len: int,
    bos: str,
    batch_size: int,
    exclude_first: bool,
    effective_rank: bool,
    process_weights: bool,
    device: str | None,
    edge_k: int,
    out: Path,
    overwrite: bool,
    progress: bool,
) -> None:
    """Profile homogenization on a corpus and write a report (HTML, PNG, safetensors, CSV)."""
    from homoglens.data import corpus_windows
    from homoglens.models import load_model
    from homoglens.profile import homogenization_profile
    from homoglens.report import prepare_output_dir, write_profile_report

    try:
        folder = prepare_output_dir(out, overwrite=overwrite)
        start = time.perf_counter()
        click.echo(f"loading {model} ({backend} backend) ...", err=True)
        lm = load_model(
            model,
            backend=backend,
            device=device,  # type: ignore[arg-type]
            process_weights=process_weights,
        )
        windows = corpus_windows(
            lm,
            text_file if text_file is not None else corpus,
            n_seq=n_seq,
            seq_len=seq_len,
            bos=bos,
        )  # type: ignore[arg-type]
        result = homogenization_profile(
            lm,
            windows,
            batch_size=batch_size,
            exclude_first=exclude_first,
            effective_rank=effective_rank,
            progress=progress,
        )
        report = write_profile_report(result, folder, edge_k=edge_k)
    except HomoglensError as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"{result!r}", err=True)
    click.echo(f"wrote {report} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":  # pragma: no cover
    main()
