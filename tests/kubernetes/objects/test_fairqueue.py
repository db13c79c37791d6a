"""Claims wait in one line per namespace and the namespaces take turns: a flood delays no one else."""

from __future__ import annotations

from tangram.kubernetes.objects.fairqueue import FairQueue


def drain(queue: FairQueue) -> list[str]:
    out = []
    while (uid := queue.pop()) is not None:
        out.append(uid)
    return out


def test_a_claim_behind_a_flood_of_another_namespace_is_served_second() -> None:
    queue = FairQueue()
    for n in range(5000):
        queue.push("flood", f"f{n}")
    queue.push("quiet", "q0")
    served = drain(queue)
    assert served.index("q0") == 1
    assert served[:3] == ["f0", "q0", "f1"]
    assert len(served) == 5001


def test_namespaces_take_turns_and_each_keeps_its_own_order() -> None:
    queue = FairQueue()
    for n in range(3):
        queue.push("a", f"a{n}")
    queue.push("b", "b0")
    queue.push("c", "c0")
    queue.push("c", "c1")
    assert drain(queue) == ["a0", "b0", "c0", "a1", "c1", "a2"]


def test_a_namespace_that_comes_back_waits_for_its_turn() -> None:
    queue = FairQueue()
    queue.push("a", "a0")
    queue.push("a", "a1")
    queue.push("b", "b0")
    assert queue.pop() == "a0"
    assert queue.pop() == "b0"
    queue.push("b", "b1")  # b's line was empty: it joins behind a
    assert drain(queue) == ["a1", "b1"]


def test_a_claim_waits_once_and_a_discarded_one_is_skipped() -> None:
    queue = FairQueue()
    assert queue.push("a", "x")
    assert not queue.push("a", "x")
    assert queue.push("a", "y")
    queue.discard("x")
    assert "x" not in queue and "y" in queue
    assert len(queue) == 1
    assert drain(queue) == ["y"]
    assert queue.pop() is None


def test_a_discarded_claim_put_back_is_served_once() -> None:
    queue = FairQueue()
    queue.push("a", "x")
    queue.push("a", "y")
    queue.discard("x")
    queue.push("a", "x")
    assert drain(queue) == ["x", "y"]  # in the place it had first, and only there


def test_a_higher_priority_is_always_served_first_then_namespaces_take_turns_within_it() -> None:
    queue = FairQueue()
    for n in range(100):  # a flood of low-priority claims, waiting first
        queue.push("batch", f"low-{n}", priority=0)
    queue.push("serving", "urgent-1", priority=1000)
    queue.push("batch", "late-low", priority=0)
    queue.push("serving", "urgent-2", priority=1000)
    queue.push("training", "mid", priority=100)
    queue.push("research", "urgent-3", priority=1000)
    served = [queue.pop() for _ in range(5)]
    assert served == ["urgent-1", "urgent-3", "urgent-2", "mid", "low-0"]


def test_a_claim_discarded_and_pushed_again_at_another_priority_is_served_once_at_the_new_one() -> None:
    queue = FairQueue()
    queue.push("team", "a", priority=0)
    queue.push("team", "b", priority=0)
    queue.discard("a")
    assert queue.push("team", "a", priority=10)
    assert [queue.pop(), queue.pop(), queue.pop()] == ["a", "b", None]
    assert len(queue) == 0
