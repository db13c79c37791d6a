"""The claim bridge finds a claim's pods from what it keeps of each pod, not by walking every pod:
the same pods `uses_claim` finds, as pods come, change and go."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient

from services.allocator.kubernetes import ClaimBridge
from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import Event
from tangram.kubernetes.objects.claimbridge import ClaimRef, uses_claim
from tangram.kubernetes.objects.names import SCHEDULING_GATE


async def _publish(event: Event) -> None:
    return None


def _pod(
    namespace: str, name: str, *, claim: str | None = None, template: str | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "gpus"}
    if claim is not None:
        entry["resourceClaimName"] = claim
    if template is not None:
        entry["resourceClaimTemplateName"] = template
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"{namespace}-{name}"},
        "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}], "resourceClaims": [entry]},
        "status": {},
    }


async def test_a_claims_pods_are_those_that_use_it_as_pods_come_change_and_go() -> None:
    async with ApiClient() as api:
        bridge = ClaimBridge(api, Ledger(FleetState(), {}), _publish, producer="test")
        refs = [ClaimRef("a", "c1", "u1"), ClaimRef("a", "c2", "u2"), ClaimRef("b", "c1", "u3")]

        def check() -> None:
            for ref in refs:
                expected = sorted(key for key, pod in bridge.pods.by_key.items() if uses_claim(pod, ref))
                found = [
                    (p["metadata"]["namespace"], p["metadata"]["name"]) for p in bridge.pods.users_of(ref)
                ]
                assert found == expected, ref

        await bridge._pod_seen("ADDED", _pod("a", "p1", claim="c1"))
        await bridge._pod_seen("ADDED", _pod("a", "p2", claim="c1"))
        await bridge._pod_seen("ADDED", _pod("b", "p1", claim="c1"))
        # From a template: no claim until the controller records the one it made.
        made = _pod("a", "p3", template="t")
        await bridge._pod_seen("ADDED", made)
        check()
        assert len(bridge.pods.users_of(refs[0])) == 2 and bridge.pods.users_of(refs[1]) == []
        made = {**made, "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "c2"}]}}
        await bridge._pod_seen("MODIFIED", made)
        check()
        assert [p["metadata"]["name"] for p in bridge.pods.users_of(refs[1])] == ["p3"]
        await bridge._pod_seen("DELETED", _pod("a", "p1", claim="c1"))
        await bridge._pod_seen("DELETED", made)
        check()
        assert [p["metadata"]["name"] for p in bridge.pods.users_of(refs[0])] == ["p2"]
        assert bridge.pods.users_of(refs[1]) == []
        # A pod that no longer uses claims nor carries the gate is not kept at all.
        await bridge._pod_seen("MODIFIED", {"metadata": {"namespace": "b", "name": "p1"}, "spec": {}})
        check()
        assert bridge.pods.users_of(refs[2]) == [] and ("b", "p1") not in bridge.pods.by_key
        assert bridge.pods.claims_used() == {("a", "c1")}
