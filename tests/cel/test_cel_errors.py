"""What users get wrong: each mistake is a CelCompileError or CelRuntimeError naming the problem."""

from __future__ import annotations

import re

import pytest

from tangram.cel import (
    CelCompileError,
    CelRuntimeError,
    compile_selector,
    validate_selector,
)
from tangram.dra.model import Device, Version
from tests.cel.devices import h100


@pytest.mark.parametrize(
    ("expression", "key"),
    [
        ('device.attributes["gpu.tangram.dev"].memoryBandwidth == 3', "memoryBandwidth"),
        ('device.capacity["gpu.tangram.dev"].vram.compareTo(quantity("1Gi")) > 0', "vram"),
        ('device.attributes["example.com"].model == "x"', "model"),
    ],
)
def test_missing_attribute_is_a_runtime_error_naming_the_key(expression: str, key: str, gpu: Device) -> None:
    with pytest.raises(CelRuntimeError, match=f"no such key: {key}"):
        compile_selector(expression).matches(gpu)


@pytest.mark.parametrize(
    ("expression", "wanted"),
    [
        ('device.attributes["gpu.tangram.dev"].index', "must evaluate to bool, got int 3"),
        ('device.attributes["gpu.tangram.dev"].productName', "must evaluate to bool, got string"),
        ('dyn(device.capacity["gpu.tangram.dev"].memory)', "must evaluate to bool, got Quantity"),
    ],
)
def test_non_bool_result_is_a_runtime_error(expression: str, wanted: str, gpu: Device) -> None:
    with pytest.raises(CelRuntimeError, match=wanted):
        compile_selector(expression).matches(gpu)


@pytest.mark.parametrize(
    ("expression", "wanted"),
    [
        ('device.attributes["gpu.tangram.dev"].type ==', "syntax error at 1:45: unexpected end of input"),
        ('device.driver == "gpu', "syntax error at 1:18: unterminated string literal"),
        ("(true", "expected ')'"),
        ("true &&\n  #", "syntax error at 2:3: unexpected character '#'"),
        ("", "the expression is empty"),
        ("devices.driver == 'x'", "undeclared reference to 'devices' at 1:1"),
        ('device.driverName == "x"', "undefined field 'driverName' of device"),
        ('quantity("1Gi").toString() == "1Gi"', "undeclared reference to 'toString'"),
        ('"1Gi".quantity().sign() == 1', "quantity() is a function, not a method"),
        ('"abc"', "must evaluate to bool or the unknown type, not string"),
        ("1 + 2", "must evaluate to bool or the unknown type, not int"),
        (
            'device.capacity["gpu.tangram.dev"].memory',
            "must evaluate to bool or the unknown type, not quantity",
        ),
        ('device.capacity["gpu.tangram.dev"].memory > quantity("1Gi")', "no matching overload for '_>_'"),
        ("9223372036854775808 > 0", "integer literal 9223372036854775808 overflows int64"),
        ("if == 1", "reserved identifier 'if'"),
        ("(" * 120 + "true" + ")" * 120, "nested more than 100 levels deep"),
    ],
)
def test_invalid_expression_is_a_compile_error(expression: str, wanted: str) -> None:
    with pytest.raises(CelCompileError, match=_literal(wanted)):
        compile_selector(expression)
    assert wanted in (validate_selector(expression) or "")


def test_compile_error_carries_the_position() -> None:
    with pytest.raises(CelCompileError) as raised:
        compile_selector("true && nope")
    assert raised.value.position == 8


def test_valid_expression_validates_to_none() -> None:
    assert validate_selector('device.attributes["gpu.tangram.dev"].type == "gpu"') is None


def test_expression_longer_than_the_limit_is_rejected() -> None:
    def of_length(size: int) -> str:
        frame = 'device.driver != ""'
        return frame[:-1] + "x" * (size - len(frame)) + '"'

    assert len(of_length(10240)) == 10240
    assert validate_selector(of_length(10240)) is None
    with pytest.raises(CelCompileError, match="10241 bytes long, more than the limit of 10240 bytes"):
        compile_selector(of_length(10241))
    # The limit counts bytes, as the API server does: "é" is two of them.
    assert "10242 bytes long" in (validate_selector(of_length(10241).replace("x", "é", 1)) or "")


def test_cost_limit_rejects_nested_comprehensions() -> None:
    hundred = "[" + ",".join(str(i) for i in range(100)) + "]"
    affordable = f"{hundred}.all(x, {hundred}.all(y, x + y >= 0))"
    assert validate_selector(affordable) is None
    costly = f"{hundred}.all(x, {hundred}.all(y, {hundred}.all(z, x + y + z >= 0)))"
    with pytest.raises(
        CelCompileError, match=r"too complex: estimated cost [0-9]+ exceeds the limit of 1000000"
    ):
        compile_selector(costly)


def test_cost_counts_device_maps_at_their_api_limits() -> None:
    # 32 domains x 32 names x 32 names x 32 names: each level at the API's maximum size.
    nested = (
        "device.attributes.all(d, device.attributes[d].all(a, device.attributes[d].all(b, "
        "device.attributes[d].all(c, a + b + c != d))))"
    )
    assert validate_selector(nested) is not None
    assert "too complex" in (validate_selector(nested) or "")


@pytest.mark.parametrize(
    ("expression", "wanted"),
    [
        ('quantity("200K").sign() == 1', "quantity: unable to parse quantity's suffix"),
        ('quantity("Three").sign() == 1', "quantity: quantities must match the regular expression"),
        ('semver("1.0").major() == 1', "semver: invalid semantic version '1.0'"),
        ('quantity("1.5").asInteger() == 1', "asInteger: cannot convert value to integer"),
        ('"abc".substring(5) == ""', "substring: index out of range: 5"),
        ("[1, 2].filter(x, x > 5).min() == 0", "min: min called on empty list"),
        (
            'quantity("1").compareTo(semver("1.0.0")) == 0',
            "no such overload: compareTo\\(Quantity, Semver\\)",
        ),
        ("1 / 0 == 0", "division by zero"),
    ],
)
def test_library_errors_are_runtime_errors(expression: str, wanted: str, gpu: Device) -> None:
    with pytest.raises(CelRuntimeError, match=wanted):
        compile_selector(expression).matches(gpu)


def test_invalid_version_attribute_is_a_runtime_error() -> None:
    device = h100(**{"gpu.tangram.dev/driverVersion": Version("580.95")})
    with pytest.raises(
        CelRuntimeError, match=r"attribute gpu\.tangram\.dev/driverVersion: invalid semantic version"
    ):
        compile_selector("true").matches(device)


def _literal(text: str) -> str:
    return re.escape(text)
