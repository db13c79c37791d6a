"""The whole life of a claim with every service as its own OS process: `tangram demo`."""

from __future__ import annotations

import json
import subprocess
import sys


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
    # The opening: a 4-GPU NVLink claim, two MIG claims, a 2-GPU claim and one too big to fit.
    assert summary["failed"] >= 1
    assert any(reason.startswith("ml/too-big: 0/2 nodes fit") for reason in summary["failure_reasons"])
    assert summary["undecided"] == 0 and summary["prepare_failed"] == 0
    assert summary["ready"] == summary["allocated"] >= 4
    assert summary["released"] == summary["allocated"]
    assert summary["mig_created"] >= 2
    assert summary["mig_destroy_pending"] == 0
    assert summary["events"]["claim.prepared"] == summary["ready"]
    assert any(line.startswith("+") and "claim.prepared" in line for line in lines)
