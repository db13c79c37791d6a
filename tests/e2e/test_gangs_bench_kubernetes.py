"""`tangram bench gangs --kubernetes` against the real control plane: a job of two pods and a
single claim on a rack of two trays, driven in real time by each decider, and the figures the run
reports are those of what the API server bound."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.bench.gangkube import run_on
from tangram.bench.gangs import Job, gang_fleet
from tangram.local.controlplane import ControlPlane

pytestmark = [pytest.mark.timeout(300), pytest.mark.controlplane]


@pytest.mark.parametrize("decider", ["kube-scheduler", "tangram"])
async def test_each_decider_runs_the_trace_and_reports_what_was_bound(
    controlplane: ControlPlane, kube: Any, unique: str, decider: str
) -> None:
    fleet = gang_fleet(1, 0, trays=2, prefix=f"g{unique.rsplit('-', 1)[-1]}-")
    trace = [
        Job(name="job-1", pods=2, gpus=4, domain=True, arrival=0.0, duration=2.0),
        Job(name="claim-2", pods=1, gpus=4, domain=False, arrival=0.5, duration=1.0),
    ]
    report = await run_on(controlplane, kube, decider, fleet, trace, seconds_per_minute=1.0, settle_s=3.0)
    assert (report["jobs"], report["single_claims"]) == (1, 1)
    # both fit one at a time: the job first (the claim waits for a tray), then the claim
    assert report["jobs_started"] == 1 and report["single_claims_started"] == 1
    assert report["deadlocked_jobs"] == 0 and report["domain_jobs_split_across_cliques"] == 0
    assert report["job_minutes_to_all_running"]["p50"] is not None
