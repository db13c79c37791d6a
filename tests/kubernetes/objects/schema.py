"""Strict validation against the official schemas shipped by kubernetes-validate (named "1.34" ...)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate


def validate_strictly(obj: dict[str, Any], k8s_version: str) -> None:
    """Raises kubernetes_validate.ValidationError naming the offending path."""
    validated = kubernetes_validate.validate(obj, k8s_version, strict=True)
    assert validated == k8s_version  # the schema of that exact version, not an older fallback
