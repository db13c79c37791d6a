"""Every event decoder over hostile bytes: an event or EventDecodeError, never anything else."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.events import EVENT_TYPES, Event, EventDecodeError, decode, encode
from tangram.events.codec import MAX_DEPTH, nesting_depth_exceeds
from tests.events.samples import every_event

from .strategies import FUZZ, TIMEOUT_S, depths, hostile_values, text, valid_json, with_deep

pytestmark = pytest.mark.timeout(TIMEOUT_S)

SAMPLES = {type(e).type_name(): e for e in every_event()}


def decodes_or_refuses(data: bytes) -> Event | None:
    try:
        event = decode(data)
    except EventDecodeError as error:
        assert str(error) and "\n" not in str(error) and len(str(error)) <= 500
        return None
    assert isinstance(event, EVENT_TYPES)
    return event


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document where a value sits."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += paths(child, (*prefix, index))
    return found


def replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, *rest = path
    copy = dict(document) if isinstance(document, dict) else list(document)
    copy[head] = replaced(document[head], tuple(rest), value)
    return copy


@pytest.mark.parametrize("tag", sorted(SAMPLES))
@FUZZ
@given(data=st.data(), value=hostile_values, depth=depths)
def test_a_field_replaced_by_anything(tag: str, data: st.DataObject, value: Any, depth: int) -> None:
    document = json.loads(encode(SAMPLES[tag]))
    path = data.draw(st.sampled_from(paths(document)), label="path")
    mutated = replaced(document, path, value)
    decodes_or_refuses(with_deep(json.dumps(mutated).encode(), depth))


@pytest.mark.parametrize("tag", sorted(SAMPLES))
@FUZZ
@given(data=st.data())
def test_bytes_cut_flipped_or_spliced(tag: str, data: st.DataObject) -> None:
    encoded = encode(SAMPLES[tag])
    cut = data.draw(st.integers(0, len(encoded)), label="cut")
    flip = data.draw(st.integers(0, max(len(encoded) - 1, 0)), label="flip")
    byte = data.draw(st.integers(0, 255), label="byte")
    splice = data.draw(st.binary(max_size=64), label="splice")
    decodes_or_refuses(encoded[:cut])
    decodes_or_refuses(encoded[:flip] + bytes([byte]) + encoded[flip + 1 :])
    decodes_or_refuses(encoded[:cut] + splice + encoded[cut:])


@FUZZ
@given(st.binary(max_size=2048))
def test_any_bytes(data: bytes) -> None:
    decodes_or_refuses(data)


@FUZZ
@given(tag=st.sampled_from(sorted(SAMPLES)), extra=st.dictionaries(text, valid_json, max_size=6))
def test_unknown_fields_never_change_the_event(tag: str, extra: dict[str, Any]) -> None:
    document = json.loads(encode(SAMPLES[tag]))
    known = set(document)
    document.update({k: v for k, v in extra.items() if k not in known})
    assert decodes_or_refuses(json.dumps(document).encode()) == SAMPLES[tag]


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


@FUZZ
@given(value=valid_json, wrap=st.integers(0, 80))
def test_the_depth_check_agrees_with_the_decoded_depth(value: Any, wrap: int) -> None:
    for level in range(wrap):
        # Brackets and escaped quotes inside strings and keys are not nesting.
        value = [value, ']]}}[[{{\\"'] if level % 2 else {'k\\"[': value}
    data = json.dumps(value).encode()
    assert nesting_depth_exceeds(data) == (depth_of(json.loads(data)) > MAX_DEPTH)
