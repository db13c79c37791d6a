"""Names that end up in file names and CDI device ids: checked before they touch the file system.

Claim uids and device names follow the rule the allocator applies too (`tangram.kubernetes.objects.names`).
"""

from __future__ import annotations

import re

from tangram.kubernetes.objects.names import InvalidName, validate_claim_uid, validate_device_name

# CDI: vendor and class start with a letter; names start with a letter or a digit; all end alphanumeric.
_CDI_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CDI_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CDI_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def validate_cdi_kind(kind: str) -> tuple[str, str]:
    vendor, sep, cls = kind.partition("/")
    if not sep or not _CDI_VENDOR.match(vendor) or not _CDI_CLASS.match(cls):
        raise InvalidName(f"CDI kind {kind!r} is not '<vendor>/<class>' (letters, digits, '-', '_', '.')")
    return vendor, cls


def is_valid_cdi_device_name(name: str) -> bool:
    return bool(_CDI_DEVICE.match(name))


__all__ = [
    "InvalidName",
    "is_valid_cdi_device_name",
    "validate_cdi_kind",
    "validate_claim_uid",
    "validate_device_name",
]
