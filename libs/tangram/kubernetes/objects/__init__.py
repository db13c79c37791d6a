"""Kubernetes objects Tangram publishes, built as plain dicts (pure: no API client here)."""

from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.kubernetes.objects.limits import K8S_VERSIONS, LIMITS, K8sVersion, SliceLimits, check_limits
from tangram.kubernetes.objects.slices import SliceRenderError, render_device, render_slices, slice_name
from tangram.quantity import binary_quantity, decimal_quantity

__all__ = [
    "K8S_VERSIONS",
    "LIMITS",
    "K8sVersion",
    "SliceLimits",
    "SliceRenderError",
    "binary_quantity",
    "check_limits",
    "decimal_quantity",
    "load_shipped_device_classes",
    "render_device",
    "render_slices",
    "slice_name",
]
