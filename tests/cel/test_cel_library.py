"""The Kubernetes CEL libraries: quantity, semver, strings, lists, regex and sets."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tangram.cel import compile_selector
from tangram.cel.quantity import parse_quantity
from tangram.cel.semver import Semver, compare_semver, parse_semver
from tangram.dra.model import Device


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", Fraction(85899345920)),
        ("1Ki", Fraction(1024)),
        ("1.5Gi", Fraction(1610612736)),
        ("1.5G", Fraction(1500000000)),
        ("200k", Fraction(200000)),
        ("500m", Fraction(1, 2)),
        ("-2M", Fraction(-2000000)),
        ("+3", Fraction(3)),
        ("1e3", Fraction(1000)),
        ("1E-2", Fraction(1, 100)),
        ("0", Fraction(0)),
        (".5", Fraction(1, 2)),
        ("1.", Fraction(1)),
        ("1n", Fraction(1, 1000000000)),
        ("0.1n", Fraction(1, 1000000000)),  # rounds up to the nano scale
        ("1E", Fraction(10**18)),
    ],
)
def test_quantity_parsing(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "200K", "Three", "Mi", "1.5.5", "1 Gi", "1Gi ", "0x10", "1e", "--1"])
def test_invalid_quantities(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


@pytest.mark.parametrize(
    "expression",
    [
        'quantity("200M").compareTo(quantity("0.2G")) == 0',
        'quantity("50M").compareTo(quantity("50Mi")) == -1',
        'quantity("50Mi").compareTo(quantity("50M")) == 1',
        'quantity("150Mi").isGreaterThan(quantity("100Mi"))',
        '!quantity("50Mi").isGreaterThan(quantity("100Mi"))',
        'quantity("50M").isLessThan(quantity("100M"))',
        'quantity("1Gi") == quantity("1024Mi")',
        'quantity("1G") != quantity("1Gi")',
        'quantity("50k").add(quantity("20k")) == quantity("70k")',
        'quantity("50k").add(20) == quantity("50020")',
        'quantity("50k").sub(20000) == quantity("30k")',
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")',
        'quantity("50k").sub(20000).asApproximateFloat() == 30000.0',
        'quantity("50k").asInteger() == 50000',
        'quantity("50000000G").isInteger()',
        '!quantity("9999999999999999999999999999999999999G").isInteger()',
        '!quantity("500m").isInteger()',
        'quantity("-1").sign() == -1 && quantity("0").sign() == 0 && sign(quantity("1m")) == 1',
        'quantity("1Gi").mul(3) == quantity("3Gi")',
        'isQuantity("1.3Gi") && !isQuantity("1,3G") && !isQuantity("200K")',
    ],
)
def test_quantity_library(expression: str, gpu: Device) -> None:
    assert compile_selector(expression).matches(gpu) is True


@pytest.mark.parametrize(
    ("text", "normalize", "version"),
    [
        ("1.2.3", False, Semver(1, 2, 3)),
        ("580.95.5", False, Semver(580, 95, 5)),
        ("1.0.0-alpha.1+build.7", False, Semver(1, 0, 0, ("alpha", "1"))),
        ("v1.2", True, Semver(1, 2, 0)),
        ("01.02.03", True, Semver(1, 2, 3)),
        ("9", True, Semver(9, 0, 0)),
    ],
)
def test_semver_parsing(text: str, normalize: bool, version: Semver) -> None:
    assert parse_semver(text, normalize=normalize) == version


@pytest.mark.parametrize("text", ["1.0", "v1.0.0", "01.2.3", "1.2.3-01", "1.2.3-", "1.2.x", "580.95.05"])
def test_invalid_semvers(text: str) -> None:
    with pytest.raises(ValueError, match="invalid semantic version"):
        parse_semver(text)


@pytest.mark.parametrize(
    ("left", "right", "order"),
    [
        ("1.2.3", "1.2.3", 0),
        ("1.2.3", "2.0.0", -1),
        ("1.2.3", "0.1.2", 1),
        ("1.10.0", "1.9.0", 1),
        ("1.0.0-alpha", "1.0.0", -1),
        ("1.0.0-alpha", "1.0.0-alpha.1", -1),
        ("1.0.0-alpha.beta", "1.0.0-beta", -1),
        ("1.0.0-beta.2", "1.0.0-beta.11", -1),
        ("1.0.0-rc.1", "1.0.0-beta.11", 1),
        ("1.0.0-1", "1.0.0-alpha", -1),
        ("1.0.0+build.1", "1.0.0+build.2", 0),
    ],
)
def test_semver_ordering(left: str, right: str, order: int) -> None:
    assert compare_semver(parse_semver(left), parse_semver(right)) == order


@pytest.mark.parametrize(
    "expression",
    [
        'semver("1.2.3").compareTo(semver("1.2.3")) == 0',
        'semver("1.2.3").isLessThan(semver("2.0.0"))',
        'semver("1.2.3").isGreaterThan(semver("0.1.2"))',
        'semver("1.0.0+a") == semver("1.0.0+b")',
        'semver("v1.0", true) == semver("1.0.0")',
        'isSemver("1.0.0") && !isSemver("v1.0") && isSemver("v1.0", true)',
        'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3',
    ],
)
def test_semver_library(expression: str, gpu: Device) -> None:
    assert compile_selector(expression).matches(gpu) is True


@pytest.mark.parametrize(
    "expression",
    [
        '"TeSt".lowerAscii() == "test"',
        '"TeSt é".upperAscii() == "TEST é"',
        '"a,b,c".split(",") == ["a", "b", "c"]',
        '"a,b,c".split(",", 2) == ["a", "b,c"]',
        '"abc".split("") == ["a", "b", "c"]',
        '["a", "b"].join("-") == "a-b"',
        '["a", "b"].join() == "ab"',
        '"hello hello".replace("he", "we") == "wello wello"',
        '"hello hello".replace("he", "we", 1) == "wello hello"',
        '"tacocat".substring(4) == "cat"',
        '"tacocat".substring(0, 4) == "taco"',
        '"héllo".substring(1, 2) == "é"',
        '"hello mellow".indexOf("ello") == 1',
        '"hello mellow".indexOf("ello", 2) == 7',
        '"hello mellow".lastIndexOf("ello") == 7',
        '"hello mellow".lastIndexOf("ello", 6) == 1',
        '"héllo".indexOf("l") == 2',
        '"  \\ttrim\\n ".trim() == "trim"',
        '"tacocat".charAt(3) == "o" && "tacocat".charAt(7) == ""',
        '"abc".startsWith("ab") && "abc".endsWith("bc") && "abc".contains("b")',
        '"abc123".matches("^[a-z]+[0-9]+$")',
        '"abc 123 def 456".find("[0-9]+") == "123"',
        '"abc 123 def 456".findAll("[0-9]+") == ["123", "456"]',
        '"abc 123 def 456".findAll("[0-9]+", 1) == ["123"]',
        'strings.quote("a\\"b") == "\\"a\\\\\\"b\\""',
        'bool("true") && !bool("f")',
        '"abc".size() == 3 && size("héllo") == 5',
    ],
)
def test_strings_library(expression: str, gpu: Device) -> None:
    assert compile_selector(expression).matches(gpu) is True


@pytest.mark.parametrize(
    "expression",
    [
        "[1, 2, 3].isSorted() && ![3, 1].isSorted()",
        '["a", "b"].isSorted()',
        "[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0",
        "[].sum() == 0",
        "[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3",
        '["b", "a"].min() == "a"',
        "[1, 2, 3, 2].indexOf(2) == 1 && [1, 2, 3, 2].lastIndexOf(2) == 3",
        "[1, 2].indexOf(5) == -1",
        "[true, 1].indexOf(1) == 1",
        "[1, 2, 3].all(x, x > 0) && [1, 2, 3].exists(x, x == 2)",
        "[1, 2, 3].exists_one(x, x > 2) && ![1, 2, 3].exists_one(x, x > 1)",
        "[1, 2, 3].map(x, x * 2) == [2, 4, 6]",
        "[1, 2, 3].map(x, x > 1, x * 10) == [20, 30]",
        "[1, 2, 3].filter(x, x % 2 == 1) == [1, 3]",
        "size([1, 2]) == 2 && [1, 2].size() == 2",
        "sets.contains([1, 2, 3], [3, 1]) && !sets.contains([1], [2])",
        "sets.equivalent([1, 2, 2], [2, 1]) && sets.intersects([1, 2], [2, 3])",
        "2 in [1, 2] && !(5 in [1, 2])",
    ],
)
def test_lists_library(expression: str, gpu: Device) -> None:
    assert compile_selector(expression).matches(gpu) is True
