"""The control plane launcher's own behaviour: cache keys, a missing binary, a binary that fails."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tangram.local.controlplane import (
    KUBERNETES_VERSION,
    ControlPlane,
    ControlPlaneError,
    binary_path,
    find_binary,
    free_ports,
    source_dir,
)


def test_the_cache_key_follows_the_version_and_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = tmp_path / "src"
    shutil.copytree(source_dir(), copy)
    before = binary_path(copy)
    (copy / "main.go").write_text((copy / "main.go").read_text() + "\n// changed\n")
    after = binary_path(copy)

    assert before.parent.parent == tmp_path / "cache" / "tangram" / "controlplane"
    assert before.parent.name.startswith(f"{KUBERNETES_VERSION}-") and before.name == "controlplane"
    assert before != after and before.parent.name[:8] == after.parent.name[:8]


def test_a_missing_binary_says_how_to_build_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TANGRAM_CONTROLPLANE", raising=False)
    with pytest.raises(ControlPlaneError, match="make controlplane"):
        find_binary()


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
