"""Lossless JSON for xbackend's frozen result dataclasses, read back by their type hints.

`encode` turns a dataclass tree into JSON values; `decode(cls, data)` rebuilds it.
Floats survive exactly (JSON text holds repr()); non-finite floats travel as the
strings "nan", "inf", "-inf". Subclasses of a field's declared class (probe
results) carry their tag (the class name), and are looked up only among the subclasses
registered here with `register_subclass` (each probe's result registers itself when its
module is imported): a JSON file never names code to run.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar

__all__ = ["OMIT_DEFAULT", "CodecError", "decode", "encode", "register_subclass"]

T = TypeVar("T")
CLASS_KEY = "__class__"
# field metadata: leave the field out while it holds its default (decode restores it)
OMIT_DEFAULT = "codec_omit_default"
TIME_FIELDS = frozenset(
    {"build_s", "timings", "latency", "peak_rss_bytes", "start_rss_bytes", "seconds"}
)  # wall times: left out unless asked for (byte-stable)
# Polymorphic bases -> {tag: subclass}; filled by register_subclass.
_SUBCLASSES: dict[type, dict[str, type]] = {}


class CodecError(ValueError):
    """The JSON does not match the dataclass it should rebuild."""


def encode(obj: Any, times: bool = True) -> Any:
    """JSON values for `obj`; `times=False` leaves wall-time fields at their defaults."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        if _tagged(type(obj)):
            out[CLASS_KEY] = _tag(type(obj))
        for field in dataclasses.fields(obj):
            v = getattr(obj, field.name)
            if field.metadata.get(OMIT_DEFAULT) and v == field.default:
                continue  # a field newer than the files it must stay byte-identical with
            if not times and field.name in TIME_FIELDS:
                v = field.default if field.default is not dataclasses.MISSING else v
            out[field.name] = encode(v, times)
        return out
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, list | tuple):
        return [encode(v, times) for v in obj]
    if isinstance(obj, Mapping):
        return {str(key): encode(value, times) for key, value in obj.items()}
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    raise CodecError(f"cannot encode {type(obj).__name__}")


def _tag(cls: type) -> str:
    """The name a subclass travels under: `codec_tag` where a class keeps an older name."""
    return str(getattr(cls, "codec_tag", cls.__name__))


def register_subclass(base: type, cls: type) -> None:
    """Let values declared as `base` be `cls` in JSON (tagged with its name)."""
    _SUBCLASSES.setdefault(base, {base.__name__: base})[_tag(cls)] = cls


def _tagged(cls: type) -> bool:
    return any(issubclass(cls, base) for base in _SUBCLASSES)


def _subclasses(base: type) -> dict[str, type]:
    return _SUBCLASSES.get(base, {})


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(tp: Any, data: Any, where: str = "result") -> Any:
    """Rebuild a value of type `tp` from `encode`'s output; CodecError names the bad path."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return data
    if origin is typing.Literal:  # a status: one of the words its type lists
        if data not in args:
            raise CodecError(f"{where}: {data!r} is none of {', '.join(map(repr, args))}")
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        rest = [arg for arg in args if arg is not type(None)]
        if len(rest) == 1:
            return decode(rest[0], data, where)
        for a in rest:
            try:
                return decode(a, data, where)
            except CodecError:
                continue
        raise CodecError(f"{where}: {data!r} matches none of {tp}")
    if origin is tuple:
        if not isinstance(data, list):
            raise CodecError(f"{where}: expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v, f"{where}[{index}]") for index, v in enumerate(data))
        if len(args) != len(data):
            raise CodecError(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(data, dict):
            raise CodecError(f"{where}: expected an object, got {type(data).__name__}")
        vt = args[1] if len(args) == 2 else Any
        return {key: decode(vt, value, f"{where}.{key}") for key, value in data.items()}
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or _tagged(tp)):
        return _decode_dataclass(tp, data, where)
    return _scalar(tp, data, where)


def _decode_dataclass(tp: type[T], data: Any, where: str) -> T:
    if not isinstance(data, dict):
        raise CodecError(f"{where}: expected an object, got {type(data).__name__}")
    cls: type = tp
    if CLASS_KEY in data:
        known = _subclasses(typing.cast(type, tp))
        if data[CLASS_KEY] not in known:
            raise CodecError(f"{where}: unknown result class {data[CLASS_KEY]!r}")
        cls = known[data[CLASS_KEY]]
    if not dataclasses.is_dataclass(cls):
        raise CodecError(f"{where}: missing {CLASS_KEY!r} naming the result class")
    hints = _hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):
        if field.name in data:
            kwargs[field.name] = decode(hints[field.name], data[field.name], f"{where}.{field.name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise CodecError(f"{where}: missing field {field.name!r}")
    return typing.cast(T, cls(**kwargs))


def _scalar(tp: Any, data: Any, where: str) -> Any:
    if tp is float:
        if isinstance(data, str) and data in ("nan", "inf", "-inf"):
            return float(data)
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
    elif tp is bool:
        if isinstance(data, bool):
            return data
    elif tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
    elif tp is str:
        if isinstance(data, str):
            return data
    elif tp is type(None):
        if data is None:
            return None
    else:
        raise CodecError(f"{where}: cannot decode type {tp}")
    raise CodecError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {data!r}")
