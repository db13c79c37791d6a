"""A rebuilt allocator is the live one: the whole log, folded in the rebuild's order, gives the
state the live allocator had, and it decides on exactly as the live one did."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tangram.events import CLAIMS_STREAM, NODES_STREAM, PartitionRequested

from .helpers import applied, gpus, mig, released, request
from .histories import Driver, commands_and_decisions, replayed, untimed


def test_a_destroy_sent_again_after_a_rebuild_is_the_one_the_live_allocator_sent() -> None:
    """A release delivered again after a restart sends its destroys again. The rebuild folds the
    create's result before the decision made after it, as the live allocator read it, so the
    destroy names the instance and carries the positions it was first sent with: the very command,
    not one that asks the node to find the instance itself."""
    driver = Driver(seed=0)
    first = request(1, mig("7g.141gb"))  # no instance of it on the node: it is made for the claim
    driver.read(CLAIMS_STREAM, first)
    [create] = driver.pending.values()
    driver.read(NODES_STREAM, applied(create, "MIG-made-for-claim-1"))
    driver.read(CLAIMS_STREAM, request(2, gpus(1)))
    driver.read(CLAIMS_STREAM, released(first))
    [destroy] = driver.run.outputs[-1]
    assert isinstance(destroy, PartitionRequested)
    assert destroy.mig_uuid == "MIG-made-for-claim-1"
    assert destroy.positions[NODES_STREAM] == 1
    rebuilt = replayed(driver.run.claims, driver.run.nodes)
    assert untimed(rebuilt.apply(released(first))) == untimed([destroy])


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(10, 160), restart_at=st.floats(0, 1))
# histories where the live allocator once diverged from a rebuild: its demand index's supply drifted
# (seed 332), and a GPU both deciders gave out was freed while kube-scheduler's claim held it (85)
@example(seed=332, steps=160, restart_at=0.7).via("a drift of the supply")
@example(seed=85, steps=160, restart_at=0.7).via("a contested GPU")
def test_a_ledger_rebuilt_from_the_log_is_the_live_one_and_decides_on_as_it(
    seed: int, steps: int, restart_at: float
) -> None:
    driver = Driver(seed)
    restart_step = int(restart_at * steps)
    for _ in range(restart_step):
        driver.step()
    at_restart = driver.live.snapshot()
    restart_mark = len(driver.run.inputs)
    for _ in range(restart_step, steps):
        driver.step()
    run = driver.run
    claims_end, nodes_end = run.marks[restart_mark]
    rebuilt = replayed(run.claims[:claims_end], run.nodes[:nodes_end])
    assert rebuilt.snapshot() == at_restart
    for n, (stream, seq, event) in enumerate(run.inputs[restart_mark:], restart_mark):
        rebuilt.folded(stream, seq)
        got = commands_and_decisions(rebuilt.apply(event))
        assert got == commands_and_decisions(run.outputs[n]), f"input {n}: {event!r}"
    assert rebuilt.snapshot() == driver.live.snapshot()
