"""`tangram chaos --kubernetes` with a few dozen pods: the real control plane (the newest release and
the oldest Tangram supports), the webhook, two allocators and two simulated nodes; every fault kind
injected (the API server and etcd killed and restarted on their data among them), and no invariant
violated."""

from __future__ import annotations

import shutil

import pytest

from tangram.chaos.kube import KUBE_FAULT_KINDS, KubeChaosConfig, kube_chaos
from tangram.local.controlplane import RELEASES, Release
from tests.support.servicelogs import lines_naming

pytestmark = [pytest.mark.controlplane]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
async def test_a_short_chaos_run_on_kubernetes_injects_every_fault_and_violates_nothing(
    release: Release,
) -> None:
    config = KubeChaosConfig(
        pods=40, seed=3, concurrency=12, fault_interval_s=1.0, keep_at_end=4, release=release
    )
    report, cluster = await kube_chaos(config)
    print(f"\nchaos --kubernetes: {report['pods']} pods in {report['wall_s']} s, phases {report['phases_s']}")
    passed = False
    try:
        examples = report["violation_examples"]
        if examples:
            reports = [line for lines in examples.values() for line in lines]
            print(lines_naming(cluster.workdir / "logs", reports))
        assert report["violations"] == {}, examples
        assert report["completed"] is True
        assert all(report["faults"][kind] >= 1 for kind in KUBE_FAULT_KINDS), report["faults"]
        outcomes = report["outcomes"]
        # every pod the workers made has an outcome; the faults' own pods come on top
        own = outcomes.get("deleted_in_flight", 0) + sum(
            v for k, v in outcomes.items() if k.startswith("claim_")
        )
        assert sum(outcomes.values()) - own == report["pods"] == config.pods
        assert outcomes["ran"] > config.pods // 2
        assert all(code == 0 for code in report["services_exit_codes"].values()), report[
            "services_exit_codes"
        ]
        passed = True
    finally:
        if passed:
            shutil.rmtree(cluster.workdir, ignore_errors=True)
        else:  # its logs and stores, for whoever traces the failure
            print(f"kept {cluster.workdir}")
