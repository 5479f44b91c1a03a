"""The report folder: Markdown, its figures and the full layer CSV, each written atomically."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
from pathlib import Path

from xbackend.files.atomic import stage_bytes
from xbackend.files.owned import forget, is_ours, place_all
from xbackend.report.figures import FIXED_SLUGS, planned_figures, render
from xbackend.report.jsonreport import to_json
from xbackend.report.layers_csv import to_csv
from xbackend.report.markdown import to_markdown
from xbackend.results import Result

__all__ = ["bundle_files", "bundle_outputs", "write_markdown_bundle"]


def bundle_files(result: Result, md_path: str | os.PathLike[str]) -> dict[Path, bytes]:
    """Every file of the report folder for `md_path`, by path: OUT.md, OUT.SLUG.png, OUT.layers.csv."""
    path = Path(md_path)
    stem = path.stem
    files = {
        path: to_markdown(result, stem).encode("utf-8"),
        path.with_name(f"{stem}.layers.csv"): to_csv(result).encode("utf-8"),
    }
    for planned_figure in planned_figures(result):
        files[path.with_name(f"{stem}.{planned_figure.slug}.png")] = render(planned_figure)
    return files


def bundle_outputs(flag: str, md_path: str | os.PathLike[str] | None) -> list[tuple[str, Path | None]]:
    """Every file the report for `md_path` may write, as xbackend.files.atomic.check_outputs takes
    them: the Markdown, its table, each figure it can draw (and a cost figure already there)."""
    if not md_path:
        return []
    path = Path(md_path)
    stem = path.stem
    figures = [path.with_name(f"{stem}.{s}.png") for s in FIXED_SLUGS]
    with contextlib.suppress(OSError):
        figures += sorted(path.parent.glob(f"{glob.escape(stem)}.cost-*.png"))
    table = (f"{flag} {path}'s table", path.with_name(f"{stem}.layers.csv"))
    return [(flag, path), table, *((f"{flag} {path}'s figure", figure) for figure in figures)]


def write_markdown_bundle(
    result: Result, md_path: str | os.PathLike[str] | None, json_path: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Write the report folder (and the JSON twin at `json_path`) whole or not at all: every file
    is staged first (a full disk or a file-size limit then leaves nothing), every destination
    checked, then each moved into place, the Markdown last, so its links never point at missing
    files."""
    files = bundle_files(result, md_path) if md_path else {}
    if json_path:
        files[Path(json_path)] = to_json(result).encode("utf-8")
    md = Path(md_path) if md_path else None
    order = [*(file for file in files if file != md), *([md] if md else [])]
    staged: dict[Path, Path] = {}
    try:
        for path in order:
            staged[path] = stage_bytes(path, files[path], "report")
        # every file checked and every ledger staged before the first is placed: all or none
        place_all([(staged[p], p, hashlib.sha256(files[p]).hexdigest()) for p in order], "report")
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
    if md:
        _drop_stale(md, set(files))
    return list(files)


def _drop_stale(md: Path, written: set[Path]) -> None:
    """A figure an earlier report of this name drew and this one does not: removed if xbackend
    wrote it and it is unchanged (a reader would take it for this run's)."""
    stale = [f for _, f in bundle_outputs("-", md)[2:] if f is not None and f not in written]
    gone = []
    for f in stale:
        if f.is_file() and not f.is_symlink() and is_ours(f):
            f.unlink(missing_ok=True)
            gone.append(f.name)
    if gone:
        forget(md.parent, gone)
