"""The PodGroups of the Workload API, where the API server serves them (scheduling.k8s.io/v1beta1
in Kubernetes 1.37 with GenericWorkload): a pod whose `spec.schedulingGroup` names a PodGroup with a
gang scheduling policy is placed with the PodGroup's other pods, all together or not at all
(`tangram.kubernetes.objects.gangs`). Listed and watched in every namespace; where the API server
serves none, nothing is followed and groups are named by Tangram's label alone."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client import CustomObjectsApi

from tangram.kubernetes.api import KubeApiError, call_json
from tangram.kubernetes.api.client import WATCH_ERRORS, relist_delay
from tangram.kubernetes.api.watching import list_then_watch

log = logging.getLogger("tangram.allocator.kubernetes")

GROUP = "scheduling.k8s.io"
VERSIONS = ("v1beta1", "v1alpha3")  # the newest first
PLURAL = "podgroups"
Key = tuple[str, str]


class PodGroups:
    """`changed(key)` is called when a PodGroup appears or changes: its pods' claims, asked while
    its size was not known, are asked again."""

    def __init__(
        self, api: Any, changed: Callable[[Key], None], *, request_timeout_s: float, watch_timeout_s: int
    ) -> None:
        self._custom = CustomObjectsApi(api)
        self._changed = changed
        self._timeout = request_timeout_s
        self._watch_timeout = watch_timeout_s
        self._by_key: dict[Key, dict[str, Any]] = {}
        self.version: str | None = None  # the version served; None until found (or when none is)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._by_key.get((namespace, name))

    async def follow(self, stop: asyncio.Event) -> None:
        self.version = await self._served(stop)
        if self.version is None:
            if not stop.is_set():
                log.info("the API server serves no PodGroups: groups of pods are named by label alone")
            # the bridge's tasks run until it stops: one that ended would wake its wait for ever
            await stop.wait()
            return
        watch = functools.partial(self._custom.list_cluster_custom_object, GROUP, self.version, PLURAL)
        await list_then_watch(
            "podgroups",
            self._list,
            watch,
            self._seen,
            stop,
            watch_timeout_s=self._watch_timeout,
            request_timeout_s=self._timeout,
        )

    async def _served(self, stop: asyncio.Event) -> str | None:
        """The version the API server serves PodGroups at; None when it serves none (or when
        stopped first). An API server that cannot be reached is asked again: it may be restarting."""
        failures = 0
        while not stop.is_set():
            try:
                for version in VERSIONS:
                    try:
                        await self._list_version(version)
                    except KubeApiError as error:
                        if error.not_found:
                            continue
                        raise
                    return version
                return None
            except WATCH_ERRORS as error:
                failures += 1
                delay = relist_delay(failures)
                log.warning(
                    "cannot tell whether PodGroups are served; asking again",
                    extra={"error": f"{type(error).__name__}: {error}", "retry_in_s": delay},
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        return None

    async def _list(self) -> str:
        assert self.version is not None
        return await self._list_version(self.version)

    async def _list_version(self, version: str) -> str:
        listed = await call_json(
            f"list PodGroups ({GROUP}/{version})",
            self._custom.list_cluster_custom_object(
                GROUP, version, PLURAL, _preload_content=False, _request_timeout=self._timeout
            ),
        )
        before = self._by_key
        self._by_key = {_key(g): g for g in listed.get("items") or []}
        for key, group in self._by_key.items():
            if before.get(key) != group:
                self._changed(key)
        return str((listed.get("metadata") or {}).get("resourceVersion", ""))

    async def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        if kind == "DELETED":
            self._by_key.pop(key, None)
            return
        self._by_key[key] = obj
        self._changed(key)


def _key(obj: dict[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
