"""The on-disk record of prepared claims: versioned, checksummed, tied to one boot of the node."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import msgspec

from tangram.cdi.atomic import atomic_write
from tangram.cdi.devices import ResolvedAllocation

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
CHECKPOINT_MODE = 0o600
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

# "preparing" is recorded before the spec is written, "prepared" after: a restart in between knows.
ClaimState = Literal["preparing", "prepared"]


class CheckpointedClaim(msgspec.Struct, frozen=True, kw_only=True):
    state: ClaimState
    allocation: ResolvedAllocation


class CheckpointBody(msgspec.Struct, frozen=True, kw_only=True):
    boot_id: str
    claims: dict[str, CheckpointedClaim] = {}


class CheckpointFile(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    checksum: str  # "sha256:<hex>" of the body's exact bytes
    body: msgspec.Raw


class _Versioned(msgspec.Struct):
    version: int


class CorruptCheckpoint(ValueError):
    """The checkpoint cannot be trusted: unreadable, wrong checksum or unknown version."""


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    return path.read_text(encoding="ascii").strip()


def _checksum(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def encode_checkpoint(body: CheckpointBody) -> bytes:
    body_bytes = msgspec.json.encode(body)
    document = CheckpointFile(
        version=CHECKPOINT_VERSION, checksum=_checksum(body_bytes), body=msgspec.Raw(body_bytes)
    )
    return msgspec.json.encode(document)


def decode_checkpoint(raw: bytes) -> CheckpointBody:
    try:
        version = msgspec.json.decode(raw, type=_Versioned).version
    except msgspec.DecodeError as error:
        raise CorruptCheckpoint(f"checkpoint is not a versioned JSON document: {error}") from error
    if version != CHECKPOINT_VERSION:
        raise CorruptCheckpoint(
            f"checkpoint version {version} is not supported (expected {CHECKPOINT_VERSION})"
        )
    try:
        document = msgspec.json.decode(raw, type=CheckpointFile)
    except msgspec.DecodeError as error:
        raise CorruptCheckpoint(f"checkpoint envelope is invalid: {error}") from error
    body_bytes = bytes(document.body)
    if _checksum(body_bytes) != document.checksum:
        raise CorruptCheckpoint("checkpoint checksum does not match its content")
    try:
        return msgspec.json.decode(body_bytes, type=CheckpointBody)
    except msgspec.DecodeError as error:
        raise CorruptCheckpoint(f"checkpoint body is invalid: {error}") from error


class CheckpointStore:
    """Loads and saves the checkpoint; concurrent saves are coalesced into one write (group commit)."""

    def __init__(self, path: Path, *, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self._lock = asyncio.Lock()
        self._requested = 0
        self._written = 0
        self.writes = 0

    def load(self) -> CheckpointBody | None:
        """None when there is no checkpoint; CorruptCheckpoint when there is one that cannot be used."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return decode_checkpoint(raw)

    def move_aside(self) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        self.path.rename(target)
        return target

    def write_now(self, claims: dict[str, CheckpointedClaim]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = encode_checkpoint(CheckpointBody(boot_id=self.boot_id, claims=claims))
        atomic_write(self.path, data, mode=CHECKPOINT_MODE)
        self.writes += 1

    async def save(self, snapshot: dict[str, CheckpointedClaim]) -> None:
        """Persist the caller's change: returns once a write containing it is durable.

        `snapshot` must be the live mapping the callers mutate, so that a write started later
        includes every change requested before it.
        """
        self._requested += 1
        mine = self._requested
        async with self._lock:
            if self._written >= mine:
                return
            covered = self._requested
            await asyncio.to_thread(self.write_now, dict(snapshot))
            self._written = covered
