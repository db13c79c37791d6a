"""Times as the Kubernetes API writes them: Time (RFC 3339, seconds), MicroTime (microseconds)."""

from __future__ import annotations

from datetime import UTC, datetime


def kube_time(when: datetime) -> str:
    """A Kubernetes Time (an Event's timestamps, a condition's transition): seconds, in UTC."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(when: datetime) -> str:
    """A Kubernetes MicroTime (a Lease's renewTime): RFC 3339 with microseconds, in UTC."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(stamp: object) -> datetime | None:
    """A Kubernetes Time or MicroTime (or a datetime, as the client's models give it) as an aware
    datetime; None when unreadable."""
    if isinstance(stamp, datetime):
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
