"""What the node's sharing manager keeps across restarts: the shares it holds per device, and for
a whole GPU under MPS the compute mode to give back. Versioned, checksummed, written temp + fsync +
rename, and tied to the boot it was written in (compute modes and daemons do not survive a reboot).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from tangram.cdi.atomic import atomic_write
from tangram.inputs import InputError, read_bytes
from tangram.sharing.records import SharingState

STATE_VERSION = 1
STATE_MODE = 0o600
MAX_STATE_BYTES = 64 * 1024 * 1024


class _StateFile(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    checksum: str  # "sha256:<hex>" of the body's exact bytes
    body: msgspec.Raw


class _Versioned(msgspec.Struct):
    version: int


class CorruptState(ValueError):
    """A state file that cannot be trusted: unreadable, wrong checksum or unknown version."""


def _checksum(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def encode_state(state: SharingState) -> bytes:
    body = msgspec.json.encode(state)
    return msgspec.json.encode(
        _StateFile(version=STATE_VERSION, checksum=_checksum(body), body=msgspec.Raw(body))
    )


def decode_state(raw: bytes) -> SharingState:
    try:
        version = msgspec.json.decode(raw, type=_Versioned).version
        if version != STATE_VERSION:
            raise CorruptState(f"sharing state version {version} is not supported (expected {STATE_VERSION})")
        document = msgspec.json.decode(raw, type=_StateFile)
        body = bytes(document.body)
        if _checksum(body) != document.checksum:
            raise CorruptState("sharing state checksum does not match its content")
        return msgspec.json.decode(body, type=SharingState)
    except (msgspec.DecodeError, RecursionError) as error:
        raise CorruptState(f"sharing state is unreadable: {error}") from None


class StateStore:
    """The state file: None when absent, CorruptState when present and unusable."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> SharingState | None:
        if not self.path.exists():
            return None
        try:
            raw = read_bytes(self.path, "sharing state", max_bytes=MAX_STATE_BYTES)
        except InputError as error:
            raise CorruptState(str(error)) from None
        return decode_state(raw)

    def save(self, state: SharingState) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(self.path, encode_state(state), mode=STATE_MODE)

    def move_aside(self) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        self.path.rename(target)
        return target
