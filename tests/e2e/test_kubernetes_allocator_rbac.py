"""The chart's allocator role is what the allocator's writes take on the real control plane: with
its token, an allocation written to a claim's status is accepted on both releases, and on a
release that authorizes the binding of a claim apart (Kubernetes 1.36 on), the same role without
its resourceclaims/binding rule is refused it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api, RbacAuthorizationV1Api, ResourceV1Api

from tangram.kubernetes.api import KubeApiError, call, call_json, connect
from tangram.local.admission import render, service_account_kubeconfig
from tangram.local.controlplane import ControlPlane, register_node
from tests.e2e.kubecluster import DRIVER

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]


def allocation(node: str) -> dict[str, Any]:
    return {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-1"}]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


async def test_the_allocator_role_writes_allocations_and_needs_its_binding_rule_from_1_36(
    controlplane: ControlPlane, kube: Any, unique: str, tmp_path: Path
) -> None:
    node = f"al-{unique.rsplit('-', 1)[-1]}"
    core, resource, rbac = CoreV1Api(kube), ResourceV1Api(kube), RbacAuthorizationV1Api(kube)
    rendered = {
        (o["kind"], o["metadata"]["name"]): o
        for o in render(namespace=unique, kube_version=f"{controlplane.release.minor}.0")
    }
    full = rendered[("ClusterRole", "tangram-allocator")]
    without = {
        **full,
        "rules": [r for r in full["rules"] if "resourceclaims/binding" not in r["resources"]],
    }
    assert len(without["rules"]) == len(full["rules"]) - 1
    await register_node(kube, node)
    await call("create namespace", core.create_namespace({"metadata": {"name": unique}}))
    outcomes: dict[str, str] = {}
    for label, rules in (("chart", full), ("without-binding", without)):
        account = f"allocator-{label}"
        role = {**rules, "metadata": {"name": f"{unique}-{label}"}}
        await rbac.create_cluster_role(role)
        await rbac.create_cluster_role_binding(
            {
                "metadata": {"name": f"{unique}-{label}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role["metadata"]["name"],
                },
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": unique}],
            }
        )
        await core.create_namespaced_service_account(unique, {"metadata": {"name": account}})
        kubeconfig = await service_account_kubeconfig(
            controlplane, kube, unique, account, tmp_path / f"{label}.kubeconfig"
        )
        claim = await call_json(
            "create claim",
            resource.create_namespaced_resource_claim(
                unique,
                {
                    "metadata": {"name": f"claim-{label}"},
                    "spec": {
                        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
                    },
                },
                _preload_content=False,
            ),
        )
        claim["status"] = {"allocation": allocation(node)}
        as_allocator = await connect(kubeconfig=kubeconfig)
        try:
            await call_json(
                "write the allocation as the allocator",
                ResourceV1Api(as_allocator).replace_namespaced_resource_claim_status(
                    claim["metadata"]["name"], unique, claim, _preload_content=False
                ),
            )
            outcomes[label] = "written"
        except KubeApiError as error:
            outcomes[label] = str(error)
        finally:
            await as_allocator.close()
    for label in ("chart", "without-binding"):
        await rbac.delete_cluster_role_binding(f"{unique}-{label}")
        await rbac.delete_cluster_role(f"{unique}-{label}")
    assert outcomes["chart"] == "written"
    if int(controlplane.release.minor.split(".")[1]) >= 36:
        assert 'requires resource="resourceclaims/binding"' in outcomes["without-binding"], outcomes
    else:
        assert outcomes["without-binding"] == "written"
