"""Kubernetes resource quantities ("80Gi", "1.5G", "500m"): exact parsing and canonical writing.

Parsing follows `resource.ParseQuantity`: a signed decimal number, then a binary-SI suffix
(Ki..Ei), a decimal-SI suffix (n, u, m, k, M, G, T, P, E) or a decimal exponent (e3, E-2);
values finer than 10^-9 round up, away from zero, as Kubernetes does. Writing uses the canonical
form the API server writes back, so a published object equals what a later GET returns.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

FORMAT_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
SUFFIX_ERROR = "unable to parse quantity's suffix"

_SHAPE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[-+]?[0-9]*)")
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_EXPONENT = re.compile(r"[eE]([-+]?[0-9]+)")


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


def ceil_quantity(value: str | int) -> int:
    """A quantity in whole base units, rounded up: capacity >= this satisfies the request."""
    if isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a number")
    if isinstance(value, int):
        return value
    try:
        return math.ceil(parse_quantity(value.strip()))
    except ValueError:
        raise ValueError(
            f"quantity {value!r} is not a Kubernetes quantity (for example 40Gi, 1.5G, 500m)"
        ) from None


_CANONICAL_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_CANONICAL_DECIMAL = ("", "k", "M", "G", "T", "P", "E")


def decimal_quantity(value: int) -> str:
    """Canonical DecimalSI: 132 -> "132", 16000 -> "16k", 0 -> "0"."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa = abs(value)
    step = 0
    while step < len(_CANONICAL_DECIMAL) - 1 and mantissa % 1000 == 0:
        mantissa //= 1000
        step += 1
    return f"{sign}{mantissa}{_CANONICAL_DECIMAL[step]}"


def binary_quantity(value: int) -> str:
    """Canonical BinarySI: 85520809984 -> "81559Mi"; below 1024 Kubernetes falls back to DecimalSI."""
    if -1024 < value < 1024:
        return decimal_quantity(value)
    sign = "-" if value < 0 else ""
    mantissa = abs(value)
    step = 0
    while step < len(_CANONICAL_BINARY) - 1 and mantissa % 1024 == 0:
        mantissa //= 1024
        step += 1
    return f"{sign}{mantissa}{_CANONICAL_BINARY[step]}"
