"""Each option of a comparison declared once with its field: a Flag carries its flag's name, how a
command-line or Python value becomes its value, what it must satisfy, and how command() writes it
back. CompareOptions declares its fields with `flag()`; the command line's help, metavars and
typer types are the CLI's (xbackend.cli.flags)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from xbackend.errors import UsageError
from xbackend.files.codec import OMIT_DEFAULT

__all__ = [
    "MAX_COUNT",
    "Flag",
    "at_least",
    "comma_list",
    "count",
    "declared",
    "flag",
    "option_triple",
    "pairs",
]

MAX_COUNT = 1_000_000  # runs, builds, samples: past this a count is a typo, not a plan


@dataclass(frozen=True)
class Flag:
    """One option: its flag, how a value becomes the field's, and how command() writes it."""

    cli: str  # "--runs"; the parameter's name is its field's (or `name`)
    parse: Callable[[Any], Any] | None = None  # a command-line or Python value -> the field's value
    check: Callable[[str, Any], None] | None = None  # raises UsageError for a value out of range
    # (the options, the value) -> its words in command(); None: "CLI VALUE" when not the default
    show: Callable[[Any, Any], Iterable[str]] | None = None
    always: bool = False  # in command() even at its default
    name: str = ""  # for an option that is not a CompareOptions field
    sweep_file: bool = False  # a sweep file may set it, for the whole sweep or one model

    def words(self, options: Any, value: Any, default: Any) -> list[str]:
        """This option's words in the command that reproduces a comparison."""
        if self.show is not None:
            return list(self.show(options, value))
        if not self.always and value == default:
            return []
        if isinstance(value, bool):
            return [self.cli] if value else []
        if value is None:
            return []
        return [self.cli, f"{value:g}" if isinstance(value, float) else str(value)]


def flag(default: Any, cli: str, omit_default: bool = False, **kw: Any) -> Any:
    """A CompareOptions field declared with its Flag (dataclasses' metadata holds it);
    `omit_default`: the JSON leaves it out at its default (a flag newer than saved reports)."""
    meta: dict[str, Any] = {"flag": Flag(cli, **kw)}
    if omit_default:
        meta[OMIT_DEFAULT] = True
    return dataclasses.field(default=default, metadata=meta)


def declared(cls: type) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of `cls` that declare a Flag, in field order."""
    return [(field, field.metadata["flag"]) for field in dataclasses.fields(cls) if "flag" in field.metadata]


def count(lo: int, hi: int = MAX_COUNT, what: str = "") -> Callable[[str, Any], None]:
    """A whole number in [lo, hi]; `what` names the unit in the error. None passes (a default
    that is chosen later)."""

    def check(cli: str, n: Any) -> None:
        if n is None:
            return
        if n > hi:
            raise UsageError(f"{cli} must be at most {hi:,}, got {n:,}")
        if n < lo:
            raise UsageError(f"{cli} must be >= {lo}{what}, got {n}")

    return check


def at_least(lo: float, strict: bool, unit: str = "") -> Callable[[str, Any], None]:
    """A number above lo (strictly, or not), never NaN; None passes (a default that is chosen later)."""

    def check(cli: str, x: Any) -> None:
        if x is None:
            return
        if math.isnan(x) or x < lo or (strict and x == lo):
            raise UsageError(f"{cli} must be {'>' if strict else '>='} {lo:g}{unit}, got {x}")

    return check


def comma_list(value: Any) -> tuple[str, ...]:
    """'a,b' or ['a', 'b'] -> ('a', 'b')."""
    if isinstance(value, str):
        return tuple(x for x in value.split(",") if x)
    return tuple(str(x) for x in value)


def option_triple(text: str) -> tuple[str, str, str]:
    """--set BACKEND.OPTION=VALUE -> (backend, option, value)."""
    key, sep, value = text.partition("=")
    backend, dot, name = key.rpartition(".")  # a label may hold dots (ort-cpu@1.20.threads)
    if not sep or not dot or not backend or not name:
        raise UsageError(f"--set: expected BACKEND.OPTION=VALUE (e.g. ort-cpu.threads=1), got {text!r}")
    return backend, name, value


def pairs(options: object) -> tuple[tuple[str, str, str], ...]:
    """runner_options as (backend, key, value): from {backend: {key: value}}, triples or
    'BACKEND.OPTION=VALUE' strings."""
    if options is None:
        return ()
    if isinstance(options, Mapping):
        return tuple((str(key), str(k), str(opt)) for key, opts in options.items() for k, opt in opts.items())
    return tuple(
        option_triple(option) if isinstance(option, str) else (str(option[0]), str(option[1]), str(option[2]))
        for option in options  # type: ignore[attr-defined]
    )
