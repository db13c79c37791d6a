"""Kubernetes API adapter: the only package that talks to the API server (through kubernetes_asyncio)."""

from tangram.kubernetes.api.client import (
    WATCH_ERRORS,
    KubeApiError,
    KubeConfigError,
    call,
    call_json,
    connect,
    relist_delay,
)
from tangram.kubernetes.api.layout import LayoutError, SliceLayout, detect_layout
from tangram.kubernetes.api.slices import (
    SPEC_HASH_ANNOTATION,
    SliceInputError,
    SlicePublisher,
    SyncReport,
    spec_hash,
)

__all__ = [
    "SPEC_HASH_ANNOTATION",
    "WATCH_ERRORS",
    "KubeApiError",
    "KubeConfigError",
    "LayoutError",
    "SliceInputError",
    "SliceLayout",
    "SlicePublisher",
    "SyncReport",
    "call",
    "call_json",
    "connect",
    "detect_layout",
    "relist_delay",
    "spec_hash",
]
