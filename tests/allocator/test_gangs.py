"""Groups of pods in the allocator's fold: all of a group's claims are allocated in one decision or
none is, a group that waits holds nothing, two groups that cannot both fit never deadlock, and a
group that asks for one NVLink domain lands in one fabric clique."""

from __future__ import annotations

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.dra.imex import ImexChannel, imex_of
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    GangMember,
    NodeInventory,
    PartitionRequested,
    subject_token,
)
from tangram.events.inventory import renamed_machine

from .helpers import CLASSES, applied, gpus, hardware, inventory, member, mig, of, request


def ledger() -> Ledger:
    return Ledger(fleet=FleetState(), classes=CLASSES)


def released(n: int) -> ClaimReleased:
    uid = request(n, {}).uid
    return ClaimReleased(key=uid, namespace="team", name=f"claim-{n}", uid=uid)


def tray(node: str, clique: str | None, *, degraded: bool = False) -> NodeInventory:
    """A GB200 tray of the rack (fabric clique) `clique`; None: its registration failed."""
    hw = renamed_machine(hardware("gb200-tray", "template"), node)
    gpus = [msgspec.structs.replace(g, clique_id=clique, fabric_degraded=degraded) for g in hw.gpus]
    hw = msgspec.structs.replace(hw, gpus=gpus)
    return NodeInventory(key=subject_token(node), hardware=hw)


def held(book: Ledger) -> dict[str, str]:
    return {uid: a.node for uid in book.claims if (a := book.fleet.allocation(uid)) is not None}


def test_a_group_is_allocated_in_one_decision_once_its_last_pod_is_asked_and_holds_nothing_before() -> None:
    book = ledger()
    for node in ("n1", "n2"):
        book.apply(inventory("l40s-8", node), live=False)
    for n in (1, 2, 3):
        [waiting] = book.apply(member(n, "train", 4))
        assert isinstance(waiting, ClaimFailed) and waiting.cause == "gang"
        assert f"group train: {n} of its 4 pods have all their claims asked" in waiting.reason
        assert held(book) == {}
    outputs = book.apply(member(4, "train", 4))
    allocated = of(ClaimAllocated, outputs)
    assert sorted(a.name for a in allocated) == ["claim-1", "claim-2", "claim-3", "claim-4"]
    assert not of(ClaimFailed, outputs)
    # on the fewest nodes: two 4-GPU claims on each 8-GPU node
    nodes = [a.node for a in allocated]
    assert sorted(nodes) == ["n1", "n1", "n2", "n2"]
    # a redelivered request of a placed member decides nothing again
    assert book.apply(member(2, "train", 4)) == []


def test_a_group_that_does_not_fit_holds_nothing_and_is_placed_whole_once_room_is_freed() -> None:
    book = ledger()
    for node in ("n1", "n2"):
        book.apply(inventory("l40s-8", node), live=False)
    [blocker] = of(ClaimAllocated, book.apply(request(9, gpus(4))))
    for n in (1, 2, 3):
        book.apply(member(n, "train", 4))
    outputs = book.apply(member(4, "train", 4))
    failed = of(ClaimFailed, outputs)
    assert sorted(f.name for f in failed) == ["claim-1", "claim-2", "claim-3", "claim-4"]
    assert {f.cause for f in failed} == {"capacity"} and not of(ClaimAllocated, outputs)
    assert (
        "group train: its 4 claims do not all fit on the fleet at once, so none is allocated"
        in failed[0].reason
    )
    assert "claim team/claim-4: 0/2 nodes fit" in failed[0].reason  # the claim that did not fit, by name
    assert held(book) == {blocker.uid: blocker.node}  # 12 GPUs were free: three members fit, none holds

    book.apply(ClaimReleased(key=blocker.uid, namespace="team", name="claim-9", uid=blocker.uid))
    outputs = book.apply(member(3, "train", 4, attempt=1))  # one member asked again decides the group
    assert sorted(a.name for a in of(ClaimAllocated, outputs)) == ["claim-1", "claim-2", "claim-3", "claim-4"]


def test_two_groups_that_cannot_both_fit_do_not_deadlock() -> None:
    """Asked interleaved, pod by pod: one group gets all it asks, the other holds nothing and
    gets all once the first is gone."""
    book = ledger()
    for node in ("n1", "n2"):
        book.apply(inventory("l40s-8", node), live=False)
    order = [(1, "a"), (11, "b"), (2, "a"), (12, "b"), (3, "a"), (13, "b")]
    decided: dict[str, list[Event]] = {"a": [], "b": []}
    for n, group in order:
        decided[group] += book.apply(member(n, group, 3))
    assert sorted(a.name for a in of(ClaimAllocated, decided["a"])) == ["claim-1", "claim-2", "claim-3"]
    assert not of(ClaimAllocated, decided["b"])
    b_failed = [f for f in of(ClaimFailed, decided["b"]) if f.cause == "capacity"]
    assert sorted(f.name for f in b_failed) == ["claim-11", "claim-12", "claim-13"]
    assert set(held(book)) == {request(n, {}).uid for n in (1, 2, 3)}

    for n in (1, 2, 3):
        book.apply(released(n))
    outputs = book.apply(member(12, "b", 3, attempt=1))
    assert sorted(a.name for a in of(ClaimAllocated, outputs)) == ["claim-11", "claim-12", "claim-13"]


def test_a_group_asking_for_an_nvlink_domain_lands_in_one_clique_the_tightest_that_holds_it() -> None:
    book = ledger()
    for node, clique in (("a1", "rack-a.1"), ("a2", "rack-a.1"), ("a3", "rack-a.1")):
        book.apply(tray(node, clique), live=False)
    for node, clique in (("b1", "rack-b.1"), ("b2", "rack-b.1")):
        book.apply(tray(node, clique), live=False)
    book.apply(inventory("l40s-8", "pcie"), live=False)  # no fabric: never a domain's

    small = [member(n, "pair", 2, nvlink=True) for n in (1, 2)]
    outputs = [o for m in small for o in book.apply(m)]
    assert sorted(a.node for a in of(ClaimAllocated, outputs)) == ["b1", "b2"]  # rack b is filled exactly

    large = [member(n, "triple", 3, nvlink=True) for n in (11, 12, 13)]
    outputs = [o for m in large for o in book.apply(m)]
    assert sorted(a.node for a in of(ClaimAllocated, outputs)) == ["a1", "a2", "a3"]

    # nothing left in any clique: a third domain waits, holding nothing, though "pcie" is free
    outputs = [
        o
        for m in (member(21, "more", 2, nvlink=True), member(22, "more", 2, nvlink=True))
        for o in book.apply(m)
    ]
    failed = [f for f in of(ClaimFailed, outputs) if f.cause != "gang"]
    assert len(failed) == 2 and {f.cause for f in failed} == {"capacity"}
    assert "every node of the fleet's NVLink fabric cliques serves another group's domain" in failed[0].reason
    assert all(book.fleet.allocation(request(n, {}).uid) is None for n in (21, 22))


def test_a_domain_avoids_a_degraded_rack_and_never_counts_a_failed_tray() -> None:
    book = ledger()
    for node, clique, degraded in (("a1", "rack-a.1", True), ("a2", "rack-a.1", False)):
        book.apply(tray(node, clique, degraded=degraded), live=False)
    for node, clique in (("b1", "rack-b.1"), ("b2", "rack-b.1")):
        book.apply(tray(node, clique), live=False)
    for node, clique in (("c1", "rack-c.1"), ("c2", None)):  # c2 failed: rack c holds one tray
        book.apply(tray(node, clique), live=False)
    outputs = [o for n in (1, 2) for o in book.apply(member(n, "pair", 2, nvlink=True))]
    assert sorted(a.node for a in of(ClaimAllocated, outputs)) == ["b1", "b2"]
    # rack a, degraded, is taken when it is all that is left; rack c never (one tray in the clique)
    outputs = [o for n in (3, 4) for o in book.apply(member(n, "next", 2, nvlink=True))]
    assert sorted(a.node for a in of(ClaimAllocated, outputs)) == ["a1", "a2"]
    outputs = [o for n in (5, 6) for o in book.apply(member(n, "last", 2, nvlink=True))]
    assert {f.cause for f in of(ClaimFailed, outputs)} == {"gang", "capacity"} and not of(
        ClaimAllocated, outputs
    )


def test_a_domain_on_a_fleet_without_fabric_fails_for_hardware() -> None:
    book = ledger()
    book.apply(inventory("hgx-h200", "n1"), live=False)
    book.apply(member(1, "solo", 2, nvlink=True))
    failed = of(ClaimFailed, book.apply(member(2, "solo", 2, nvlink=True)))
    assert sorted(f.name for f in failed) == ["claim-1", "claim-2"]
    assert {f.cause for f in failed} == {"hardware"}
    assert "no node of the fleet is in an NVLink fabric clique" in failed[0].reason
    assert held(book) == {}


def test_a_member_naming_its_group_wrongly_fails_with_the_problem() -> None:
    book = ledger()
    book.apply(inventory("l40s-8", "n1"), live=False)
    bad = msgspec.structs.replace(
        request(1, gpus(1)),
        gang=GangMember(
            group="g", size=0, pod="p", problem="annotation tangram.dev/gang-size must be 1..1024"
        ),
    )
    [failed] = book.apply(bad)
    assert isinstance(failed, ClaimFailed) and failed.cause == "claim"
    assert failed.reason == "invalid group of pods: annotation tangram.dev/gang-size must be 1..1024"


def test_a_rebuilt_ledger_holds_what_the_live_one_decided_for_groups() -> None:
    book = ledger()
    log: list[Event] = [inventory("l40s-8", "n1"), inventory("l40s-8", "n2")]
    for event in log:
        book.apply(event, live=False)
    for n, group in [(1, "a"), (11, "b"), (2, "a"), (12, "b"), (3, "a"), (13, "b")]:
        asked = member(n, group, 3)
        log += [asked, *book.apply(asked)]
    rebuilt = ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.snapshot() == book.snapshot()
    assert len(rebuilt.snapshot()["held"]) == 3
    # the rebuilt ledger knows the waiting group: released capacity lets it in whole
    for n in (1, 2, 3):
        rebuilt.apply(released(n))
    outputs = rebuilt.apply(member(13, "b", 3, attempt=1))
    assert sorted(a.name for a in of(ClaimAllocated, outputs)) == ["claim-11", "claim-12", "claim-13"]


def test_a_released_member_leaves_the_group_and_its_replacement_is_placed_with_the_rest_held() -> None:
    book = ledger()
    book.apply(inventory("l40s-8", "n1"), live=False)
    for n in (1, 2):
        book.apply(member(n, "duo", 2))
    book.apply(released(2))
    # the group misses a pod again: the replacement is asked under a new pod name and claim
    replacement = msgspec.structs.replace(
        member(3, "duo", 2), gang=GangMember(group="duo", size=2, pod="duo-pod-2b")
    )
    [allocated] = of(ClaimAllocated, book.apply(replacement))
    assert allocated.name == "claim-3" and book.fleet.allocation(request(1, {}).uid) is not None


def channel_of(allocated: ClaimAllocated) -> ImexChannel | None:
    return imex_of(allocated.config, "gpu.tangram.dev")


def test_a_domain_gets_an_imex_channel_on_exactly_its_nodes_and_no_node_serves_two_domains() -> None:
    book = ledger()
    for node in ("a1", "a2", "a3"):
        book.apply(tray(node, "rack-a.1"), live=False)
    first = [o for n in (1, 2) for o in book.apply(member(n, "one", 2, 1, nvlink=True))]
    [c1, c2] = [channel_of(a) for a in of(ClaimAllocated, first)]
    assert c1 == c2 and c1 is not None
    assert (c1.domain, c1.channel, c1.clique, c1.nodes) == ("team/one", 0, "rack-a.1", ("a1",))

    # the second domain would fit beside the first on a1 (2 GPUs free), but a1 serves domain one
    second = [o for n in (3, 4) for o in book.apply(member(n, "two", 2, 1, nvlink=True))]
    channels = {channel_of(a) for a in of(ClaimAllocated, second)}
    assert len(channels) == 1
    [c3] = channels
    assert c3 is not None and (c3.domain, c3.channel, c3.nodes) == ("team/two", 1, ("a2",))
    # a claim alone (no domain) may still take what is free on a domain's node
    [alone] = of(ClaimAllocated, book.apply(request(9, gpus(4))))
    assert alone.node == "a3" and channel_of(alone) is None
    [small] = of(ClaimAllocated, book.apply(request(10, gpus(2))))
    assert small.node in ("a1", "a2") and channel_of(small) is None

    # once all of domain one's claims are gone, so is it, and its channel is free again
    assert set(book.domains) == {"team/one", "team/two"}
    for n in (1, 2):
        book.apply(released(n))
    assert set(book.domains) == {"team/two"}
    third = [o for n in (5, 6) for o in book.apply(member(n, "three", 2, 1, nvlink=True))]
    assert {c.channel for a in of(ClaimAllocated, third) if (c := channel_of(a))} == {0}


def test_a_rebuilt_ledger_holds_the_same_domains() -> None:
    book = ledger()
    log: list[Event] = [tray("a1", "rack-a.1"), tray("a2", "rack-a.1")]
    for event in log:
        book.apply(event, live=False)
    for n in (1, 2):
        asked = member(n, "one", 2, 4, nvlink=True)
        log += [asked, *book.apply(asked)]
    rebuilt = ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.snapshot()["domains"] == book.snapshot()["domains"] != {}
    assert rebuilt.domains["team/one"].nodes == ("a1", "a2")


def test_a_claim_cannot_ask_for_an_imex_channel_itself() -> None:
    """The kind is the allocator's to write: a claim carrying it is refused, naming the kind."""
    book = ledger()
    book.apply(tray("a1", "rack-a.1"), live=False)
    forged = ImexChannel(domain="team/x", clique="rack-a.1", channel=0, nodes=("a1",))
    spec = gpus(1)
    spec["devices"]["config"] = [
        {"opaque": {"driver": "gpu.tangram.dev", "parameters": forged.model_dump(mode="json")}}
    ]
    [failed] = book.apply(request(1, spec))
    assert isinstance(failed, ClaimFailed) and failed.cause == "claim"
    assert "'ImexChannel' is not a gpu.tangram.dev parameter kind" in failed.reason


def test_troubles_of_a_running_domains_nodes_are_named_node_by_node() -> None:
    book = ledger()
    for node in ("a1", "a2", "a3"):
        book.apply(tray(node, "rack-a.1"), live=False)
    outputs = [o for n in (1, 2) for o in book.apply(member(n, "one", 2, 4, nvlink=True))]
    assert sorted(a.node for a in of(ClaimAllocated, outputs)) == ["a1", "a2"]
    assert book.domain_troubles() == {}
    # a GPU of a1 turns unhealthy (an XID); a2's fabric registration is lost
    sick = tray("a1", "rack-a.1")
    gpus = list(sick.hardware.gpus)
    gpus[2] = msgspec.structs.replace(gpus[2], health="unhealthy", health_reason="XID 79")
    book.apply(
        msgspec.structs.replace(sick, hardware=msgspec.structs.replace(sick.hardware, gpus=gpus)), live=False
    )
    book.apply(tray("a2", None), live=False)
    troubles = book.domain_troubles()
    assert troubles[("team/one", "a1")] == f"GPU 2 ({gpus[2].uuid}) of node a1 is unhealthy: XID 79"
    assert troubles[("team/one", "a2")] == "the GPUs of node a2 are no longer in the domain's NVLink clique"
    # a degraded fabric, and a node gone from the fleet
    book.apply(tray("a1", "rack-a.1", degraded=True), live=False)
    book.fleet.remove_node("a2")
    troubles = book.domain_troubles()
    assert troubles == {
        ("team/one", "a1"): "the NVLink fabric reports degraded bandwidth on node a1",
        ("team/one", "a2"): "node a2 left the fleet",
    }
    assert book.domain_members("team/one") == sorted(request(n, {}).uid for n in (1, 2))


def test_a_waiting_group_is_kept_room_that_later_claims_of_its_priority_leave_alone() -> None:
    """Two racks of two trays; a claim holds a tray of each. A domain of two 4-GPU pods waits: the
    rack that fills soonest is kept for it, a later claim goes to the other rack though both fit,
    and once the kept rack's claim ends the group is placed there."""
    book = ledger()
    # the claims come while only a1 and b1 are in: one on each rack
    for node, clique in (("a1", "rack-a.1"), ("b1", "rack-b.1")):
        book.apply(tray(node, clique), live=False)
    [on_a] = of(ClaimAllocated, book.apply(request(1, gpus(4))))
    [on_b] = of(ClaimAllocated, book.apply(request(2, gpus(4))))
    assert {on_a.node, on_b.node} == {"a1", "b1"}
    for node, clique in (("a2", "rack-a.1"), ("b2", "rack-b.1")):
        book.apply(tray(node, clique), live=False)
    book.apply(member(11, "pair", 2, 4, nvlink=True))
    failed = of(ClaimFailed, book.apply(member(12, "pair", 2, 4, nvlink=True)))
    assert {f.cause for f in failed} == {"capacity"}
    kept = failed[0].held_for_group
    assert len(kept) == 2 and len({n[0] for n in kept}) == 1, kept  # both trays of one rack
    assert all(f.held_for_group == kept for f in failed) and "are kept for it meanwhile" in failed[0].reason
    holder = on_a if on_a.node in kept else on_b

    # a later claim of the same priority fits on either rack's free tray: it gets the other rack's
    [later] = of(ClaimAllocated, book.apply(request(3, gpus(2))))
    assert later.node not in kept
    # a claim of a higher priority may use the kept room
    urgent = msgspec.structs.replace(request(4, gpus(1)), priority=100)
    assert book._fenced_for(urgent).isdisjoint(kept) and not book._fenced_for(request(5, gpus(1))).isdisjoint(
        kept
    )

    book.apply(ClaimReleased(key=holder.uid, namespace="team", name=holder.name, uid=holder.uid))
    placed = of(ClaimAllocated, book.apply(member(11, "pair", 2, 4, nvlink=True, attempt=1)))
    assert sorted(a.node for a in placed) == sorted(kept) and book.gang_holds == {}


def test_only_the_first_waiting_group_is_kept_room_and_a_rebuild_keeps_the_same() -> None:
    book = ledger()
    log: list[Event] = [tray("a1", "rack-a.1"), tray("b1", "rack-b.1")]
    for event in log:
        book.apply(event, live=False)
    for n in (1, 2):  # one on each rack, before the racks' second trays are in
        asked = request(n, gpus(4))
        log += [asked, *book.apply(asked)]
    for event in (tray("a2", "rack-a.1"), tray("b2", "rack-b.1")):
        log.append(event)
        book.apply(event, live=False)
    for group, numbers in (("first", (11, 12)), ("second", (21, 22))):
        for n in numbers:
            asked = member(n, group, 2, 4, nvlink=True)
            log += [asked, *book.apply(asked)]
    assert list(book.gang_holds) == [("team", "first")]
    # A member of the group kept room frees it when it goes; one of the other group frees nothing.
    asked = {e.name: e.uid for e in log if isinstance(e, ClaimRequested)}
    assert book.frees_capacity(asked["claim-11"]) and not book.frees_capacity(asked["claim-21"])
    second = [e for e in log if isinstance(e, ClaimFailed) and e.name in ("claim-21", "claim-22")]
    assert second and all(not f.held_for_group for f in second if f.cause == "capacity")
    rebuilt = ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.snapshot()["gang_holds"] == book.snapshot()["gang_holds"] != {}


def test_a_member_whose_group_size_is_not_known_yet_waits_holding_nothing() -> None:
    """A pod names a PodGroup the allocator has not seen: its claim waits, and is decided with the
    group once asked again with the size known."""
    book = ledger()
    book.apply(inventory("l40s-8", "n1"), live=False)
    unknown = msgspec.structs.replace(request(1, gpus(1)), gang=GangMember(group="trainer", size=0, pod="p1"))
    [waiting] = book.apply(unknown)
    assert isinstance(waiting, ClaimFailed) and waiting.cause == "gang"
    assert (
        waiting.reason
        == "group trainer: its PodGroup is not known yet; the claim waits for it, holding nothing"
    )
    assert held(book) == {}
    known = msgspec.structs.replace(unknown, gang=GangMember(group="trainer", size=1, pod="p1"), attempt=1)
    [allocated] = of(ClaimAllocated, book.apply(known))
    assert allocated.name == "claim-1"


def in_block(node: str, block: str, machine: str = "l40s-8") -> NodeInventory:
    """A node whose Node carries the network block label `block`."""
    hw = msgspec.structs.replace(renamed_machine(hardware(machine, "template"), node), network_block=block)
    return NodeInventory(key=subject_token(node), hardware=hw)


def test_a_group_spread_over_nodes_is_kept_under_one_network_block_where_one_holds_it() -> None:
    """n1 and n2 are alike and first by name; n3, another machine, is in n1's block: the group
    takes the two nodes of block x."""
    book = ledger()
    for node, block, machine in (("n1", "x", "l40s-8"), ("n2", "y", "l40s-8"), ("n3", "x", "dgx-h100")):
        book.apply(in_block(node, block, machine), live=False)
    book.apply(member(1, "train", 2, 8))
    placed = of(ClaimAllocated, book.apply(member(2, "train", 2, 8)))
    assert sorted(a.node for a in placed) == ["n1", "n3"]


def test_a_group_no_one_network_block_holds_is_placed_across_blocks() -> None:
    book = ledger()
    for node, block in (("n1", "x"), ("n2", "y")):
        book.apply(in_block(node, block), live=False)
    book.apply(member(1, "train", 2, 8))
    placed = of(ClaimAllocated, book.apply(member(2, "train", 2, 8)))
    assert sorted(a.node for a in placed) == ["n1", "n2"]


def test_a_waiting_group_is_kept_room_under_one_network_block() -> None:
    """Blocks x (n1, n3, n4) and y (n2, n5, n6); claims of 6 GPUs hold n1, n2, n4 and n5. A group
    of three 8-GPU pods waits, and the nodes kept for it are the three of one block, though the
    nodes with the most GPUs free now (n3 and n6) and the first by name are in both."""
    book = ledger()
    blocks = {"n1": "x", "n2": "y", "n3": "x", "n4": "x", "n5": "y", "n6": "y"}
    for node in ("n1", "n2", "n4", "n5"):
        book.apply(in_block(node, blocks[node]), live=False)
    blockers = [of(ClaimAllocated, book.apply(request(90 + n, gpus(6))))[0] for n in range(4)]
    assert sorted(b.node for b in blockers) == ["n1", "n2", "n4", "n5"]
    # n3 and n6 are another machine of 8 GPUs: alike each other, unlike the rest of their blocks
    for node in ("n3", "n6"):
        book.apply(in_block(node, blocks[node], "dgx-h100"), live=False)
    book.apply(member(1, "train", 3, 8))
    book.apply(member(2, "train", 3, 8))
    failed = of(ClaimFailed, book.apply(member(3, "train", 3, 8)))
    assert {f.cause for f in failed} == {"capacity"}
    kept = failed[0].held_for_group
    assert len(kept) == 3 and len({blocks[n] for n in kept}) == 1, kept


def test_a_group_is_never_placed_on_a_mig_instance_already_destroyed_and_a_rebuild_places_it_alike() -> None:
    # gpu-0 of the machine starts with a free 3g.71gb instance at slice 0. A claim takes it and is
    # released; its destroy is applied, then another claim's instance at slice 0 is made and
    # released (its destroy not answered yet). A group is placed in a trial copy of the fleet,
    # which must not bring the destroyed instance back from the inventory read before the destroy:
    # live it was handed out again with no create; a rebuild, whose destroy at that slice was
    # still to come, made it anew.
    live = Ledger(fleet=FleetState(), classes=CLASSES)
    live.apply(inventory("hgx-h200", "n1"), live=False)
    claims: list[Event] = []
    nodes: list[Event] = []

    def fold(event: Event) -> list[Event]:
        outputs = live.apply(event)
        claims.extend(o for o in outputs if isinstance(o, ClaimAllocated | ClaimFailed))
        return [o for o in outputs if isinstance(o, PartitionRequested)]

    first, second = request(1, mig("3g.71gb")), request(2, mig("2g.35gb"))
    claims.append(first)
    assert fold(first) == []  # the free instance is reused
    claims.append(released(1))
    (destroy,) = fold(released(1))
    nodes.append(applied(destroy, destroy.mig_uuid))
    live.apply(nodes[-1])
    claims.append(second)
    (create,) = fold(second)
    assert (create.gpu_index, create.placement.start) == (0, 0)
    claims.append(released(2))
    fold(released(2))
    rebuilt = Ledger(fleet=FleetState(), classes=CLASSES)
    rebuilt.apply(inventory("hgx-h200", "n1"), live=False)
    for event in [*claims, *nodes]:
        rebuilt.apply(event, live=False)

    group = [
        msgspec.structs.replace(request(n, mig("3g.71gb")), gang=GangMember(group="g", size=2, pod=f"p{n}"))
        for n in (3, 4)
    ]
    for ask in group:
        outputs, replayed = live.apply(ask), rebuilt.apply(ask)
        assert [msgspec.structs.replace(o, time=ask.time) for o in outputs] == [
            msgspec.structs.replace(o, time=ask.time) for o in replayed
        ]
    allocated = of(ClaimAllocated, outputs)
    assert len(allocated) == 2
    made = {c.command_id for c in of(PartitionRequested, outputs) if c.action == "create"}
    # every instance the group is given is one made for it
    assert all(d.partition_command in made for a in allocated for d in a.devices)
