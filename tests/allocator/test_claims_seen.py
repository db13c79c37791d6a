"""The claims the bridge has seen, indexed by the devices their allocations hold: a decision's
devices are checked against the claims that hold them, whatever the claims' changes since."""

from __future__ import annotations

from typing import Any

from services.allocator.clusterview import ClaimsSeen, ClusterView
from tangram.kubernetes.objects.claimbridge import taken_by_others

DRIVER = "gpu.tangram.dev"


def claim(name: str, *devices: str, admin: bool = False, uid: str | None = None) -> dict[str, Any]:
    results = [
        {
            "request": "gpus",
            "driver": DRIVER,
            "pool": "n1",
            "device": d,
            **({"adminAccess": True} if admin else {}),
        }
        for d in devices
    ]
    status = {"allocation": {"devices": {"results": results}}} if devices else {}
    return {"metadata": {"namespace": "a", "name": name, "uid": uid or f"uid-{name}"}, "status": status}


def names(claims: list[dict[str, Any]]) -> list[str]:
    return [c["metadata"]["name"] for c in claims]


def key(device: str) -> tuple[str, str, str]:
    return (DRIVER, "n1", device)


def test_holders_follow_allocations_as_claims_change_and_go() -> None:
    seen = ClaimsSeen()
    seen[("a", "c1")] = claim("c1", "gpu-0", "gpu-1")
    seen[("a", "c2")] = claim("c2", "gpu-2")
    seen[("a", "c3")] = claim("c3")  # not allocated
    assert names(seen.holding([key("gpu-1"), key("gpu-2"), key("gpu-7")])) == ["c1", "c2"]
    seen[("a", "c1")] = claim("c1", "gpu-3")  # reallocated elsewhere
    assert names(seen.holding([key("gpu-0"), key("gpu-1")])) == []
    assert names(seen.holding([key("gpu-3")])) == ["c1"]
    del seen[("a", "c2")]
    assert seen.holding([key("gpu-2")]) == []
    assert seen.pop(("a", "c1"))["metadata"]["name"] == "c1"
    assert seen.holding([key("gpu-3")]) == [] and list(seen) == [("a", "c3")]


def test_admin_access_holds_no_device() -> None:
    seen = ClaimsSeen({("a", "watcher"): claim("watcher", "gpu-0", admin=True)})
    assert seen.holding([key("gpu-0")]) == []


def test_what_the_index_finds_is_what_walking_every_claim_finds() -> None:
    # each device held by one claim at most, as the API server's allocations are
    everyone = {
        ("a", f"c{n}"): claim(f"c{n}", *([f"gpu-{n}", f"gpu-{n + 20}"] if n % 3 else [])) for n in range(20)
    }
    seen = ClaimsSeen(everyone)
    decision = claim("new", "gpu-1", "gpu-3", "gpu-24", "gpu-40")["status"]["allocation"]
    wanted = [key("gpu-1"), key("gpu-3"), key("gpu-24"), key("gpu-40")]
    assert taken_by_others("uid-new", decision, seen.holding(wanted)) == taken_by_others(
        "uid-new", decision, everyone.values()
    )
    assert {
        d: c["metadata"]["name"]
        for d, c in taken_by_others("uid-new", decision, seen.holding(wanted)).items()
    } == {
        "gpu-1": "c1",
        "gpu-24": "c4",
    }


def test_a_view_given_plain_claims_indexes_them() -> None:
    view = ClusterView()
    view.claims = {("a", "c1"): claim("c1", "gpu-0")}
    assert isinstance(view.claims, ClaimsSeen)
    assert names(view.claims.holding([key("gpu-0")])) == ["c1"]
