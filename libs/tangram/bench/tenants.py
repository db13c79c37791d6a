"""`tangram bench tenants`: one namespace's flood of claims beside another namespace's few, decided
by the allocator in a real Kubernetes.

A fresh control plane, Tangram's simulated nodes (an `hgx-h200` and an `l40s-8`) and the allocator
in its Kubernetes mode. Every claim is a ResourceClaim used by one pod that carries Tangram's
scheduling gate (as admission adds it), so the allocator decides it. Two phases, in one run:

- alone: the quiet namespace creates `--quiet` claims one after another, each created once the
  one before is allocated: a MIG 1g.18gb slice of an H200, which always fits;
- flood: the flood namespace creates `--flood` claims at once, each for one whole L40S: the first
  eight are allocated, every other one fails for want of capacity (a decision, and a Warning Event
  on the claim and its pod), and stays pending. The allocator is held still (SIGSTOP) while the
  flood is created, so that the flood waits as one burst however fast the allocator would keep
  up with its creation; once it is let go, and while it works through the flood, the quiet
  namespace creates the same quiet claims again.

The flood asks for other hardware than the quiet claims, so the quiet claims never wait for
capacity, only for the allocator's attention: their latency under the flood against alone is what
asking fairly across namespaces (`services.allocator.asking`) is about. Quiet claims stay allocated
to the end (the alone phase's too), so nothing is released while the flood waits: each flood claim
is decided once.

A quiet claim's latency runs from just before its creation to its `status.allocation` seen in
the API server. Flood decisions are counted from the allocator's decisions on the bus
(`ClaimAllocated`, `ClaimFailed`), on the same clock.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram import DRIVER_NAME
from tangram.bench.kubesim import BenchError, control_plane, simulated_nodes
from tangram.bench.traces import GPU_CLASS, ClaimShape, claim_spec
from tangram.bus import Bus, BusConfig
from tangram.events import CLAIMS_STREAM, ClaimAllocated, ClaimFailed, Event
from tangram.kubernetes.api import KubeApiError, call, call_json
from tangram.kubernetes.api.watching import list_then_watch
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlaneError
from tangram.stats import percentiles

NODES = (("hgx-h200-0", "hgx-h200"), ("l40s-8-1", "l40s-8"))
QUIET_SHAPE = ClaimShape("mig", compute=1, slices=1)  # a 1g.18gb slice: 56 on the H200 node
FLOOD_PRODUCT = "NVIDIA L40S"  # eight on the L40S node
MAX_QUIET = 28  # both phases' quiet claims are held at once on the H200's 56 slices
MAX_FLOOD = 20_000
CREATE_CONCURRENCY = 16  # flood objects being created at once
QUIET_WAIT_S = 300.0  # a quiet claim not allocated by then counts as not allocated
DRAIN_WAIT_S = 600.0
DECISION_SUBJECTS = ("tangram.claim.allocated.>", "tangram.claim.failed.>")


# --- the objects (pure) --------------------------------------------------------------------------


def quiet_claim_spec(driver: str = DRIVER_NAME) -> dict[str, Any]:
    return claim_spec(QUIET_SHAPE, driver)


def flood_claim_spec(driver: str = DRIVER_NAME) -> dict[str, Any]:
    """One whole GPU of the flood's product: the L40S node holds eight."""
    expression = f'device.attributes["{driver}"].productName == "{FLOOD_PRODUCT}"'
    exactly = {"deviceClassName": GPU_CLASS, "selectors": [{"cel": {"expression": expression}}]}
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def claim_manifest(name: str, namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": dict(spec),
    }


def pod_manifest(name: str, namespace: str, claim: str) -> dict[str, Any]:
    """A pod using the claim, held by Tangram's gate: the allocator decides the claim for it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


# --- what a run saw, and what it reports (pure) --------------------------------------------------


@dataclass
class QuietRecord:
    """One quiet claim; times are seconds on the run's monotonic clock."""

    name: str
    created: float
    flood_backlog: int = 0  # flood claims created and not yet decided when it was created
    allocated: float | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.allocated is None else self.allocated - self.created


@dataclass
class FloodTally:
    """The flood's claims: how many were created, and each decision the allocator made about them."""

    created: int = 0
    decisions: list[float] = field(default_factory=list)  # every decision's time, in order
    first_decision: dict[str, float] = field(default_factory=dict)  # uid -> its first decision
    last_outcome: dict[str, str] = field(default_factory=dict)  # uid -> "allocated" | "failed"

    def decided(self, uid: str, outcome: str, now: float) -> None:
        self.decisions.append(now)
        self.first_decision.setdefault(uid, now)
        self.last_outcome[uid] = outcome

    @property
    def backlog(self) -> int:
        return max(0, self.created - len(self.first_decision))

    def decisions_between(self, start: float, end: float) -> int:
        """Decisions made after `start`, up to and including `end`."""
        return bisect.bisect_right(self.decisions, end) - bisect.bisect_right(self.decisions, start)

    def claims_decided_by(self, when: float) -> int:
        return sum(t <= when for t in self.first_decision.values())


def latency(records: Sequence[QuietRecord]) -> dict[str, float | None]:
    """p50, p99 and max of the allocated claims' latencies, in ms (None when none was allocated)."""
    samples = sorted(r.latency_s * 1000 for r in records if r.latency_s is not None)
    if not samples:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {**percentiles(samples), "max_ms": round(samples[-1], 3)}


def quiet_report(
    records: Sequence[QuietRecord], *, loadavg: Sequence[float], phase_s: float
) -> dict[str, Any]:
    return {
        "quiet_claims": len(records),
        "quiet_allocated": sum(r.allocated is not None for r in records),
        "quiet_latency": latency(records),
        "phase_s": round(phase_s, 3),
        "loadavg": [round(x, 2) for x in loadavg],
    }


def flood_report(
    records: Sequence[QuietRecord],
    flood: FloodTally,
    *,
    flood_claims: int,
    started: float,
    created_at: float,
    ended: float,
    loadavg: Sequence[float],
) -> dict[str, Any]:
    """The flood phase: the quiet claims' figures, and what the flood did around them. `started`
    is when the flood's creation began, `created_at` when it was all created, `ended` when the
    phase stopped waiting for the flood to drain."""
    report = quiet_report(records, loadavg=loadavg, phase_s=ended - started)
    allocated = [r for r in records if r.allocated is not None]
    quiet_done = max((r.allocated for r in allocated if r.allocated is not None), default=None)
    waited = [flood.decisions_between(r.created, r.allocated) for r in allocated if r.allocated is not None]
    drained = len(flood.first_decision) >= flood_claims
    last = max(flood.first_decision.values(), default=None)
    span = (flood.decisions[-1] - flood.decisions[0]) if len(flood.decisions) > 1 else 0.0
    outcomes = list(flood.last_outcome.values())
    report.update(
        {
            "flood_claims": flood_claims,
            "flood_create_s": round(created_at - started, 3),
            "flood_backlog_at_quiet_start": records[0].flood_backlog if records else None,
            "flood_backlog_per_quiet_claim": [r.flood_backlog for r in records],
            # Flood decisions made while each quiet claim waited (created -> allocated).
            "flood_decisions_while_quiet_waited": {
                "max": max(waited, default=None),
                "mean": round(sum(waited) / len(waited), 2) if waited else None,
            },
            "flood_decisions_during_quiet": (
                flood.decisions_between(records[0].created, quiet_done)
                if records and quiet_done is not None
                else None
            ),
            "flood_claims_decided_when_quiet_done": (
                None if quiet_done is None else flood.claims_decided_by(quiet_done)
            ),
            "flood_decisions": len(flood.decisions),
            "flood_claims_decided": len(flood.first_decision),
            "flood_allocated": outcomes.count("allocated"),
            "flood_failed": outcomes.count("failed"),
            "flood_decisions_per_s": round((len(flood.decisions) - 1) / span, 2) if span > 0 else None,
            "quiet_done_s": None if quiet_done is None else round(quiet_done - started, 3),
            "flood_drained_s": round(last - started, 3) if drained and last is not None else None,
        }
    )
    return report


def ratios(under_flood: Mapping[str, Any], alone: Mapping[str, Any]) -> dict[str, float | None]:
    """Quiet latency under the flood over alone, per figure; None where either is missing or 0."""
    out: dict[str, float | None] = {}
    for key in ("p50_ms", "p99_ms", "max_ms"):
        a, b = under_flood["quiet_latency"][key], alone["quiet_latency"][key]
        out[key] = round(a / b, 3) if a is not None and b else None
    return out


# --- one run against the real control plane ------------------------------------------------------


class _Tenants:
    """The run's two namespaces: the quiet claims seen allocated, the flood's decisions on the bus."""

    def __init__(self, api: Any, quiet_ns: str, flood_ns: str) -> None:
        self.core, self.resource = CoreV1Api(api), ResourceV1Api(api)
        self.quiet_ns, self.flood_ns = quiet_ns, flood_ns
        self.allocated: dict[str, float] = {}  # quiet claim name -> first seen allocated
        self.changed = asyncio.Event()
        self.flood = FloodTally()

    # The quiet claims, as the API server holds them.

    async def _relist(self) -> str:
        listed = await call_json(
            "list quiet claims",
            self.resource.list_namespaced_resource_claim(self.quiet_ns, _preload_content=False),
        )
        for claim in listed.get("items") or []:
            self._seen(claim)
        return str(listed["metadata"].get("resourceVersion", ""))

    async def _changed(self, kind: str, claim: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._seen(claim)

    def _seen(self, claim: dict[str, Any]) -> None:
        name = str(claim["metadata"]["name"])
        if name not in self.allocated and (claim.get("status") or {}).get("allocation"):
            self.allocated[name] = asyncio.get_running_loop().time()
            self.changed.set()

    async def watch_quiet(self, stop: asyncio.Event) -> None:
        await list_then_watch(
            "quiet claims",
            self._relist,
            functools.partial(self.resource.list_namespaced_resource_claim, self.quiet_ns),
            self._changed,
            stop,
            watch_timeout_s=300,
            request_timeout_s=30.0,
        )

    # The flood's decisions, as the allocator publishes them.

    def decision(self, event: Event) -> None:
        if isinstance(event, ClaimAllocated | ClaimFailed) and event.namespace == self.flood_ns:
            outcome = "allocated" if isinstance(event, ClaimAllocated) else "failed"
            self.flood.decided(event.uid, outcome, asyncio.get_running_loop().time())
            self.changed.set()

    # Creating claims.

    async def create(self, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
        await call_json(
            f"create ResourceClaim {namespace}/{name}",
            self.resource.create_namespaced_resource_claim(
                namespace, claim_manifest(name, namespace, spec), _preload_content=False
            ),
        )
        await call_json(
            f"create Pod {namespace}/{name}",
            self.core.create_namespaced_pod(
                namespace, pod_manifest(name, namespace, name), _preload_content=False
            ),
        )

    async def quiet(self, names: Sequence[str]) -> list[QuietRecord]:
        """The quiet claims one after another, each once the one before is allocated."""
        loop = asyncio.get_running_loop()
        records = []
        for name in names:
            record = QuietRecord(name=name, created=loop.time(), flood_backlog=self.flood.backlog)
            records.append(record)
            await self.create(self.quiet_ns, name, quiet_claim_spec())
            deadline = record.created + QUIET_WAIT_S
            while name not in self.allocated and loop.time() < deadline:
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 1.0)
            record.allocated = self.allocated.get(name)
        return records

    async def flood_all(self, count: int) -> None:
        """`count` flood claims (and their pods), CREATE_CONCURRENCY at a time."""
        names = iter(f"flood-{n}" for n in range(count))
        spec = flood_claim_spec()

        async def worker() -> None:
            for name in names:
                await self.create(self.flood_ns, name, spec)
                self.flood.created += 1

        await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))

    async def drained(self, count: int, limit_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while len(self.flood.first_decision) < count and loop.time() < deadline:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0)


async def run_tenants(
    api: Any,
    kubeconfig: Path,
    *,
    flood: int,
    quiet: int,
    prefix: str = "",
    drain_wait_s: float = DRAIN_WAIT_S,
    cleanup: bool = True,
) -> dict[str, Any]:
    """Both phases on fresh simulated nodes (named with `prefix`) against the control plane `api`
    talks to; the report. With `cleanup` false the namespaces are left for inspection."""
    nodes = [(prefix + name, machine) for name, machine in NODES]
    tenants = _Tenants(api, f"{prefix}quiet", f"{prefix}flood")
    core = tenants.core
    for namespace in (tenants.quiet_ns, tenants.flood_ns):
        await call(f"create namespace {namespace}", core.create_namespace({"metadata": {"name": namespace}}))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        async with simulated_nodes(
            api,
            kubeconfig,
            nodes,
            allocator_args=("--kubernetes", "--kubeconfig", str(kubeconfig)),
            cleanup=cleanup,
            benchmark="tenants",
        ) as cluster:
            bus = await Bus.connect(
                BusConfig(servers=cluster.urls, name="bench-tenants", producer="bench-tenants"), wait_s=30
            )
            try:
                tasks.append(asyncio.create_task(tenants.watch_quiet(stop)))
                tasks.append(
                    asyncio.create_task(
                        bus.follow(CLAIMS_STREAM, DECISION_SUBJECTS, tenants.decision, stop=stop)
                    )
                )
                started = loop.time()
                alone = await tenants.quiet([f"alone-{n}" for n in range(quiet)])
                alone_report = quiet_report(alone, loadavg=os.getloadavg(), phase_s=loop.time() - started)

                started = loop.time()
                # The flood arrives as one burst, however fast the allocator keeps up with its
                # creation: held still while it is created, the allocator finds it all waiting.
                with cluster.frozen("allocator"):
                    await tenants.flood_all(flood)
                created_at = loop.time()
                under = await tenants.quiet([f"flood-phase-{n}" for n in range(quiet)])
                await tenants.drained(flood, drain_wait_s)
                flood_phase = flood_report(
                    under,
                    tenants.flood,
                    flood_claims=flood,
                    started=started,
                    created_at=created_at,
                    ended=loop.time(),
                    loadavg=os.getloadavg(),
                )
            finally:
                stop.set()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await bus.close()
    finally:
        if cleanup:
            for namespace in (tenants.quiet_ns, tenants.flood_ns):
                with contextlib.suppress(KubeApiError):
                    await call(f"delete namespace {namespace}", core.delete_namespace(namespace))
    return {
        "benchmark": "tenants",
        "nodes": dict(nodes),
        "flood": flood,
        "quiet": quiet,
        "cpus": os.cpu_count(),
        "alone": alone_report,
        "under_flood": flood_phase,
        "under_flood_over_alone": ratios(flood_phase, alone_report),
        "quiet_claims": [
            {"claim": r.name, "latency_ms": None if r.latency_s is None else round(r.latency_s * 1000, 3)}
            for r in [*alone, *under]
        ],
    }


# --- the command ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--flood", type=int, default=5000, help="claims the flood namespace creates at once")
    parser.add_argument(
        "--quiet",
        type=int,
        default=20,
        help=f"claims the quiet namespace creates in each phase (at most {MAX_QUIET})",
    )
    parser.add_argument(
        "--drain-wait",
        type=float,
        default=DRAIN_WAIT_S,
        help="seconds to wait, after the quiet claims, for every flood claim to be decided",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    if not 1 <= args.flood <= MAX_FLOOD or not 1 <= args.quiet <= MAX_QUIET or args.drain_wait < 0:
        raise BenchError(f"--flood in [1, {MAX_FLOOD}], --quiet in [1, {MAX_QUIET}], --drain-wait >= 0")
    async with control_plane() as (plane, api):
        return await run_tenants(
            api, plane.kubeconfig, flood=args.flood, quiet=args.quiet, drain_wait_s=args.drain_wait
        )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def table(result: Mapping[str, Any]) -> str:
    alone, under, ratio = result["alone"], result["under_flood"], result["under_flood_over_alone"]
    rows = [["", "alone", "under the flood", "ratio"]]
    rows.append(
        [
            "quiet claims allocated",
            f"{alone['quiet_allocated']}/{alone['quiet_claims']}",
            f"{under['quiet_allocated']}/{under['quiet_claims']}",
            "",
        ]
    )
    for key in ("p50_ms", "p99_ms", "max_ms"):
        rows.append(
            [
                f"quiet latency {key[:-3]} ms",
                _cell(alone["quiet_latency"][key]),
                _cell(under["quiet_latency"][key]),
                _cell(ratio[key]),
            ]
        )
    rows.append(
        [
            "load average (1, 5, 15 min)",
            " ".join(map(_cell, alone["loadavg"])),
            " ".join(map(_cell, under["loadavg"])),
            "",
        ]
    )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    out = [
        f"tangram bench tenants: {result['flood']} flood claims beside {result['quiet']} quiet claims on "
        + ", ".join(f"{n} ({m})" for n, m in result["nodes"].items())
    ]
    out += [
        "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))
        for row in rows
    ]
    waited = under["flood_decisions_while_quiet_waited"]
    out += [
        f"flood created in {_cell(under['flood_create_s'])} s; "
        f"{_cell(under['flood_backlog_at_quiet_start'])} flood claims waiting when the quiet ones began",
        f"flood decisions while the quiet claims were made: {_cell(under['flood_decisions_during_quiet'])}"
        f" (at most {_cell(waited['max'])} while one quiet claim waited)",
        f"flood claims decided: {under['flood_claims_decided']}/{under['flood_claims']}"
        f" ({under['flood_allocated']} allocated, {under['flood_failed']} failed),"
        f" {_cell(under['flood_decisions_per_s'])} decisions/s",
        f"quiet claims done at {_cell(under['quiet_done_s'])} s, flood drained at"
        f" {_cell(under['flood_drained_s'])} s (from the flood's start)",
    ]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("tangram.kubernetes.api").setLevel(logging.ERROR)
    try:
        result = asyncio.run(bench(args))
    except (BenchError, ControlPlaneError, KubeApiError, OSError) as error:
        print(f"tangram bench tenants: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else table(result))
    return 0
