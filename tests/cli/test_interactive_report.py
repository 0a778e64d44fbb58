"""`homoglens profile --interactive`: every figure of the report is an inline plotly figure,
plotly.js is inlined once (no CDN, no other script source), the PNGs are still written, and the
page renders in a real headless browser (Chromium through Playwright, the system's browser: no
download) with no console error, no page error and no network request. The default report
keeps its embedded PNGs and no script."""

from __future__ import annotations

import os
import re
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("plotly", reason='plotly is an optional extra: pip install "homoglens[plotly]"')

from homoglens.cli import main  # noqa: E402
from homoglens.testing import tiny_model_folder  # noqa: E402

# a report of a few windows: too few for 16-window bootstrap blocks, which it says
pytestmark = pytest.mark.filterwarnings("ignore:.*fewer than 4 blocks:UserWarning")

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome",
            "google-chrome-stable")  # fmt: skip
"""Looked up on PATH, in this order, when HOMOGLENS_BROWSER is not set."""


def find_browser() -> tuple[str | None, str]:
    """The browser executable to drive, or ``None`` and why not."""
    chosen = os.environ.get("HOMOGLENS_BROWSER")
    if chosen:
        path = shutil.which(chosen) or (chosen if Path(chosen).is_file() else None)
        return path, f"HOMOGLENS_BROWSER={chosen!r} is not an executable"
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path, ""
    return None, (
        f"no headless browser found (set HOMOGLENS_BROWSER, or put one of {', '.join(BROWSERS)} "
        "on PATH; on Debian: apt-get install chromium-headless-shell)"
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interactive profile report of a tiny model with every section (all figure kinds)."""
    out = tmp_path_factory.mktemp("interactive") / "report"
    result = CliRunner().invoke(
        main,
        ["profile", "--model", str(tiny_model_folder("gpt2")), "--n-seq", "6", "--seq-len",
         "32", "--sink-n-seq", "2", "--patch-n-seq", "2", "--bias-n-seq", "4", "--interactive",
         "--out", str(out), "--no-progress"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def test_the_report_embeds_each_figure_and_plotly_js_once(report: Path) -> None:
    from plotly.offline import get_plotlyjs

    page = (report / "report.html").read_text(encoding="utf-8")
    pngs = sorted((report / "figures").glob("*.png"))
    assert len(pngs) >= 12  # profile, similarity, ablation, bias, sinks, patching: all kinds
    divs = re.findall(r'<div id="figure-([^"]+)" class="plotly-graph-div"', page)
    assert sorted(divs) == [p.stem for p in pngs]  # one interactive figure per PNG written
    assert "<img " not in page  # every figure is the interactive one
    assert page.count(get_plotlyjs()[:400]) == 1  # plotly.js inlined, once
    assert page.count("<script") == 1 + len(divs)  # the library and one call per figure
    assert not re.search(r"<script[^>]*\bsrc=", page)  # no script from anywhere
    assert not re.search(r"<link[^>]*\bhref=", page)  # no style sheet from anywhere
    size = (report / "report.html").stat().st_size
    print(f"interactive report: {size / 1e6:.2f} MB, {len(divs)} figures")
    assert size < 20e6


def test_the_default_report_keeps_its_pngs_and_no_script(tmp_path: Path) -> None:
    from homoglens.report.html import figure_tag, interactive_figures, page_html
    from homoglens.results.plotting import curves, new_figure

    asked: list[str] = []

    def draw(backend: str):
        asked.append(backend)
        fig, (ax,) = new_figure(3, 2)
        curves(ax, [0, 1], {"a": [0.0, 1.0]})
        return fig

    tag = figure_tag(draw, tmp_path / "a.png", 'a "b"')
    assert tag.startswith('<img alt="a &quot;b&quot;" src="data:image/png;base64,')
    assert asked == ["matplotlib"] and (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert "<script" not in page_html("heading", tag)
    with interactive_figures():
        assert "<script" in page_html("heading", "")
    assert "<script" not in page_html("heading", "")  # the block ends interactive mode


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_report_renders_offline_in_a_headless_browser(report: Path) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the browser check drives Chromium with Playwright"
    )
    browser_path, why = find_browser()
    if browser_path is None:
        pytest.skip(why)
    url = (report / "report.html").resolve().as_uri()
    requests: list[str] = []
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on(
                "console",
                lambda m: (
                    problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "assert")
                    else None
                ),
            )
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))

            def route(handle) -> None:  # record every request; only the page itself may load
                requests.append(handle.request.url)
                if handle.request.url == url:
                    handle.continue_()
                else:
                    handle.abort()

            page.route("**/*", route)
            page.goto(url, wait_until="load")
            # nothing overflows the page at 1200 px: wide tables scroll inside their column
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, f"the page is {overflow} px wider than the window"
            n = page.locator(".plotly-graph-div").count()
            assert n >= 12
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n}",
                timeout=60_000,
            )
            # every figure drew its traces: heatmap images or curve paths in its plot area
            traces = ".heatmaplayer image, .scatterlayer .js-line, .barlayer .point"
            drawn = page.evaluate(
                """traces => [...document.querySelectorAll('.js-plotly-plot')].filter(
                    d => d.querySelector(traces)).length""",
                traces,
            )
            assert drawn == n
            # hover over the layer x position heatmap: the label says layer, position, cosine
            page.locator("#figure-heatmap").scroll_into_view_if_needed()
            box = page.locator("#figure-heatmap .nsewdrag").first.bounding_box()
            assert box is not None
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, steps=5)
            hover = "#figure-heatmap .hoverlayer .hovertext"
            page.wait_for_selector(hover, state="attached", timeout=10_000)
            label = page.locator(hover).first.text_content() or ""
            assert "layer: " in label and "position" in label and "cosine: " in label, label
            shot = page.screenshot(full_page=True)
        finally:
            browser.close()
    (report / "screenshot.png").write_bytes(shot)  # for a look by hand
    assert not problems, problems
    assert requests == [url], requests  # no network request: nothing but the file itself
    width, height = _png_size(shot)
    assert width >= 1000 and height >= 5000, (width, height)
    assert len(shot) > 200_000  # a blank page compresses to a few kilobytes
