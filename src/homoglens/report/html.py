"""HTML building blocks of the reports: the page, its style, tables, embedded figures (PNG,
or interactive plotly figures with plotly.js inlined once), the provenance table, and the
output-folder check."""

from __future__ import annotations

import base64
import contextlib
import html
import io
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homoglens.core.errors import InvalidInputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from homoglens.core.types import PlotBackend

_INTERACTIVE: ContextVar[bool] = ContextVar("homoglens_interactive_report", default=False)


CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em}
h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0;display:block;max-width:100%;
overflow-x:auto}
th{overflow-wrap:anywhere;min-width:4em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}img{max-width:100%}
.note{color:#555;font-size:.9em}
"""


def check_output_dir(out: str | Path, *, overwrite: bool) -> Path:
    """Validate an output folder before any work is done; nothing is created or deleted here.

    Raises:
        InvalidInputError: ``out`` is a file; is the working folder, one of its parents, the home
            folder or a filesystem root (never replaced); or is not empty and ``overwrite`` is
            False.
    """
    folder = Path(out).expanduser()
    if folder.is_symlink():
        raise InvalidInputError(
            f"--out {str(folder)!r} is a symbolic link; give the real folder it points to"
        )
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"--out {str(folder)!r} is a file; give a folder")
    blocker = next((p for p in folder.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise InvalidInputError(
            f"--out {str(folder)!r} cannot be created: {str(blocker)!r} is a file, not a folder"
        )
    resolved = folder.resolve()
    cwd = Path.cwd().resolve()
    protected = {cwd, Path.home().resolve(), Path(resolved.anchor)} | set(cwd.parents)
    if resolved in protected:
        raise InvalidInputError(
            f"--out {str(folder)!r} is the working folder, one of its parents, the home folder or "
            "a filesystem root; homoglens never replaces those. Give a new folder, e.g. "
            "--out homoglens-report"
        )
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise InvalidInputError(
            f"output folder {str(folder)!r} is not empty; choose another --out or pass "
            "--overwrite to replace its contents (only after the run succeeds)"
        )
    return folder


def png_tag(fig: Figure, path: Path) -> str:
    """Save ``fig`` as a PNG at ``path`` and return it base64-encoded for an ``<img>``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    data = buf.getvalue()
    path.write_bytes(data)
    return base64.b64encode(data).decode("ascii")


@contextlib.contextmanager
def interactive_figures(interactive: bool = True) -> Iterator[None]:
    """Within the block, :func:`figure_tag` embeds plotly figures and :func:`page_html` inlines
    plotly.js (an interactive report); outside it, PNGs as always.

    Raises:
        MissingDependencyError: ``interactive`` without plotly installed.
    """
    if interactive:
        from homoglens.results.plotting_plotly import require_plotly

        require_plotly()
    token = _INTERACTIVE.set(interactive)
    try:
        yield
    finally:
        _INTERACTIVE.reset(token)


def figure_tag(draw: Callable[[PlotBackend], Any], path: Path, alt: str) -> str:
    """One figure of a report as HTML.

    The matplotlib figure ``draw("matplotlib")`` is always saved as a PNG at ``path`` (for
    papers). The tag is an ``<img>`` with that PNG embedded, or, inside
    :func:`interactive_figures`, the plotly figure ``draw("plotly")`` as an inline ``<div>``
    (its data inline; plotly.js comes once with the page, see :func:`page_html`).

    Args:
        draw: Makes the figure with the backend it is given.
        path: Where the PNG goes (its stem names the plotly ``<div>``).
        alt: Text alternative of the image (plain text).

    Returns:
        The HTML.
    """
    data = png_tag(draw("matplotlib"), path)
    if not _INTERACTIVE.get():
        return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
    fig = draw("plotly")
    div = fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=f"figure-{path.stem}",
        config={"displaylogo": False, "responsive": True,
                "toImageButtonOptions": {"filename": path.stem}},
    )  # fmt: skip
    return f'<div class="figure" role="img" aria-label="{html.escape(alt)}">{div}</div>'


def _plotly_script() -> str:
    """plotly.js, minified, as one inline ``<script>`` (no CDN: the page opens offline)."""
    from plotly.offline import get_plotlyjs

    return f'<script type="text/javascript">{get_plotlyjs()}</script>'


def table_html(frame: Any, *, missing: str = "NaN") -> str:
    """A DataFrame as an HTML table, floats to 4 decimals.

    Args:
        frame: The table.
        missing: What a NaN cell shows (a dash where the section's note says why it is empty).

    Returns:
        The ``<table>`` HTML; it scrolls sideways inside its column when wider than the page
        (:data:`CSS`).
    """
    return str(frame.to_html(index=False, float_format=lambda v: f"{v:.4f}", na_rep=missing))


def page_html(heading: str, body: str) -> str:
    """A self-contained HTML page (the report's style inlined; inside
    :func:`interactive_figures`, plotly.js too, once)."""
    script = _plotly_script() if _INTERACTIVE.get() else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(heading)}</title>
<style>{CSS}</style>{script}</head><body>
<h1>{html.escape(heading)}</h1>
{body}
</body></html>
"""


def shown_revision(rows: dict[str, Any]) -> str:
    """The ``model_revision`` a report shows: the recorded one (a Hub name's revision and
    commit), else what is known of a model that has none: the package, its version and the
    file of the embedded model or the shipped model's training record (``model_source``), or
    ``"n/a (local ...)"`` for a folder or a model object (no Hub revision exists)."""
    revision = str(rows.get("model_revision") or "")
    if revision:
        return revision
    source = str(rows.get("model_source") or "")
    if source:
        return f"n/a (not from the Hub; version: {source})"
    return "n/a (local folder or model object: no Hub revision)"


def provenance_table(rows: dict[str, Any]) -> str:
    """A two-column HTML table of provenance fields (a blank ``model_revision`` shown as
    :func:`shown_revision` says)."""
    if "model_revision" in rows:
        rows = {**rows, "model_revision": shown_revision(rows)}
    return (
        "<table>"
        + "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in rows.items()
        )
        + "</table>"
    )


def section_page(out: Path, heading: str, section: str, provenance: Any) -> Path:
    """Write ``report.html``: one section and the provenance table."""
    prov = asdict(provenance)
    prov.pop("hook_points", None)
    prov.pop("data_rows", None)
    body = section + "<h2>Provenance</h2>" + provenance_table(prov)
    path = out / "report.html"
    path.write_text(page_html(heading, body), encoding="utf-8")
    return path
