"""Write results as files: safetensors + JSON, tidy CSV, PNG figures, and one self-contained
HTML report per command (figures embedded, no network needed to view it)."""

from homoglens.models.assets import staged_output
from homoglens.report import pages
from homoglens.report.html import check_output_dir
from homoglens.report.pages import *  # noqa: F403 - the report writers, pages.__all__

__all__ = ["check_output_dir", "staged_output"]
__all__ += pages.__all__
