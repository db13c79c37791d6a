"""Kubernetes resource quantities in their canonical form, as the API server would write them back.

Writing the canonical form means a published object equals what a later GET returns, so a
comparison before an update does not see a difference where there is none.
"""

from __future__ import annotations

_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


def decimal_quantity(value: int) -> str:
    """Canonical DecimalSI: 132 -> "132", 16000 -> "16k", 0 -> "0"."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa = abs(value)
    step = 0
    while step < len(_DECIMAL_SUFFIXES) - 1 and mantissa % 1000 == 0:
        mantissa //= 1000
        step += 1
    return f"{sign}{mantissa}{_DECIMAL_SUFFIXES[step]}"


def binary_quantity(value: int) -> str:
    """Canonical BinarySI: 85520809984 -> "81559Mi"; below 1024 Kubernetes falls back to DecimalSI."""
    if -1024 < value < 1024:
        return decimal_quantity(value)
    sign = "-" if value < 0 else ""
    mantissa = abs(value)
    step = 0
    while step < len(_BINARY_SUFFIXES) - 1 and mantissa % 1024 == 0:
        mantissa //= 1024
        step += 1
    return f"{sign}{mantissa}{_BINARY_SUFFIXES[step]}"
