"""How a run record's typed parts are read from its JSON and written back: the codec `suite.run.record_parts` and
`RunRecord` share.

A part is a frozen dataclass whose fields are its JSON keys, each annotated with what it holds: a number (`float`:
null reads as NaN, the writer's NaN), `int`, `str`, `bool`, another part, `tuple[T, ...]` (a JSON list),
`Mapping[str, T]` (an object whose keys are not the suite's: metric names, split names, a method's facts) or `Any`
(kept as read). `read_fields` checks each value against its field's type and names the first that differs;
`json_fields` gives the JSON back as it was read: the keys in their order, an absent key absent, and the keys the
suite does not define (an older or a newer writer's) kept in `unknown`, so a record read and written back is the same
bytes and no recorded fact is dropped.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import functools
import json
import math
import stat
import sys
import types
import typing
from pathlib import Path
from typing import Any, Mapping

# what the rest of the suite uses; other names are this module's own
__all__ = ["Part", "PartError", "json_fields", "json_value", "read_fields", "read_json", "wrong_type"]

NO_JSON = {"json": False}  # a field's metadata: not part of the JSON (the codec's own bookkeeping, in-memory arrays)


class PartError(ValueError):
    """A part of a record's JSON that is not what a run record holds there; the message names where."""


# No field of a record holds an integer beyond int64 (seeds < 2**32, counts of parameters and steps): a longer one is
# an edit, and Python refuses to read one past 4,300 digits with a ValueError of its own.
MAX_INT_DIGITS = 19


def read_json(path: Path) -> Any:
    """A record file's JSON, its numbers bounded as they are parsed: PartError for a file that is not a regular one
    (a FIFO would hang the reader; nothing is read from it), for text that is not JSON, and for a number no record
    holds (an integer of more than MAX_INT_DIGITS digits, a decimal beyond a float's range); OSError as reading
    raised it (absent, a folder, no permission)."""
    mode = path.stat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a folder: reading it raises what callers name
        raise PartError(f"not a regular file ({_kind(mode)}): nothing is read from it; remove it")
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_int=_bounded_int, parse_float=_bounded_float)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PartError(f"not JSON ({exc})") from None


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise PartError(f"not a run record: it holds an integer of {digits} digits, and no field of a record holds "
                        f"more than {MAX_INT_DIGITS} (edited by hand?)")
    return int(text)


def _bounded_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # the suite writes a non-finite number as null: this one is too large for a float
        shown = text if len(text) <= 24 else f"{text[:24]}... ({len(text)} characters)"
        raise PartError(f"not a run record: it holds the number {shown}, beyond a float's range (edited by hand?)")
    return value


def wrong_type(where: str, value: Any) -> str:
    return f"{where} is a JSON {type(value).__name__}, not what a run record holds there (edited by hand?)"


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The JSON fields of a dataclass and their types (each evaluated alone: a field kept out of the JSON may name a
    type its module imports only for type checkers)."""
    return {f.name: _evaluated(f.type, sys.modules[_owner(cls, f.name).__module__].__dict__)
            for f in dataclasses.fields(cls) if f.metadata.get("json", True)}


def _owner(cls: type, name: str) -> type:
    """The class (of `cls`'s bases) that declares field `name`: its module's names resolve the annotation."""
    return next(c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {}))


def _evaluated(annotation: Any, names: dict[str, Any]) -> Any:
    return eval(annotation, names) if isinstance(annotation, str) else annotation  # noqa: S307  our own source


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # JSON's true/false is no number


def _decode(hint: Any, value: Any, where: str) -> Any:
    """`value` (from JSON) as a value of type `hint`; PartError when it is another JSON type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if value is None and len(inner) < len(args):
            return None
        return _decode(inner[0] if len(inner) == 1 else Any, value, where)
    if hint in LEAVES:
        found = LEAVES[hint](value)
        if found is not WRONG:
            return found
    elif isinstance(hint, type) and hasattr(hint, "from_json"):
        return hint.from_json(value, where)
    elif origin is tuple and isinstance(value, list):
        return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    elif origin in (collections.abc.Mapping, dict) and isinstance(value, dict):
        return {k: _decode(args[1], v, f"{where}.{k}") for k, v in value.items()}
    elif origin not in (tuple, collections.abc.Mapping, dict):
        raise TypeError(f"{hint!r}: no JSON form")  # a field declared with a type the codec does not read
    raise PartError(wrong_type(where, value))


WRONG = object()  # a leaf's JSON value of another type
# How a leaf's JSON value is read (WRONG: not that type). A number's null is the writer's NaN; an int stays an int
# where a float is declared, so it is written back as read; JSON's true/false is no number.
LEAVES: dict[type, Any] = {
    float: lambda v: math.nan if v is None else v if _is_number(v) else WRONG,
    int: lambda v: v if _is_number(v) and isinstance(v, int) else WRONG,
    str: lambda v: v if isinstance(v, str) else WRONG,
    bool: lambda v: v if isinstance(v, bool) else WRONG,
}


def read_fields(cls: type, data: Any, where: str) -> dict[str, Any]:
    """The keyword arguments that build `cls` from its JSON `data`: each known key typed, the others in `unknown`, and
    the keys' order in `read_order`."""
    if not isinstance(data, dict):
        raise PartError(wrong_type(where, data))
    hints = _hints(cls)
    values = {name: _decode(hints[name], value, f"{where}.{name}".lstrip(".")) for name, value in data.items()
              if name in hints}
    unknown = {k: v for k, v in data.items() if k not in hints}
    return {**values, "unknown": unknown, "read_order": tuple(data)}


def json_value(value: Any) -> Any:
    """A typed value as JSON: parts as objects, tuples as lists, NaN as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    return value


def json_fields(obj: Any, defaults: bool = False) -> dict[str, Any]:
    """The JSON of a dataclass built by `read_fields` (or in code): the keys it was read with, in their order, then
    any field set since; built in code (no keys read): its fields in the order declared, but those that are None or
    (unless `defaults`) at their default."""
    hints, fields = _hints(type(obj)), {f.name: f for f in dataclasses.fields(obj)}
    read = obj.read_order
    names = [n for n in hints if getattr(obj, n) is not None
             and (defaults and read is None or not _same(getattr(obj, n), _default(fields[n])))]
    if read is not None:
        names = [*read, *(n for n in names if n not in read)]
    out = {}
    for name in names:
        if name in hints:
            out[name] = json_value(getattr(obj, name))
        elif name in obj.unknown:
            out[name] = obj.unknown[name]
    return out


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


@dataclasses.dataclass(frozen=True, kw_only=True)
class Part:
    """A part of the record: its fields typed, the keys it was read with and those the suite does not define."""
    # keys the suite does not define (an older or a newer writer's), written back as read
    unknown: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, metadata=NO_JSON)
    # the JSON's keys in the order read (None: built in code)
    read_order: tuple[str, ...] | None = dataclasses.field(default=None, repr=False, compare=False, metadata=NO_JSON)

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> "Part":
        return cls(**read_fields(cls, data, where))

    def to_json(self) -> dict[str, Any]:
        return json_fields(self)
