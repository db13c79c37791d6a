"""Compile DRA device selectors once, evaluate them per device as Kubernetes does."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import cel

from tangram import DRIVER_NAME
from tangram.cel.activation import ActivationCache, DeviceActivation
from tangram.cel.analysis import analyze
from tangram.cel.errors import CelCompileError, CelRuntimeError
from tangram.cel.extension_library import SIZE_FUNCTION
from tangram.cel.values import type_name
from tangram.dra.model import Device

_LIBRARY_ERROR = re.compile(
    r"Function '(?P<name>[\w.]+)' error: Python function call failed: \w+: (?P<message>.*?)"
    r"\. Check function arguments and their types\.$",
    re.DOTALL,
)
_ENGINE_HINT = re.compile(
    r"\. Check that the variable is defined.*$|\. Check function arguments.*$", re.DOTALL
)


class CelSelector:
    """A compiled selector. `matches` answers whether one device satisfies it."""

    __slots__ = ("_activations", "_domains", "_program", "estimated_cost", "expression")

    def __init__(self, expression: str, program: Any, domains: frozenset[str], estimated_cost: int) -> None:
        self.expression = expression
        self.estimated_cost = estimated_cost
        self._program = program
        self._domains = domains
        self._activations = _ACTIVATIONS

    def __repr__(self) -> str:
        return f"CelSelector({self.expression!r})"

    def matches(self, device: Device | DeviceActivation, driver: str = DRIVER_NAME) -> bool:
        """True when the device satisfies the selector; CelRuntimeError when evaluation fails."""
        activation = device if isinstance(device, DeviceActivation) else self._activations.get(device, driver)
        try:
            result = self._program.execute(activation.context)
        except KeyError as missing:
            result = self._retry_with_unknown_domains(activation, missing)
        except Exception as error:
            raise CelRuntimeError(self._describe(error)) from None
        if type(result) is not bool:
            raise CelRuntimeError(
                f"selector {self.expression!r} must evaluate to bool, "
                f"got {type_name(result)} {result!r} for device {activation.device.name}"
            )
        return result

    def matches_many(
        self, devices: Iterable[Device | DeviceActivation], driver: str = DRIVER_NAME
    ) -> list[bool]:
        """`matches` for each device, in order; the first runtime error is raised."""
        return [self.matches(device, driver) for device in devices]

    def _retry_with_unknown_domains(self, activation: DeviceActivation, missing: KeyError) -> Any:
        absent = frozenset(domain for domain in self._domains if not activation.has_domain(domain))
        key = missing.args[0] if missing.args else ""
        if key in absent:
            try:
                return self._program.execute(activation.widened_context(absent))
            except KeyError as still_missing:
                missing = still_missing
            except Exception as error:
                raise CelRuntimeError(self._describe(error)) from None
        key = missing.args[0] if missing.args else ""
        raise CelRuntimeError(
            f"no such key: {key} (evaluating {self.expression!r} on device "
            f"{activation.device.name}; guard a lookup that may be absent with has() or 'in')"
        ) from None

    def _describe(self, error: BaseException) -> str:
        text = str(error)
        library = _LIBRARY_ERROR.search(text)
        if library is not None:
            text = f"{library.group('name')}: {library.group('message')}"
        else:
            text = _ENGINE_HINT.sub("", text)
        return f"evaluating {self.expression!r}: {text.replace(SIZE_FUNCTION, 'size')}"


_ACTIVATIONS = ActivationCache()
_CACHE_LIMIT = 4096
_COMPILED: OrderedDict[str, CelSelector] = OrderedDict()


def compile_selector(expression: str) -> CelSelector:
    """The compiled selector for `expression`, from the cache when it was compiled before."""
    selector = _COMPILED.get(expression)
    if selector is not None:
        _COMPILED.move_to_end(expression)
        return selector
    if not isinstance(expression, str):
        raise CelCompileError(f"a selector expression must be a string, not {type(expression).__name__}")
    analysis = analyze(expression)
    try:
        program = cel.compile(_evaluator_source(expression, analysis.size_calls))
    except (ValueError, RuntimeError) as error:
        raise CelCompileError(f"compilation failed: {error}") from None
    selector = CelSelector(expression, program, analysis.domains, analysis.estimated_cost)
    _COMPILED[expression] = selector
    if len(_COMPILED) > _CACHE_LIMIT:
        _COMPILED.popitem(last=False)
    return selector


def _evaluator_source(expression: str, size_calls: tuple[int, ...]) -> str:
    """The expression with size() renamed to the code-point-counting function."""
    pieces: list[str] = []
    start = 0
    for position in size_calls:
        pieces.append(expression[start:position])
        pieces.append(SIZE_FUNCTION)
        start = position + len("size")
    pieces.append(expression[start:])
    return "".join(pieces)


def validate_selector(expression: str) -> str | None:
    """None when the expression compiles as a DRA selector, else the error message."""
    try:
        compile_selector(expression)
    except CelCompileError as error:
        return str(error)
    return None
