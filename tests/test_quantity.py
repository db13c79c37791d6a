"""Kubernetes quantities: one parser and one writer for the whole code base."""

from __future__ import annotations

import pytest

from tangram.quantity import binary_quantity, ceil_quantity, decimal_quantity


@pytest.mark.parametrize(
    ("text", "base_units"),
    [
        ("40Gi", 42_949_672_960),
        ("1.5G", 1_500_000_000),
        ("500m", 1),
        ("1e3", 1000),
        ("0.5Ki", 512),
        (12, 12),
        (" 80Gi ", 85_899_345_920),
    ],
)
def test_requests_round_up_to_whole_base_units(text: str | int, base_units: int) -> None:
    assert ceil_quantity(text) == base_units


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "12 Gi", "1Qi", True])
def test_bad_quantities_are_named_in_the_error(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        ceil_quantity(text)


def test_written_quantities_read_back_to_the_same_value() -> None:
    for value in (0, 132, 16_000, 85_520_809_984, 150_754_820_096):
        assert ceil_quantity(binary_quantity(value)) == value
        assert ceil_quantity(decimal_quantity(value)) == value
