"""JSON on the wire. Unknown fields are tolerated; missing or mistyped ones fail naming the field.

Bytes come from peers, so decoding is a trust boundary: whatever they hold (any size, any depth,
invalid UTF-8, numbers out of range) ends as an `EventDecodeError`, never as another exception
that would take a consumer down with it.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from tangram.events.catalogue import AnyEvent
from tangram.events.envelope import Event

# The deepest real event is about 10 levels (a claim's spec with opaque parameters); msgspec
# recurses per level and Python code after it (validation, logging) recurses again, so a message
# much deeper than any real one is refused before it is decoded.
MAX_DEPTH = 64
MAX_REASON = 500  # characters of a decode error kept: the error is logged and dead-lettered

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)

# A JSON string once its escaped backslashes and quotes are gone: brackets inside are not nesting.
# (No escapes in the pattern, so no input makes it backtrack.)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")


class EventDecodeError(ValueError):
    """Bytes that are not a valid event; the message names the offending field."""


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def nesting_depth_exceeds(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON `data` nests arrays and objects deeper than `limit`, without decoding it.

    Every step runs at C speed: a message with no more than `limit` opening brackets (most
    events) is answered by two counts. Otherwise strings are cut out, the brackets kept, and
    innermost pairs removed one level per round: a tree loses exactly one level when all its
    leaves go. Unclosed brackets count as levels, so a deep unclosed prefix is caught too.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", unescaped).translate(_AS_SQUARE, _NOT_BRACKETS)
    for rounds in range(limit + 1):
        reduced = brackets.replace(b"[]", b"")
        if not reduced:
            return rounds >= limit
        if reduced == brackets:
            # No pair left, only unmatched brackets (`]]][[[`): each unclosed one adds a level.
            return rounds + reduced.count(b"[") > limit
        brackets = reduced
    return True


def decode(data: bytes) -> Event:
    """The event in `data`, or `EventDecodeError` with a bounded, one-line reason."""
    if nesting_depth_exceeds(data):
        raise EventDecodeError(f"nested deeper than {MAX_DEPTH} levels ({len(data)} bytes)")
    try:
        event: Event = _decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise EventDecodeError(_bounded(str(exc))) from exc
    except RecursionError as exc:
        raise EventDecodeError(f"nested too deep to decode ({len(data)} bytes)") from exc
    except MemoryError as exc:
        raise EventDecodeError(f"too large to decode ({len(data)} bytes)") from exc
    except Exception as exc:
        # Anything else hostile bytes provoke is still a decode failure, not a crash.
        raise EventDecodeError(_bounded(f"{type(exc).__name__}: {exc}")) from exc
    return event


def _bounded(reason: str) -> str:
    line = " ".join(reason.split())
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."


def to_builtins(event: Event) -> dict[str, Any]:
    value = msgspec.to_builtins(event)
    assert isinstance(value, dict)
    return value
