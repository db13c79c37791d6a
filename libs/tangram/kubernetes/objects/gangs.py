"""Which group of pods (gang) a claim's pod belongs to (pure).

Where the API server serves the Workload API (scheduling.k8s.io PodGroups; 1.37 with
GenericWorkload), a pod whose `spec.schedulingGroup.podGroupName` names a PodGroup with a gang
scheduling policy is in that group, of `minCount` pods. Otherwise a pod joins a group with the label
`gpu.tangram.dev/gang: <name>` (the group's name in its namespace) and says how many pods the group
has with the annotation `gpu.tangram.dev/gang-size`.
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
# A PodGroup of the pod's namespace by name, or None while none is seen
PodGroupNamed = Callable[[str], Mapping[str, Any] | None]


def no_pod_groups(name: str) -> Mapping[str, Any] | None:
    return None


def pod_group_name(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup the pod's `spec.schedulingGroup` names; None when it names none."""
    group = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    return str(group) if group else None


def gang_size(pod_group: Mapping[str, Any]) -> int | None:
    """A PodGroup's `minCount` when its policy is gang scheduling; None for the basic policy."""
    gang = ((pod_group.get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
    if not isinstance(gang, Mapping):
        return None
    count = gang.get("minCount")
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def gang_member(
    pods: Iterable[Mapping[str, Any]],
    claim_named: ClaimNamed,
    is_tangrams: IsTangrams,
    pod_group: PodGroupNamed = no_pod_groups,
) -> GangMember | None:
    """The group of the first of `pods` (the pods that use a claim, in a fixed order) that names
    one; None when none does. A PodGroup the pod names (`pod_group` finds it) comes before the label.
    A pod that names its group wrongly gives a member with `problem` set, so the claim fails saying
    what to fix instead of being placed alone."""
    for pod in pods:
        metadata = pod.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        name = str(metadata.get("name", ""))
        named = pod_group_name(pod)
        if named is not None:
            member = _pod_group_member(pod, named, pod_group(named), claim_named, is_tangrams)
            if member is not None:
                return member
        labels = metadata.get("labels") or {}
        group = labels.get(GANG_LABEL)
        if not group:
            continue
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


def _pod_group_member(
    pod: Mapping[str, Any],
    name: str,
    found: Mapping[str, Any] | None,
    claim_named: ClaimNamed,
    is_tangrams: IsTangrams,
) -> GangMember | None:
    """The member of the PodGroup the pod names: of size 0 (its size unknown: the group waits)
    while the PodGroup is not seen; None when its policy is not gang scheduling."""
    metadata = pod.get("metadata") or {}
    pod_name = str(metadata.get("name", ""))
    size = gang_size(found) if found is not None else 0
    if size is None:
        return None
    problem = ""
    if found is not None and not 1 <= size <= MAX_GANG_SIZE:
        problem = (
            f"PodGroup {name} asks for gang scheduling of {size} pods; Tangram places 1 to {MAX_GANG_SIZE}"
        )
    domain_text = str((metadata.get("annotations") or {}).get(NVLINK_DOMAIN_ANNOTATION, "false")).lower()
    return GangMember(
        group=name,
        size=size if not problem else 0,
        pod=pod_name,
        pod_claims=_tangram_claims(pod, claim_named, is_tangrams),
        nvlink_domain=domain_text == "true",
        problem=problem,
    )


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
