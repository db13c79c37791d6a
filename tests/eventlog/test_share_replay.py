"""Replay and explain cover shares: a log of shares decided by the allocator's own fold replays
without a divergence, and `tangram explain` shows a share's device, share id and limits."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.cli.logsource import device_classes
from tangram.eventlog.records import read_log
from tangram.eventlog.replay import replay
from tangram.events import ClaimAllocated, ClaimReleased, Event
from tests.allocator.helpers import inventory, request
from tests.eventlog.stored import write_stored

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def share(gib: int, percent: int = 0) -> dict[str, Any]:
    exactly = {"deviceClassName": "shared.gpu.tangram.dev", "capacity": {"requests": {"memory": f"{gib}Gi"}}}
    devices: dict[str, Any] = {"requests": [{"name": "share", "exactly": exactly}]}
    if percent:
        parameters = {
            "apiVersion": "gpu.tangram.dev/v1alpha1",
            "kind": "SharingConfig",
            "computePercent": percent,
        }
        devices["config"] = [
            {"requests": ["share"], "opaque": {"driver": "gpu.tangram.dev", "parameters": parameters}}
        ]
    return {"devices": devices}


def make_log(path: Path) -> list[Event]:
    ledger = Ledger(fleet=FleetState(), classes=device_classes())
    stored: list[Event] = [inventory("l40s-8", "n1")]
    ledger.apply(stored[0], live=False)
    for n, (gib, percent) in enumerate([(10, 0), (20, 40), (8, 0), (30, 0), (12, 60)], start=1):
        wanted = request(n, share(gib, percent), namespace="ml")
        stored += [wanted, *ledger.apply(wanted)]
    released = ClaimReleased(key=request(2, {}).uid, namespace="ml", name="claim-2", uid=request(2, {}).uid)
    stored += [released, *ledger.apply(released)]
    again = request(6, share(20), namespace="ml")
    stored += [again, *ledger.apply(again)]
    return write_stored(path, stored, START)


def test_a_log_of_shares_replays_without_a_divergence(tmp_path: Path) -> None:
    path = tmp_path / "log.tlog.gz"
    stored = make_log(path)
    decided = [e for e in stored if isinstance(e, ClaimAllocated)]
    assert [d.devices[0].device for d in decided] == [
        "gpu-0-shared",  # 10 GiB opens the first GPU
        "gpu-0-shared",  # 20 GiB joins it (44.99 GiB)
        "gpu-0-shared",  # 8 GiB: 6.99 GiB left there after
        "gpu-1-shared",  # 30 GiB does not fit the first any more
        "gpu-1-shared",  # 12 GiB, 60%: beside the 30 GiB share, the fuller host with room
        "gpu-0-shared",  # after claim-2 left, 20 GiB fits the first again
    ]
    report = replay(read_log(path), device_classes())
    assert report.claims_decided == 6
    assert report.divergences == []


def test_explain_shows_a_shares_device_id_and_limits(tmp_path: Path) -> None:
    path = tmp_path / "log.tlog.gz"
    stored = make_log(path)
    run = subprocess.run(
        [sys.executable, "-m", "tangram.cli", "explain", "ml/claim-5", "--log", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["recorded"] == report["recomputed"]
    [device] = report["devices"]
    [decision] = [e for e in stored if isinstance(e, ClaimAllocated) and e.name == "claim-5"]
    assert decision.devices[0].share is not None
    assert device["device"] == "gpu-1-shared"
    assert device["share"] == {
        "id": decision.devices[0].share.id,
        "strategy": "MPS",
        "memory_bytes": 12 * 2**30,
        "compute_percent": 60,
        "time_slice": "Default",
    }
