"""Which claim holds which devices, and which MIG instances Tangram created: the fleet's records."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec

from tangram.allocation.model import Allocated
from tangram.events.catalogue import AllocatedDevice

MadeInstance = tuple[str, int, int, int]  # (node, GPU index, profile id, start)


@dataclass(frozen=True, slots=True)
class Held:
    decision: Allocated
    node: str
    devices: tuple[str, ...]  # device names taken (admin access excluded)


class Holdings:
    """Claims' holds by uid and by node; the record stays while the node is away."""

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}
        self._on: dict[str, set[str]] = {}
        self.made: set[MadeInstance] = set()  # the MIG instances Tangram created
        # uid -> (request, device name) of devices a claim was prepared on while another claim
        # held them (two deciders at once): it takes them when that claim frees them
        self.contested: dict[str, list[tuple[str, str]]] = {}

    def get(self, claim_uid: str) -> Held | None:
        return self.held.get(claim_uid)

    def __contains__(self, claim_uid: str) -> bool:
        return claim_uid in self.held

    def hold(self, decision: Allocated, devices: tuple[str, ...]) -> None:
        """Record the claim's decision and the devices it takes on its node."""
        self.held[decision.claim_uid] = Held(decision=decision, node=decision.node, devices=devices)
        self._on.setdefault(decision.node, set()).add(decision.claim_uid)

    def name_devices(self, claim_uid: str, devices: list[AllocatedDevice]) -> None:
        """The held decision's devices as the allocation names them, with the partition commands
        that make them: as a decision read back from the log holds them."""
        held = self.held.get(claim_uid)
        if held is not None:
            self.held[claim_uid] = replace(
                held, decision=msgspec.structs.replace(held.decision, devices=devices)
            )

    def take_more(self, claim_uid: str, devices: list[AllocatedDevice]) -> None:
        """The held claim takes these devices too."""
        held = self.held[claim_uid]
        self.held[claim_uid] = replace(
            held,
            decision=msgspec.structs.replace(held.decision, devices=[*held.decision.devices, *devices]),
            devices=(*held.devices, *(d.device for d in devices)),
        )

    def drop(self, claim_uid: str) -> Held | None:
        """Forget the claim's hold; returns it, or None when the claim held nothing."""
        held = self.held.pop(claim_uid, None)
        self.contested.pop(claim_uid, None)
        if held is not None:
            self._on[held.node].discard(claim_uid)
        return held

    def on(self, node_name: str) -> list[str]:
        """The uids of the claims held on the node, in order."""
        return sorted(self._on.get(node_name, ()))
