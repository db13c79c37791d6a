"""The event catalogue as one AsyncAPI 3 document, generated from the Structs (never written by hand)."""

from __future__ import annotations

from typing import Any

import msgspec

from tangram import __version__
from tangram.events.catalogue import EVENT_TYPES
from tangram.events.envelope import SCHEMA_VERSION
from tangram.events.subjects import CHANNELS_BY_TYPE


def _channel_id(event_type: str) -> str:
    return event_type.replace(".", "-")


def asyncapi_document() -> dict[str, Any]:
    """Every event with its subject (channel address), stream and payload schema."""
    (schemas_list, components) = msgspec.json.schema_components(
        EVENT_TYPES, ref_template="#/components/schemas/{name}"
    )
    channels: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for event_cls, schema in zip(EVENT_TYPES, schemas_list, strict=True):
        type_name = event_cls.type_name()
        channel = _channel_id(type_name)
        messages[channel] = {
            "name": type_name,
            "title": event_cls.__name__,
            "summary": (event_cls.__doc__ or event_cls.__name__).strip().splitlines()[0],
            "contentType": "application/json",
            "headers": {
                "type": "object",
                "properties": {"Nats-Msg-Id": {"type": "string", "description": "the event_id"}},
            },
            "payload": schema,
        }
        channels[channel] = {
            "address": event_cls.subject_pattern,
            "parameters": {"key": {"description": "node subject token or claim uid"}},
            "messages": {type_name: {"$ref": f"#/components/messages/{channel}"}},
            "x-jetstream-stream": event_cls.stream,
            # Readers refuse (dead-letter) anything else on this address: see docs/trust-model.md.
            "x-tangram-carries-only": type_name,
            "x-tangram-publisher": CHANNELS_BY_TYPE[event_cls].publisher,
            "x-tangram-identity": CHANNELS_BY_TYPE[event_cls].identity,
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Tangram events",
            "version": __version__,
            "description": (
                f"Events exchanged by Tangram services over NATS JetStream (envelope schema_version "
                f"{SCHEMA_VERSION}). JSON on the wire; unknown fields are ignored by readers."
            ),
        },
        "defaultContentType": "application/json",
        "channels": dict(sorted(channels.items())),
        "components": {"messages": dict(sorted(messages.items())), "schemas": components},
    }
