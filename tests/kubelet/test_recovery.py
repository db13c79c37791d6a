"""Start-up recovery: the checkpoint and the CDI directory are made to agree, whatever state they are in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tangram.cdi import (
    CdiKind,
    CdiSpecWriter,
    CheckpointedClaim,
    CheckpointStore,
    ClaimRef,
    ResolvedAllocation,
    ResolvedDevice,
)
from tangram.kubelet import ClaimPreparer, InMemoryAllocationSource

UID_A = "0b6f6c55-3f0e-4c4e-9a59-2d3f2c1f7a01"
UID_B = "1c7a7d66-4a1f-4d5f-8b6a-3e4a3d2a8b02"
KIND = CdiKind(vendor="gpu.tangram.dev", cls="claim")


def allocation(uid: str, minor: int = 0) -> ResolvedAllocation:
    return ResolvedAllocation(
        claim=ClaimRef(namespace="default", name="train", uid=uid),
        devices=[
            ResolvedDevice(
                request="gpu",
                pool="node-a",
                device=f"gpu-{minor}",
                gpu_index=minor,
                gpu_uuid=f"GPU-{minor}",
                gpu_minor=minor,
            )
        ],
    )


class Node:
    def __init__(self, tmp_path: Path, boot_id: str = "boot-1") -> None:
        self.cdi_dir = tmp_path / "cdi"
        self.checkpoint_path = tmp_path / "plugin" / "checkpoint.json"
        self.writer = CdiSpecWriter(self.cdi_dir, kind=KIND)
        self.boot_id = boot_id

    def preparer(self, boot_id: str | None = None) -> ClaimPreparer:
        return ClaimPreparer(
            node="node-a",
            source=InMemoryAllocationSource("node-a"),
            writer=self.writer,
            checkpoint=CheckpointStore(self.checkpoint_path, boot_id=boot_id or self.boot_id),
            resolve_timeout_s=0.05,
        )

    def record(self, claims: dict[str, CheckpointedClaim], boot_id: str | None = None) -> None:
        CheckpointStore(self.checkpoint_path, boot_id=boot_id or self.boot_id).write_now(claims)

    def spec_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob("*.json"))


def spec_name(uid: str) -> str:
    return f"gpu.tangram.dev-claim_{uid}.json"


async def test_prepared_claim_whose_spec_vanished_gets_it_back(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.record({UID_A: CheckpointedClaim(state="prepared", allocation=allocation(UID_A))})
    report = await node.preparer().recover()
    assert (report.checkpoint, report.kept, report.rewritten, report.removed) == ("loaded", 1, 1, 0)
    assert node.spec_files() == [spec_name(UID_A)]


async def test_claim_caught_while_preparing_is_cleaned_up(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.writer.write(allocation(UID_A))  # the spec was written, "prepared" was never recorded
    node.record({UID_A: CheckpointedClaim(state="preparing", allocation=allocation(UID_A))})
    preparer = node.preparer()
    report = await preparer.recover()
    assert (report.kept, report.removed) == (0, 1)
    assert node.spec_files() == []
    assert preparer.prepared_claims == {}


async def test_orphan_spec_without_a_record_is_removed(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.writer.write(allocation(UID_B, minor=1))
    node.record({UID_A: CheckpointedClaim(state="prepared", allocation=allocation(UID_A))})
    (node.cdi_dir / "other-vendor.json").write_text("{}")
    preparer = node.preparer()
    await preparer.recover()
    assert node.spec_files() == sorted([spec_name(UID_A), "other-vendor.json"])
    assert list(preparer.prepared_claims) == [UID_A]


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"{not json",
        b'{"version": 1, "checksum": "sha256:00", "body": {"boot_id": "boot-1", "claims": {}}}',
        b'{"version": 99, "checksum": "", "body": {}}',
    ],
    ids=["empty", "garbage", "bad-checksum", "unknown-version"],
)
async def test_corrupt_checkpoint_is_moved_aside_and_rebuilt_from_specs(
    tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path)
    node.writer.write(allocation(UID_A))
    node.checkpoint_path.parent.mkdir(parents=True)
    node.checkpoint_path.write_bytes(damage)
    preparer = node.preparer()
    report = await preparer.recover()
    assert (report.checkpoint, report.kept) == ("corrupt", 1)
    assert preparer.prepared_claims == {UID_A: allocation(UID_A)}
    aside = [p.name for p in node.checkpoint_path.parent.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1
    assert (node.checkpoint_path.parent / aside[0]).read_bytes() == damage
    assert any(r.levelname == "ERROR" and "checkpoint" in r.getMessage() for r in caplog.records)
    # the rebuilt checkpoint is sound: a second start loads it as it is
    again = await node.preparer().recover()
    assert (again.checkpoint, again.kept) == ("loaded", 1)


async def test_reboot_discards_prepared_state(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.writer.write(allocation(UID_A))
    node.record({UID_A: CheckpointedClaim(state="prepared", allocation=allocation(UID_A))}, boot_id="boot-1")
    preparer = node.preparer(boot_id="boot-2")
    report = await preparer.recover()
    assert (report.checkpoint, report.kept, report.removed) == ("rebooted", 0, 1)
    assert node.spec_files() == []
    stored: dict[str, Any] = json.loads(node.checkpoint_path.read_text())
    assert stored["body"] == {"boot_id": "boot-2", "claims": {}}


async def test_missing_checkpoint_adopts_specs_on_disk(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.writer.write(allocation(UID_A))
    preparer = node.preparer()
    report = await preparer.recover()
    assert (report.checkpoint, report.kept) == ("missing", 1)
    assert node.checkpoint_path.stat().st_mode & 0o777 == 0o600
