"""The event catalogue: wire format, validation errors, forward compatibility, schema document."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import msgspec
import pytest

from tangram.bus import Bus
from tangram.cli import main as cli_main
from tangram.events import (
    EVENT_TYPES,
    ClaimRequested,
    EventDecodeError,
    InvalidKey,
    decode,
    encode,
    subject_token,
)
from tangram.events.schema import asyncapi_document

from .samples import UID, every_event

REPO = Path(__file__).resolve().parents[2]


def test_samples_cover_every_event_type() -> None:
    assert {type(e) for e in every_event()} == set(EVENT_TYPES)
    assert len(EVENT_TYPES) == 13


@pytest.mark.parametrize("event", every_event(), ids=lambda e: e.type_name())
def test_json_round_trip(event: object) -> None:
    data = encode(event)  # type: ignore[arg-type]
    assert decode(data) == event
    assert json.loads(data)["type"] == event.type_name()  # type: ignore[attr-defined]


async def test_every_event_type_round_trips_through_jetstream(bus: Bus) -> None:
    events = every_event()
    for event in events:
        await bus.publish(event)
    received = {}
    for stream in sorted({e.stream for e in events}):
        async for _, event in bus.replay(stream):
            received[event.event_id] = event
    assert [received[e.event_id] for e in events] == events


def test_subjects_follow_keys() -> None:
    subjects = {e.type_name(): e.subject for e in every_event()}
    assert subjects["node.inventory"] == "tangram.inventory.node-a"
    assert subjects["claim.requested"] == f"tangram.claim.requested.{UID}"
    assert subjects["partition.requested"] == "tangram.node.node-a.partition.requested"
    assert subjects["dead.letter"] == "tangram.deadletter.allocator"


def test_unknown_fields_are_tolerated() -> None:
    event = every_event()[1]
    document = json.loads(encode(event))
    document["added_in_a_later_version"] = {"nested": [1, 2]}
    assert decode(json.dumps(document).encode()) == event


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("namespace"), "Object missing required field `namespace`"),
        (lambda d: d.update(uid=3), "Expected `str`, got `int` - at `$.uid`"),
        (lambda d: d.update(spec=[]), "Expected `object`, got `array` - at `$.spec`"),
        (lambda d: d.update(type="claim.exploded"), "Invalid value 'claim.exploded' - at `$.type`"),
        (lambda d: d.update(key="../etc"), "invalid subject key '../etc'"),
    ],
)
def test_bad_fields_are_rejected_naming_the_field(mutate: object, message: str) -> None:
    document = json.loads(encode(every_event()[1]))
    mutate(document)  # type: ignore[operator]
    with pytest.raises(EventDecodeError) as excinfo:
        decode(json.dumps(document).encode())
    assert message in str(excinfo.value)


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(EventDecodeError):
        decode(b"\xff\x00")


def test_constructing_with_a_path_like_key_fails() -> None:
    with pytest.raises(ValueError, match="invalid subject key"):
        ClaimRequested(key="a/b", namespace="n", name="x", uid="a/b", spec={})


@pytest.mark.parametrize(
    ("name", "token"), [("gpu-node-1", "gpu-node-1"), ("node.zone-a.example.com", "node_zone-a_example_com")]
)
def test_subject_token_maps_dns_names(name: str, token: str) -> None:
    assert subject_token(name) == token


@pytest.mark.parametrize("name", ["", "a b", "x>", "*", "a/b", "-lead"])
def test_subject_token_rejects_non_tokens(name: str) -> None:
    with pytest.raises(InvalidKey):
        subject_token(name)


def test_schema_document_lists_every_event_with_subject_and_stream() -> None:
    document = asyncapi_document()
    assert document["asyncapi"] == "3.0.0"
    channels = document["channels"]
    assert channels["partition-applied"]["address"] == "tangram.node.{key}.partition.applied"
    assert channels["partition-applied"]["x-jetstream-stream"] == "TANGRAM_NODES"
    assert channels["node-inventory"]["x-jetstream-stream"] == "TANGRAM_INVENTORY"
    assert len(channels) == len(EVENT_TYPES)
    payload = document["components"]["messages"]["claim-requested"]["payload"]
    assert payload["$ref"] == "#/components/schemas/ClaimRequested"
    claim_schema = document["components"]["schemas"]["ClaimRequested"]
    assert {"key", "event_id", "schema_version", "producer", "time", "uid", "spec"} <= set(
        claim_schema["properties"]
    )


def test_published_schema_document_is_in_step_with_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    committed = json.loads((REPO / "docs" / "events.asyncapi.json").read_text())
    assert printed == committed, "run `make schema` to regenerate docs/events.asyncapi.json"


def test_payload_validates_against_its_generated_schema() -> None:
    document = asyncapi_document()
    schemas = document["components"]["schemas"]
    for event in every_event():
        instance = msgspec.json.decode(encode(event))
        schema = {"$ref": f"#/components/schemas/{type(event).__name__}", "components": {"schemas": schemas}}
        jsonschema.validate(instance, schema)
