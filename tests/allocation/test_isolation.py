"""A decision is the claim's own: hostile claims beside plain ones change nothing for the plain ones.

A tenant's claim may carry a selector that fails while it is evaluated, an opaque config that does
not parse, or a count no node has. It fails, with its reason, and every other claim gets exactly
the decision it gets when the hostile claim is absent: the same node, the same devices, the same
partition commands, and the fleet ends in the same state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.allocation import Allocated, Decision, Failed, FleetState
from tangram.allocation import fleet as fleet_module
from tangram.allocation.demand import claim_kind
from tangram.allocation.eligibility import Eligible, evaluate
from tangram.allocation.placement import DemandIndex
from tangram.allocation.requests import resolve
from tangram.allocation.spec import parse_claim_spec
from tangram.events.inventory import NodeHardware
from tests.allocation.machines import (
    CLASSES,
    DRIVER,
    request,
)
from tests.allocation.tenants import (
    CEL_RUNTIME_ERRORS,
    HOSTILE_CONFIGS,
    PLAIN,
    Step,
    fleet_nodes,
    hostile,
    hostile_specs,
    mig,
    selector_claim,
    whole,
)


def run(
    steps: Sequence[Step], nodes: Sequence[NodeHardware] | None = None
) -> tuple[FleetState, dict[str, Any]]:
    """Decides the steps in order; returns the fleet and, per claim uid, what it got or freed."""
    state = FleetState()
    for hw in nodes or fleet_nodes():
        state.apply_inventory(hw)
    outcomes: dict[str, Any] = {}
    for step in steps:
        if isinstance(step, str):
            outcomes[f"release {step}"] = state.release(step)
        else:
            outcomes[step.uid] = state.allocate(step, CLASSES)
    return state, outcomes


def plain_only(outcomes: dict[str, Any]) -> dict[str, Any]:
    return {uid: outcome for uid, outcome in outcomes.items() if "hostile" not in uid}


def test_the_plain_trace_exercises_what_isolation_protects() -> None:
    """The baseline is not vacuous: its claims land on several nodes, some on MIG instances."""
    _, outcomes = run(PLAIN)
    allocated = [o for o in outcomes.values() if isinstance(o, Allocated)]
    assert len(allocated) == 10
    assert len({o.node for o in allocated}) >= 3
    assert any(d.placement is not None for o in allocated for d in o.devices)


@pytest.mark.parametrize("kind", sorted(CEL_RUNTIME_ERRORS))
@pytest.mark.parametrize("device_class", ["gpu.tangram.dev", "mig.gpu.tangram.dev"])
def test_a_selector_failing_at_run_time_fails_its_own_claim_only(kind: str, device_class: str) -> None:
    bad = selector_claim(0, CEL_RUNTIME_ERRORS[kind], device_class)
    baseline_state, baseline = run(PLAIN)
    state, outcomes = run(
        [bad, *PLAIN[:6], selector_claim(1, CEL_RUNTIME_ERRORS[kind], device_class), *PLAIN[6:]]
    )
    for uid in ("hostile-0", "hostile-1"):
        failed = outcomes[uid]
        assert isinstance(failed, Failed), failed
        assert failed.cause == "claim"
        assert failed.reason.startswith('request "gpus": request "gpus" selector: CEL runtime error: ')
    assert plain_only(outcomes) == baseline
    assert state.snapshot() == baseline_state.snapshot()


def test_the_reason_names_the_asking_claims_own_request() -> None:
    """Claims that share a failing selector share its evaluation, not each other's wording."""
    expression = CEL_RUNTIME_ERRORS["division by zero"]
    spec = {"devices": {"requests": [request(name="mine", selectors=(expression,))]}}
    _, outcomes = run([selector_claim(0, expression), hostile(1, spec)])
    assert outcomes["hostile-1"].reason.startswith(
        'request "mine": request "mine" selector: CEL runtime error: '
    )
    assert "division by zero" in outcomes["hostile-1"].reason


def test_an_index_error_in_a_selector_fails_the_claim_with_its_reason() -> None:
    _, outcomes = run([selector_claim(0, "[1, 2][5] == 1")])
    assert outcomes["hostile-0"].reason == (
        'request "gpus": request "gpus" selector: CEL runtime error: '
        "evaluating '[1, 2][5] == 1': index out of bounds: 5"
    )


@pytest.mark.parametrize("config", HOSTILE_CONFIGS, ids=range(len(HOSTILE_CONFIGS)))
def test_a_hostile_opaque_config_fails_its_own_claim_only(config: Any) -> None:
    spec = {
        "devices": {
            "requests": [request(count=2)],
            "config": [{"requests": ["gpus"], "opaque": {"driver": DRIVER, "parameters": config}}],
        }
    }
    baseline_state, baseline = run(PLAIN)
    state, outcomes = run([hostile(0, spec), *PLAIN])
    assert isinstance(outcomes["hostile-0"], Failed) and outcomes["hostile-0"].cause == "claim"
    assert "spec.devices.config[0].opaque.parameters" in outcomes["hostile-0"].reason
    assert plain_only(outcomes) == baseline
    assert state.snapshot() == baseline_state.snapshot()


@pytest.mark.parametrize("count", [9, 16, 32])
def test_a_count_no_node_has_fails_as_hardware_and_moves_nothing(count: int) -> None:
    baseline_state, baseline = run(PLAIN)
    state, outcomes = run(
        [*PLAIN[:3], hostile(0, {"devices": {"requests": [request(count=count)]}}), *PLAIN[3:]]
    )
    failed = outcomes["hostile-0"]
    assert isinstance(failed, Failed) and failed.cause == "hardware"
    assert f"only 8 devices of this hardware match (needs {count})" in failed.reason
    assert plain_only(outcomes) == baseline
    assert state.snapshot() == baseline_state.snapshot()


def test_a_release_after_a_failing_selector_leaves_the_index_whole() -> None:
    """The reported KeyError: a release re-files its node while the demand mix held the failing
    kind; counting that kind raised half-way and left the node filed under two states."""
    bad = selector_claim(0, CEL_RUNTIME_ERRORS["int overflow"])
    _, outcomes = run([whole(0, 1), bad, "plain-0", whole(1, 1), "plain-1", whole(2, 2)])
    assert isinstance(outcomes["hostile-0"], Failed)
    assert all(isinstance(outcomes[uid], Allocated) for uid in ("plain-0", "plain-1", "plain-2"))
    assert outcomes["release plain-0"].node == outcomes["plain-0"].node


def test_an_index_whose_count_fails_is_left_as_it_was() -> None:
    """Counting a node's fits can fail (it evaluates eligibility): the node stays filed where it was,
    and is moved once counting works, instead of failing every later decision with a KeyError."""
    state = FleetState()
    for hw in fleet_nodes():
        state.apply_inventory(hw)
    node = state.node("hgx-a")
    assert node is not None
    failing = False

    def eligible(n: Any, alt: Any) -> Eligible:
        if failing:
            raise RuntimeError("evaluation failed")
        return evaluate(alt, n.devices, DRIVER)

    index = DemandIndex(state._shapes, eligible)
    index.set_sample(node.shape.signature, node)
    spec = parse_claim_spec({"devices": {"requests": [request(count=2)]}})
    kind = claim_kind(resolve(spec, CLASSES, DRIVER))
    assert kind is not None and kind.alt is not None
    index.note(kind)
    index.place(node)
    before = ({k: list(v) for k, v in index.groups.items()}, list(index.supply))
    node.take([node.shape.index_by_name["gpu-3"]], "someone")
    index._wants.clear()
    index._fits.clear()
    failing = True
    with pytest.raises(RuntimeError):
        index.place(node)
    assert ({k: list(v) for k, v in index.groups.items()}, list(index.supply)) == before
    failing = False
    index.place(node)  # the KeyError was here
    assert index.groups == {node.group_key(): ["hgx-a"]}
    assert index.supply != before[1]


def test_a_failure_inside_the_engine_fails_that_claim_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong deciding one claim, that claim fails with a reason, nothing is held for
    it, and the next claims are decided as they would have been."""
    baseline_state, baseline = run(PLAIN)
    real_solve = fleet_module.solve

    def solve(node: Any, resolved: Any, *args: Any, **kwargs: Any) -> Any:
        if any(r.name == "boom" for r in resolved.requests):
            raise KeyError(("placement", 3))
        return real_solve(node, resolved, *args, **kwargs)

    monkeypatch.setattr(fleet_module, "solve", solve)
    broken = hostile(0, {"devices": {"requests": [request(name="boom", count=2)]}})
    state, outcomes = run([*PLAIN[:4], broken, *PLAIN[4:]])
    failed = outcomes["hostile-0"]
    assert isinstance(failed, Failed) and failed.cause == "internal"
    assert "internal error: KeyError" in failed.reason and "nothing was allocated" in failed.reason
    assert plain_only(outcomes) == baseline
    assert state.snapshot() == baseline_state.snapshot()


# --- generated: hostile claims at random places in a random plain trace ----------------------------

PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]

plain_steps = st.lists(
    st.one_of(
        st.tuples(st.just("whole"), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("mig"), st.sampled_from(PROFILES), st.just(False)),
        st.tuples(st.just("release"), st.integers(0, 30), st.just(False)),
    ),
    min_size=1,
    max_size=30,
)


def build(plain: list[tuple[Any, ...]]) -> list[Step]:
    steps: list[Step] = []
    live: list[str] = []
    for i, (what, arg, nvlink) in enumerate(plain):
        if what == "release":
            if live:
                steps.append(live.pop(arg % len(live)))
            continue
        made = whole(i, arg, nvlink) if what == "whole" else mig(i, arg)
        steps.append(made)
        live.append(made.uid)
    return steps


# CPU-bound examples: each decides two traces of up to 50 claims on five nodes.
@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(plain_steps, st.lists(st.tuples(st.integers(0, 30), hostile_specs), min_size=1, max_size=12))
def test_generated_hostile_claims_never_change_a_plain_decision(
    plain: list[tuple[Any, ...]], inserted: list[tuple[int, Any]]
) -> None:
    steps = build(plain)
    baseline_state, baseline = run(steps)
    mixed: list[Step] = list(steps)
    for n, (position, spec) in enumerate(inserted):
        mixed.insert(min(position, len(mixed)), hostile(n, spec))
    state, outcomes = run(mixed)
    for n in range(len(inserted)):
        decision: Decision = outcomes[f"hostile-{n}"]
        assert isinstance(decision, Failed), decision
        assert decision.cause in ("claim", "hardware"), decision
    assert plain_only(outcomes) == baseline
    assert state.snapshot() == baseline_state.snapshot()
