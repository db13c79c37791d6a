"""The sharing state file: round trip, and every way it can be unusable."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tangram.sharing.records import DeviceRecord, SharingState
from tangram.sharing.state import STATE_VERSION, CorruptState, StateStore, decode_state, encode_state

STATE = SharingState(
    boot_id="3f1e-boot",
    devices={
        "GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26": DeviceRecord(
            strategy="MPS", shares={"claim-a": "s1", "claim-b": "s2"}, restore_compute_mode=0
        ),
        "MIG-0b7c0b8e-2f5a-5c5e-8f63-2c3c3a1d9e11": DeviceRecord(
            strategy="TimeSlicing", shares={"claim-c": "s3"}
        ),
    },
)


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state" / "sharing-state.json")
    assert store.load() is None
    store.save(STATE)
    assert store.load() == STATE
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert [p.name for p in store.path.parent.iterdir()] == ["sharing-state.json"]  # no temp file left


def test_the_format_is_versioned_and_checksummed() -> None:
    document = json.loads(encode_state(STATE))
    assert document["version"] == STATE_VERSION == 1
    assert document["checksum"].startswith("sha256:")
    assert (
        document["body"]["devices"]["GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26"]["restore_compute_mode"] == 0
    )


def _tampered() -> bytes:
    document = json.loads(encode_state(STATE))
    document["body"]["devices"]["GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26"]["restore_compute_mode"] = 3
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "unreadable"),
        (b"not json", "unreadable"),
        (encode_state(STATE)[:-7], "unreadable"),
        (encode_state(STATE).replace(b'"version":1', b'"version":2'), "version 2 is not supported"),
        (_tampered(), "checksum does not match"),
        (b"[" * 100_000, "unreadable"),
    ],
)
def test_unusable_state_is_refused(raw: bytes, match: str) -> None:
    with pytest.raises(CorruptState, match=match):
        decode_state(raw)


def test_a_corrupt_file_can_be_moved_aside(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "sharing-state.json")
    store.path.write_bytes(b"garbage")
    with pytest.raises(CorruptState):
        store.load()
    aside = store.move_aside()
    assert aside.name.startswith("sharing-state.json.corrupt-") and aside.read_bytes() == b"garbage"
    assert store.load() is None


def test_a_directory_in_place_of_the_file_is_corrupt_not_a_crash(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "sharing-state.json")
    store.path.mkdir()
    with pytest.raises(CorruptState, match="directory"):
        store.load()
