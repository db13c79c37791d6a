"""Quantities as CEL sees them: exact rationals with Kubernetes' int64 and float conversions."""

from __future__ import annotations

from fractions import Fraction

from tangram.quantity import FORMAT_ERROR, SUFFIX_ERROR, is_quantity, parse_quantity

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

__all__ = [
    "FORMAT_ERROR",
    "INT64_MAX",
    "INT64_MIN",
    "SUFFIX_ERROR",
    "approximate_float",
    "as_int64",
    "is_quantity",
    "parse_quantity",
]


def as_int64(value: Fraction) -> int | None:
    """The value as an int64, or None when that would lose precision or overflow."""
    if value.denominator != 1 or not INT64_MIN <= value.numerator <= INT64_MAX:
        return None
    return value.numerator


def approximate_float(value: Fraction) -> float:
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")
