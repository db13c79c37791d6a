"""Raw requests to the real API server: any object the chart renders, by its discovered resource."""

from __future__ import annotations

import json
from typing import Any


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
