"""Raw requests to the real API server: any object the chart renders, by its discovered resource,
and the CRDs of the custom resources among them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tests.support.polling import until


class Refused(AssertionError):
    """The API server answered with an error status."""


async def api_request(kube: Any, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    # unparsed responses do not raise on error statuses: read the status here
    response = await kube.call_api(
        path,
        method,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
        **kwargs,
    )
    body = await response.read()
    if response.status >= 300:
        raise Refused(f"{method} {path}: {response.status} {body.decode(errors='replace')}")
    answer: dict[str, Any] = json.loads(body)
    return answer


async def api_resources(kube: Any, api_version: str) -> dict[str, dict[str, Any]]:
    path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    listing = await api_request(kube, "GET", path, header_params={"Accept": "application/json"})
    return {r["kind"]: r for r in listing["resources"] if "/" not in r["name"]}


async def install_crds(kube: Any, crds: Sequence[dict[str, Any]]) -> None:
    """Apply the CRDs (server-side, for real) and wait until the API server serves their kinds.

    CRDs are cluster-scoped and the tests of a session share a control plane: applying them again
    changes nothing, and they are never deleted, since another test may be using them."""
    for crd in crds:
        await api_request(
            kube,
            "PATCH",
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
            query_params=[("fieldManager", "tangram-chart-test"), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=crd,
        )

    async def served() -> bool:
        for crd in crds:
            name = crd["metadata"]["name"]
            stored = await api_request(
                kube, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            # a CRD just made has no conditions yet: null, not an empty list
            status = stored.get("status") or {}
            conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
            if conditions.get("Established") != "True":
                return False
            # discovery lists a kind only some time after its CRD is Established, and the tests
            # find every resource through discovery
            group = crd["spec"]["group"]
            for version in crd["spec"]["versions"]:
                if not version["served"]:
                    continue
                try:
                    resources = await api_resources(kube, f"{group}/{version['name']}")
                except Refused as error:
                    if ": 404 " not in str(error):
                        raise
                    return False
                if crd["spec"]["names"]["kind"] not in resources:
                    return False
        return True

    await until(f"CRDs {', '.join(c['metadata']['name'] for c in crds)} served", served)
