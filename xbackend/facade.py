"""A package facade whose names load on first use (PEP 562): `python -m xbackend.execution.worker` and a
lower layer importing `xbackend.results.backend` both run their package's `__init__` first, and
must not pull in the comparator or the modules that judge results."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, where: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's `__getattr__` and `__dir__`: name -> the module that defines it (`where`),
    imported when the name is first read and kept in the package's `namespace`; a submodule's
    name imports the submodule."""

    def getattr_(name: str) -> Any:
        module = where.get(name)
        if module is None:
            # a submodule read as an attribute (xbackend.report.to_json), as an eager
            # __init__ that imported it would have allowed
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *where})

    return getattr_, dir_
