"""Which group of pods (gang) a claim's pod belongs to, from the pod's own metadata (pure).

A pod joins a group with the label `gpu.tangram.dev/gang: <name>` (the group's name in its
namespace) and says how many pods the group has with the annotation `gpu.tangram.dev/gang-size`.
`gpu.tangram.dev/nvlink-domain: "true"` on the group's pods asks for one NVLink domain: all its
claims in one fabric clique (a GB200 NVL rack or partition), sharing one IMEX channel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tangram.events import GangMember
from tangram.kubernetes.objects.claimbridge import pod_claims

GANG_LABEL = "gpu.tangram.dev/gang"
GANG_SIZE_ANNOTATION = "gpu.tangram.dev/gang-size"
NVLINK_DOMAIN_ANNOTATION = "gpu.tangram.dev/nvlink-domain"
MAX_GANG_SIZE = 1024

# A claim of the pod's namespace by name, or None while it is not made yet; and whether a claim
# is Tangram's to decide.
ClaimNamed = Callable[[str], Mapping[str, Any] | None]
IsTangrams = Callable[[Mapping[str, Any]], bool]


def gang_member(
    pods: Iterable[Mapping[str, Any]], claim_named: ClaimNamed, is_tangrams: IsTangrams
) -> GangMember | None:
    """The group of the first of `pods` (the pods that use a claim, in a fixed order) that names
    one; None when none does. A pod that names its group wrongly gives a member with `problem` set,
    so the claim fails saying what to fix instead of being placed alone."""
    for pod in pods:
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        group = labels.get(GANG_LABEL)
        if not group:
            continue
        annotations = metadata.get("annotations") or {}
        name = str(metadata.get("name", ""))
        size_text = annotations.get(GANG_SIZE_ANNOTATION)
        problem = ""
        size = 0
        try:
            size = int(str(size_text))
        except ValueError:
            size = 0
        if not 1 <= size <= MAX_GANG_SIZE:
            problem = (
                f"pod {name} is in group {group} (label {GANG_LABEL}) and its annotation "
                f"{GANG_SIZE_ANNOTATION} must be the group's number of pods, 1 to {MAX_GANG_SIZE}; "
                f"it is {size_text!r}"
            )
        domain_text = str(annotations.get(NVLINK_DOMAIN_ANNOTATION, "false")).lower()
        if domain_text not in ("true", "false"):
            problem = problem or (
                f'pod {name}: annotation {NVLINK_DOMAIN_ANNOTATION} must be "true" or "false", '
                f"not {annotations.get(NVLINK_DOMAIN_ANNOTATION)!r}"
            )
        return GangMember(
            group=str(group),
            size=max(size, 0) if not problem else 0,
            pod=name,
            pod_claims=_tangram_claims(pod, claim_named, is_tangrams),
            nvlink_domain=domain_text == "true",
            problem=problem,
        )
    return None


def _tangram_claims(pod: Mapping[str, Any], claim_named: ClaimNamed, is_tangrams: IsTangrams) -> int:
    """How many of the pod's claims are Tangram's: those made and Tangram's, and those not made yet
    (counted until they are, so the group waits for them rather than decide without them)."""
    names = pod_claims(pod)
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    if names is None:
        return max(1, len(entries))
    count = 0
    for name in names:
        claim = claim_named(name)
        if claim is None or is_tangrams(claim):
            count += 1
    return max(1, count)
