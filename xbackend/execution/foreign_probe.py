"""Run in another interpreter (python=PATH): what that Python has, and whether a runner is
available there. Prints one tagged JSON line. Python >= 3.8; imports nothing of xbackend's
beyond the runner named on the command line."""

from __future__ import annotations

import importlib
import json
import platform
import sys

TAG = "@@xbackend-probe "


def _packages() -> list[list[str]]:
    from importlib import metadata  # Python >= 3.8: the probe reports older ones first

    seen: dict[str, str] = {}
    for distribution in metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            seen.setdefault(name.lower().replace("_", "-"), distribution.version)
    return [[n, seen[n]] for n in sorted(seen)]


def probe(target: str) -> dict[str, object]:
    """What this interpreter is and can import for the runner `target` (version, platform, the runner's
    modules)."""
    out: dict[str, object] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
    }
    if sys.version_info < (3, 8):
        out["error"] = f"Python {out['python']} is too old; xbackend's worker needs Python >= 3.8"
        return out
    try:
        import numpy  # optional: the other environment may lack numpy (reported)

        out["numpy"] = numpy.__version__
    except ImportError:
        out["error"] = f"numpy is not installed there ({sys.executable} -m pip install numpy)"
        return out
    out["packages"] = _packages()
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
        avail = cls.availability()
    except Exception as error:
        out["error"] = f"cannot import {target} there: {type(error).__name__}: {error}"
        return out
    out["available"] = bool(avail.available)
    # an install hint must name this interpreter's pip, not the one on PATH
    out["reason"] = avail.reason.replace("(pip install ", "(" + sys.executable + " -m pip install ")
    out["version"] = avail.version
    if avail.available:
        try:
            out["max_ir"] = cls.max_ir_version()
        except Exception as error:
            out["max_ir_error"] = f"{type(error).__name__}: {error}"
    return out


def main() -> int:
    """Print the probe of sys.argv[1] as one tagged JSON line; exit 0."""
    print(TAG + json.dumps(probe(sys.argv[1])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
