"""When a phase of the synthetic Kubernetes benchmark is over: every pod bound, or the rest declared
unplaceable by their decider while the deciders have nothing left to try."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tangram.bench.kubernetes import settling
from tangram.bench.kubernetes.report import PodRecord
from tangram.bench.traces import ClaimShape

ONE = ClaimShape("gpu", 1)


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(settling, "IDLE_S", 0.05)
    monkeypatch.setattr(settling, "POLL_S", 0.01)
    yield


def records(bound: int, declared: int, undecided: int = 0) -> dict[str, PodRecord]:
    made: dict[str, PodRecord] = {}
    for n in range(bound + declared + undecided):
        record = PodRecord(name=f"p{n}", shape=ONE, created=0.0)
        if n < bound:
            record.scheduled, record.node = 1.0, "node-a"
        elif n < bound + declared:
            record.unplaceable = "Unschedulable: 0/1 nodes are available"
        made[record.name] = record
    return made


class Queue:
    """A decider's queue as its metrics show it: busy for the first `busy` looks."""

    def __init__(self, busy: int) -> None:
        self.busy, self.looks = busy, 0

    async def idle(self) -> bool:
        self.looks += 1
        return self.looks > self.busy


async def test_a_phase_whose_pods_are_all_bound_ends_bound() -> None:
    pods = records(bound=3, declared=0)
    ended = await settling.settled(pods, list(pods), set(), Queue(busy=10**6).idle, limit_s=5)
    assert ended.how == "bound"


async def test_pods_deleted_before_they_were_bound_are_not_waited_for() -> None:
    pods = records(bound=2, declared=0, undecided=1)
    ended = await settling.settled(pods, list(pods), {"p2"}, Queue(busy=10**6).idle, limit_s=5)
    assert ended.how == "bound"


async def test_declared_pods_end_the_phase_only_once_the_deciders_stay_idle() -> None:
    pods = records(bound=2, declared=2)
    queue = Queue(busy=3)
    ended = await settling.settled(pods, list(pods), set(), queue.idle, limit_s=5)
    assert ended.how == "declared"
    # looked at until the queue emptied, then for IDLE_S more
    assert queue.looks > 4


async def test_a_decider_that_keeps_trying_holds_the_phase_open_until_the_limit() -> None:
    pods = records(bound=2, declared=2)
    ended = await settling.settled(pods, list(pods), set(), Queue(busy=10**6).idle, limit_s=0.3)
    assert ended.how == "limit"


async def test_a_pod_not_declared_yet_holds_the_phase_open_however_idle() -> None:
    pods = records(bound=1, declared=1, undecided=1)
    queue = Queue(busy=0)
    ended = await settling.settled(pods, list(pods), set(), queue.idle, limit_s=0.3)
    assert ended.how == "limit"
    assert queue.looks == 0  # the queues are read only once every unbound pod is declared


def test_kube_schedulers_declaration_is_the_pods_unschedulable_condition() -> None:
    gated = {
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    }
    declared = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "Unschedulable"},
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/500 nodes are available: cannot allocate all claims.",
                },
            ]
        }
    }
    assert settling.unschedulable(gated) is None
    assert settling.unschedulable({}) is None
    assert (
        settling.unschedulable(declared)
        == "Unschedulable: 0/500 nodes are available: cannot allocate all claims."
    )


def test_tangrams_declaration_is_its_warning_event_on_the_pod() -> None:
    on_pod = {
        "reason": "TangramUnschedulable",
        "message": "no node has 8 free GPUs in one NVLink domain",
        "involvedObject": {"kind": "Pod", "name": "pod-claim-7"},
    }
    on_claim = {**on_pod, "involvedObject": {"kind": "ResourceClaim", "name": "pod-claim-7-gpus"}}
    other = {**on_pod, "reason": "FailedScheduling"}
    assert settling.tangram_unschedulable(on_pod) == (
        "pod-claim-7",
        "TangramUnschedulable: no node has 8 free GPUs in one NVLink domain",
    )
    assert settling.tangram_unschedulable(on_claim) is None
    assert settling.tangram_unschedulable(other) is None


def test_samples_are_read_by_name_and_labels_from_the_exposition() -> None:
    text = "\n".join(
        [
            "# HELP scheduler_pending_pods Number of pending pods, by the queue type.",
            "# TYPE scheduler_pending_pods gauge",
            'scheduler_pending_pods{queue="active"} 3',
            'scheduler_pending_pods{queue="backoff"} 1',
            'scheduler_pending_pods{queue="unschedulable"} 40',
            'scheduler_pending_pods_other{queue="active"} 9',
            "",
        ]
    )
    found = settling.samples(text, "scheduler_pending_pods")
    assert found == [
        ({"queue": "active"}, 3.0),
        ({"queue": "backoff"}, 1.0),
        ({"queue": "unschedulable"}, 40.0),
    ]
