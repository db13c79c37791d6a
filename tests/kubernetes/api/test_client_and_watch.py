"""The client choke point and the local API server's list/watch, through kubernetes_asyncio itself."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ResourceV1Api
from kubernetes_asyncio.watch import Watch

from tangram.kubernetes.api import KubeApiError, KubeConfigError, call, connect
from tests.kubernetes.api.apiserver import LocalApiServer
from tests.kubernetes.api.helpers import write_kubeconfig
from tests.support.driver import DRIVER


def slice_object(node: str, index: int = 0, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"{node}-{index}"}
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


async def test_errors_come_out_as_one_type_with_status_and_reason(
    apiserver: LocalApiServer, kube_api: Any
) -> None:
    api = ResourceV1Api(kube_api)
    await call("create", api.create_resource_slice(slice_object("n1")))

    with pytest.raises(KubeApiError) as missing:
        await call("read n9", api.read_resource_slice("n9-0"))
    assert (missing.value.status, missing.value.reason, missing.value.not_found) == (404, "NotFound", True)
    assert str(missing.value) == 'read n9: 404 NotFound: resourceslices.resource.k8s.io "n9-0" not found'

    with pytest.raises(KubeApiError) as duplicate:
        await call("create again", api.create_resource_slice(slice_object("n1")))
    assert (duplicate.value.status, duplicate.value.already_exists, duplicate.value.conflict) == (
        409,
        True,
        False,
    )

    stale = copy.deepcopy(slice_object("n1"))
    stale["metadata"]["resourceVersion"] = "1"
    with pytest.raises(KubeApiError) as conflict:
        await call("replace", api.replace_resource_slice("n1-0", stale))
    assert (conflict.value.status, conflict.value.reason, conflict.value.conflict) == (409, "Conflict", True)


async def test_an_unreachable_server_is_status_zero(apiserver: LocalApiServer, kube_api: Any) -> None:
    await apiserver.stop()
    with pytest.raises(KubeApiError) as down:
        await call("list", ResourceV1Api(kube_api).list_resource_slice(_request_timeout=5))
    assert (down.value.status, down.value.reason) == (0, "Unreachable")
    await apiserver.start()


async def test_connect_reads_a_kubeconfig(apiserver: LocalApiServer, tmp_path: Path) -> None:
    apiserver.put_object(slice_object("n1"))
    client = await connect(kubeconfig=write_kubeconfig(tmp_path / "config", apiserver.url))
    try:
        listed = await call("list", ResourceV1Api(client).list_resource_slice())
    finally:
        await client.close()
    assert [item.metadata.name for item in listed.items] == ["n1-0"]
    assert apiserver.requests == [("GET", "/apis/resource.k8s.io/v1/resourceslices")]


async def test_connect_names_a_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="nowhere/config"):
        await connect(kubeconfig=tmp_path / "nowhere" / "config")


async def test_list_filters_by_field_and_label_selectors(apiserver: LocalApiServer, kube_api: Any) -> None:
    apiserver.put_object(slice_object("n1", labels={"tier": "a"}))
    apiserver.put_object(slice_object("n2", labels={"tier": "b"}))
    api = ResourceV1Api(kube_api)

    by_node = await api.list_resource_slice(field_selector=f"spec.nodeName=n2,spec.driver={DRIVER}")
    by_label = await api.list_resource_slice(label_selector="tier!=b")
    assert [i.metadata.name for i in by_node.items] == ["n2-0"]
    assert [i.metadata.name for i in by_label.items] == ["n1-0"]
    assert by_node.metadata.resource_version == "102"  # two writes after the server's first version 100
    with pytest.raises(KubeApiError) as unsupported:
        await call("list", api.list_resource_slice(field_selector="spec.colour=red"))
    assert (unsupported.value.status, unsupported.value.reason) == (400, "BadRequest")


async def test_watch_streams_changes_from_a_resource_version(
    apiserver: LocalApiServer, kube_api: Any
) -> None:
    api = ResourceV1Api(kube_api)
    await api.create_resource_slice(slice_object("n1"))
    listed = await api.list_resource_slice()
    await api.create_resource_slice(slice_object("n2"))
    await api.create_resource_slice(slice_object("n1", 1))
    apiserver.modify("n1-0", lambda o: o["metadata"].setdefault("labels", {}).update(seen="yes"))
    await api.delete_resource_slice("n1-1")

    events: list[tuple[str, str, str]] = []
    async with Watch() as watch:
        async for event in watch.stream(
            api.list_resource_slice,
            field_selector="spec.nodeName=n1",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=5,
        ):
            obj = event["object"]
            events.append((event["type"], obj.metadata.name, obj.metadata.resource_version))
            if len(events) == 3:
                watch.stop()
    assert events == [("ADDED", "n1-1", "103"), ("MODIFIED", "n1-0", "104"), ("DELETED", "n1-1", "105")]
