"""The bridge's side of preemption: what a claim is decided with, and the evictions a decision asks.

Each claim is asked with its pods' priority and preemption policy and, when it may preempt, with
the claims that may not be preempted now: those whose pods a PodDisruptionBudget keeps (the
budgets are listed and watched in every namespace) and those whose eviction was refused a moment
ago (the budget's status may not have caught up yet).

A `ClaimPreempting` decision evicts every pod of each victim claim through the Eviction API, so a
budget that forbids it is honoured; an Event on the preemptor's pods and on each victim's pods
names the other and the reason. An eviction refused (a budget, 429) is told on the preemptor's
pods, and the preemptor is asked again with that victim protected: the allocator plans anew. A
new leader evicts again the victims of the preemptions its ledger holds, in case the one before
it died between deciding and evicting (evicting a pod already going is harmless).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, PolicyV1Api

from services.allocator.clusterview import ClusterView, key_of, uid_of
from services.allocator.gates import PodGates
from tangram.allocation.ledger import Ledger
from tangram.events import ClaimPreempting, PreemptionPolicy, PreemptionVictim
from tangram.events.ids import derived_id
from tangram.kubernetes.api import KubeApiError, call, call_json
from tangram.kubernetes.api.events import record_event
from tangram.kubernetes.api.watching import list_then_watch
from tangram.kubernetes.objects.claimbridge import ClaimRef, claim_ref, pod_claims, warning_event
from tangram.kubernetes.objects.preempting import (
    PREEMPTED_REASON,
    PREEMPTING_REASON,
    PREEMPTION_BLOCKED_REASON,
    blocked_pods,
    claim_priority,
    eviction,
    pod_name,
)
from tangram.kubernetes.objects.times import kube_time

log = logging.getLogger("tangram.allocator.kubernetes")

COMPONENT = "tangram-allocator"
# How long a refused eviction keeps its claim out of preemption plans: until the budget's status,
# watched, says the same.
REFUSED_FOR_S = 30.0


class Preemptions:
    """`retry()` asks again the claims that failed for capacity (the bridge's own retry)."""

    def __init__(
        self,
        api: Any,
        view: ClusterView,
        gates: PodGates,
        ledger: Ledger,
        retry: Callable[[], None],
        *,
        request_timeout_s: float,
        watch_timeout_s: int,
    ) -> None:
        self._core = CoreV1Api(api)
        self._policy = PolicyV1Api(api)
        self._view = view
        self._gates = gates
        self._ledger = ledger
        self._retry = retry
        self._timeout = request_timeout_s
        self._watch_timeout = watch_timeout_s
        self._budgets: dict[tuple[str, str], dict[str, Any]] = {}
        self._refused: dict[str, float] = {}  # claim uid -> when its eviction was refused (loop time)

    # --- what a claim is asked with --------------------------------------------------------------

    def rank(self, claim: dict[str, Any]) -> tuple[int, PreemptionPolicy]:
        """The claim's priority and preemption policy, from its pods."""
        return claim_priority(self._gates.pods.users_of(claim_ref(claim)))

    def protected(self) -> list[str]:
        """The claims no claim may preempt now: a budget allows their pods no disruption, or their
        eviction was refused lately."""
        now = asyncio.get_running_loop().time()
        self._refused = {uid: at for uid, at in self._refused.items() if now - at < REFUSED_FOR_S}
        protected = set(self._refused)
        blocked = blocked_pods(self._budgets.values(), self._gates.pods.by_key.values())
        for key in blocked:
            pod = self._gates.pods.by_key.get(key)
            for name in (pod_claims(pod) or []) if pod is not None else []:
                claim = self._view.claims.get((key[0], name))
                if claim is not None:
                    protected.add(uid_of(claim))
        return sorted(protected)

    # --- budgets ---------------------------------------------------------------------------------

    async def follow_budgets(self, stop: asyncio.Event) -> None:
        await list_then_watch(
            "budgets",
            self._list_budgets,
            self._policy.list_pod_disruption_budget_for_all_namespaces,
            self._budget_changed,
            stop,
            watch_timeout_s=self._watch_timeout,
            request_timeout_s=self._timeout,
        )

    async def _list_budgets(self) -> str:
        listed = await call_json(
            "list PodDisruptionBudgets",
            self._policy.list_pod_disruption_budget_for_all_namespaces(
                _preload_content=False, _request_timeout=self._timeout
            ),
        )
        self._budgets = {key_of(b): b for b in listed.get("items") or []}
        return str(listed["metadata"].get("resourceVersion", ""))

    async def _budget_changed(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._budgets.pop(key_of(obj), None)
        else:
            self._budgets[key_of(obj)] = obj

    # --- evictions -------------------------------------------------------------------------------

    async def preempt(self, decision: ClaimPreempting) -> None:
        """Evict the victims' pods, and say so on both sides."""
        preemptors = self._gates.pods.users_of(
            ClaimRef(namespace=decision.namespace, name=decision.name, uid=decision.uid)
        )
        refused = False
        for victim in decision.victims:
            for pod in self._gates.pods.users_of(
                ClaimRef(namespace=victim.namespace, name=victim.name, uid=victim.uid)
            ):
                refused |= not await self._evict(decision, victim, pod, preemptors)
        if refused:
            self._retry()

    async def resume(self) -> None:
        """After taking over: evict again the victims still holding devices of every preemption
        the ledger holds (the previous leader may have died before evicting them)."""
        for uid, reservation in sorted(self._ledger.reservations.items()):
            namespace, name = self._ledger.claims.get(uid, ("", ""))
            victims = [
                self._ledger.victim(v)
                for v in reservation.victims
                if self._ledger.fleet.allocation(v) is not None
            ]
            if victims:
                await self.preempt(
                    ClaimPreempting(
                        key=uid,
                        namespace=namespace,
                        name=name,
                        uid=uid,
                        node=reservation.node,
                        priority=reservation.priority,
                        victims=victims,
                        reason="resumed by a new leader",
                    )
                )

    async def _evict(
        self,
        decision: ClaimPreempting,
        victim: PreemptionVictim,
        pod: dict[str, Any],
        preemptors: list[dict[str, Any]],
    ) -> bool:
        """Evict one victim pod; False when the eviction was refused (a budget forbids it)."""
        metadata = pod.get("metadata") or {}
        namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
        if metadata.get("deletionTimestamp"):
            return True  # already going
        who = ", ".join(pod_name(p) for p in preemptors) or f"{decision.namespace}/{decision.name}"
        # a claim of a preempted group of pods may be on another node than the one reserved
        node = str((pod.get("spec") or {}).get("nodeName") or decision.node)
        try:
            await call(
                f"evict Pod {namespace}/{name}",
                self._core.create_namespaced_pod_eviction(
                    name, namespace, eviction(pod), _request_timeout=self._timeout
                ),
            )
        except KubeApiError as error:
            if error.not_found:
                return True
            if error.status != 429:
                raise
            self._refused[victim.uid] = asyncio.get_running_loop().time()
            log.info(
                "eviction refused by a disruption budget",
                extra={"pod": f"{namespace}/{name}", "preemptor": decision.uid},
            )
            await self._note(
                preemptors,
                PREEMPTION_BLOCKED_REASON,
                f"eviction of pod {namespace}/{name} (claim {victim.namespace}/{victim.name}, priority "
                f"{victim.priority}) on node {node} refused: {error.message or error.reason}; "
                "another preemption is planned",
                derived_id(decision.uid, decision.attempt, victim.uid, "blocked"),
                "Warning",
            )
            return False
        log.info(
            "pod evicted to preempt its claim",
            extra={"pod": f"{namespace}/{name}", "preemptor": f"{decision.namespace}/{decision.name}"},
        )
        await self._note(
            preemptors,
            PREEMPTING_REASON,
            f"preempting pod {namespace}/{name} (priority {victim.priority}) on node {node}: "
            f"its claim {victim.namespace}/{victim.name} holds devices this pod's claim "
            f"{decision.namespace}/{decision.name} (priority {decision.priority}) needs",
            derived_id(decision.uid, decision.attempt, victim.uid, name),
            "Normal",
        )
        await self._note(
            [pod],
            PREEMPTED_REASON,
            f"preempted by pod {who} (priority {decision.priority}) on node {node}: its claim "
            f"{decision.namespace}/{decision.name} needs the devices of claim {victim.namespace}/"
            f"{victim.name} (priority {victim.priority})",
            derived_id(decision.uid, decision.attempt, victim.uid, "preempted"),
            "Warning",
        )
        return True

    async def _note(
        self, pods: list[dict[str, Any]], reason: str, message: str, suffix: str, event_type: str
    ) -> None:
        now = kube_time(datetime.now(UTC))
        for pod in pods:
            event = warning_event(
                pod,
                "Pod",
                reason=reason,
                message=message,
                now=now,
                component=COMPONENT,
                suffix=suffix[:16],
                event_type=event_type,
            )
            await record_event(self._core, event, timeout_s=self._timeout)
