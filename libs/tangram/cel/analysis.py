"""Compile-time checks Kubernetes makes that the evaluator does not, and a static cost bound.

Kubernetes type-checks a selector (undeclared names, functions that do not exist, a result that
cannot be a bool) and rejects one whose estimated worst-case cost exceeds 1,000,000. The
evaluator here measures no cost at run time, so the estimate below is the limit: it follows
cel-go's cost model in outline (1 per variable, field, index and call; string work at 0.1 per
character; a comprehension pays its body once per element) and bounds everything the device
can hold with the API's own limits (32 attributes and capacities per device, attribute strings
of at most 64 characters). It is conservative, never exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tangram.cel.errors import CelCompileError
from tangram.cel.syntax import (
    Call,
    Comprehension,
    Ident,
    ListExpr,
    Literal,
    MapExpr,
    Node,
    Select,
    StructExpr,
    parse,
)

MAX_EXPRESSION_LENGTH = 10 * 1024
"""resource.k8s.io CELSelectorExpressionMaxLength, in bytes."""
MAX_COST = 1_000_000
"""resource.k8s.io CELSelectorExpressionMaxCost."""

MAX_ENTRIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength
MAX_NAME_LENGTH = 63  # domains, attribute names and the driver name
UNKNOWN_SIZE = MAX_VALUE_LENGTH
INT64_MAX = 2**63 - 1

TYPE_NAMES = frozenset(
    {"int", "uint", "double", "string", "bytes", "bool", "list", "map", "null_type", "type"}
)

_BOOL, _INT, _DYN = "bool", "int", "dyn"
# name -> (result type, may be called as a method, may be called as a function)
FUNCTIONS: dict[str, tuple[str, bool, bool]] = {
    **dict.fromkeys(("contains", "startsWith", "endsWith"), (_BOOL, True, False)),
    "matches": (_BOOL, True, True),
    "size": (_INT, True, True),
    "int": (_INT, False, True),
    "uint": ("uint", False, True),
    "double": ("double", False, True),
    "string": ("string", False, True),
    "bytes": ("bytes", False, True),
    "bool": (_BOOL, False, True),
    "type": ("type", False, True),
    "dyn": (_DYN, False, True),
    "timestamp": ("timestamp", False, True),
    "duration": ("duration", False, True),
    **dict.fromkeys(
        (
            "getFullYear",
            "getMonth",
            "getDayOfYear",
            "getDayOfMonth",
            "getDate",
            "getDayOfWeek",
            "getHours",
            "getMinutes",
            "getSeconds",
            "getMilliseconds",
        ),
        (_INT, True, False),
    ),
    "quantity": ("quantity", False, True),
    "isQuantity": (_BOOL, False, True),
    "semver": ("semver", False, True),
    "isSemver": (_BOOL, False, True),
    "sign": (_INT, True, True),
    **dict.fromkeys(("isInteger", "isGreaterThan", "isLessThan", "isSorted"), (_BOOL, True, False)),
    **dict.fromkeys(("compareTo", "asInteger", "major", "minor", "patch"), (_INT, True, False)),
    **dict.fromkeys(("indexOf", "lastIndexOf"), (_INT, True, False)),
    "asApproximateFloat": ("double", True, False),
    **dict.fromkeys(("add", "sub", "mul"), ("quantity", True, False)),
    **dict.fromkeys(
        ("charAt", "lowerAscii", "upperAscii", "replace", "substring", "trim", "join", "find"),
        ("string", True, False),
    ),
    **dict.fromkeys(("split", "findAll"), ("list", True, False)),
    **dict.fromkeys(("sum", "min", "max"), (_DYN, True, False)),
    "strings.quote": ("string", False, True),
    **dict.fromkeys(("sets.contains", "sets.equivalent", "sets.intersects"), (_BOOL, False, True)),
}
_BOOL_OPERATORS = frozenset({"_&&_", "_||_", "!_", "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_", "@in"})
_ARITHMETIC = frozenset({"_+_", "_-_", "_*_", "_/_", "_%_", "-_"})
_LINEAR_STRING_WORK = frozenset(
    {
        "contains",
        "startsWith",
        "endsWith",
        "charAt",
        "indexOf",
        "lastIndexOf",
        "lowerAscii",
        "upperAscii",
        "replace",
        "split",
        "substring",
        "trim",
        "join",
        "strings.quote",
        "_==_",
        "_!=_",
        "_<_",
        "_<=_",
        "_>_",
        "_>=_",
        "string",
        "bytes",
    }
)
_REGEX = frozenset({"matches", "find", "findAll"})
_LIST_WORK = frozenset(
    {
        "sum",
        "min",
        "max",
        "isSorted",
        "indexOf",
        "lastIndexOf",
        "join",
        "@in",
        "sets.contains",
        "sets.equivalent",
        "sets.intersects",
    }
)


@dataclass(frozen=True, slots=True)
class Shape:
    """What the estimator knows of a value: its type, its largest size, where in `device` it is."""

    type: str = _DYN
    size: int = 0  # characters of a string, elements of a list or map
    path: str = ""  # "device", "domains", "names", "value" inside the device variable
    element: Shape | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    cost: int
    shape: Shape


@dataclass(frozen=True, slots=True)
class Analysis:
    domains: frozenset[str]
    estimated_cost: int
    result_type: str
    size_calls: tuple[int, ...]  # source positions of the name of each size() call


_DEVICE = Shape("map", 4, "device")
_VALUE = Shape(_DYN, MAX_VALUE_LENGTH, "value")
_NAME = Shape("string", MAX_NAME_LENGTH)
_NAMES = Shape("map", MAX_ENTRIES, "names", _NAME)
_DOMAINS = Shape("map", MAX_ENTRIES, "domains", _NAME)
_CAPACITY_NAMES = Shape("map", MAX_ENTRIES, "capacity names", _NAME)
_CAPACITY_DOMAINS = Shape("map", MAX_ENTRIES, "capacity domains", _NAME)
_QUANTITY = Shape("quantity")
_ORDERING = frozenset({"_<_", "_<=_", "_>_", "_>=_"})


def analyze(expression: str) -> Analysis:
    """Everything Kubernetes would reject at compile time raises CelCompileError here."""
    size = len(expression.encode())
    if size > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(
            f"expression is {size} bytes long, more than the limit of {MAX_EXPRESSION_LENGTH} bytes"
        )
    tree = parse(expression)
    walker = _Walker(expression)
    try:
        estimate = walker.visit(tree, {"device": _DEVICE})
    except RecursionError:
        raise CelCompileError("the expression is nested too deeply") from None
    if estimate.shape.type not in (_BOOL, _DYN):
        raise CelCompileError(
            f"must evaluate to bool or the unknown type, not {estimate.shape.type}", position=0
        )
    if estimate.cost > MAX_COST:
        raise CelCompileError(
            f"too complex: estimated cost {estimate.cost} exceeds the limit of {MAX_COST} "
            "(large lists or nested comprehensions multiply the work)",
            position=0,
        )
    return Analysis(
        frozenset(walker.domains), estimate.cost, estimate.shape.type, tuple(sorted(walker.size_calls))
    )


def _tenth(size: int) -> int:
    return math.ceil(size * 0.1)


class _Walker:
    def __init__(self, source: str) -> None:
        self.source = source
        self.domains: set[str] = set()
        self.size_calls: list[int] = []

    def fail(self, message: str, node: Node) -> CelCompileError:
        line = self.source.count("\n", 0, node.position) + 1
        column = node.position - (self.source.rfind("\n", 0, node.position) + 1) + 1
        return CelCompileError(f"{message} at {line}:{column}", position=node.position)

    def visit(self, node: Node, scope: dict[str, Shape]) -> Estimate:
        match node:
            case Literal():
                return self.literal(node)
            case Ident():
                if node.name in scope:
                    return Estimate(1, scope[node.name])
                if node.name in TYPE_NAMES:
                    return Estimate(1, Shape("type"))
                raise self.fail(f"undeclared reference to {node.name!r}", node)
            case Select():
                return self.select(node, scope)
            case Call() if node.function in ("_&&_", "_||_"):
                return self.logical_chain(node, scope)
            case Call():
                return self.call(node, scope)
            case ListExpr():
                parts = [self.visit(element, scope) for element in node.elements]
                element = _widest([part.shape for part in parts])
                return Estimate(10 + sum(p.cost for p in parts), Shape("list", len(parts), "", element))
            case MapExpr():
                cost = 30
                keys: list[Shape] = []
                for key, value in node.entries:
                    key_estimate = self.visit(key, scope)
                    keys.append(key_estimate.shape)
                    cost += key_estimate.cost + self.visit(value, scope).cost
                return Estimate(cost, Shape("map", len(node.entries), "", _widest(keys)))
            case StructExpr():
                raise self.fail(f"undeclared reference to message type {node.type_name!r}", node)
            case Comprehension():
                return self.comprehension(node, scope)
        raise self.fail("unsupported expression", node)

    def literal(self, node: Literal) -> Estimate:
        if node.kind == "int" and isinstance(node.value, int) and node.value > INT64_MAX:
            raise self.fail(f"integer literal {node.value} overflows int64", node)
        size = len(node.value) if isinstance(node.value, str | bytes) else 0
        return Estimate(0, Shape(node.kind, size))

    def select(self, node: Select, scope: dict[str, Shape]) -> Estimate:
        operand = self.visit(node.operand, scope)
        cost = operand.cost + 1
        if node.test_only:
            return Estimate(cost, Shape(_BOOL))
        return Estimate(cost, self.member_shape(operand.shape, node.field, node))

    def member_shape(self, shape: Shape, key: str | None, node: Node) -> Shape:
        if shape.path == "device":
            if key == "attributes":
                return _DOMAINS
            if key == "capacity":
                return _CAPACITY_DOMAINS
            if key == "driver":
                return Shape("string", MAX_NAME_LENGTH)
            if key == "allowMultipleAllocations":
                return Shape(_BOOL)
            if key is not None:
                raise self.fail(f"undefined field {key!r} of device", node)
            return _VALUE
        if shape.path == "domains":
            return _NAMES
        if shape.path == "names":
            return _VALUE
        if shape.path == "capacity domains":
            return _CAPACITY_NAMES
        if shape.path == "capacity names":
            return _QUANTITY
        if shape.element is not None:
            return shape.element
        return Shape(_DYN, UNKNOWN_SIZE)

    def call(self, node: Call, scope: dict[str, Shape]) -> Estimate:
        function, target = node.function, node.target
        if (
            isinstance(target, Ident)
            and target.name not in scope
            and f"{target.name}.{function}" in FUNCTIONS
        ):
            function, target = f"{target.name}.{function}", None
        args = [self.visit(arg, scope) for arg in node.args]
        receiver = self.visit(target, scope) if target is not None else None
        cost = 1 + sum(a.cost for a in args) + (receiver.cost if receiver else 0)
        inputs = ([receiver] if receiver else []) + args
        if function == "_[_]":
            self.note_domain(node)
            key = node.args[1]
            literal_key = key.value if isinstance(key, Literal) and isinstance(key.value, str) else None
            container = inputs[0].shape
            if container.path == "device" and literal_key is None:
                return Estimate(cost, _VALUE)
            return Estimate(cost, self.member_shape(container, literal_key, node))
        opaque = [i.shape.type for i in inputs if i.shape.type in ("quantity", "semver")]
        if opaque and (function in _ORDERING or function in _ARITHMETIC):
            kinds = ", ".join(i.shape.type for i in inputs)
            raise self.fail(
                f"found no matching overload for {function!r} applied to ({kinds}); "
                "compare quantities and versions with compareTo, isLessThan or isGreaterThan",
                node,
            )
        if function in _BOOL_OPERATORS:
            if function in _LINEAR_STRING_WORK:
                cost += _tenth(min(i.shape.size for i in inputs))
            if function == "@in":
                cost += inputs[1].shape.size
            return Estimate(cost, Shape(_BOOL))
        if function in _ARITHMETIC:
            shape = inputs[0].shape
            if function == "_+_" and shape.type in ("string", "bytes", "list"):
                total = inputs[0].shape.size + inputs[1].shape.size
                return Estimate(cost + _tenth(total), Shape(shape.type, total, "", shape.element))
            return Estimate(cost, Shape(shape.type if shape.type in ("int", "uint", "double") else _DYN))
        if function == "_?_:_":
            then, otherwise = inputs[1].shape, inputs[2].shape
            shape = then if then.type == otherwise.type else Shape(_DYN, max(then.size, otherwise.size))
            return Estimate(
                cost - inputs[1].cost - inputs[2].cost + max(inputs[1].cost, inputs[2].cost), shape
            )
        if function == "size":
            self.size_calls.append(node.position)
        declared = FUNCTIONS.get(function)
        if declared is None:
            raise self.fail(f"undeclared reference to {function!r}", node)
        result, as_method, as_function = declared
        if receiver is not None and not as_method:
            raise self.fail(
                f"{function}() is a function, not a method: write {function}(x) instead of x.{function}()",
                node,
            )
        if receiver is None and not as_function:
            raise self.fail(f"{function}() is a method: write x.{function}(...)", node)
        largest = max((i.shape.size for i in inputs), default=0)
        if function in _LINEAR_STRING_WORK:
            cost += _tenth(sum(i.shape.size for i in inputs))
        if function in _REGEX:
            cost += _tenth(inputs[0].shape.size) * max(1, math.ceil(inputs[-1].shape.size * 0.25))
        if function in _LIST_WORK:
            cost += inputs[0].shape.size
        if function in ("split", "findAll"):
            return Estimate(
                cost, Shape("list", inputs[0].shape.size + 1, "", Shape("string", inputs[0].shape.size))
            )
        if function in ("sum", "min", "max") and inputs[0].shape.element is not None:
            return Estimate(cost, inputs[0].shape.element)
        if function == "dyn" and inputs:
            return Estimate(
                cost, Shape(_DYN, inputs[0].shape.size, inputs[0].shape.path, inputs[0].shape.element)
            )
        if result == "string":
            return Estimate(cost, Shape("string", largest * 2))
        return Estimate(cost, Shape(result, largest if result == _DYN else 0))

    def logical_chain(self, node: Call, scope: dict[str, Shape]) -> Estimate:
        """Long `a && b && c ...` chains are common; walk them without one frame per operand."""
        operands: list[Node] = []
        pending: list[Node] = [node]
        while pending:
            current = pending.pop()
            if isinstance(current, Call) and current.function == node.function:
                pending.extend(reversed(current.args))
            else:
                operands.append(current)
        cost = len(operands) - 1 + sum(self.visit(operand, scope).cost for operand in operands)
        return Estimate(cost, Shape(_BOOL))

    def note_domain(self, node: Call) -> None:
        container, key = node.args
        if (
            isinstance(container, Select)
            and isinstance(container.operand, Ident)
            and container.operand.name == "device"
            and container.field in ("attributes", "capacity")
            and isinstance(key, Literal)
            and isinstance(key.value, str)
        ):
            self.domains.add(key.value)

    def comprehension(self, node: Comprehension, scope: dict[str, Shape]) -> Estimate:
        source = self.visit(node.range, scope)
        if node.macro == "bind":
            body = self.visit(node.body[0], {**scope, node.variable: source.shape})
            return Estimate(source.cost + body.cost, body.shape)
        shape = source.shape
        element = shape.element or (
            Shape(_DYN, UNKNOWN_SIZE) if shape.path == "" else self.member_shape(shape, None, node)
        )
        if shape.path in ("domains", "names", "capacity domains", "capacity names"):
            element = _NAME  # iterating a map visits its keys
        iterations = shape.size if shape.type in ("list", "map") else UNKNOWN_SIZE
        inner = {**scope, node.variable: element}
        per_element = 2 + sum(self.visit(part, inner).cost for part in node.body)
        cost = source.cost + iterations * per_element
        if node.macro in ("map", "filter"):
            produced = Shape(_DYN, UNKNOWN_SIZE) if node.macro == "map" else element
            return Estimate(cost + 10, Shape("list", iterations, "", produced))
        return Estimate(cost, Shape(_BOOL))


def _widest(shapes: list[Shape]) -> Shape | None:
    if not shapes:
        return None
    types = {shape.type for shape in shapes}
    widest = max(shapes, key=lambda shape: shape.size)
    return widest if len(types) == 1 else Shape(_DYN, widest.size)
