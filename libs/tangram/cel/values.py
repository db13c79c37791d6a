"""How quantities and semantic versions travel through the CEL evaluator.

The evaluator only carries plain CEL values, so a quantity is a one-entry map
{"@quantity": <exact value>} and a version a one-entry map {"@semver": <canonical string>}.
The stored value is canonical (an int when the quantity is a whole int64, the reduced fraction
as a string otherwise; the version without build metadata), so CEL's own `==` on two such maps
is Kubernetes' semantic equality: quantity("1Gi") == quantity("1024Mi").
A map is used rather than a tagged string so that `<`, `+` and string functions on these values
fail, as they do in Kubernetes, instead of silently comparing text.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from tangram.cel.quantity import INT64_MAX, INT64_MIN
from tangram.cel.semver import Semver, parse_semver

QUANTITY_KEY = "@quantity"
SEMVER_KEY = "@semver"

QuantityValue = dict[str, int | str]
SemverValue = dict[str, str]


def quantity_value(value: Fraction | int) -> QuantityValue:
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return {QUANTITY_KEY: value}
        return {QUANTITY_KEY: str(value)}
    if value.denominator == 1 and INT64_MIN <= value.numerator <= INT64_MAX:
        return {QUANTITY_KEY: value.numerator}
    return {QUANTITY_KEY: str(value)}


def semver_value(version: Semver) -> SemverValue:
    return {SEMVER_KEY: version.canonical()}


def is_quantity_value(value: object) -> bool:
    return type(value) is dict and len(value) == 1 and QUANTITY_KEY in value


def is_semver_value(value: object) -> bool:
    return type(value) is dict and len(value) == 1 and SEMVER_KEY in value


def quantity_of(value: Any) -> Fraction | int:
    """The exact number inside a quantity value (an int on the common whole-bytes path)."""
    raw = value[QUANTITY_KEY]
    return raw if type(raw) is int else Fraction(raw)


def semver_of(value: Any) -> Semver:
    return parse_semver(value[SEMVER_KEY])


def type_name(value: object) -> str:
    """The CEL type name of a converted value, for error messages."""
    if is_quantity_value(value):
        return "Quantity"
    if is_semver_value(value):
        return "Semver"
    match value:
        case bool():
            return "bool"
        case int():
            return "int"
        case float():
            return "double"
        case str():
            return "string"
        case bytes():
            return "bytes"
        case list():
            return "list"
        case dict():
            return "map"
        case None:
            return "null_type"
    return type(value).__name__
