"""Named blobs too large for one message, kept in a JetStream object store (chunked, digest-checked):
the allocator's ledger image."""

from __future__ import annotations

import base64
import hashlib

import nats.js.errors
from nats.js.api import ObjectStoreConfig, StorageType

from tangram.bus.connection import Link, setup_retry_s
from tangram.bus.declarations import ObjectStoreSpec
from tangram.bus.errors import BusError
from tangram.bus.replay import replay_messages


async def ensure_object_store(link: Link, spec: ObjectStoreSpec) -> None:
    js, retry_s = link.js, setup_retry_s(link)
    try:
        await link.request(
            lambda: js.object_store(spec.bucket), f"object store {spec.bucket}", retry_s=retry_s
        )
    except BusError as exc:
        if not isinstance(exc.__cause__, nats.js.errors.BucketNotFoundError | nats.js.errors.NotFoundError):
            raise
        config = ObjectStoreConfig(
            description=spec.description,
            storage=StorageType.FILE,
            replicas=link.config.stream_replicas,
        )
        await link.request(
            lambda: js.create_object_store(spec.bucket, config),
            f"create object store {spec.bucket}",
            retry_s=retry_s,
        )


async def put_object(link: Link, bucket: str, name: str, data: bytes) -> None:
    """Store `data` as `name`, replacing what was there once it is all stored."""
    store = await link.request(lambda: link.js.object_store(bucket), f"object store {bucket}", retry_s=10)
    await link.request(lambda: store.put(name, data), f"put {name} into {bucket}", retry_s=10)


# Reads of an entry replaced while its chunks were read, before giving up.
_READS = 5


async def get_object(link: Link, bucket: str, name: str) -> bytes | None:
    """The bytes stored as `name`; None when nothing is. Chunks that do not match the entry's size
    and digest are a BusError, unless the entry was replaced while they were read: a put writes
    the new chunks and entry, then purges the old chunks, so a reader of the old entry may find
    them gone. It reads the new one then.

    The chunks are read through the same named, filtered replay as the log is, not nats-py's
    reader, which asks the server for every stream's name first.
    """
    store = await link.request(lambda: link.js.object_store(bucket), f"object store {bucket}", retry_s=10)
    seen: set[str] = set()
    while len(seen) < _READS:
        try:
            info = await link.request(lambda: store.get_info(name), f"entry {name} of {bucket}", retry_s=10)
        except BusError as exc:
            gone = nats.js.errors.ObjectNotFoundError | nats.js.errors.ObjectDeletedError
            if isinstance(exc.__cause__, gone):
                return None
            raise
        if not info.nuid:
            raise BusError(f"entry {name} of {bucket} names no chunks")
        chunks = bytearray()
        if info.size:
            subject = f"$O.{bucket}.C.{info.nuid}"
            async for _, msg in replay_messages(link, f"OBJ_{bucket}", subjects=(subject,)):
                chunks += msg.data
        digest = base64.urlsafe_b64encode(hashlib.sha256(chunks).digest()).decode()
        if len(chunks) == (info.size or 0) and info.digest == f"SHA-256={digest}":
            return bytes(chunks)
        if info.nuid in seen:
            break
        seen.add(info.nuid)  # read again: replaced meanwhile, or else refused the second time
    raise BusError(f"{name} of {bucket}: the chunks read do not match the entry's size and digest")
