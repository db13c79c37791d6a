"""A watch event can reach the claim bridge after the claim writer kept the newer claim its own
write returned: the older version must not read as the allocation being taken away."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient

from services.allocator.clusterview import older
from services.allocator.kubernetes import ClaimBridge
from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import Event


def _claim(version: str, *, allocated: bool, uid: str = "u1") -> dict[str, Any]:
    status = (
        {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": "gpu.tangram.dev", "pool": "n1", "device": "gpu-0"}
                    ]
                }
            }
        }
        if allocated
        else {}
    )
    return {
        "metadata": {"namespace": "a", "name": "c1", "uid": uid, "resourceVersion": version},
        "spec": {"devices": {"requests": []}},
        "status": status,
    }


def test_older_compares_versions_of_the_same_object_only() -> None:
    assert older(_claim("99", allocated=False), _claim("100", allocated=True))
    assert not older(_claim("100", allocated=False), _claim("99", allocated=True))
    assert not older(_claim("100", allocated=False), _claim("100", allocated=True))
    assert not older(_claim("99", allocated=False, uid="u2"), _claim("100", allocated=True))
    assert not older(_claim("x9", allocated=False), _claim("100", allocated=True))


async def test_a_stale_event_after_the_writers_own_write_releases_nothing() -> None:
    published: list[Event] = []

    async def publish(event: Event) -> None:
        published.append(event)

    async with ApiClient() as api:
        bridge = ClaimBridge(api, Ledger(FleetState(), {}), publish, producer="test")
        bridge._listed.update({"classes", "claims", "pods"})
        bridge._requester._known.add("u1")  # the bridge asked about the claim
        written = _claim("120", allocated=True)
        bridge.claims[("a", "c1")] = written  # what the writer kept of its own write
        await bridge._claim_changed("MODIFIED", _claim("118", allocated=False))
        assert published == []
        assert bridge.claims[("a", "c1")] is written
        # a newer version without the allocation is a real deallocation: released
        await bridge._claim_changed("MODIFIED", _claim("121", allocated=False))
        assert [type(e).__name__ for e in published] == ["ClaimReleased"]
