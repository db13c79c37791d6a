"""`tangram explain` on a log made by the allocator's own fold: a MIG claim through prepare, a failure."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.cli.explain import render
from tangram.cli.logsource import device_classes
from tangram.eventlog.explain import Explanation, losses_in
from tangram.eventlog.replay import Outcome
from tangram.events import (
    ClaimPrepared,
    Event,
    PartitionApplied,
    PartitionRequested,
)
from tests.allocator.helpers import inventory, mig, request
from tests.eventlog.stored import write_stored

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def make_log(path: Path) -> list[Event]:
    """What a node and the allocator would store: the allocator's part decided by its own Ledger."""
    ledger = Ledger(fleet=FleetState(), classes=device_classes())
    stored: list[Event] = [inventory("hgx-h200", "n1")]
    ledger.apply(stored[0], live=False)
    # GPU 0 of the simulated HGX H200 holds a 3g and a 1g instance: a 2g instance must be created.
    wanted = request(1, mig("2g.35gb"), namespace="ml")
    stored += [wanted, *ledger.apply(wanted)]
    command = next(e for e in stored if isinstance(e, PartitionRequested))
    stored.append(
        PartitionApplied(
            key=command.key,
            command_id=command.command_id,
            node="n1",
            action="create",
            gpu_uuid=command.gpu_uuid,
            gpu_index=command.gpu_index,
            profile=command.profile,
            placement=command.placement,
            claim_uid=command.claim_uid,
            mig_uuid="MIG-created",
            duration_ms=42.0,
        )
    )
    stored.append(
        ClaimPrepared(key="n1", node="n1", namespace="ml", name="claim-1", uid=wanted.uid, devices=[])
    )
    impossible = request(2, mig("9g.999gb"), namespace="ml")
    stored += [impossible, *ledger.apply(impossible)]
    return write_stored(path, stored, START)


def explain(path: Path, claim: str) -> dict[str, object]:
    run = subprocess.run(
        [sys.executable, "-m", "tangram.cli", "explain", claim, "--log", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, object] = json.loads(run.stdout)
    return result


def test_a_mig_claim_through_partition_and_prepare(tmp_path: Path) -> None:
    path = tmp_path / "log.tlog.gz"
    stored = make_log(path)
    report = explain(path, "ml/claim-1")
    assert report["recorded"] == report["recomputed"]
    assert report["recorded"]["status"] == "allocated" and report["recorded"]["node"] == "n1"  # type: ignore[index]
    [command] = report["commands"]  # type: ignore[misc]
    assert command["action"] == "create" and command["profile"] == "2g.35gb"
    assert (
        command["result"] == "applied"
        and command["duration_ms"] == 42.0
        and command["mig_uuid"] == "MIG-created"
    )
    [device] = report["devices"]  # type: ignore[misc]
    assert device["profile"] == "2g.35gb" and device["partition_command"] == command["command_id"]
    assert [(s["step"], s["after_ms"]) for s in report["steps"]] == [  # type: ignore[attr-defined]
        ("requested", 0.0),
        ("decided", 20.0),  # the partition command is stored first, then the allocation
        ("partition applied", 30.0),
        ("prepared", 40.0),
    ]
    assert isinstance(stored[2], PartitionRequested)


def test_a_claim_no_node_can_take(tmp_path: Path) -> None:
    path = tmp_path / "log.tlog.gz"
    make_log(path)
    report = explain(path, "ml/claim-2")
    reason = report["recorded"]["reason"]  # type: ignore[index]
    # The allocator's words for the CEL selector that no device of the node matches.
    assert reason.startswith('0/1 nodes fit: 1 node: request "mig": ')
    assert report["recomputed"]["reason"] == reason  # type: ignore[index]
    assert report["devices"] == [] and report["commands"] == []
    assert [s["step"] for s in report["steps"]] == ["requested", "decided"]  # type: ignore[attr-defined]
    alternatives = report["understood"]["requests"][0]["alternatives"]  # type: ignore[index]
    assert alternatives[0]["device_class"] == "mig.gpu.tangram.dev"
    assert any('profile == "9g.999gb"' in s for s in alternatives[0]["selectors"])


def test_fields_the_engine_adds_to_its_explanation_are_shown() -> None:
    """A structured explanation (per node: score, demand-weighted loss) prints without code for it."""
    candidates = [
        {"node": "n1", "verdict": "fits", "demand_weighted_loss": 0.125, "terms": {"stranded": 0.1}},
        {"node": "n2", "verdict": "rejected", "reason": "not enough free GPUs or MIG slices"},
    ]
    assert losses_in(candidates) == [0.125]
    outcome = Outcome(status="allocated", node="n1", devices=["gpu-0"])
    text = render(
        Explanation(
            claim="ml/x",
            uid="u",
            understood={},
            recorded=outcome,
            recomputed=outcome,
            candidates=candidates,
            scores={},
            devices=[],
            commands=[],
            steps=[],
            losses=losses_in(candidates),
        )
    )
    assert "node=n1, verdict=fits, demand_weighted_loss=0.125" in text
    assert "    stranded=0.1" in text
    assert "node=n2, verdict=rejected, reason=not enough free GPUs or MIG slices" in text
    assert "demand-weighted loss: 0.125" in text
