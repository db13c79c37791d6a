"""A parser for CEL source, producing a small AST used for checks the evaluator does not make.

The evaluator parses again on its own; this tree serves the checks Kubernetes makes at
compile time (undeclared names, result type, cost), and gives positions in error messages.
Grammar: https://github.com/google/cel-spec/blob/master/doc/langdef.md#syntax
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tangram.cel.errors import CelCompileError

RESERVED = frozenset(
    {"as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop"}
    | {"package", "namespace", "return", "var", "void", "while"}
)
MAX_NESTING = 100
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<float>(?:\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?))
  | (?P<uint>(?:0[xX][0-9a-fA-F]+|\d+)[uU])
  | (?P<int>0[xX][0-9a-fA-F]+|\d+)
  | (?P<string>[rRbB]{0,2}(?:\"\"\"|'''|"|'))
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||\.\?|\[\?|[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(?:[abfnrtv\\'\"`?]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-3][0-7]{2})")
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # int uint float string bytes ident op eof
    text: str
    position: int
    value: object = None


@dataclass(slots=True)
class Node:
    position: int


@dataclass(slots=True)
class Literal(Node):
    value: object
    kind: str  # int uint double string bytes bool null


@dataclass(slots=True)
class Ident(Node):
    name: str


@dataclass(slots=True)
class Select(Node):
    operand: Node
    field: str
    test_only: bool = False  # has(operand.field)


@dataclass(slots=True)
class Call(Node):
    function: str  # operators are spelled like cel-go's: _&&_, _[_], !_, _?_:_, @in
    args: list[Node]
    target: Node | None = None


@dataclass(slots=True)
class ListExpr(Node):
    elements: list[Node]


@dataclass(slots=True)
class MapExpr(Node):
    entries: list[tuple[Node, Node]]


@dataclass(slots=True)
class StructExpr(Node):
    type_name: str
    fields: list[tuple[str, Node]]


@dataclass(slots=True)
class Comprehension(Node):
    macro: str  # all exists exists_one map filter bind
    range: Node
    variable: str
    body: list[Node] = field(default_factory=list)


def _error(message: str, source: str, position: int) -> CelCompileError:
    line = source.count("\n", 0, position) + 1
    column = position - (source.rfind("\n", 0, position) + 1) + 1
    return CelCompileError(f"syntax error at {line}:{column}: {message}", position=position)


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    position = 0
    while position < len(source):
        match = _TOKEN.match(source, position)
        if match is None:
            raise _error(f"unexpected character {source[position]!r}", source, position)
        kind = match.lastgroup or ""
        text = match.group()
        if kind == "string":
            token, position = _string_token(source, position, text)
            tokens.append(token)
            continue
        if kind != "space":
            tokens.append(Token(kind, text, position, _number(kind, text, source, position)))
        position = match.end()
    tokens.append(Token("eof", "", len(source)))
    return tokens


def _number(kind: str, text: str, source: str, position: int) -> object:
    if kind == "int":
        value = int(text, 0) if text[:2].lower() == "0x" else int(text)
        if value > 2**63:
            raise _error(f"integer literal {text} overflows int64", source, position)
        return value
    if kind == "uint":
        digits = text[:-1]
        value = int(digits, 0) if digits[:2].lower() == "0x" else int(digits)
        if value >= 2**64:
            raise _error(f"unsigned literal {text} overflows uint64", source, position)
        return value
    if kind == "float":
        return float(text)
    return None


def _string_token(source: str, start: int, opener: str) -> tuple[Token, int]:
    prefix = opener.rstrip("'\"").lower()
    quote = opener[len(prefix) :]
    if set(prefix) - {"r", "b"} or len(set(prefix)) != len(prefix):
        raise _error(f"bad string prefix {prefix!r}", source, start)
    raw, is_bytes = "r" in prefix, "b" in prefix
    position = start + len(opener)
    chunks: list[str] = []
    while True:
        if source.startswith(quote, position):
            break
        if position >= len(source) or (len(quote) == 1 and source[position] == "\n"):
            raise _error("unterminated string literal", source, start)
        char = source[position]
        if char == "\\" and not raw:
            escape = _ESCAPE.match(source, position)
            if escape is None:
                raise _error("invalid escape sequence in string literal", source, position)
            chunks.append(_unescape(escape.group()))
            position = escape.end()
            continue
        if char == "\\" and raw and position + 1 < len(source):
            chunks.append(source[position : position + 2])
            position += 2
            continue
        chunks.append(char)
        position += 1
    end = position + len(quote)
    text = "".join(chunks)
    kind = "bytes" if is_bytes else "string"
    value: object = text.encode("utf-8", "surrogatepass") if is_bytes else text
    return Token(kind, source[start:end], start, value), end


def _unescape(escape: str) -> str:
    code = escape[1]
    if code in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[code]
    if code in "xuU":
        return chr(int(escape[2:], 16))
    if code.isdigit():
        return chr(int(escape[1:], 8))
    return code


class Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.index = 0
        self.depth = 0

    def parse(self) -> Node:
        node = self.expression()
        if self.peek().kind != "eof":
            raise self.unexpected()
        return node

    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.index + offset, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def accept(self, text: str) -> Token | None:
        token = self.peek()
        if token.kind == "op" and token.text == text:
            self.index += 1
            return token
        return None

    def expect(self, text: str) -> Token:
        token = self.accept(text)
        if token is None:
            raise self.unexpected(f"expected {text!r}")
        return token

    def unexpected(self, wanted: str = "") -> CelCompileError:
        token = self.peek()
        found = "end of input" if token.kind == "eof" else repr(token.text)
        detail = f"{wanted}, found {found}" if wanted else f"unexpected {found}"
        return _error(detail, self.source, token.position)

    def expression(self) -> Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _error(
                f"expression nested more than {MAX_NESTING} levels deep", self.source, self.peek().position
            )
        try:
            return self.conditional()
        finally:
            self.depth -= 1

    def conditional(self) -> Node:
        condition = self.binary(0)
        question = self.accept("?")
        if question is None:
            return condition
        then = self.binary(0)
        self.expect(":")
        otherwise = self.expression()
        return Call(question.position, "_?_:_", [condition, then, otherwise])

    _PRECEDENCE: dict[str, int] = {
        "||": 1,
        "&&": 2,
        **dict.fromkeys(("==", "!=", "<", "<=", ">", ">=", "in"), 3),
        "+": 4,
        "-": 4,
        "*": 5,
        "/": 5,
        "%": 5,
    }

    def binary(self, minimum: int) -> Node:
        """Precedence climbing: one Python frame per nesting level keeps deep input cheap."""
        left = self.unary()
        while True:
            token = self.peek()
            operator = token.text if token.kind in ("op", "ident") else ""
            precedence = self._PRECEDENCE.get(operator, 0)
            if precedence <= minimum:
                return left
            self.advance()
            right = self.binary(precedence)
            name = "@in" if operator == "in" else f"_{operator}_"
            left = Call(token.position, name, [left, right])

    def unary(self) -> Node:
        token = self.peek()
        if token.kind == "op" and token.text in ("!", "-"):
            self.advance()
            operand = self.unary()
            if token.text == "-" and isinstance(operand, Literal) and operand.kind in ("int", "double"):
                operand.value = -operand.value  # type: ignore[operator]
                operand.position = token.position
                return operand
            return Call(token.position, f"{token.text}_", [operand])
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            token = self.peek()
            if self.accept(".") or self.accept(".?"):
                name = self.advance()
                if name.kind != "ident":
                    raise _error("expected a field or method name", self.source, name.position)
                if token.text == ".?":
                    raise _error(
                        "optional field selection '.?' is not supported", self.source, token.position
                    )
                node = self.method(node, name) if self.accept("(") else Select(name.position, node, name.text)
            elif self.accept("["):
                index = self.expression()
                self.expect("]")
                node = Call(token.position, "_[_]", [node, index])
            elif token.kind == "op" and token.text == "[?":
                raise _error("optional index '[?' is not supported", self.source, token.position)
            else:
                return node

    def arguments(self, closer: str) -> list[Node]:
        items: list[Node] = []
        while not self.accept(closer):
            items.append(self.expression())
            if not self.accept(","):
                self.expect(closer)
                break
        return items

    def method(self, target: Node, name: Token) -> Node:
        args = self.arguments(")")
        if name.text in MACROS and len(args) in (2, 3):
            variable = args[0]
            if not isinstance(variable, Ident):
                raise _error(f"{name.text}() needs a variable name first", self.source, name.position)
            if len(args) == 3 and name.text != "map":
                raise _error(f"{name.text}() takes 2 arguments", self.source, name.position)
            return Comprehension(name.position, name.text, target, variable.name, args[1:])
        if name.text == "bind" and isinstance(target, Ident) and target.name == "cel" and len(args) == 3:
            variable = args[0]
            if not isinstance(variable, Ident):
                raise _error("cel.bind() needs a variable name first", self.source, name.position)
            return Comprehension(name.position, "bind", args[1], variable.name, [args[2]])
        return Call(name.position, name.text, args, target)

    def primary(self) -> Node:
        token = self.advance()
        match token.kind:
            case "int" | "uint" | "float":
                return Literal(token.position, token.value, "double" if token.kind == "float" else token.kind)
            case "string" | "bytes":
                return Literal(token.position, token.value, token.kind)
            case "ident":
                return self.identifier(token)
        if token.kind == "op":
            if token.text == "(":
                node = self.expression()
                self.expect(")")
                return node
            if token.text == "[":
                return ListExpr(token.position, self.arguments("]"))
            if token.text == "{":
                return MapExpr(token.position, self.map_entries())
            if token.text == ".":
                name = self.advance()
                if name.kind == "ident":
                    return self.identifier(name)
        self.index -= 1
        raise self.unexpected()

    def identifier(self, token: Token) -> Node:
        name = token.text
        if name in ("true", "false"):
            return Literal(token.position, name == "true", "bool")
        if name == "null":
            return Literal(token.position, None, "null")
        if name in RESERVED or name == "in":
            raise _error(f"reserved identifier {name!r}", self.source, token.position)
        if self.accept("("):
            args = self.arguments(")")
            if name == "has":
                if len(args) != 1 or not isinstance(args[0], Select):
                    raise _error(
                        "has() takes one field selection, e.g. has(a.b)", self.source, token.position
                    )
                args[0].test_only = True
                return args[0]
            return Call(token.position, name, args)
        if self.peek().kind == "op" and self.peek().text == "{" and name[:1].isupper():
            self.advance()
            return StructExpr(token.position, name, self.struct_fields())
        return Ident(token.position, name)

    def map_entries(self) -> list[tuple[Node, Node]]:
        entries: list[tuple[Node, Node]] = []
        while not self.accept("}"):
            key = self.expression()
            self.expect(":")
            entries.append((key, self.expression()))
            if not self.accept(","):
                self.expect("}")
                break
        return entries

    def struct_fields(self) -> list[tuple[str, Node]]:
        fields: list[tuple[str, Node]] = []
        while not self.accept("}"):
            name = self.advance()
            if name.kind != "ident":
                raise _error("expected a field name", self.source, name.position)
            self.expect(":")
            fields.append((name.text, self.expression()))
            if not self.accept(","):
                self.expect("}")
                break
        return fields


def parse(source: str) -> Node:
    """The AST of `source`; CelCompileError with line:column when it is not valid CEL."""
    if not source.strip():
        raise CelCompileError("syntax error at 1:1: the expression is empty", position=0)
    try:
        return Parser(source).parse()
    except RecursionError:
        raise CelCompileError("the expression is nested too deeply") from None
