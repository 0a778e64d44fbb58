"""Write results as files: safetensors + JSON, tidy CSV, PNG figures, and one self-contained
HTML report per command (figures embedded, no network needed to view it)."""

from homoglens.assets import staged_output
from homoglens.report.html import check_output_dir
from homoglens.report.pages import (
    write_bias_report,
    write_comparison_report,
    write_length_report,
    write_patching_report,
    write_profile_report,
    write_sinks_report,
)

__all__ = [
    "check_output_dir",
    "staged_output",
    "write_bias_report",
    "write_comparison_report",
    "write_length_report",
    "write_patching_report",
    "write_profile_report",
    "write_sinks_report",
]
