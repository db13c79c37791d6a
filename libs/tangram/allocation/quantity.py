"""Parse Kubernetes resource quantities ("40Gi", "1.5G", "500m") into integers of base units."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[KMGTPE]i|[mkMGTPE]?)$")
_MULTIPLIERS: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def parse_quantity(value: str | int) -> int:
    """A quantity in base units, rounded up: a device with capacity >= the result satisfies the request."""
    if isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a number")
    if isinstance(value, int):
        return value
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"quantity {value!r} is not a Kubernetes quantity (for example 40Gi, 1.5G, 500m)")
    number, suffix = match.groups()
    try:
        mantissa = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"quantity {value!r} has an invalid number {number!r}") from None
    multiplier = Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _MULTIPLIERS[suffix]
    return math.ceil(mantissa * multiplier)
