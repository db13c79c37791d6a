"""The whole life of a claim with every service as its own OS process: `tangram demo`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(300)  # above the run's own limit, which is generous for a loaded 2-core machine
def test_demo_runs_claims_to_ready_and_shuts_down_cleanly() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tangram.cli", "demo", "--duration", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = completed.stdout.strip().splitlines()
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = json.loads(lines[-1])
    assert summary["clean_shutdown"] is True
    assert set(summary["services"]) == {
        "allocator",
        "discovery@node-a",
        "partitioner@node-a",
        "cdi@node-a",
        "discovery@node-b",
        "partitioner@node-b",
        "cdi@node-b",
    }
    # The opening: a 4-GPU NVLink claim, three MIG claims, a 2-GPU claim and one too big to fit.
    assert summary["failed"] >= 1
    assert any(reason.startswith("ml/too-big: 0/2 nodes fit") for reason in summary["failure_reasons"])
    assert summary["undecided"] == 0 and summary["prepare_failed"] == 0
    assert summary["ready"] == summary["allocated"] >= 5
    assert summary["released"] == summary["allocated"]
    # No default machine starts with a 2g instance: the opening's 2g claim has one created.
    assert any("partition.applied" in line and ": create 2g." in line for line in lines)
    # However short the run, the churn itself creates and destroys MIG instances.
    assert summary["churn"]["claims"] >= 1 and summary["churn"]["releases"] >= 1
    assert summary["churn"]["mig_created"] >= 1 and summary["churn"]["mig_destroyed"] >= 1
    assert summary["mig_created"] >= 2
    # Everything is released at the end, and every released MIG instance is destroyed.
    assert summary["mig_destroy_pending"] == 0 and summary["mig_destroy_refused"] == 0
    assert summary["mig_destroyed"] >= summary["mig_created"]
    assert summary["events"]["claim.prepared"] == summary["ready"]
    assert summary["events"]["claim.released"] == summary["released"]
    assert any(line.startswith("+") and "claim.prepared" in line for line in lines)
    # --duration counts from the first claim: start-up is not part of it.
    assert summary["claims_s"] >= 4
