"""Reports: pure functions from a Result to text, and an atomic file writer."""

from __future__ import annotations

from xbackend.comparison.saved_report import SCHEMA, from_json, read_result
from xbackend.files.atomic import write_atomic
from xbackend.report.bundle import bundle_files, bundle_outputs, write_markdown_bundle
from xbackend.report.jsonreport import to_dict, to_json
from xbackend.report.markdown import to_markdown

__all__ = [
    "SCHEMA",
    "bundle_files",
    "bundle_outputs",
    "from_json",
    "read_result",
    "to_dict",
    "to_json",
    "to_markdown",
    "write_atomic",
    "write_markdown_bundle",
]
