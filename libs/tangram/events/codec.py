"""JSON on the wire. Unknown fields are tolerated; missing or mistyped ones fail naming the field."""

from __future__ import annotations

from typing import Any

import msgspec

from tangram.events.catalogue import AnyEvent
from tangram.events.envelope import Event

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


class EventDecodeError(ValueError):
    """Bytes that are not a valid event; the message names the offending field."""


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(data: bytes) -> Event:
    try:
        event: Event = _decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise EventDecodeError(str(exc)) from exc
    return event


def to_builtins(event: Event) -> dict[str, Any]:
    value = msgspec.to_builtins(event)
    assert isinstance(value, dict)
    return value
