"""cel-go's strings extension, the Kubernetes lists and regex libraries, and cel-go's sets.

Indices count Unicode code points, as cel-go does; out-of-range indices are errors with
cel-go's wording ("index out of range: 7").
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from typing import Any

from tangram.cel.kubernetes_library import no_such_overload
from tangram.cel.values import type_name

_ORDERABLE = (int, float, str, bytes)


def cel_equal(left: object, right: object) -> bool:
    """CEL equality: numbers compare across int/double, bools never equal numbers."""
    if type(left) is bool or type(right) is bool:
        return type(left) is type(right) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    return type(left) is type(right) and left == right


def _out_of_range(index: int) -> IndexError:
    return IndexError(f"index out of range: {index}")


def _string(function: str, value: object, *rest: object) -> str:
    if type(value) is not str:
        raise no_such_overload(function, value, *rest)
    return value


def _int(function: str, receiver: object, value: object) -> int:
    if type(value) is not int:
        raise no_such_overload(function, receiver, value)
    return value


SIZE_FUNCTION = "tangramCodePointSize"
"""What `size` is renamed to before the evaluator compiles an expression."""

_TRUE_TEXT = frozenset({"1", "t", "true", "TRUE", "True"})
_FALSE_TEXT = frozenset({"0", "f", "false", "FALSE", "False"})


def to_bool(value: object) -> bool:
    """cel-go's bool() conversion."""
    if type(value) is bool:
        return value
    text = _string("bool", value)
    if text in _TRUE_TEXT:
        return True
    if text in _FALSE_TEXT:
        return False
    raise ValueError(f"type conversion error from 'string' to 'bool': {text!r}")


def code_point_size(value: object) -> int:
    """size(): code points for strings, as the CEL spec says (the evaluator's own counts bytes)."""
    if isinstance(value, str | bytes | list | dict):
        return len(value)
    raise no_such_overload("size", value)


def char_at(text: object, index: object) -> str:
    string = _string("charAt", text, index)
    position = _int("charAt", text, index)
    if position < 0 or position > len(string):
        raise _out_of_range(position)
    return string[position : position + 1]


def index_of(receiver: object, item: object, offset: object = 0) -> int:
    if type(receiver) is list:
        return next((i for i, element in enumerate(receiver) if cel_equal(element, item)), -1)
    string = _string("indexOf", receiver, item)
    needle = _string("indexOf", item, receiver)
    start = _int("indexOf", receiver, offset)
    if start < 0 or start > len(string):
        raise _out_of_range(start)
    return string.find(needle, start)


def last_index_of(receiver: object, item: object, offset: object = None) -> int:
    if type(receiver) is list:
        matches = [i for i, element in enumerate(receiver) if cel_equal(element, item)]
        return matches[-1] if matches else -1
    string = _string("lastIndexOf", receiver, item)
    needle = _string("lastIndexOf", item, receiver)
    if offset is None:
        return len(string) if needle == "" else string.rfind(needle)
    end = _int("lastIndexOf", receiver, offset)
    if needle == "":
        return end
    if end < 0 or end >= len(string):
        raise _out_of_range(end)
    return string.rfind(needle, 0, end + len(needle))


def lower_ascii(text: object) -> str:
    string = _string("lowerAscii", text)
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in string)


def upper_ascii(text: object) -> str:
    string = _string("upperAscii", text)
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in string)


def replace(text: object, old: object, new: object, limit: object = -1) -> str:
    string = _string("replace", text, old, new)
    count = _int("replace", text, limit)
    return string.replace(_string("replace", old), _string("replace", new), count if count >= 0 else -1)


def split(text: object, separator: object, limit: object = -1) -> list[str]:
    string = _string("split", text, separator)
    sep = _string("split", separator, text)
    count = _int("split", text, limit)
    if count == 0:
        return []
    if sep == "":
        characters = list(string)
        if 0 < count < len(characters):
            return [*characters[: count - 1], "".join(characters[count - 1 :])]
        return characters
    return string.split(sep, count - 1 if count > 0 else -1)


def substring(text: object, start: object, end: object = None) -> str:
    string = _string("substring", text, start)
    first = _int("substring", text, start)
    last = len(string) if end is None else _int("substring", text, end)
    if first < 0 or first > len(string):
        raise _out_of_range(first)
    if last < 0 or last > len(string):
        raise _out_of_range(last)
    if first > last:
        raise IndexError(f"invalid substring range. start: {first}, end: {last}")
    return string[first:last]


def trim(text: object) -> str:
    return _string("trim", text).strip()


def join(items: object, separator: object = "") -> str:
    if type(items) is not list or not all(type(item) is str for item in items):
        raise no_such_overload("join", items, separator)
    return _string("join", separator, items).join(items)


def quote(text: object) -> str:
    string = _string("strings.quote", text)
    escaped = string.replace("\\", "\\\\").replace('"', '\\"')
    for raw, escape in (("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\a", "\\a"), ("\b", "\\b")):
        escaped = escaped.replace(raw, escape)
    return f'"{escaped.replace(chr(12), chr(92) + "f").replace(chr(11), chr(92) + "v")}"'


def _orderable_list(function: str, items: object) -> list[Any]:
    if type(items) is not list:
        raise no_such_overload(function, items)
    kinds = {type_name(item) for item in items}
    if len(kinds) > 1 or (items and not isinstance(items[0], _ORDERABLE)):
        raise no_such_overload(function, items)
    return items


def is_sorted(items: object) -> bool:
    values = _orderable_list("isSorted", items)
    return all(a <= b for a, b in itertools.pairwise(values))


def list_sum(items: object) -> int | float:
    values = _orderable_list("sum", items)
    if values and not isinstance(values[0], int | float):
        raise no_such_overload("sum", items)
    total: int | float = 0.0 if values and type(values[0]) is float else 0
    for value in values:
        total += value
    return total


def list_min(items: object) -> Any:
    values = _orderable_list("min", items)
    if not values:
        raise ValueError("min called on empty list")
    return min(values)


def list_max(items: object) -> Any:
    values = _orderable_list("max", items)
    if not values:
        raise ValueError("max called on empty list")
    return max(values)


@functools.lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(f"invalid regular expression {pattern!r}: {error}") from None


def find(text: object, pattern: object) -> str:
    match = _regex(_string("find", pattern, text)).search(_string("find", text, pattern))
    return match.group(0) if match else ""


def find_all(text: object, pattern: object, limit: object = -1) -> list[str]:
    compiled = _regex(_string("findAll", pattern, text))
    count = _int("findAll", text, limit)
    found = [match.group(0) for match in compiled.finditer(_string("findAll", text, pattern))]
    return found if count < 0 else found[:count]


def _list(function: str, value: object, other: object) -> list[Any]:
    if type(value) is not list:
        raise no_such_overload(function, value, other)
    return value


def sets_contains(items: object, subset: object) -> bool:
    values = _list("sets.contains", items, subset)
    return all(any(cel_equal(a, b) for a in values) for b in _list("sets.contains", subset, items))


def sets_equivalent(left: object, right: object) -> bool:
    return sets_contains(left, right) and sets_contains(right, left)


def sets_intersects(left: object, right: object) -> bool:
    values = _list("sets.intersects", left, right)
    return any(any(cel_equal(a, b) for a in values) for b in _list("sets.intersects", right, left))


EXTENSION_FUNCTIONS: dict[str, Callable[..., object]] = {
    "bool": to_bool,
    SIZE_FUNCTION: code_point_size,
    "charAt": char_at,
    "indexOf": index_of,
    "lastIndexOf": last_index_of,
    "lowerAscii": lower_ascii,
    "upperAscii": upper_ascii,
    "replace": replace,
    "split": split,
    "substring": substring,
    "trim": trim,
    "join": join,
    "strings.quote": quote,
    "isSorted": is_sorted,
    "sum": list_sum,
    "min": list_min,
    "max": list_max,
    "find": find,
    "findAll": find_all,
    "sets.contains": sets_contains,
    "sets.equivalent": sets_equivalent,
    "sets.intersects": sets_intersects,
}
