"""A certificate's body checked against its schema: every field verify reads, of the type it
expects, and every value it trusts (probe and property names, sizes, digests, dtypes, the
backend the options are for) in range. A damaged or hand-made certificate is one line naming
the field, never a traceback or a misleading blame."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xbackend.errors import InputError
from xbackend.files.modelref import np_dtype
from xbackend.files.untrusted import field, number
from xbackend.probes.registry import PROBES
from xbackend.results.promises import PROPERTIES

__all__ = ["SCHEMA", "check_body"]

SCHEMA = "xbackend.certificate/2"


def check_body(body: dict[str, Any], path: Path) -> None:
    """Every field verify reads, of the type it expects: a damaged or hand-made certificate is
    one line, never a traceback."""
    fix = "certify the model again"
    if body.get("schema") != SCHEMA:
        raise InputError(
            f"{path} is not an {SCHEMA} certificate (schema {str(body.get('schema'))[:40]!r}); {fix}"
        )
    parts = {
        k: field(body, k, dict, str(path), fix) for k in ("backend", "battery", "model", "inputs", "outputs")
    }
    field(body, "environment", dict, str(path), fix)
    field(body, "environment_sha256", str, str(path), fix)
    field(body, "properties", list, str(path), fix)
    b, bat = parts["backend"], parts["battery"]
    field(b, "name", str, f"{path}: backend", fix)
    field(b, "info", dict, f"{path}: backend", fix)
    for key, lo in (("runs", 2), ("builds", 2), ("batch", 0), ("timed_runs", 0)):
        number(bat, key, f"{path}: battery", fix, lo, 1_000_000)
    opts = field(bat, "runner_options", list, f"{path}: battery", fix)
    if not all(
        isinstance(opt, list) and len(opt) == 3 and all(isinstance(x, str) for x in opt) for opt in opts
    ):
        raise InputError(f"{path}: battery: runner_options must be [backend, key, value] strings; {fix}")
    for key in ("name", "path", "sha256"):
        field(parts["model"], key, str, f"{path}: model", fix)
    given = parts["inputs"]
    field(given, "sha256", str, f"{path}: inputs", fix)
    number(given, "seed", f"{path}: inputs", fix, 0, 2**32 - 1)
    field(given, "file", (str, type(None)), f"{path}: inputs", fix)
    shapes, ranges = (
        field(given, "shapes", list, f"{path}: inputs", fix),
        field(given, "ranges", list, f"{path}: inputs", fix),
    )
    ok = all(
        isinstance(shape, list)
        and len(shape) == 2
        and isinstance(shape[0], str)
        and isinstance(shape[1], list)
        and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 2**31 for d in shape[1])
        for shape in shapes
    ) and all(
        isinstance(x, list)
        and len(x) == 3
        and isinstance(x[0], str)
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in x[1:])
        for x in ranges
    )
    if not ok:
        raise InputError(f"{path}: inputs: shapes or ranges are not [name, dims] / [name, low, high]; {fix}")
    out = parts["outputs"]
    field(out, "sha256", str, f"{path}: outputs", fix)
    tensors = field(out, "tensors", dict, f"{path}: outputs", fix)
    if not all(isinstance(tensor, str) for tensor in tensors.values()):
        raise InputError(f"{path}: outputs: tensors must map names to sha256 strings; {fix}")
    for prop in body["properties"]:
        if not isinstance(prop, dict) or not all(isinstance(prop.get(k), str) for k in ("name", "status")):
            raise InputError(f"{path}: properties must each have a name and a status; {fix}")
    _check_values(body, path, fix)


_HEX64 = re.compile(r"[0-9a-f]{64}")
_STATUSES = ("held", "broken", "unchecked", "not applicable")


def _check_values(body: Mapping[str, Any], path: Path, fix: str) -> None:
    """Beyond types, the values verify trusts: names it knows, sizes in range, digests that are
    digests. A hand-made certificate is one line naming the field."""
    field(body, "granted", bool, str(path), fix)
    b, bat = body["backend"], body["battery"]
    probes = field(bat, "probes", list, f"{path}: battery", fix)
    unknown = [probe for probe in probes if not isinstance(probe, str) or probe not in PROBES]
    if unknown:
        raise InputError(
            f"{path}: battery: probes names {str(unknown[0])[:60]!r}, no probe of xbackend's "
            f"({', '.join(PROBES)}); {fix}"
        )
    others = sorted({runner_option[0] for runner_option in bat["runner_options"]} - {b["name"]})
    if others:
        raise InputError(
            f"{path}: battery: runner_options set {others[0][:60]!r}, but the certificate is for "
            f"{b['name'][:60]!r}: it is not consistent; {fix}"
        )
    for prop in body["properties"]:
        if prop["name"] not in PROPERTIES or prop["status"] not in _STATUSES:
            raise InputError(
                f"{path}: properties: {prop['name'][:40]!r} {prop['status'][:20]!r} is not a property of "
                f"{', '.join(PROPERTIES)} held, broken, unchecked or not applicable; {fix}"
            )
    digests = [body["outputs"]["sha256"], *body["outputs"]["tensors"].values(), body["model"]["sha256"]]
    if not all(_HEX64.fullmatch(digest) for digest in digests):
        raise InputError(f"{path}: a sha256 in model or outputs is not 64 hex digits; {fix}")
    for t in field(body["inputs"], "tensors", (list, type(None)), f"{path}: inputs", fix) or ():
        if not (isinstance(t, list) and len(t) == 3 and all(isinstance(x, str) for x in t)):
            raise InputError(f"{path}: inputs: tensors must be [name, dtype, shape] strings; {fix}")
        try:
            known = np_dtype(t[1]) if len(t[1]) <= 20 else None
        except Exception:  # numpy's and ml_dtypes' refusals differ by name
            known = None
        if known is None or known.kind not in "biufcUSOV" or (known.kind == "V" and known.names):
            raise InputError(
                f"{path}: inputs: dtype {t[1][:30]!r} of {t[0][:40]!r} is no dtype xbackend feeds; {fix}"
            )
    lat = field(body, "latency", (dict, type(None)), str(path), fix)
    if lat is not None:
        for key in ("median_ms", "min_ms", "max_ms"):
            number(lat, key, f"{path}: latency", fix, 0, 1e9, integer=False)
        number(lat, "runs", f"{path}: latency", fix, 1, 1_000_000)
