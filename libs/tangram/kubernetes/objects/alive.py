"""Whether Tangram's allocator is alive, as the API server shows it: a coordination.k8s.io Lease.

The leading allocator in Kubernetes mode keeps the Lease `ALLOCATOR_LEASE` in its namespace,
renewing it every `RENEW_S` seconds (`services.allocator.alive`). The admission webhook's gate
keeper reads it: while the Lease was renewed within the gate timeout the allocator is alive, and a
pod Tangram cannot place yet stays gated (the allocator retries it when capacity frees); with the
Lease missing, unreadable or renewed longer ago than the gate timeout the allocator is down, and
the gates of pods held past the timeout are lifted so that kube-scheduler decides.

Pure: the Lease as the API server sends it (a dict), the times given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from tangram.kubernetes.objects.times import micro_time, parse_time

ALLOCATOR_LEASE = "tangram-allocator"
DEFAULT_NAMESPACE = "tangram-system"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
RENEW_S = 1.0  # how often the leading allocator renews the Lease
LEASE_DURATION_S = 10  # leaseDurationSeconds written (informative: the gate keeper uses its timeout)


def own_namespace(explicit: str | None = None) -> str:
    """The namespace given, else the pod's own (in a cluster), else `DEFAULT_NAMESPACE`."""
    if explicit:
        return explicit
    with contextlib.suppress(OSError):
        found = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        if found:
            return found
    return DEFAULT_NAMESPACE


def lease_spec(holder: str, now: datetime, *, acquired: str | None = None) -> dict[str, Any]:
    """The Lease's spec as the allocator writes it: held by `holder`, renewed `now`."""
    return {
        "holderIdentity": holder,
        "leaseDurationSeconds": LEASE_DURATION_S,
        "acquireTime": acquired or micro_time(now),
        "renewTime": micro_time(now),
    }


def allocator_alive(lease: Mapping[str, Any] | None, now: datetime, timeout_s: float) -> bool:
    """Whether the allocator renewed its Lease within `timeout_s` of `now`.

    A missing Lease (None), one without a holder, or one whose renewTime is missing or unreadable
    means the allocator is down. A renewTime ahead of `now` (clocks apart) counts as alive.
    """
    if not isinstance(lease, Mapping):
        return False
    spec = lease.get("spec")
    if not isinstance(spec, Mapping) or not spec.get("holderIdentity"):
        return False
    renewed = parse_time(spec.get("renewTime"))
    if renewed is None:
        return False
    return (now - renewed).total_seconds() <= timeout_s
