"""The claims waiting after a failed decision, by cause, and how long the oldest has waited."""

from __future__ import annotations

from services.allocator.waiting import WaitingClaims
from tangram.events import ClaimAllocated, ClaimFailed, ClaimReleased, ClaimRequested


def failed(uid: str, cause: str = "capacity") -> ClaimFailed:
    return ClaimFailed(key=uid, namespace="ml", name=uid, uid=uid, reason="full", cause=cause)  # type: ignore[arg-type]


def test_waiting_claims_are_counted_by_cause_and_aged_from_their_first_failure() -> None:
    now = [100.0]
    waiting = WaitingClaims(clock=lambda: now[0])
    asked = ClaimRequested(key="a", namespace="ml", name="a", uid="a", spec={})
    waiting.observe(asked, [failed("a")])
    now[0] = 130.0
    waiting.observe(asked, [failed("b", "hardware")])
    assert (waiting.count("capacity"), waiting.count("hardware"), waiting.count("gang")) == (1, 1, 0)
    assert waiting.oldest_s() == 30.0
    now[0] = 160.0
    waiting.observe(asked, [failed("a", "gang")])  # failed again: its wait goes on from the first
    assert waiting.oldest_s() == 60.0 and waiting.count("gang") == 1 and waiting.count("capacity") == 0
    allocated = ClaimAllocated(key="a", namespace="ml", name="a", uid="a", node="n1", devices=[])
    waiting.observe(asked, [allocated])
    assert waiting.oldest_s() == 30.0
    waiting.observe(ClaimReleased(key="b", namespace="ml", name="b", uid="b"), [])
    assert waiting.oldest_s() == 0.0 and waiting.count("hardware") == 0
