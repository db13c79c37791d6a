"""`tangram bench gangs`: multi-pod jobs on GB200 NVL racks and HGX H200 nodes, placed by Tangram
as whole groups against a pod-at-a-time first-fit, over the same seeded trace in simulated time.

The fleet: `--racks` GB200 NVL72 racks (18 trays of 4 GPUs, one NVLink fabric clique per rack) and
`--hgx` HGX H200 nodes (8 GPUs on NVSwitch). The trace: jobs of 2-16 pods of 4 or 8 GPUs each
(pods of 4 GPUs on one tray's worth, some jobs asking for one NVLink domain), mixed with single-pod
claims of 1-8 GPUs, arriving as a Poisson stream and each running for an exponential time once all
its pods run; offered load is `--load` times the fleet's GPUs.

Deciders, each with its own allocator state (`Ledger`, pure, no I/O) over the same trace:

- `tangram`: a job's claims carry its group (and its NVLink domain); the allocator places the whole
  group in one decision or none of it. A job that does not fit waits holding nothing and is asked
  again, in arrival order, whenever capacity is freed.
- `first-fit-pods`: what a pod-at-a-time scheduler does (kube-scheduler's DRA allocator is
  first-fit): each pod's claim is placed alone, first fit, as it arrives; pods that do not fit wait
  in arrival order. A job runs once its last pod is placed; its placed pods hold their GPUs idle
  until then, and a job that never completes holds them for ever (a deadlock).

What is reported per decider: jobs started (and single claims admitted), GPU-hours held idle by
partly placed jobs, deadlocked jobs (partly placed when nothing more can depart), time from a
job's arrival to all of its pods running (p50/p99/max, simulated minutes), NVLink-domain jobs
whose pods do not share one fabric clique (they run without NVLink between trays), and clique
fragmentation (the time-averaged share of the racks' free GPUs on trays a claim already uses, where
no 4-GPU domain pod fits). Ratios compare Tangram with the baseline; `--kubernetes` adds
kube-scheduler alone on the real control plane (`tangram.bench.gangkube`).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import random
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.allocation.model import Policy
from tangram.bench.traces import ClaimShape, claim_spec, machine_hardware, shipped_classes
from tangram.events import (
    ClaimAllocated,
    ClaimReleased,
    ClaimRequested,
    GangMember,
    NodeHardware,
    NodeInventory,
    subject_token,
)
from tangram.events.inventory import renamed_machine
from tangram.stats import percentile

TRAYS_PER_RACK = 18
# A job's pods are created one after another, as a controller makes them: two jobs that arrive
# together have their pods interleaved, as they are in a cluster.
POD_GAP_MINUTES = 0.05
DECIDERS = ("tangram", "first-fit-pods")
NAMESPACE = "bench"
# (pods, GPUs per pod, one NVLink domain, weight): jobs. Pods of 8 GPUs fit only HGX nodes; pods of
# 4 fit a tray or half an HGX node; a domain job's pods must all be on one rack.
JOB_MIX: tuple[tuple[int, int, bool, float], ...] = (
    (2, 4, True, 0.10),
    (4, 4, True, 0.10),
    (8, 4, True, 0.06),
    (16, 4, True, 0.03),
    (2, 4, False, 0.08),
    (4, 4, False, 0.06),
    (2, 8, False, 0.06),
    (4, 8, False, 0.03),
)
# (GPUs, weight): single-pod claims beside the jobs.
SINGLE_MIX: tuple[tuple[int, float], ...] = ((1, 0.24), (2, 0.12), (4, 0.08), (8, 0.04))


@dataclass(frozen=True, slots=True)
class Job:
    """A job of `pods` pods of `gpus` GPUs each (a single-pod claim is a job of one pod, no group)."""

    name: str
    pods: int
    gpus: int
    domain: bool
    arrival: float  # simulated minutes
    duration: float  # minutes it runs once all its pods run

    @property
    def grouped(self) -> bool:
        return self.pods > 1

    def uid(self, pod: int) -> str:
        number = int(self.name.rsplit("-", 1)[-1])
        return f"00000000-0000-4000-8000-{number:07d}{pod:05d}"


def gang_trace(seed: int, fleet_gpus: int, *, jobs: int, load: float, mean_minutes: float) -> list[Job]:
    """`jobs` arrivals (jobs and single-pod claims), offered at `load` times the fleet's GPUs."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible trace, not a secret
    shapes: list[tuple[int, int, bool]] = [(p, g, d) for p, g, d, _ in JOB_MIX] + [
        (1, g, False) for g, _ in SINGLE_MIX
    ]
    weights = [w for *_, w in JOB_MIX] + [w for _, w in SINGLE_MIX]
    mean_gpus = sum(p * g * w for (p, g, _), w in zip(shapes, weights, strict=True)) / sum(weights)
    # Little's law: GPUs busy = arrival rate x mean GPUs x mean duration
    rate = load * fleet_gpus / (mean_gpus * mean_minutes)
    now = 0.0
    trace = []
    for n in range(jobs):
        now += rng.expovariate(rate)
        pods, gpus, domain = rng.choices(shapes, weights)[0]
        kind = "job" if pods > 1 else "claim"
        trace.append(
            Job(
                name=f"{kind}-{n}",
                pods=pods,
                gpus=gpus,
                domain=domain,
                arrival=now,
                duration=rng.expovariate(1.0 / mean_minutes),
            )
        )
    return trace


def gang_fleet(racks: int, hgx: int, *, trays: int = TRAYS_PER_RACK, prefix: str = "") -> list[NodeHardware]:
    """`racks` GB200 NVL racks of `trays` trays (a clique each) and `hgx` HGX H200 nodes."""
    tray = machine_hardware("gb200-tray")
    nodes = []
    for rack in range(racks):
        for n in range(trays):
            hw = renamed_machine(tray, f"{prefix}rack{rack}-tray{n}")
            clique = f"00000000-0000-4000-8000-{rack:012d}.1"
            nodes.append(
                msgspec.structs.replace(
                    hw, gpus=[msgspec.structs.replace(g, clique_id=clique) for g in hw.gpus]
                )
            )
    hgx_template = machine_hardware("hgx-h200")
    nodes.extend(renamed_machine(hgx_template, f"{prefix}hgx-{n}") for n in range(hgx))
    return nodes


@dataclass
class _Holding:
    """A job's pods placed so far: node per pod, and since when each holds its GPUs."""

    nodes: dict[int, str] = field(default_factory=dict)
    since: dict[int, float] = field(default_factory=dict)


@dataclass
class Outcome:
    decider: str
    jobs: int = 0
    singles: int = 0
    jobs_started: int = 0
    singles_started: int = 0
    idle_gpu_minutes: float = 0.0
    deadlocked_jobs: int = 0  # partly placed for ever, though the job alone fits the fleet
    deadlocked_gpus: int = 0
    never_fitting_jobs_holding: int = 0  # partly placed for ever: the fleet can never hold all of it
    domain_jobs_split: int = 0
    waits: list[float] = field(default_factory=list)  # minutes from arrival to all pods running, jobs
    fragmentation: list[tuple[float, float]] = field(default_factory=list)  # (duration, share) samples
    decisions: int = 0
    decide_s: float = 0.0

    def report(self) -> dict[str, Any]:
        waits = sorted(self.waits)
        weight = sum(d for d, _ in self.fragmentation)
        return {
            "jobs": self.jobs,
            "jobs_started": self.jobs_started,
            "single_claims": self.singles,
            "single_claims_started": self.singles_started,
            "idle_gpu_hours_partly_placed": round(self.idle_gpu_minutes / 60.0, 2),
            "deadlocked_jobs": self.deadlocked_jobs,
            "gpus_held_by_deadlocked_jobs": self.deadlocked_gpus,
            "never_fitting_jobs_holding_gpus": self.never_fitting_jobs_holding,
            "domain_jobs_split_across_cliques": self.domain_jobs_split,
            "job_minutes_to_all_running": {
                "p50": round(percentile(waits, 0.5), 2) if waits else None,
                "p99": round(percentile(waits, 0.99), 2) if waits else None,
                "max": round(waits[-1], 2) if waits else None,
            },
            # no samples (a run in Kubernetes does not follow the trays' use): None, never 0
            "clique_fragmentation": round(sum(d * s for d, s in self.fragmentation) / weight, 4)
            if weight
            else None,
            "decisions": self.decisions,
            "decide_ms_mean": round(self.decide_s * 1000 / self.decisions, 3) if self.decisions else None,
        }


class _Simulation:
    """One decider over the trace, in simulated time; the allocator's ledger decides."""

    def __init__(self, decider: str, fleet: list[NodeHardware], trace: list[Job]) -> None:
        self.decider = decider
        policy: Policy = "tangram" if decider == "tangram" else "first-fit"
        self.ledger = Ledger(fleet=FleetState(), classes=shipped_classes(), policy=policy)
        for hw in fleet:
            self.ledger.apply(NodeInventory(key=subject_token(hw.node), hardware=hw), live=False)
        self.rack_of = {hw.node: hw.gpus[0].clique_id for hw in fleet if hw.gpus and hw.gpus[0].clique_id}
        self.tray_gpus = {hw.node: len(hw.gpus) for hw in fleet if hw.node in self.rack_of}
        self.trace = trace
        self.fleet = fleet
        self.outcome = Outcome(decider)
        self.attempts: dict[str, int] = {}
        self.holding: dict[str, _Holding] = {}
        self.waiting: list[tuple[Job, int]] = []  # (job, pod) pods waiting, or (job, -1) whole jobs
        # (time, order, "arrive" | "depart", (job, pod)): a pod created, or a job ended (pod -1)
        self.events: list[tuple[float, int, str, tuple[Job, int]]] = []
        self.now = 0.0
        self.used_on: dict[str, int] = {}  # node -> GPUs held there
        self.running: set[str] = set()  # jobs whose pods all run
        self.by_name = {job.name: job for job in trace}

    # --- asking the ledger --------------------------------------------------------------------------

    def _request(self, job: Job, pod: int) -> ClaimRequested:
        uid = job.uid(pod)
        attempt = self.attempts.get(uid, -1) + 1
        self.attempts[uid] = attempt
        spec = claim_spec(ClaimShape("gpu", job.gpus, nvlink=job.gpus > 1))
        gang = (
            GangMember(group=job.name, size=job.pods, pod=f"{job.name}-{pod}", nvlink_domain=job.domain)
            if job.grouped and self.decider == "tangram"
            else None
        )
        return ClaimRequested(
            key=uid,
            namespace=NAMESPACE,
            name=f"{job.name}-{pod}",
            uid=uid,
            spec=spec,
            attempt=attempt,
            gang=gang,
        )

    def _ask(self, job: Job, pod: int) -> list[tuple[int, str]]:
        """Ask for the pod's claim; the (pod, node) of every claim of the job allocated by it."""
        started = time.perf_counter()
        outputs = self.ledger.apply(self._request(job, pod))
        self.outcome.decide_s += time.perf_counter() - started
        self.outcome.decisions += 1
        prefix = job.uid(0)[:-5]
        return [
            (int(o.uid[-5:]), o.node)
            for o in outputs
            if isinstance(o, ClaimAllocated) and o.uid.startswith(prefix)
        ]

    # --- the run ------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        order = 0
        for job in self.trace:
            for pod in range(job.pods):
                order += 1
                heapq.heappush(
                    self.events, (job.arrival + pod * POD_GAP_MINUTES, order, "arrive", (job, pod))
                )
            if job.grouped:
                self.outcome.jobs += 1
            else:
                self.outcome.singles += 1
        while self.events:
            at, _, what, (job, pod) = heapq.heappop(self.events)
            self._advance(at)
            if what == "arrive":
                self._arrive(job, pod)
            else:
                self._depart(job)
                self._retry()
            for started in self._started_now():
                order += 1
                heapq.heappush(self.events, (self.now + started.duration, order, "depart", (started, -1)))
        self._end()
        return self.outcome

    def _advance(self, at: float) -> None:
        elapsed = at - self.now
        if elapsed > 0:
            for name, held in self.holding.items():
                job = self._job(name)
                if job.grouped and len(held.nodes) < job.pods:
                    self.outcome.idle_gpu_minutes += elapsed * len(held.nodes) * job.gpus
            self.outcome.fragmentation.append((elapsed, self._fragmentation()))
        self.now = at

    def _arrive(self, job: Job, pod: int) -> None:
        """A pod is created: its claim asked (for Tangram, its group placed with its last pod)."""
        self.holding.setdefault(job.name, _Holding())
        placed = self._ask(job, pod)
        if placed:
            self._hold(job, placed)
        elif self.decider == "tangram" and job.grouped:
            if pod == job.pods - 1:
                self.waiting.append((job, -1))  # the group did not fit: it waits whole
        else:
            self.waiting.append((job, pod))

    def _retry(self) -> None:
        """Waiting pods (or whole jobs) asked again in arrival order, once capacity was freed."""
        still: list[tuple[Job, int]] = []
        for job, pod in self.waiting:
            placed = self._ask(job, 0 if pod < 0 else pod)
            if placed:
                self._hold(job, placed)
            else:
                still.append((job, pod))
        self.waiting = still

    def _hold(self, job: Job, placed: Iterable[tuple[int, str]]) -> None:
        held = self.holding[job.name]
        for pod, node in placed:
            held.nodes[pod] = node
            held.since[pod] = self.now
            self.used_on[node] = self.used_on.get(node, 0) + job.gpus

    def _started_now(self) -> list[Job]:
        started = []
        for name, held in list(self.holding.items()):
            job = self._job(name)
            if len(held.nodes) == job.pods and name not in self.running:
                self.running.add(name)
                started.append(job)
                if job.grouped:
                    self.outcome.jobs_started += 1
                    self.outcome.waits.append(self.now - job.arrival)
                    if job.domain and not self._in_one_clique(held.nodes.values()):
                        self.outcome.domain_jobs_split += 1
                else:
                    self.outcome.singles_started += 1
        return started

    def _depart(self, job: Job) -> None:
        held = self.holding.pop(job.name)
        self.running.discard(job.name)
        for pod, node in held.nodes.items():
            uid = job.uid(pod)
            self.ledger.apply(ClaimReleased(key=uid, namespace=NAMESPACE, name=f"{job.name}-{pod}", uid=uid))
            self.used_on[node] -= job.gpus

    def _end(self) -> None:
        """Nothing departs any more: what is still partly placed waits for ever."""
        stuck = [
            (job, len(held.nodes))
            for name, held in self.holding.items()
            if held.nodes and len(held.nodes) < (job := self._job(name)).pods
        ]
        settle_stuck(self.outcome, stuck, self.fleet)

    def _fragmentation(self) -> float:
        """The racks' free GPUs on trays partly used, over all the racks' free GPUs."""
        free = partly = 0
        for node, size in self.tray_gpus.items():
            left = size - self.used_on.get(node, 0)
            free += left
            if 0 < left < size:
                partly += left
        return partly / free if free else 0.0

    def _in_one_clique(self, nodes: Iterable[str]) -> bool:
        cliques = {self.rack_of.get(node) for node in nodes}
        return len(cliques) == 1 and None not in cliques

    def _job(self, name: str) -> Job:
        return self.by_name[name]


def settle_stuck(outcome: Outcome, stuck: list[tuple[Job, int]], fleet: list[NodeHardware]) -> None:
    """Jobs partly placed for ever (`(job, pods placed)`): deadlocked when the job alone fits the
    empty fleet (others hold what it waits for), else jobs the fleet can never hold whole."""
    fits: dict[tuple[int, int], bool] = {}
    for job, placed in stuck:
        key = (job.pods, job.gpus)
        if key not in fits:
            fits[key] = fits_empty_fleet(fleet, job)
        if fits[key]:
            outcome.deadlocked_jobs += 1
            outcome.deadlocked_gpus += placed * job.gpus
        else:
            outcome.never_fitting_jobs_holding += 1


def fits_empty_fleet(fleet: list[NodeHardware], job: Job) -> bool:
    """Whether all the job's pods fit the fleet at once with nothing else on it."""
    alone = Job(name="job-0", pods=job.pods, gpus=job.gpus, domain=False, arrival=0.0, duration=1.0)
    simulation = _Simulation("tangram", fleet, [alone])
    return any(simulation._ask(alone, pod) for pod in range(alone.pods))


def simulate(decider: str, fleet: list[NodeHardware], trace: list[Job]) -> dict[str, Any]:
    started = time.perf_counter()
    outcome = _Simulation(decider, fleet, trace).run()
    return {**outcome.report(), "wall_s": round(time.perf_counter() - started, 2)}


def ratios(tangram: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    def ratio(key: str) -> float | None:
        return round(tangram[key] / baseline[key], 3) if baseline[key] and tangram[key] is not None else None

    return {
        "jobs_started": ratio("jobs_started"),
        "single_claims_started": ratio("single_claims_started"),
        "idle_gpu_hours_partly_placed": ratio("idle_gpu_hours_partly_placed"),
        "deadlocked_jobs": ratio("deadlocked_jobs"),
        "job_minutes_to_all_running_p50": _quantile_ratio(tangram, baseline, "p50"),
        "job_minutes_to_all_running_p99": _quantile_ratio(tangram, baseline, "p99"),
        "clique_fragmentation": ratio("clique_fragmentation"),
    }


def _quantile_ratio(tangram: dict[str, Any], baseline: dict[str, Any], q: str) -> float | None:
    ours, theirs = tangram["job_minutes_to_all_running"][q], baseline["job_minutes_to_all_running"][q]
    return round(ours / theirs, 3) if ours is not None and theirs else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--racks", type=int, default=2, help="GB200 NVL72 racks (18 trays of 4 GPUs each)")
    parser.add_argument("--hgx", type=int, default=8, help="HGX H200 nodes (8 GPUs each)")
    parser.add_argument("--jobs", type=int, default=400, help="arrivals: jobs and single-pod claims")
    parser.add_argument("--load", type=float, default=1.2, help="offered load, in times the fleet's GPUs")
    parser.add_argument("--minutes", type=float, default=60.0, help="mean run time of a job, in minutes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="also run a shorter trace on the real control plane: kube-scheduler alone, and Tangram deciding",
    )
    parser.add_argument("--kube-jobs", type=int, default=40, help="with --kubernetes: arrivals of its trace")
    parser.add_argument(
        "--seconds-per-minute",
        type=float,
        default=1.0,
        help="with --kubernetes: real seconds per simulated minute",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=15.0,
        help="with --kubernetes: seconds with nothing bound that end a run",
    )


def bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.racks < 0 or args.hgx < 0 or args.racks + args.hgx == 0:
        raise ValueError("the fleet needs at least one rack or HGX node")
    if args.jobs < 1 or args.load <= 0 or args.minutes <= 0:
        raise ValueError("--jobs, --load and --minutes must be positive")
    fleet = gang_fleet(args.racks, args.hgx)
    gpus = sum(len(hw.gpus) for hw in fleet)
    trace = gang_trace(args.seed, gpus, jobs=args.jobs, load=args.load, mean_minutes=args.minutes)
    runs = {decider: simulate(decider, fleet, trace) for decider in DECIDERS}
    result = {
        "benchmark": "gangs",
        "fleet": {
            "racks": args.racks,
            "trays": args.racks * TRAYS_PER_RACK,
            "hgx_h200": args.hgx,
            "gpus": gpus,
        },
        "trace": {
            "seed": args.seed,
            "arrivals": len(trace),
            "jobs": sum(1 for j in trace if j.grouped),
            "domain_jobs": sum(1 for j in trace if j.domain),
            "load": args.load,
            "mean_minutes": args.minutes,
        },
        "deciders": runs,
        "ratios_vs_first_fit_pods": ratios(runs["tangram"], runs["first-fit-pods"]),
    }
    if args.kubernetes:
        result["kubernetes"] = _in_kubernetes(args, fleet, gpus)
    return result


def _in_kubernetes(args: argparse.Namespace, fleet: list[NodeHardware], gpus: int) -> dict[str, Any]:
    """The shorter trace on the real control plane (kube-scheduler alone, Tangram deciding), and
    simulated for both in-process deciders: every figure of the same trace, side by side."""
    from tangram.bench.gangkube import run_in_kubernetes  # noqa: PLC0415 - a control plane only here
    from tangram.bench.kubesim import stopped_by_signal  # noqa: PLC0415

    trace = gang_trace(args.seed, gpus, jobs=args.kube_jobs, load=args.load, mean_minutes=args.minutes)

    async def both() -> dict[str, Any]:
        return {
            name: await run_in_kubernetes(
                name, fleet, trace, seconds_per_minute=args.seconds_per_minute, settle_s=args.settle
            )
            for name in ("kube-scheduler", "tangram")
        }

    runs = asyncio.run(stopped_by_signal(both()))
    simulated = {decider: simulate(decider, fleet, trace) for decider in DECIDERS}
    return {
        "arrivals": len(trace),
        "jobs": sum(1 for j in trace if j.grouped),
        "domain_jobs": sum(1 for j in trace if j.domain),
        "runs": runs,
        "simulated_same_trace": simulated,
        "ratios_tangram_vs_kube_scheduler": ratios(runs["tangram"], runs["kube-scheduler"]),
    }


def run(args: argparse.Namespace) -> int:
    from tangram.bench.kubesim import BenchError  # noqa: PLC0415
    from tangram.kubernetes.api import KubeApiError  # noqa: PLC0415
    from tangram.local.controlplane import ControlPlaneError  # noqa: PLC0415

    try:
        result = bench(args)
    except (ValueError, BenchError, ControlPlaneError, KubeApiError, OSError) as error:
        print(f"tangram bench gangs: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0
