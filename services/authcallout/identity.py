"""Who a projected service-account token belongs to, and which node it speaks for.

A token is accepted only when the API server's TokenReview says it is valid for the configured
audience, it belongs to the node services' service account, and it is bound to a Pod (tokens
projected into a pod are): the node is the one the API server wrote into the token
(`authentication.kubernetes.io/node-name`, Kubernetes 1.32+), else the bound Pod's
`spec.nodeName`. A token of a deleted Pod fails the review. The answer never depends on anything
the client says about itself but the token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import AuthenticationV1Api, CoreV1Api

from tangram.bus.config import token_expiry
from tangram.kubernetes.api import call
from tangram.kubernetes.api.client import KubeApiError

NODE_NAME = "authentication.kubernetes.io/node-name"
POD_NAME = "authentication.kubernetes.io/pod-name"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class Refused(Exception):
    """The token proves no node identity; the message says why (never the token)."""


@dataclass(frozen=True)
class NodeIdentity:
    node: str
    namespace: str
    pod: str
    expires_at: int | None  # the token's own expiry (seconds since the epoch), when it names one


def _first(extra: dict[str, Any], key: str) -> str | None:
    values = extra.get(key) or []
    return values[0] if isinstance(values, list) and values and isinstance(values[0], str) else None


class TokenReviewer:
    """Reviews tokens as the service account of the callout (it needs `tokenreviews: create` and
    `pods: get`, `nodes: list`)."""

    def __init__(self, api: Any, *, audience: str, service_accounts: frozenset[str]) -> None:
        self._api = api
        self.audience = audience
        # `namespace:name` of the accounts whose pods are node services
        self.service_accounts = service_accounts

    async def review(self, token: str) -> NodeIdentity:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        try:
            response = await call(
                "review a NATS token",
                AuthenticationV1Api(self._api).create_token_review(body, _preload_content=False),
            )
            review = await response.json()
        except KubeApiError as exc:
            raise Refused(f"token review failed: {exc.status} {exc.reason}") from None
        status = review.get("status") or {}
        if not status.get("authenticated"):
            raise Refused(f"token not authenticated: {str(status.get('error') or 'no reason given')[:200]}")
        if self.audience not in (status.get("audiences") or []):
            raise Refused(f"token is not for audience {self.audience!r}")
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        if not username.startswith(SERVICE_ACCOUNT_PREFIX):
            raise Refused(f"{username[:100]!r} is not a service account")
        account = username[len(SERVICE_ACCOUNT_PREFIX) :]
        if account not in self.service_accounts:
            raise Refused(f"service account {account!r} does not run node services")
        namespace = account.split(":", 1)[0]
        extra = user.get("extra") or {}
        pod = _first(extra, POD_NAME)
        if pod is None:
            raise Refused("token is not bound to a pod, so it names no node")
        node = _first(extra, NODE_NAME) or await self.node_of_pod(namespace, pod)
        return NodeIdentity(node=node, namespace=namespace, pod=pod, expires_at=token_expiry(token))

    async def node_of_pod(self, namespace: str, pod: str) -> str:
        """Where a Pod runs (for servers whose token reviews do not name the node)."""
        try:
            response = await call(
                f"read Pod {namespace}/{pod}",
                CoreV1Api(self._api).read_namespaced_pod(pod, namespace, _preload_content=False),
            )
            body = await response.json()
        except KubeApiError as exc:
            raise Refused(f"pod {namespace}/{pod}: {exc.status} {exc.reason}") from None
        node = (body.get("spec") or {}).get("nodeName")
        if not isinstance(node, str) or not node:
            raise Refused(f"pod {namespace}/{pod} is not on a node")
        return node

    async def nodes(self) -> list[str]:
        """Every Node of the cluster: the other nodes whose durables a node's user must not touch."""
        response = await call("list Nodes", CoreV1Api(self._api).list_node(_preload_content=False))
        body = await response.json()
        return [str(item["metadata"]["name"]) for item in body.get("items") or []]
