"""The envelope every event carries, and the rules for the keys that place events on subjects."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import ClassVar

import msgspec

SCHEMA_VERSION = 1

# A key is one NATS subject token: node names (DNS subdomains, dots mapped to '_') or claim uids.
_KEY = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,251}[a-z0-9])?$")


class InvalidKey(ValueError):
    """A key that cannot be one NATS subject token."""


def subject_token(name: str) -> str:
    """Map a Kubernetes name (DNS subdomain) to one subject token; injective since '_' is not DNS."""
    token = name.lower().replace(".", "_")
    if not _KEY.match(token):
        raise InvalidKey(f"{name!r} is not a valid node name or claim uid for a subject")
    return token


def new_event_id() -> str:
    return uuid.uuid4().hex


def utc_now() -> datetime:
    return datetime.now(UTC)


class Event(
    msgspec.Struct,
    kw_only=True,
    frozen=True,
    tag_field="type",
    omit_defaults=False,
):
    """Base of every event. Subclasses set `stream` and `subject_pattern` ({key} is the key)."""

    stream: ClassVar[str]
    subject_pattern: ClassVar[str]

    key: str
    event_id: str = msgspec.field(default_factory=new_event_id)
    schema_version: int = SCHEMA_VERSION
    producer: str = "tangram"
    time: datetime = msgspec.field(default_factory=utc_now)

    def __post_init__(self) -> None:
        if not _KEY.match(self.key):
            raise ValueError(f"invalid subject key {self.key!r} (one lowercase token: a-z 0-9 - _)")

    @property
    def subject(self) -> str:
        return self.subject_pattern.format(key=self.key)

    @classmethod
    def type_name(cls) -> str:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str)
        return tag
