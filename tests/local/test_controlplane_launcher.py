"""The control plane launcher's own behaviour: cache keys, a missing binary, a binary that fails."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tangram.local.controlplane import (
    NEWEST,
    OLDEST,
    ControlPlane,
    ControlPlaneError,
    binary_path,
    find_binary,
    free_ports,
    release,
    source_dir,
)


def test_the_cache_key_follows_the_version_and_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = tmp_path / "src"
    shutil.copytree(source_dir(), copy)
    before = binary_path(NEWEST, copy)
    oldest = binary_path(OLDEST, copy)
    (copy / "main.go").write_text((copy / "main.go").read_text() + "\n// changed\n")
    after = binary_path(NEWEST, copy)
    (copy / "k8s-v1.34.4.sum").write_text("changed\n")
    oldest_after = binary_path(OLDEST, copy)

    assert before.parent.parent == tmp_path / "cache" / "tangram" / "controlplane"
    assert before.parent.name.startswith("v1.37.2-") and before.name == "controlplane"
    assert oldest.parent.name.startswith("v1.34.4-")
    assert before != after and before.parent.name[:8] == after.parent.name[:8]
    # the oldest release's own pin is part of its key, and not of the newest's
    assert oldest_after != oldest and binary_path(NEWEST, copy) == after


def test_a_release_is_named_by_its_version_or_its_minor() -> None:
    assert release("1.34") is OLDEST and release("v1.37.2") is NEWEST and release("1.37.2") is NEWEST
    with pytest.raises(
        ControlPlaneError,
        match=r"no control plane for Kubernetes 1\.35: the versions built are v1\.34\.4, v1\.37\.2",
    ):
        release("1.35")


def test_each_release_says_what_its_dra_features_need() -> None:
    # 1.34: partitionable devices and device taints are alpha, DeviceTaintRule served at v1alpha3
    assert OLDEST.gates() == {"DRAPartitionableDevices": True, "DRADeviceTaints": True}
    assert OLDEST.runtime_config(OLDEST.gates()) == "resource.k8s.io/v1alpha3=true"
    # 1.37: on by default; partitionable devices can still be turned off
    assert NEWEST.gates(partitionable=False) == {
        "DRAPartitionableDevices": False,
        "DRADeviceTaints": True,
        "GenericWorkload": True,
    }
    # 1.37: DeviceTaintRule served by default; the Workload API's PodGroups turned on
    assert NEWEST.gates()["GenericWorkload"] is True and "GenericWorkload" not in OLDEST.gates()
    assert NEWEST.runtime_config(NEWEST.gates()) == "scheduling.k8s.io/v1beta1=true"


def test_a_missing_binary_says_how_to_build_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TANGRAM_CONTROLPLANE_1_34", raising=False)
    with pytest.raises(ControlPlaneError, match="make controlplane"):
        find_binary(OLDEST)


def test_a_binary_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    failing = tmp_path / "controlplane"
    failing.write_text("#!/bin/sh\necho 'controlplane: etcd: address already in use' >&2\nexit 1\n")
    failing.chmod(0o755)
    plane = ControlPlane(tmp_path / "data", binary=failing, startup_timeout=30)
    with pytest.raises(ControlPlaneError, match=r"(?s)exited.*address already in use"):
        plane.start()
    assert plane.pid is None


def test_free_ports_are_distinct() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(0 < p < 65536 for p in ports)
