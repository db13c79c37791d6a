"""Which group of pods a claim is placed with, read from its pods' label and annotations."""

from __future__ import annotations

from typing import Any

from tangram.events import GangMember
from tangram.kubernetes.objects.gangs import (
    GANG_LABEL,
    GANG_SIZE_ANNOTATION,
    NVLINK_DOMAIN_ANNOTATION,
    gang_member,
)

TANGRAM = {
    "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tangram.dev"}}]}}
}
OTHER = {
    "spec": {"devices": {"requests": [{"name": "n", "exactly": {"deviceClassName": "nic.example.com"}}]}}
}


def a_pod(
    name: str, *, group: str | None, size: object = "4", claims: int = 1, **annotations: str
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "annotations": dict(annotations)}
    if group is not None:
        metadata["labels"] = {GANG_LABEL: group}
        metadata["annotations"][GANG_SIZE_ANNOTATION] = size
    entries = [{"name": f"c{i}", "resourceClaimName": f"{name}-c{i}"} for i in range(claims)]
    return {"metadata": metadata, "spec": {"resourceClaims": entries}}


def is_tangrams(claim: Any) -> bool:
    return claim is TANGRAM


def test_a_pod_without_the_label_places_its_claims_alone() -> None:
    assert gang_member([a_pod("p", group=None)], lambda name: TANGRAM, is_tangrams) is None


def test_the_group_its_size_the_pod_and_its_tangram_claims_are_read() -> None:
    claims = {"p-c0": TANGRAM, "p-c1": OTHER}  # p-c2 not made yet: counted until it is
    pod = a_pod("p", group="train", size="8", claims=3, **{NVLINK_DOMAIN_ANNOTATION: "true"})
    assert gang_member([pod], claims.get, is_tangrams) == GangMember(
        group="train", size=8, pod="p", pod_claims=2, nvlink_domain=True
    )


def test_the_first_pod_naming_a_group_is_the_one_read() -> None:
    pods = [a_pod("alone", group=None), a_pod("member", group="g", size="2")]
    found = gang_member(pods, lambda name: TANGRAM, is_tangrams)
    assert found is not None and (found.pod, found.group, found.size) == ("member", "g", 2)


def test_a_wrong_size_or_domain_is_a_problem_that_names_what_to_fix() -> None:
    for size in ("four", "0", "1025", None):
        found = gang_member([a_pod("p", group="g", size=size)], lambda name: TANGRAM, is_tangrams)
        assert found is not None and found.size == 0
        assert (
            f"annotation {GANG_SIZE_ANNOTATION} must be the group's number of pods, 1 to 1024"
            in found.problem
        )
        assert repr(size) in found.problem
    wrong = a_pod("p", group="g", **{NVLINK_DOMAIN_ANNOTATION: "yes"})
    found = gang_member([wrong], lambda name: TANGRAM, is_tangrams)
    assert found is not None and f"annotation {NVLINK_DOMAIN_ANNOTATION} must be" in found.problem


def with_pod_group(name: str, group: str) -> dict[str, Any]:
    pod = a_pod(name, group=None)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def pod_group(policy: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "trainer", "namespace": "ns"}, "spec": {"schedulingPolicy": policy}}


def test_a_pod_group_of_the_workload_api_names_the_group_and_its_size() -> None:
    groups = {"trainer": pod_group({"gang": {"minCount": 6}})}
    found = gang_member([with_pod_group("p", "trainer")], lambda name: TANGRAM, is_tangrams, groups.get)
    assert found == GangMember(group="trainer", size=6, pod="p", pod_claims=1)
    # the PodGroup not seen yet: the group's size is unknown (0), and its claims wait for it
    unknown = gang_member([with_pod_group("p", "trainer")], lambda name: TANGRAM, is_tangrams)
    assert unknown is not None and unknown.size == 0 and not unknown.problem
    # a basic policy places the pods one by one: no group (the label, if any, decides)
    basic = {"trainer": pod_group({"basic": {}})}
    assert gang_member([with_pod_group("p", "trainer")], lambda name: TANGRAM, is_tangrams, basic.get) is None
    too_big = {"trainer": pod_group({"gang": {"minCount": 5000}})}
    found = gang_member([with_pod_group("p", "trainer")], lambda name: TANGRAM, is_tangrams, too_big.get)
    assert found is not None and "asks for gang scheduling of 5000 pods" in found.problem
