"""The webhook's TLS, kept without manual steps: certificates in a Secret, the CA in the
MutatingWebhookConfiguration's caBundle.

At start and then periodically every replica reads the Secret; when it is missing, unreadable or
due for renewal (`services.admission.certs.renew`) the replica writes new material, with the
Secret's resourceVersion so that of two replicas renewing at once one wins and the other takes
what the winner wrote. Every replica serves what the Secret holds, and patches the caBundle of
each of its webhooks in the named configuration when it differs from the Secret's bundle (a
JSONPatch that tests the webhook's name at its index first, so a configuration changed in between
is never patched at the wrong place).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import AdmissionregistrationV1Api, CoreV1Api

from services.admission.certs import CA_DAYS, SERVING_DAYS, TlsMaterial, renew
from tangram.kubernetes.api import KubeApiError, call, call_json

log = logging.getLogger("tangram.admission.keeper")

# every request is bounded: a hung API server is retried, never waited on for ever
_TIMEOUT_S = 10.0
_KEYS = {"ca_bundle": "ca.crt", "ca_key": "ca.key", "cert": "tls.crt", "key": "tls.key"}


def material_of(secret: dict[str, Any]) -> TlsMaterial | None:
    """The material a Secret holds, or None when a key is missing or not base64."""
    data = secret.get("data")
    if not isinstance(data, dict):
        return None
    try:
        fields = {field: base64.b64decode(data[key], validate=True) for field, key in _KEYS.items()}
    except (KeyError, TypeError, ValueError):
        return None
    return TlsMaterial(**fields)


def secret_data(material: TlsMaterial) -> dict[str, str]:
    return {key: base64.b64encode(getattr(material, field)).decode() for field, key in _KEYS.items()}


class CertificateKeeper:
    def __init__(
        self,
        api: Any,
        *,
        namespace: str,
        secret: str,
        webhook_configuration: str | None,
        hosts: tuple[str, ...],
        ca_days: int = CA_DAYS,
        serving_days: int = SERVING_DAYS,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._core = CoreV1Api(api)
        self._admission = AdmissionregistrationV1Api(api)
        self.namespace = namespace
        self.secret = secret
        self.webhook_configuration = webhook_configuration
        self.hosts = hosts
        self._ca_days = ca_days
        self._serving_days = serving_days
        self._now = now

    async def _read_secret(self) -> dict[str, Any] | None:
        try:
            return await call_json(
                f"read Secret {self.namespace}/{self.secret}",
                self._core.read_namespaced_secret(
                    self.secret, self.namespace, _preload_content=False, _request_timeout=_TIMEOUT_S
                ),
            )
        except KubeApiError as error:
            if error.not_found:
                return None
            raise

    async def ensure_material(self) -> TlsMaterial:
        """The material to serve: the Secret's, renewed (and written back) when due."""
        for _ in range(5):
            secret = await self._read_secret()
            current = material_of(secret) if secret is not None else None
            fresh = renew(
                current, self.hosts, self._now(), ca_days=self._ca_days, serving_days=self._serving_days
            )
            if fresh is None and current is not None:
                return current
            assert fresh is not None
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": self.secret,
                    "namespace": self.namespace,
                    "labels": {
                        "app.kubernetes.io/name": "tangram",
                        "app.kubernetes.io/component": "admission",
                    },
                },
                "type": "Opaque",
                "data": secret_data(fresh),
            }
            try:
                if secret is None:
                    await call(
                        f"create Secret {self.namespace}/{self.secret}",
                        self._core.create_namespaced_secret(
                            self.namespace, body, _request_timeout=_TIMEOUT_S
                        ),
                    )
                else:
                    body["metadata"]["resourceVersion"] = secret["metadata"]["resourceVersion"]
                    body["metadata"]["labels"] = {
                        **(secret["metadata"].get("labels") or {}),
                        **body["metadata"]["labels"],
                    }
                    body["type"] = secret.get("type") or "Opaque"
                    await call(
                        f"update Secret {self.namespace}/{self.secret}",
                        self._core.replace_namespaced_secret(
                            self.secret, self.namespace, body, _request_timeout=_TIMEOUT_S
                        ),
                    )
            except KubeApiError as error:
                if error.conflict or error.already_exists:
                    continue  # another replica wrote first: take what it wrote
                raise
            log.info(
                "wrote new webhook certificates",
                extra={"secret": f"{self.namespace}/{self.secret}", "hosts": list(self.hosts)},
            )
            return fresh
        raise KubeApiError(f"write Secret {self.namespace}/{self.secret}", 409, "Conflict", "kept changing")

    async def ensure_ca_bundle(self, material: TlsMaterial) -> bool:
        """Patch the caBundle of every webhook of the configuration that lacks this bundle;
        True when something was patched."""
        name = self.webhook_configuration
        if not name:
            return False
        config = await call_json(
            f"read MutatingWebhookConfiguration {name}",
            self._admission.read_mutating_webhook_configuration(
                name, _preload_content=False, _request_timeout=_TIMEOUT_S
            ),
        )
        wanted = base64.b64encode(material.ca_bundle).decode()
        patch: list[dict[str, Any]] = []
        for index, webhook in enumerate(config.get("webhooks") or []):
            if (webhook.get("clientConfig") or {}).get("caBundle") == wanted:
                continue
            patch += [
                {"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]},
                {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": wanted},
            ]
        if not patch:
            return False
        await call(
            f"patch the caBundle of MutatingWebhookConfiguration {name}",
            self._admission.patch_mutating_webhook_configuration(name, patch, _request_timeout=_TIMEOUT_S),
        )
        log.info("patched the webhook's caBundle", extra={"configuration": name})
        return True
