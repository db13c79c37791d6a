"""The Kubernetes quantity and semver CEL libraries, as functions for the evaluator.

The evaluator calls `x.f(a)` as `f(x, a)`, so one Python function serves each method name and
dispatches on the receiver, like cel-go's overloads; a receiver of the wrong type is a
"no such overload" error, as in Kubernetes.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from tangram.cel.quantity import approximate_float, as_int64, is_quantity, parse_quantity
from tangram.cel.semver import compare_semver, is_semver, parse_semver
from tangram.cel.values import (
    QuantityValue,
    SemverValue,
    is_quantity_value,
    is_semver_value,
    quantity_of,
    quantity_value,
    semver_of,
    semver_value,
    type_name,
)


def no_such_overload(function: str, *args: object) -> TypeError:
    signature = ", ".join(type_name(arg) for arg in args)
    return TypeError(f"no such overload: {function}({signature})")


def _require_string(function: str, value: object) -> str:
    if type(value) is not str:
        raise no_such_overload(function, value)
    return value


def quantity(text: object) -> QuantityValue:
    return quantity_value(parse_quantity(_require_string("quantity", text)))


def is_quantity_function(text: object) -> bool:
    return is_quantity(_require_string("isQuantity", text))


def semver(text: object, normalize: object = False) -> SemverValue:
    if type(normalize) is not bool:
        raise no_such_overload("semver", text, normalize)
    return semver_value(parse_semver(_require_string("semver", text), normalize=normalize))


def is_semver_function(text: object, normalize: object = False) -> bool:
    if type(normalize) is not bool:
        raise no_such_overload("isSemver", text, normalize)
    return is_semver(_require_string("isSemver", text), normalize=normalize)


def _compare(function: str, left: object, right: object) -> int:
    if is_quantity_value(left) and is_quantity_value(right):
        mine, theirs = quantity_of(left), quantity_of(right)
        return (mine > theirs) - (mine < theirs)
    if is_semver_value(left) and is_semver_value(right):
        return compare_semver(semver_of(left), semver_of(right))
    raise no_such_overload(function, left, right)


def compare_to(left: object, right: object) -> int:
    return _compare("compareTo", left, right)


def is_greater_than(left: object, right: object) -> bool:
    return _compare("isGreaterThan", left, right) == 1


def is_less_than(left: object, right: object) -> bool:
    return _compare("isLessThan", left, right) == -1


def _quantity_receiver(function: str, value: object, *rest: object) -> Fraction | int:
    if not is_quantity_value(value):
        raise no_such_overload(function, value, *rest)
    return quantity_of(value)


def sign(value: object) -> int:
    number = _quantity_receiver("sign", value)
    return (number > 0) - (number < 0)


def is_integer(value: object) -> bool:
    return as_int64(Fraction(_quantity_receiver("isInteger", value))) is not None


def as_integer(value: object) -> int:
    number = as_int64(Fraction(_quantity_receiver("asInteger", value)))
    if number is None:
        raise ValueError("cannot convert value to integer")
    return number


def as_approximate_float(value: object) -> float:
    return approximate_float(Fraction(_quantity_receiver("asApproximateFloat", value)))


def _operand(function: str, receiver: object, operand: object) -> Fraction | int:
    if is_quantity_value(operand):
        return quantity_of(operand)
    if type(operand) is int:
        return operand
    raise no_such_overload(function, receiver, operand)


def add(value: object, operand: object) -> QuantityValue:
    number = _quantity_receiver("add", value, operand)
    return quantity_value(number + _operand("add", value, operand))


def sub(value: object, operand: object) -> QuantityValue:
    number = _quantity_receiver("sub", value, operand)
    return quantity_value(number - _operand("sub", value, operand))


def mul(value: object, operand: object) -> QuantityValue:
    number = _quantity_receiver("mul", value, operand)
    if type(operand) is not int:
        raise no_such_overload("mul", value, operand)
    return quantity_value(number * operand)


def _semver_receiver(function: str, value: object) -> Any:
    if not is_semver_value(value):
        raise no_such_overload(function, value)
    return semver_of(value)


def major(value: object) -> int:
    return int(_semver_receiver("major", value).major)


def minor(value: object) -> int:
    return int(_semver_receiver("minor", value).minor)


def patch(value: object) -> int:
    return int(_semver_receiver("patch", value).patch)


KUBERNETES_FUNCTIONS: dict[str, Callable[..., object]] = {
    "quantity": quantity,
    "isQuantity": is_quantity_function,
    "semver": semver,
    "isSemver": is_semver_function,
    "sign": sign,
    "isInteger": is_integer,
    "asInteger": as_integer,
    "asApproximateFloat": as_approximate_float,
    "add": add,
    "sub": sub,
    "mul": mul,
    "major": major,
    "minor": minor,
    "patch": patch,
}
"""Functions whose name no other library uses; compareTo and friends are merged in `functions`."""

ORDERING_FUNCTIONS: dict[str, Callable[..., object]] = {
    "compareTo": compare_to,
    "isGreaterThan": is_greater_than,
    "isLessThan": is_less_than,
}
