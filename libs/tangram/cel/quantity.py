"""Kubernetes resource quantities ("80Gi", "1.5G", "500m") as exact rationals.

Parsing follows `resource.ParseQuantity`: a signed decimal number, then a binary-SI suffix
(Ki..Ei), a decimal-SI suffix (n, u, m, k, M, G, T, P, E) or a decimal exponent (e3, E-2);
values finer than 10^-9 round up, away from zero, as Kubernetes does.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

FORMAT_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
SUFFIX_ERROR = "unable to parse quantity's suffix"

_SHAPE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[-+]?[0-9]*)")
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_EXPONENT = re.compile(r"[eE]([-+]?[0-9]+)")
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@functools.lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string; ValueError with Kubernetes' message when invalid."""
    match = _SHAPE.fullmatch(text)
    if not text or match is None:
        raise ValueError(FORMAT_ERROR)
    sign, whole, fraction, suffix = match.groups()
    if not whole and not fraction:
        raise ValueError(FORMAT_ERROR)
    mantissa = Fraction(int(whole or "0")) + (
        Fraction(int(fraction), 10 ** len(fraction)) if fraction else Fraction(0)
    )
    value = mantissa * _suffix_multiplier(suffix)
    if (value * 10**9).denominator != 1:
        # Kubernetes rounds up to the nano scale so that "some" never becomes "none".
        value = Fraction(-((-value.numerator * 10**9) // value.denominator), 10**9)
    return -value if sign == "-" else value


def _suffix_multiplier(suffix: str) -> Fraction:
    if suffix in _BINARY_SUFFIXES:
        return Fraction(2 ** _BINARY_SUFFIXES[suffix])
    if suffix in _DECIMAL_SUFFIXES:
        return Fraction(10) ** _DECIMAL_SUFFIXES[suffix]
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is None:
        raise ValueError(SUFFIX_ERROR)
    return Fraction(10) ** int(exponent.group(1))


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


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
