"""What preemption reads of pods and budgets, and what it writes: evictions and Events (pure).

A claim's priority is the highest of the pods that use it (their `spec.priority`, which the
API server's Priority admission sets from the PriorityClass); it never preempts when any of those
pods says `preemptionPolicy: Never`. A claim is protected from preemption while a
PodDisruptionBudget that selects one of its pods allows no disruption: the Eviction API would
refuse to evict that pod, so such a claim is never planned as a victim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tangram.events import PreemptionPolicy

PREEMPTING_REASON = "TangramPreempting"
PREEMPTED_REASON = "TangramPreempted"
PREEMPTION_BLOCKED_REASON = "TangramPreemptionBlocked"


def claim_priority(pods: Iterable[Mapping[str, Any]]) -> tuple[int, PreemptionPolicy]:
    """The priority and preemption policy a claim is decided with, from the pods that use it."""
    priority = 0
    policy: PreemptionPolicy = "PreemptLowerPriority"
    seen = False
    for pod in pods:
        spec = pod.get("spec") or {}
        value = spec.get("priority")
        value = value if isinstance(value, int) and not isinstance(value, bool) else 0
        priority = value if not seen else max(priority, value)
        seen = True
        if spec.get("preemptionPolicy") == "Never":
            policy = "Never"
    return priority, policy


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a metav1.LabelSelector selects `labels`. An empty selector selects everything (as a
    policy/v1 budget's does); a malformed one selects nothing."""
    if not isinstance(selector, Mapping):
        return False
    wanted = selector.get("matchLabels") or {}
    if not isinstance(wanted, Mapping) or any(labels.get(str(k)) != v for k, v in wanted.items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        if not isinstance(expression, Mapping):
            return False
        key, operator = str(expression.get("key", "")), expression.get("operator")
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def blocked_pods(
    budgets: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> set[tuple[str, str]]:
    """(namespace, name) of the pods a PodDisruptionBudget forbids evicting now: one that selects
    them allows no disruption (`status.disruptionsAllowed` 0, or not yet computed)."""
    closed: dict[str, list[Mapping[str, Any]]] = {}
    for budget in budgets:
        status = budget.get("status") or {}
        if int(status.get("disruptionsAllowed") or 0) > 0:
            continue
        namespace = str((budget.get("metadata") or {}).get("namespace", ""))
        closed.setdefault(namespace, []).append((budget.get("spec") or {}).get("selector") or {})
    blocked: set[tuple[str, str]] = set()
    if not closed:
        return blocked
    for pod in pods:
        metadata = pod.get("metadata") or {}
        namespace = str(metadata.get("namespace", ""))
        labels = metadata.get("labels") or {}
        if any(selects(selector, labels) for selector in closed.get(namespace, ())):
            blocked.add((namespace, str(metadata.get("name", ""))))
    return blocked


def eviction(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A policy/v1 Eviction of the pod as read (only that pod: its uid is a precondition)."""
    metadata = pod.get("metadata") or {}
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": metadata.get("name", ""), "namespace": metadata.get("namespace", "")},
        "deleteOptions": {"preconditions": {"uid": metadata.get("uid", "")}},
    }


def pod_name(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
