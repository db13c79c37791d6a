"""A chaos run: claims through every service, each its own OS process, on a NATS cluster, while a
seeded scheduler injects faults; then the invariants are checked from the logs and the nodes.

This module starts the cluster, waits until it decides, lets the workload (`workload`: the claims
and the faults) run until its claims are done or the time is up, brings every server and service
back, and hands over to the checks (`checks`), which write the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from typing import Any

from tangram.bus import Bus, BusConfig
from tangram.chaos.checks import ChaosChecks
from tangram.chaos.config import ChaosConfig
from tangram.chaos.nodes import NodeView
from tangram.chaos.workload import ChaosWorkload, Observed
from tangram.demo.scenario import DemoClaim
from tangram.local.processes import LocalCluster


class ChaosRun:
    def __init__(self, cluster: LocalCluster, config: ChaosConfig) -> None:
        self.cluster = cluster
        self.config = config
        self.rng = random.Random(config.seed)  # noqa: S311 - a reproducible run, not a secret
        self.seen = Observed()
        self.nodes = NodeView(cluster, config.nodes)

    async def run(self) -> dict[str, Any]:
        started = time.monotonic()
        bus_config = BusConfig(
            servers=self.cluster.urls,
            name="chaos",
            producer="chaos",
            publish_retry_s=120.0,
            stream_replicas=self.cluster.stream_replicas,
        )
        bus = await Bus.connect(bus_config, wait_s=30)
        workload = ChaosWorkload(
            self.cluster, self.config, bus, rng=self.rng, seen=self.seen, nodes=self.nodes
        )
        subscription = await bus.nats.subscribe("tangram.>", cb=workload.on_message)
        try:
            await bus.ensure_streams()
            await self._wait_until_ready(workload)
            ready = time.monotonic()
            instances_before = {node.name: self.nodes.mig_uuids(node) for node in self.config.nodes}
            workers = [asyncio.create_task(workload.worker()) for _ in range(self.config.concurrency)]
            faults = asyncio.create_task(workload.faults())
            deadline = started + self.config.duration_limit_s
            while not all(w.done() for w in workers) and time.monotonic() < deadline:
                await asyncio.wait(workers, timeout=1.0)
            workload.ending.set()
            await faults
            await asyncio.gather(*workers)
            await workload.heal()
            driven = time.monotonic()
            checks = ChaosChecks(
                self.cluster,
                self.config,
                bus,
                seen=self.seen,
                nodes=self.nodes,
                instances_before=instances_before,
            )
            report = await checks.report(completed=workload.begun >= self.config.claims)
            report["phases_s"] = {
                "start": round(ready - started, 1),
                "claims_and_faults": round(driven - ready, 1),
                "checks": round(time.monotonic() - driven, 1),
            }
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
            await bus.close()
        report["wall_s"] = round(time.monotonic() - started, 1)
        return report

    async def _wait_until_ready(self, workload: ChaosWorkload, timeout_s: float = 90.0) -> None:
        """Every node's kubelet plugin listening and the allocator deciding (a probe claim is decided)."""
        deadline = time.monotonic() + timeout_s
        while not all(self.cluster.dra_socket(n.name).exists() for n in self.config.nodes):
            if dead := self.cluster.dead():
                raise RuntimeError("a service died at start: " + "; ".join(dead))
            if time.monotonic() > deadline:
                raise RuntimeError("the kubelet plugins did not start")
            await asyncio.sleep(0.1)
        probe = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        claim = DemoClaim("chaos", "probe", {"devices": {"requests": []}})
        await workload.request(probe, claim)
        if await workload.decision(probe, timeout_s=timeout_s) is None:
            raise RuntimeError("the allocator decided nothing")


async def chaos(config: ChaosConfig) -> tuple[dict[str, Any], LocalCluster]:
    """Start the cluster, run, check; the cluster is stopped, its folder returned for the caller."""
    cluster = LocalCluster(list(config.nodes), nats_servers=config.nats_servers)
    try:
        cluster.start()
        report = await ChaosRun(cluster, config).run()
    finally:
        codes = cluster.stop()
    report["services_exit_codes"] = codes
    return report, cluster
