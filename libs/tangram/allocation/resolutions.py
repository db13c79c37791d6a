"""Claims resolved against their DeviceClasses, and the classes requests carry, remembered by what
they say.

A fleet resolves the claims of one template over and over: at each decision, and again for each
claim a rebuild folds into the demand mix, where validating and resolving the spec was half of the
fold. Resolution is pure (the same spec and the same classes give the same ResolvedClaim, or the
same error), so its answer is kept. The key is the spec's JSON and the very DeviceClass objects it
was resolved against; the entry holds those objects, so their ids cannot be reused while it lives,
and a class replaced in the mapping is a new key.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from tangram.allocation.demand import ClaimKind, claim_kind
from tangram.allocation.requests import ClaimError, ResolvedClaim, resolve
from tangram.allocation.spec import DeviceClass, parse_claim_spec

# Distinct (spec, classes) pairs kept: a fleet has a few hundred templates; a tenant sending
# thousands of distinct specs only cycles the oldest out.
RESOLUTIONS_KEPT = 4096
# A spec's JSON longer than this is resolved each time, never kept: a claim's spec is a few hundred
# bytes, and what the entries may hold must stay bounded whatever a publisher of claims sends.
KEPT_SPEC_BYTES = 16 * 1024

_encode = msgspec.json.Encoder().encode
# (the spec's JSON, (class name, id of the DeviceClass object) for each class)
_Key = tuple[bytes, tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True)
class Resolution:
    claim: ResolvedClaim
    kind: ClaimKind | None  # what it counts as in the demand mix; None when the mix does not model it


@dataclass(frozen=True, slots=True)
class _Entry:
    classes: tuple[DeviceClass, ...]  # held: the key names them by id
    answer: Resolution | ValueError | ClaimError


class Resolutions:
    def __init__(self, driver: str, *, kept: int = RESOLUTIONS_KEPT) -> None:
        self.driver = driver
        self._kept = kept
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def resolve(self, spec: Any, classes: Mapping[str, DeviceClass]) -> Resolution:
        """The claim resolved, with its demand kind. Raises ValueError for a spec that does not
        validate and ClaimError for one no fleet state can hold, as `resolve` does."""
        key = self._key(spec, classes)
        if key is None:
            return _answered(_resolution(spec, classes, self.driver))
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return _answered(entry.answer)
        entry = self._entries[key] = _Entry(tuple(classes.values()), _resolution(spec, classes, self.driver))
        if len(self._entries) > self._kept:
            self._entries.popitem(last=False)
        return _answered(entry.answer)

    @staticmethod
    def _key(spec: Any, classes: Mapping[str, DeviceClass]) -> _Key | None:
        if not isinstance(spec, dict):
            return None  # an already parsed spec (tests, the CLI): nothing to save
        try:
            text = _encode(spec)
        except (TypeError, ValueError, OverflowError):
            return None  # not JSON at all: parsing it says why
        if len(text) > KEPT_SPEC_BYTES:
            return None
        return text, tuple((name, id(device_class)) for name, device_class in classes.items())


def _resolution(
    spec: Any, classes: Mapping[str, DeviceClass], driver: str
) -> Resolution | ValueError | ClaimError:
    try:
        resolved = resolve(parse_claim_spec(spec), classes, driver)
    except (ValueError, ClaimError) as error:
        return error
    return Resolution(resolved, claim_kind(resolved))


def _answered(answer: Resolution | ValueError | ClaimError) -> Resolution:
    if isinstance(answer, Resolution):
        return answer
    # A fresh exception each time: raising the kept one would chain every caller's traceback on it.
    if isinstance(answer, ClaimError):
        raise ClaimError(str(answer))
    raise ValueError(str(answer))


def carried_class(manifest: dict[str, Any]) -> DeviceClass | None:
    """A DeviceClass a request carries; None when it does not parse. Every request from the cluster
    carries its classes: each distinct manifest is parsed once, so that the same objects let the
    fleet reuse the claims' resolutions (a manifest too long to keep is parsed each time)."""
    text = _encode(manifest)
    if len(text) > KEPT_SPEC_BYTES:
        return _parsed_class(manifest)
    return _kept_class(text)


def _parsed_class(manifest: dict[str, Any]) -> DeviceClass | None:
    try:
        return DeviceClass.from_manifest(manifest)
    except ValueError:
        return None


@functools.lru_cache(maxsize=1024)
def _kept_class(manifest: bytes) -> DeviceClass | None:
    return _parsed_class(msgspec.json.decode(manifest))
