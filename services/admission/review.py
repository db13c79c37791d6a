"""AdmissionReview in, AdmissionReview out: the pure part of the webhook.

`parse` accepts only what the API server sends for this webhook (admission.k8s.io/v1, a Pod
CREATE with the pod in `request.object`) and says precisely what is wrong with anything else;
`claim_references` lists what the pod's claims come from; `gate_patch` is the JSONPatch adding
Tangram's scheduling gate, or nothing when the gate is there already or cannot be added.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Literal

from tangram.kubernetes.objects.gates import add_gate_patch
from tangram.kubernetes.objects.names import SCHEDULING_GATE

API_VERSION = "admission.k8s.io/v1"
MAX_UID = 128

Source = Literal["ResourceClaim", "ResourceClaimTemplate"]


class BadReview(ValueError):
    """A body that is not an AdmissionReview this webhook answers; `uid` when one could be read
    (then the API server gets an allowed answer without a patch, else an HTTP error)."""

    def __init__(self, message: str, uid: str | None = None) -> None:
        super().__init__(message)
        self.uid = uid


@dataclass(frozen=True)
class PodReview:
    uid: str
    namespace: str
    pod: dict[str, Any]
    dry_run: bool


def parse(body: bytes) -> PodReview:
    """The pod of a v1 AdmissionReview for a Pod CREATE; BadReview for anything else."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadReview(f"the body is not JSON: {error}") from None
    except RecursionError:
        raise BadReview("the body nests too deeply") from None
    if not isinstance(review, dict):
        raise BadReview("the body is not an object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(f"expected kind AdmissionReview of {API_VERSION}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("the review has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID:
        raise BadReview("the request has no uid")
    kind = request.get("kind")
    if not isinstance(kind, dict) or (kind.get("group"), kind.get("version"), kind.get("kind")) != (
        "",
        "v1",
        "Pod",
    ):
        raise BadReview(f"the request is not for a v1 Pod (kind {kind!r})", uid)
    if request.get("subResource"):
        raise BadReview(f"the request is for subresource {request.get('subResource')!r}", uid)
    if request.get("operation") != "CREATE":
        raise BadReview(f"the request is a {request.get('operation')!r}, not a CREATE", uid)
    pod = request.get("object")
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        raise BadReview("the request carries no pod", uid)
    namespace = request.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        metadata = pod.get("metadata")
        namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    if not isinstance(namespace, str) or not namespace:
        raise BadReview("the request names no namespace", uid)
    return PodReview(uid=uid, namespace=namespace, pod=pod, dry_run=request.get("dryRun") is True)


def claim_references(pod: dict[str, Any]) -> list[tuple[Source, str]]:
    """What each of the pod's claims comes from: a ResourceClaim or a ResourceClaimTemplate, by name."""
    entries = pod.get("spec", {}).get("resourceClaims")
    if not isinstance(entries, list):
        return []
    found: list[tuple[Source, str]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if isinstance(claim, str) and claim:
            found.append(("ResourceClaim", claim))
        elif isinstance(template, str) and template:
            found.append(("ResourceClaimTemplate", template))
    return found


def gate_patch(pod: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The JSONPatch that adds SCHEDULING_GATE to the pod (see
    `tangram.kubernetes.objects.gates.add_gate_patch`)."""
    return add_gate_patch(pod, SCHEDULING_GATE)


def answer(uid: str, patch: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The AdmissionReview answer: always allowed (the gate only delays scheduling), with `patch`."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
