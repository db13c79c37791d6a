"""`tangram chaos` with a small number of claims: every service a separate process on a 3-server
NATS cluster, every fault kind injected, and no invariant violated."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tangram.chaos import FAULT_KINDS, ChaosConfig, chaos
from tangram.local.processes import LocalCluster


# Ten processes and three NATS servers start and stop; one allocator kill costs a lease TTL.
@pytest.mark.timeout(300)
async def test_a_small_chaos_run_injects_every_fault_and_violates_nothing() -> None:
    config = ChaosConfig(claims=50, seed=5, concurrency=12, fault_interval_s=0.5, keep_at_end=3)
    report, cluster = await chaos(config)
    print(f"\nchaos: {report['claims']} claims in {report['wall_s']} s, phases {report['phases_s']}")
    try:
        assert report["violations"] == {}, report["violation_examples"]
        assert report["completed"] is True
        assert all(report["faults"][kind] >= 1 for kind in FAULT_KINDS), report["faults"]
        outcomes = report["outcomes"]
        assert sum(outcomes.values()) == report["claims"] >= config.claims
        assert outcomes["allocated_prepared_held"] == config.keep_at_end
        assert outcomes["released"] > config.claims // 2
        assert outcomes["released_before_requested"] == report["faults"]["reorder"]
        assert report["stream_replicas"] == 3
        failed = {name: code for name, code in report["services_exit_codes"].items() if code != 0}
        assert failed == {}, {name: _log_tail(cluster, name) for name in failed}
    finally:
        shutil.rmtree(cluster.workdir, ignore_errors=True)


def _log_tail(cluster: LocalCluster, name: str, lines: int = 15) -> list[str]:
    """The last lines a service logged, for the failure message (the folder goes after the test)."""
    log = cluster.service(name).log_path
    return log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []


def test_chaos_arguments_are_checked_with_one_clear_line() -> None:
    for argv, message in (
        (["--claims", "0"], "0 is not at least 1"),
        (["--duration-limit", "soon"], "'soon' is not a number of seconds"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "tangram.cli", "chaos", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_chaos_on_kubernetes_names_a_release_it_has_no_control_plane_for() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tangram.cli", "chaos", "--kubernetes", "--kubernetes-version", "1.20"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "no control plane for Kubernetes 1.20: the versions built are" in done.stderr
    assert "Traceback" not in done.stderr
