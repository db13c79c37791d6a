"""Whether a pod uses Tangram's claims: its ResourceClaims and ResourceClaimTemplates, and the
DeviceClasses they name, read from the API server and judged by `tangram.kubernetes.objects.classes`.

A pod is gated when at least one of its claims is Tangram's (every request names a Tangram
DeviceClass) and still unallocated: that claim is what Tangram's allocator decides, and the
pod's other claims, if any, kube-scheduler allocates on the node Tangram chose. A claim that
mixes drivers, a claim or template that does not exist (yet), and a claim already allocated
gate nothing: kube-scheduler decides them, and Tangram adopts what it decided. DeviceClasses
are cached briefly: a pod burst reads each class once, and a class created or changed in the
cluster counts within `class_ttl_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import ResourceV1Api

from services.admission.review import Source
from tangram.kubernetes.api import KubeApiError, call_json
from tangram.kubernetes.objects.classes import is_tangram_class, requested_class_names


@dataclass(frozen=True)
class Verdict:
    gate: bool
    reason: str  # for the logs: which claim made the decision, or why nothing is gated


class ClaimLookup:
    def __init__(
        self,
        api: Any,
        *,
        request_timeout_s: float = 2.0,
        class_ttl_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resource = ResourceV1Api(api)
        self._timeout = request_timeout_s
        self._ttl = class_ttl_s
        self._clock = clock
        self._classes: dict[str, tuple[float, bool]] = {}

    async def is_tangram_class(self, name: str) -> bool:
        cached = self._classes.get(name)
        now = self._clock()
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        try:
            found = await call_json(
                f"read DeviceClass {name}",
                self._resource.read_device_class(
                    name, _preload_content=False, _request_timeout=self._timeout
                ),
            )
        except KubeApiError as error:
            if not error.not_found:
                raise
            ours = False
        else:
            ours = is_tangram_class(found)
        if len(self._classes) > 4096:  # bounded: class names come from users' claims
            self._classes.clear()
        self._classes[name] = (now, ours)
        return ours

    async def _spec(self, namespace: str, source: Source, name: str) -> tuple[dict[str, Any] | None, bool]:
        """The claim spec behind a pod's claim entry, and whether it is allocated already;
        (None, False) when the object does not exist."""
        try:
            if source == "ResourceClaim":
                claim = await call_json(
                    f"read ResourceClaim {namespace}/{name}",
                    self._resource.read_namespaced_resource_claim(
                        name, namespace, _preload_content=False, _request_timeout=self._timeout
                    ),
                )
                status = claim.get("status")
                allocated = isinstance(status, dict) and bool(status.get("allocation"))
                spec = claim.get("spec")
                return (spec if isinstance(spec, dict) else None), allocated
            template = await call_json(
                f"read ResourceClaimTemplate {namespace}/{name}",
                self._resource.read_namespaced_resource_claim_template(
                    name, namespace, _preload_content=False, _request_timeout=self._timeout
                ),
            )
        except KubeApiError as error:
            if error.not_found:
                return None, False
            raise
        outer = template.get("spec")
        spec = outer.get("spec") if isinstance(outer, dict) else None
        return (spec if isinstance(spec, dict) else None), False

    async def verdict(self, namespace: str, references: list[tuple[Source, str]]) -> Verdict:
        """Gate or not, for a pod in `namespace` whose claims come from `references`.
        KubeApiError when the API server cannot be asked (the caller lets the pod through)."""
        if not references:
            return Verdict(False, "the pod has no claims")
        reasons = []
        for source, name in references:
            spec, allocated = await self._spec(namespace, source, name)
            if spec is None:
                reasons.append(f"{source} {name} not found")
                continue
            if allocated:
                reasons.append(f"{source} {name} is allocated already")
                continue
            names = requested_class_names(spec)
            if not names:
                reasons.append(f"{source} {name} names no device class")
                continue
            ours = [await self.is_tangram_class(n) for n in dict.fromkeys(names)]
            if all(ours):
                return Verdict(True, f"{source} {name} requests only Tangram's devices")
            reasons.append(f"{source} {name} is not Tangram's" + (" (mixed drivers)" if any(ours) else ""))
        return Verdict(False, "; ".join(reasons))
