"""The reports committed under reports/ re-render byte for byte from their JSON: what a user's
`xbackend report` of the same JSON writes is the Markdown in the repository."""

from __future__ import annotations

from pathlib import Path

import pytest
from roots import ROOT

from xbackend.report import from_json, to_markdown

pytestmark = pytest.mark.unit  # the unit tier: make check

# written by schema xbackend.report/1 (a GPU host's, before the schema's last change): this
# version refuses them, saying so, and they stay as they were written
OLDER_SCHEMA = {"reports/gpu_convnet.json", "reports/gpu_mlp.json"}
REPORTS = sorted(
    p
    for p in (ROOT / "reports").rglob("*.json")
    if p.with_suffix(".md").is_file()
    and p.name != "fleet.json"
    and str(p.relative_to(ROOT)) not in OLDER_SCHEMA
)


def _stem(path: Path) -> str | None:
    """A sweep job's report.md links no figures (the job folder holds none); a bundle's does."""
    return None if "jobs" in path.relative_to(ROOT).parts else path.stem


def test_the_committed_reports_are_found() -> None:
    assert len(REPORTS) == 20  # the demo's, and a sweep's models and jobs


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_committed_report_re_renders_byte_for_byte(path: Path) -> None:
    result = from_json(path.read_text("utf-8"), str(path))
    assert to_markdown(result, stem=_stem(path)) == path.with_suffix(".md").read_text("utf-8")


@pytest.mark.parametrize("name", sorted(OLDER_SCHEMA))
def test_a_report_of_an_older_schema_is_refused_in_one_line(name: str) -> None:
    from xbackend.errors import InputError

    with pytest.raises(
        InputError, match=r"has schema 'xbackend.report/1', this xbackend reads 'xbackend.report/2'"
    ):
        from_json((ROOT / name).read_text("utf-8"), name)
