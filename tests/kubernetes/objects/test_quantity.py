import pytest

from tangram.kubernetes.objects import binary_quantity, decimal_quantity


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (1, "1"),
        (132, "132"),
        (1000, "1k"),
        (1500, "1500"),
        (16000, "16k"),
        (2_000_000, "2M"),
        (-3000, "-3k"),
    ],
)
def test_decimal_quantities_are_canonical(value: int, expected: str) -> None:
    assert decimal_quantity(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (85_520_809_984, "81559Mi"),  # H100 80GB HBM3: 81559 MiB
        (10_468_982_784, "9984Mi"),  # 1g.10gb
        (1024, "1Ki"),
        (1025, "1025"),
        (1023, "1023"),  # below 1024 Kubernetes writes DecimalSI
        (1000, "1k"),
        (1_073_741_824, "1Gi"),
        (1_152_921_504_606_846_976, "1Ei"),
        (1_180_591_620_717_411_303_424, "1024Ei"),
    ],
)
def test_binary_quantities_are_canonical(value: int, expected: str) -> None:
    assert binary_quantity(value) == expected
