"""Asking cluster-autoscaler for a node no current node could replace (pure).

A pod whose claim no node of the cluster could ever hold stays behind Tangram's scheduling gate,
and cluster-autoscaler (like Karpenter) never looks at a gated pod. Tangram hands it over the way
Kueue hands over gated workloads: a ProvisioningRequest (`autoscaling.x-k8s.io/v1`, class
`best-effort-atomic-scale-up.autoscaling.x-k8s.io`) naming a PodTemplate of the pod as it would be
scheduled (without the gate). Both are owned by the pod, so they go when it goes; Tangram deletes
them once the claim is allocated. When the new node's slices appear, the claims no node could hold
are decided again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

PROVISIONING_GROUP = "autoscaling.x-k8s.io"
PROVISIONING_VERSION = "v1"
PROVISIONING_PLURAL = "provisioningrequests"
PROVISIONING_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
PROVISIONING_REASON = "TangramProvisioningRequested"
_PREFIX = "tangram-"
_MAX_NAME = 253


def provisioning_name(pod: Mapping[str, Any]) -> str:
    """The name of the pod's PodTemplate and ProvisioningRequest (within an object name's length)."""
    name = str((pod.get("metadata") or {}).get("name", ""))
    if len(_PREFIX) + len(name) <= _MAX_NAME:
        return _PREFIX + name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{_PREFIX}{name[: _MAX_NAME - len(_PREFIX) - 17]}-{digest}"


def _owned_by(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    metadata = pod.get("metadata") or {}
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": metadata.get("name", ""),
            "uid": metadata.get("uid", ""),
            "blockOwnerDeletion": False,
        }
    ]


def pod_template(pod: Mapping[str, Any], gate: str) -> dict[str, Any]:
    """A PodTemplate of the pod as it would be scheduled: Tangram's gate and any binding left out."""
    metadata = pod.get("metadata") or {}
    spec = {k: v for k, v in dict(pod.get("spec") or {}).items() if k != "nodeName"}
    gates = [g for g in spec.get("schedulingGates") or [] if isinstance(g, dict) and g.get("name") != gate]
    if gates:
        spec["schedulingGates"] = gates
    else:
        spec.pop("schedulingGates", None)
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": provisioning_name(pod),
            "namespace": metadata.get("namespace", ""),
            "ownerReferences": _owned_by(pod),
        },
        "template": {"metadata": {"labels": dict(metadata.get("labels") or {})}, "spec": spec},
    }


def provisioning_request(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A ProvisioningRequest for one pod like `pod`, from its PodTemplate (named alike)."""
    metadata = pod.get("metadata") or {}
    name = provisioning_name(pod)
    return {
        "apiVersion": f"{PROVISIONING_GROUP}/{PROVISIONING_VERSION}",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name,
            "namespace": metadata.get("namespace", ""),
            "ownerReferences": _owned_by(pod),
        },
        "spec": {
            "provisioningClassName": PROVISIONING_CLASS,
            "podSets": [{"count": 1, "podTemplateRef": {"name": name}}],
        },
    }
