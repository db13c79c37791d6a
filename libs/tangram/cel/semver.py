"""Semantic versions as the Kubernetes CEL semver library sees them (blang/semver rules).

Strict parsing is `semver.Parse`: MAJOR.MINOR.PATCH, no leading zeros, optional pre-release and
build metadata. Normalized parsing (`semver(s, true)`) drops a leading "v", fills a missing
minor/patch with 0 and strips leading zeros first. Ordering ignores build metadata.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

_NUMBER = r"(0|[1-9][0-9]*)"
_IDENTIFIER = r"[0-9A-Za-z-]+"
_STRICT = re.compile(
    rf"{_NUMBER}\.{_NUMBER}\.{_NUMBER}"
    rf"(?:-({_IDENTIFIER}(?:\.{_IDENTIFIER})*))?"
    rf"(?:\+({_IDENTIFIER}(?:\.{_IDENTIFIER})*))?"
)
_LEADING_ZERO_NUMBER = re.compile(r"0[0-9]+")


class Semver(NamedTuple):
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()

    def canonical(self) -> str:
        """The version without build metadata: equal versions have equal canonical strings."""
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.prerelease)}" if self.prerelease else core


@functools.lru_cache(maxsize=4096)
def parse_semver(text: str, *, normalize: bool = False) -> Semver:
    """ValueError naming the problem when `text` is not a semantic version."""
    if normalize:
        text = _normalize(text)
    match = _STRICT.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid semantic version {text!r}: want MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]")
    major, minor, patch, prerelease, _build = match.groups()
    identifiers = tuple(prerelease.split(".")) if prerelease else ()
    for identifier in identifiers:
        if _LEADING_ZERO_NUMBER.fullmatch(identifier):
            raise ValueError(
                f"invalid semantic version {text!r}: numeric pre-release {identifier!r} has a leading zero"
            )
    return Semver(int(major), int(minor), int(patch), identifiers)


def _normalize(text: str) -> str:
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for index, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or not stripped[0].isdigit():
                stripped = "0" + stripped
            parts[index] = stripped
    if len(parts) < 3:
        if any(sign in parts[-1] for sign in "+-"):
            raise ValueError(
                f"invalid semantic version {text!r}: a short version cannot carry pre-release or build"
            )
        parts.extend(["0"] * (3 - len(parts)))
    return ".".join(parts)


def is_semver(text: str, *, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize=normalize)
    except ValueError:
        return False
    return True


def compare_semver(left: Semver, right: Semver) -> int:
    """-1, 0 or 1, by semver.org precedence (build metadata ignored)."""
    if left[:3] != right[:3]:
        return -1 if left[:3] < right[:3] else 1
    if left.prerelease == right.prerelease:
        return 0
    if not left.prerelease:
        return 1
    if not right.prerelease:
        return -1
    for mine, theirs in zip(left.prerelease, right.prerelease, strict=False):
        if mine == theirs:
            continue
        mine_numeric, theirs_numeric = mine.isdigit(), theirs.isdigit()
        if mine_numeric and theirs_numeric:
            return -1 if int(mine) < int(theirs) else 1
        if mine_numeric != theirs_numeric:
            return -1 if mine_numeric else 1
        return -1 if mine < theirs else 1
    return -1 if len(left.prerelease) < len(right.prerelease) else 1
