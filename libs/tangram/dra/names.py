"""Device, counter and attribute names: DNS labels, stable across restarts."""

from __future__ import annotations

import re
from collections.abc import Collection

STANDARD_DOMAIN = "resource.kubernetes.io"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"

MEMORY_COUNTER = "memory"
MULTIPROCESSORS_COUNTER = "multiprocessors"
MEDIA_EXTENSIONS_COUNTER = "media-extensions"
UNHEALTHY_TAINT = "unhealthy"

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


def gpu_device_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}"


def mig_device_name(gpu_index: int, profile: str, start: int) -> str:
    """`gpu-0-mig-3g-71gb-4`: profile names have '.' and '+', which DNS labels forbid."""
    profile_label = _NOT_LABEL.sub("-", profile.lower()).strip("-")
    return f"gpu-{gpu_index}-mig-{profile_label}-{start}"


SHARED_SUFFIX = "-shared"


def shared_device_name(exclusive_name: str) -> str:
    """The share host of a device: `gpu-0-shared`, `gpu-0-mig-2g-35gb-0-shared`."""
    return f"{exclusive_name}{SHARED_SUFFIX}"


def counter_set_name(gpu_index: int) -> str:
    """Unique across the pool, as 1.35 and later require."""
    return f"gpu-{gpu_index}-counters"


def memory_slice_counter(slice_index: int) -> str:
    return f"memory-slice-{slice_index}"


def qualified(domain: str, name: str) -> str:
    return f"{domain}/{name}"


def names_result(requests: Collection[str] | None, result_request: str) -> bool:
    """Whether a config or constraint naming `requests` (None or empty: every request) binds an
    allocation result of `result_request`: naming a request binds its subrequests too (results
    name `request/subrequest`)."""
    return not requests or result_request in requests or result_request.split("/", maxsplit=1)[0] in requests
