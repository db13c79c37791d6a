"""Files a person hands to Tangram (fleets, traces, machines, DeviceClasses), read within bounds.

Whatever the file is (a directory, /dev/zero, a FIFO with no writer, gigabytes, invalid UTF-8,
YAML nested thousands deep or aliases that expand to billions of nodes), the reader ends with an
`InputError` naming the file and the problem, in bounded time and memory.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tangram.events.codec import nesting_depth_exceeds

MAX_TEXT_BYTES = 16 * 1024 * 1024
MAX_YAML_DEPTH = 100  # Kubernetes manifests nest about 12 levels
MAX_YAML_NODES = 2_000_000  # per document, aliases expanded


class InputError(ValueError):
    """A user's file that cannot be used; the message names the file and what is wrong."""


def read_bytes(path: Path, what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of `path`, at most `max_bytes` of them (a device such as /dev/zero included)."""
    where = f"{what} {path}"
    try:
        # O_NONBLOCK: opening a FIFO that has no writer returns at once (and then reads as empty).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{where}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot open: {exc.strerror or exc}") from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise InputError(f"{where}: is a directory, not a file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1024 * 1024, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(f"{where}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InputError(f"{where}: larger than the limit of {max_bytes // (1024 * 1024)} MiB")
    return b"".join(chunks)


def read_text(path: Path, what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of `path`, at most `max_bytes` long."""
    data = read_bytes(path, what, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{what} {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


@dataclass(frozen=True)
class Document:
    index: int  # position in the YAML stream, from 0
    line: int  # first line of the document, from 1
    data: Any


def load_yaml_documents(text: str, source: str) -> Iterator[Document]:
    """The documents of a YAML stream, each checked for depth and size before it is built."""
    # PyYAML's scanner looks far ahead inside deep flow collections ([[[[...), slowly: their
    # depth is measured on the text first (brackets inside strings can only make it look deeper).
    if nesting_depth_exceeds(text.encode("utf-8", "surrogatepass"), MAX_YAML_DEPTH):
        raise InputError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels")
    try:
        loader = _BoundedLoader(text, source)  # reads (and may refuse) the first characters
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML: {_one_line(exc)}") from None
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                index += 1
                continue
            _check_expansion(node, source)
            yield Document(index=index, line=node.start_mark.line + 1, data=loader.construct_document(node))
            index += 1
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML: {_one_line(exc)}") from None
    finally:
        loader.dispose()


def load_yaml(text: str, source: str) -> Any:
    """The single document of `text` (None when empty)."""
    documents = list(load_yaml_documents(text, source))
    if len(documents) > 1:
        raise InputError(f"{source}: expected one YAML document, found {len(documents)}")
    return documents[0].data if documents else None


def read_yaml(path: Path, what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> Any:
    return load_yaml(read_text(path, what, max_bytes=max_bytes), f"{what} {path}")


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, refusing nesting past MAX_YAML_DEPTH while it composes (it recurses)."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self._source = source
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise InputError(f"{self._source}: nested deeper than {MAX_YAML_DEPTH} levels (line {line})")
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse a document whose aliases expand past the size or depth limits, or refer to themselves.

    Aliases share nodes, so a small file can stand for billions of them once something walks it;
    sizes and depths are counted once per node (an explicit stack: the graph may be deep).
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    ancestors: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            ancestors.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_YAML_NODES:
                raise InputError(
                    f"{source}: the document at line {root.start_mark.line + 1} expands to more than "
                    f"{MAX_YAML_NODES} nodes (aliases)"
                )
            if depth[key] > MAX_YAML_DEPTH:
                raise InputError(
                    f"{source}: the document at line {root.start_mark.line + 1} nests deeper than "
                    f"{MAX_YAML_DEPTH} levels once its aliases are expanded"
                )
            continue
        if key in size:
            continue
        ancestors.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in ancestors:
                line = child.start_mark.line + 1
                raise InputError(
                    f"{source}: a recursive alias (the node anchored at line {line} contains it)"
                )
            if id(child) not in size:
                stack.append((child, False))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
