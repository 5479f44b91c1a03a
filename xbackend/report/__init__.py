"""Reports: pure functions from a Result to text, and an atomic file writer."""

from __future__ import annotations

from xbackend.report.jsonreport import SCHEMA, to_dict, to_json
from xbackend.report.markdown import to_markdown
from xbackend.report.write import write_atomic

__all__ = ["SCHEMA", "to_dict", "to_json", "to_markdown", "write_atomic"]
