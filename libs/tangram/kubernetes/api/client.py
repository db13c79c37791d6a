"""The Kubernetes API client and the one place its errors are translated.

Every request Tangram makes to the API server goes through `call`, so the rest of the code sees a
single error type carrying the HTTP status and the API server's reason (`Conflict`,
`AlreadyExists`, `NotFound`, `Invalid`, ...), and an unreachable server looks like any other
failed request instead of a zoo of aiohttp and OS exceptions.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config

T = TypeVar("T")
log = logging.getLogger("tangram.kubernetes.api")

UNREACHABLE = 0  # the status of a request that never got an HTTP answer


class KubeApiError(Exception):
    """A request the API server refused or never answered; `status` is 0 when it never answered."""

    def __init__(self, what: str, status: int, reason: str, message: str = "") -> None:
        self.what = what
        self.status = status
        self.reason = reason
        self.message = message
        detail = f": {message}" if message else ""
        super().__init__(f"{what}: {status} {reason}{detail}")

    @property
    def conflict(self) -> bool:
        """Someone else changed the object since we read it (stale resourceVersion)."""
        return self.status == 409 and self.reason == "Conflict"

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def not_found(self) -> bool:
        return self.status == 404


# What ends a list-and-watch loop for a while, not for good: the loop lists again after
# `relist_delay`. A watch stream that breaks surfaces as any of these, depending on where it broke.
WATCH_ERRORS: tuple[type[BaseException], ...] = (
    KubeApiError,
    ApiException,
    aiohttp.ClientError,
    TimeoutError,
    OSError,
    ValueError,
)


def relist_delay(failures: int) -> float:
    """Seconds before listing again after `failures` watch breaks in a row: 0.4 s doubling to 5 s."""
    return min(5.0, 0.2 * 2.0 ** min(failures, 5))


class KubeConfigError(ValueError):
    """No usable connection settings: the message says which source was tried and why it failed."""


def _from_api_exception(what: str, error: ApiException) -> KubeApiError:
    """The API server's Status body names the reason more precisely than the HTTP reason phrase."""
    status = int(error.status or UNREACHABLE)
    reason = str(error.reason or "")
    message = ""
    body: object = error.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str) and body:
        try:
            parsed = json.loads(body)
        except ValueError:
            message = body[:500]
        else:
            if isinstance(parsed, dict):
                reason = str(parsed.get("reason") or reason)
                message = str(parsed.get("message") or "")
    return KubeApiError(what, status, reason, message)


async def call(what: str, request: Awaitable[T]) -> T:
    """Await one API request; any failure comes out as KubeApiError naming `what` was attempted."""
    try:
        return await request
    except ApiException as error:
        raise _from_api_exception(what, error) from error
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        raise KubeApiError(what, UNREACHABLE, "Unreachable", str(error) or type(error).__name__) from error


async def call_json(what: str, request: Awaitable[Any]) -> dict[str, Any]:
    """Await one request made with `_preload_content=False`: the object as the server sent it
    (opaque fields untouched by the client's models), errors translated as by `call`."""
    response = await call(what, request)
    try:
        body = await call(what, response.read())
    finally:
        response.release()
    status = int(response.status)
    if not 200 <= status < 300:
        refused = ApiException(status=status, reason=str(response.reason or ""))
        refused.body = body
        raise _from_api_exception(what, refused)
    try:
        parsed = json.loads(body)
    except ValueError as error:
        raise KubeApiError(what, status, "BadBody", f"the answer is not JSON: {error}") from error
    if not isinstance(parsed, dict):
        raise KubeApiError(what, status, "BadBody", "the answer is not an object")
    return parsed


async def connect(
    *, host: str | None = None, kubeconfig: Path | None = None, context: str | None = None
) -> Any:
    """An ApiClient (close it with `await client.close()`).

    Settings come from, in order: an explicit `host` (plain HTTP, no credentials: tests and
    `kubectl proxy`), a kubeconfig file, the pod's service account when running in a cluster,
    then `$KUBECONFIG` or `~/.kube/config`.
    """
    configuration = Configuration()
    try:
        if host is not None:
            configuration.host = host
        elif kubeconfig is not None:
            await load_kube_config(
                config_file=str(kubeconfig),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            load_incluster_config(client_configuration=configuration)
        else:
            await load_kube_config(context=context, client_configuration=configuration, persist_config=False)
    except (ConfigException, OSError) as error:
        source = f"kubeconfig {str(kubeconfig)!r}" if kubeconfig is not None else "the default settings"
        raise KubeConfigError(f"cannot configure the Kubernetes client from {source}: {error}") from error
    return ApiClient(configuration)
