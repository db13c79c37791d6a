"""`tangram bench gangs` in simulated time: Tangram places each job whole or not at all, the
pod-at-a-time first-fit baseline holds GPUs for jobs that wait and can deadlock, and the report
says so."""

from __future__ import annotations

import json
import subprocess
import sys

from tangram.bench.gangs import Job, gang_fleet, gang_trace, simulate


def test_a_trace_that_deadlocks_the_pod_at_a_time_baseline_runs_every_fitting_job_under_tangram() -> None:
    """Seed 7 on one rack and two HGX nodes at 1.5x load: two jobs of first-fit's end partly
    placed, each holding what the other waits for, and the queue behind them stalls."""
    fleet = gang_fleet(1, 2)
    trace = gang_trace(7, sum(len(hw.gpus) for hw in fleet), jobs=60, load=1.5, mean_minutes=60)
    baseline = simulate("first-fit-pods", fleet, trace)
    tangram = simulate("tangram", fleet, trace)
    assert baseline["deadlocked_jobs"] >= 1 and baseline["gpus_held_by_deadlocked_jobs"] >= 8
    assert baseline["idle_gpu_hours_partly_placed"] > 0
    assert tangram["deadlocked_jobs"] == 0 and tangram["never_fitting_jobs_holding_gpus"] == 0
    assert tangram["idle_gpu_hours_partly_placed"] == 0.0
    assert tangram["jobs_started"] > baseline["jobs_started"]
    assert tangram["jobs"] == baseline["jobs"] == sum(1 for job in trace if job.grouped)


def test_domain_jobs_share_one_clique_under_tangram_and_are_split_by_the_baseline() -> None:
    fleet = gang_fleet(2, 0, trays=6)
    trace = [
        Job(name="job-1", pods=4, gpus=4, domain=True, arrival=0.0, duration=30.0),
        Job(name="claim-2", pods=1, gpus=4, domain=False, arrival=0.01, duration=90.0),
        Job(name="job-3", pods=6, gpus=4, domain=True, arrival=1.0, duration=30.0),
    ]
    # first fit: job-1 on rack 0's first four trays, the claim on the fifth; job-3's six pods then
    # take rack 0's last tray and five of rack 1: its pods span two cliques
    baseline = simulate("first-fit-pods", fleet, trace)
    assert baseline["domain_jobs_split_across_cliques"] == 1 and baseline["jobs_started"] == 2
    tangram = simulate("tangram", fleet, trace)
    assert tangram["domain_jobs_split_across_cliques"] == 0
    assert tangram["jobs_started"] == 2 and tangram["idle_gpu_hours_partly_placed"] == 0.0


def test_the_command_prints_both_deciders_and_their_ratios_and_refuses_a_bad_fleet() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "tangram.cli", "bench", "gangs", "--jobs", "30", "--racks", "1", "--hgx", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["fleet"] == {"racks": 1, "trays": 18, "hgx_h200": 2, "gpus": 88}
    assert set(report["deciders"]) == {"tangram", "first-fit-pods"}
    assert report["deciders"]["tangram"]["jobs"] == report["trace"]["jobs"]
    assert "idle_gpu_hours_partly_placed" in report["ratios_vs_first_fit_pods"]
    refused = subprocess.run(
        [sys.executable, "-m", "tangram.cli", "bench", "gangs", "--racks", "0", "--hgx", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert refused.returncode == 2 and "the fleet needs at least one rack or HGX node" in refused.stderr
