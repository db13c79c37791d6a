"""When a phase of `tangram bench kubernetes --synthetic-nodes` is over: every pod is bound or its
decider has declared it unplaceable, and no decider has anything left to try.

A pod is declared unplaceable by kube-scheduler with its PodScheduled condition (False,
Unschedulable) and by Tangram with a `TangramUnschedulable` Event on the pod. A declaration is not
final: a deletion may free what the pod needs, and the decider tries it again. So a phase ends
only when, besides, kube-scheduler's queues hold no pod to try (`scheduler_pending_pods` of the
active and backoff queues) and, with Tangram deciding, the allocator holds no claim in line or
asked (`tangram_allocator_kubernetes_claims`), and that stays so for IDLE_S: a deletion the
deciders have not seen yet could otherwise end the phase before they try again.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tangram.bench.kubernetes.report import PodRecord
from tangram.kubernetes.objects.claimbridge import UNSCHEDULABLE_REASON

# How long both deciders must have had nothing to try before their declarations are taken as final
IDLE_S = 5.0
POLL_S = 0.5
SCHEDULER_BUSY_QUEUES = ("active", "backoff")
ALLOCATOR_BUSY_STATES = ("waiting", "asked")

Idle = Callable[[], Awaitable[bool]]


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric in a Prometheus text exposition."""
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


async def get_text(url: str, *, token: str | None = None, ca_file: Path | None = None) -> str | None:
    """The body of a GET (a /metrics or /state endpoint); None while it does not answer."""
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file is not None else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.get(url, headers=headers, ssl=context if context is not None else True) as answer,
        ):
            return await answer.text() if answer.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


def _queues_empty(
    url: str,
    metric: str,
    label: str,
    busy: Sequence[str],
    *,
    token: str | None = None,
    ca_file: Path | None = None,
) -> Idle:
    """Whether the gauge `metric` at `url` is there and 0 for every `label` value in `busy`."""

    async def idle() -> bool:
        text = await get_text(url, token=token, ca_file=ca_file)
        if text is None:
            return False
        found = samples(text, metric)
        return bool(found) and sum(v for labels, v in found if labels.get(label) in busy) == 0

    return idle


def scheduler_idle(server: str, token: str, ca_file: Path) -> Idle:
    """Whether kube-scheduler (served at `server`) has no pod in its active or backoff queue."""
    return _queues_empty(
        f"{server}/metrics",
        "scheduler_pending_pods",
        "queue",
        SCHEDULER_BUSY_QUEUES,
        token=token,
        ca_file=ca_file,
    )


def allocator_idle(port: int) -> Idle:
    """Whether the allocator (health port `port`) holds no claim in line or asked."""
    return _queues_empty(
        f"http://127.0.0.1:{port}/metrics",
        "tangram_allocator_kubernetes_claims",
        "state",
        ALLOCATOR_BUSY_STATES,
    )


def all_idle(checks: Sequence[Idle]) -> Idle:
    async def idle() -> bool:
        return all([await check() for check in checks])

    return idle


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """kube-scheduler's declaration that the pod cannot be placed, from its PodScheduled condition."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return f"Unschedulable: {condition.get('message') or ''}".strip()
    return None


def tangram_unschedulable(event: Mapping[str, Any]) -> tuple[str, str] | None:
    """(pod name, why) of Tangram's declaration that a pod cannot be placed, from an Event."""
    involved = event.get("involvedObject") or {}
    if event.get("reason") != UNSCHEDULABLE_REASON or involved.get("kind") != "Pod":
        return None
    return str(involved.get("name", "")), f"{UNSCHEDULABLE_REASON}: {event.get('message') or ''}"


@dataclass(frozen=True)
class Settled:
    how: str  # "bound": every pod bound; "declared": the rest declared unplaceable; "limit"
    seconds: float


async def settled(
    records: Mapping[str, PodRecord],
    names: Sequence[str],
    gone: set[str],
    idle: Idle,
    *,
    limit_s: float,
) -> Settled:
    """Until every pod of `names` (but those in `gone`) is bound, or the rest are declared
    unplaceable and the deciders have stayed idle for IDLE_S; at most `limit_s`."""
    started = time.monotonic()
    idle_since: float | None = None
    while time.monotonic() - started < limit_s:
        waiting = [records[n] for n in names if n not in gone and records[n].scheduled is None]
        if not waiting:
            return Settled("bound", round(time.monotonic() - started, 1))
        if all(r.unplaceable is not None for r in waiting) and await idle():
            idle_since = time.monotonic() if idle_since is None else idle_since
            if time.monotonic() - idle_since >= IDLE_S:
                return Settled("declared", round(time.monotonic() - started, 1))
        else:
            idle_since = None
        await asyncio.sleep(POLL_S)  # looked at twice a second, not at every bind of a burst
    return Settled("limit", round(time.monotonic() - started, 1))
