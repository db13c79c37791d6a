"""Names that end up in file names and CDI device ids: checked before they touch the file system."""

from __future__ import annotations

import re

# RFC 4122 textual form, as Kubernetes writes metadata.uid.
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# A DNS label: what local-mode claim ids and ResourceSlice device names look like.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# CDI: vendor and class start with a letter; names start with a letter or a digit; all end alphanumeric.
_CDI_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CDI_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CDI_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class InvalidName(ValueError):
    """A claim uid, device name or CDI kind that Tangram refuses to use."""


def validate_claim_uid(uid: str) -> str:
    """Return `uid` if it is a UUID or a DNS label; anything path-like is refused."""
    if not isinstance(uid, str) or not uid:
        raise InvalidName("claim uid is empty")
    if _UUID.match(uid) or _DNS_LABEL.match(uid):
        return uid
    shown = uid if len(uid) <= 80 else uid[:80] + "..."
    raise InvalidName(
        f"claim uid {shown!r} is neither an RFC 4122 UUID nor a DNS label "
        "(no '/', '..', NUL, upper case or spaces allowed)"
    )


def validate_device_name(name: str) -> str:
    """A ResourceSlice device name (DNS label) that becomes part of a CDI device name."""
    if not _DNS_LABEL.match(name):
        raise InvalidName(f"device name {name!r} is not a DNS label")
    return name


def validate_cdi_kind(kind: str) -> tuple[str, str]:
    vendor, sep, cls = kind.partition("/")
    if not sep or not _CDI_VENDOR.match(vendor) or not _CDI_CLASS.match(cls):
        raise InvalidName(f"CDI kind {kind!r} is not '<vendor>/<class>' (letters, digits, '-', '_', '.')")
    return vendor, cls


def is_valid_cdi_device_name(name: str) -> bool:
    return bool(_CDI_DEVICE.match(name))
