"""`tangram bench quality`: placement quality against first-fit, best-fit and an exact ILP optimum.

Each instance is a mixed fleet (NVSwitch, NVLink-bridged pairs, no NVLink; at least 8 nodes of
3 kinds, names shuffled so that name order says nothing) and a trace: `fill` traces only arrive,
`churn` traces first run arrivals and departures at 50% load, then only arrive. Either way the
arrivals ask for `--saturation` times the fleet's GPUs. Every policy replays the trace until its
first failure; the claims it admitted before (and their GPUs) are compared with the longest
prefix of the same trace whose claims alive an exact ILP (HiGHS) fits at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from tangram.allocation import POLICIES, Allocated, Claim, DeviceClass, FleetState, NvlinkTally, Policy
from tangram.bench.packing import Optimum, optimal_admitted, packing_node
from tangram.bench.traces import (
    BENCH_MIX,
    Arrival,
    ClaimShape,
    Op,
    build_fleet,
    claim_spec,
    fleet_gpus,
    saturating_trace,
    shipped_classes,
)
from tangram.events.inventory import NodeHardware, renamed_machine

Node = TypeVar("Node")
CHURN_LOAD = 0.5  # share of the fleet's GPUs the claims alive ask for while a churn trace churns
TARGETS = {"fill_claims_ratio": 0.97, "churn_claims_ratio": 0.90}
# Mixed fleets of at least 8 nodes of three kinds: NVSwitch (8-GPU NVLink sets, MIG), NVLink-bridged
# pairs (MIG), and L40S without NVLink or MIG.
FLEETS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("hgx-h200", 2), ("h100-nvl-4x2", 3), ("l40s-8", 3)),
    (("hgx-h200", 3), ("h100-nvl-4x2", 3), ("l40s-8", 4)),
    (("hgx-h200", 2), ("h100-nvl-4x2", 4), ("l40s-8", 2)),
    (("hgx-h200", 3), ("h100-nvl-4x2", 2), ("l40s-8", 3)),
)

# --- the benchmark -------------------------------------------------------------------------------


def shuffled_names(nodes: list[NodeHardware], seed: int) -> list[NodeHardware]:
    """The same fleet under random names, so that name order says nothing about the hardware."""
    rng = random.Random(seed * 104729 + 7)  # noqa: S311 - reproducible names, not a secret
    names = [f"node-{rng.getrandbits(32):08x}" for _ in nodes]
    return [renamed_machine(hw, name) for hw, name in zip(nodes, names, strict=True)]


def replay(
    nodes: list[NodeHardware], ops: list[Op], classes: Mapping[str, DeviceClass], policy: Policy
) -> dict[str, Any]:
    """One policy over the trace on a fresh fleet, up to its first failure: what it admitted."""
    fleet = FleetState()
    for hw in nodes:
        fleet.apply_inventory(hw)
    alive: dict[str, ClaimShape] = {}
    nvlink = NvlinkTally()
    arrivals = 0
    admitted_gpus = 0.0
    failed_at: int | None = None
    for op in ops:
        if not isinstance(op, Arrival):
            fleet.release(op.uid)
            alive.pop(op.uid, None)
            continue
        claim = Claim(namespace="bench", name=op.uid, uid=op.uid, spec=claim_spec(op.shape))
        decision = fleet.allocate(claim, classes, policy)
        if not isinstance(decision, Allocated):
            failed_at = arrivals
            break
        arrivals += 1
        admitted_gpus += op.shape.gpus()
        alive[op.uid] = op.shape
        nvlink.count(decision)
    metrics = fleet.metrics()
    return {
        "arrivals_before_first_failure": arrivals,
        "failed": failed_at is not None,
        "claims": arrivals,  # admitted before the first failure
        "gpus": round(admitted_gpus, 3),  # their GPUs (MIG devices as their share of a GPU)
        "claims_alive": len(alive),
        "gpus_alive": round(sum(shape.gpus() for shape in alive.values()), 3),
        "stranded_gpus": metrics.stranded_gpus,
        "free_gpus": metrics.free_gpus,
        "nvlink": dataclasses.asdict(nvlink),
    }


def _alive_after(ops: list[Op], arrivals: int) -> list[ClaimShape]:
    """The claims alive the moment the `arrivals`-th arrival came (with the departures between the
    arrivals; those listed after it happen later, so its claim met the claims they end)."""
    alive: dict[str, ClaimShape] = {}
    seen = 0
    for op in ops:
        if seen == arrivals:
            break
        if isinstance(op, Arrival):
            seen += 1
            alive[op.uid] = op.shape
        else:
            alive.pop(op.uid, None)
    return list(alive.values())


def optimal_prefix(
    nodes: Sequence[Node],
    ops: list[Op],
    feasible_at: int,
    *,
    capacity_gpus: float,
    time_limit_s: float,
    solve: Callable[..., Optimum] = optimal_admitted,
) -> tuple[int, bool, float]:
    """The most arrivals, past `feasible_at` (known to fit), whose claims alive all fit at once.

    Binary search over the arrivals of the trace's arrival-only tail (feasibility is monotone
    there), each step an exact ILP (`solve`: optimal_admitted by default). `feasible_at` is at
    least the end of the churn phase: unless a policy's failure during the churn is shown to be unavoidable
    (failing_too), the optimum is taken to fit every claim alive during the churn, so with
    departures this is an upper bound on any placement that never moves a claim.
    Returns (arrivals, proven, seconds).
    """
    total = sum(isinstance(op, Arrival) for op in ops)
    lo, hi = feasible_at, total + 1
    for arrivals in range(feasible_at + 1, total + 1):
        if sum(shape.gpus() for shape in _alive_after(ops, arrivals)) > capacity_gpus + 1e-9:
            hi = arrivals
            break
    proven = True
    seconds = 0.0
    while hi - lo > 1:
        middle = (lo + hi) // 2
        alive = _alive_after(ops, middle)
        optimum = solve(nodes, alive, time_limit_s=time_limit_s)
        seconds += optimum.seconds
        if optimum.admitted >= len(alive):
            lo = middle
        elif optimum.proven or optimum.bound < len(alive) - 0.5:
            hi = middle
        else:
            proven = False  # unknown: counted as not fitting, so the optimum is understated
            hi = middle
    return lo, proven, round(seconds, 3)


def failing_too(
    nodes: Sequence[Node],
    ops: list[Op],
    results: Any,
    churn_claims: int,
    *,
    time_limit_s: float,
    solve: Callable[..., Optimum] = optimal_admitted,
) -> tuple[int, bool, float] | None:
    """Where a policy failed during the churn, whether no placement at all fits the claims alive
    with the failing claim: then the optimum's first failure is there too (the earliest such)."""
    seconds = 0.0
    failures = sorted({r["arrivals_before_first_failure"] for r in results if r["failed"]})
    for arrivals in failures:
        if arrivals >= churn_claims:
            break
        alive = _alive_after(ops, arrivals + 1)
        optimum = solve(nodes, alive, time_limit_s=time_limit_s)
        seconds += optimum.seconds
        if optimum.proven and optimum.admitted < len(alive):
            return arrivals, True, round(seconds, 3)
    return None


def migrating_prefix(
    nodes: Sequence[Node],
    ops: list[Op],
    known: int,
    *,
    capacity_gpus: float,
    time_limit_s: float,
    solve: Callable[..., Optimum] = optimal_admitted,
) -> tuple[int, bool, float]:
    """The longest prefix of the trace whose claims alive at each of its arrivals fit at once
    (exact ILPs, `solve`): the optimum of a policy free to rearrange every claim at every arrival.
    `known` arrivals are known to fit (a policy admitted them).

    Every arrival past `known` is checked, during the churn too. Between two departures the claims
    alive only grow, so a run of arrivals is checked at its last one and searched (binary) for its
    first failure only where that fails. Returns (arrivals, proven, seconds); a solve stopped by
    its time limit without an answer counts as a failure, which understates the optimum, and the
    result is then not proven.
    """
    runs: list[list[int]] = [[]]  # arrival counts 1..total, cut at each departure
    seen = 0
    for op in ops:
        if isinstance(op, Arrival):
            seen += 1
            runs[-1].append(seen)
        elif runs[-1]:
            runs.append([])
    proven = True
    seconds = 0.0

    def fits(arrivals: int) -> bool:
        nonlocal proven, seconds
        alive = _alive_after(ops, arrivals)
        if sum(shape.gpus() for shape in alive) > capacity_gpus + 1e-9:
            return False
        optimum = solve(nodes, alive, time_limit_s=time_limit_s)
        seconds += optimum.seconds
        if optimum.admitted >= len(alive):
            return True
        if not optimum.proven and optimum.bound >= len(alive) - 0.5:
            proven = False  # unknown: counted as not fitting
        return False

    for run in runs:
        todo = [arrivals for arrivals in run if arrivals > known]
        if not todo or fits(todo[-1]):
            continue
        lo, hi = todo[0] - 1, todo[-1]  # lo fits (known, or the end of the run before), hi does not
        while hi - lo > 1:
            middle = (lo + hi) // 2
            if fits(middle):
                lo = middle
            else:
                hi = middle
        return lo, proven, round(seconds, 3)
    return seen, proven, round(seconds, 3)


def run_instance(
    fleet_spec: tuple[tuple[str, int], ...],
    seed: int,
    classes: Mapping[str, DeviceClass],
    policies: list[Policy],
    *,
    churn_claims: int,
    saturation: float,
    time_limit_s: float,
) -> dict[str, Any]:
    nodes = shuffled_names(build_fleet(list(fleet_spec)), seed)
    capacity = fleet_gpus(nodes)
    ops = saturating_trace(
        seed, capacity, churn_claims=churn_claims, churn_load=CHURN_LOAD, saturation=saturation, mix=BENCH_MIX
    )
    results = {policy: replay(nodes, ops, classes, policy) for policy in policies}
    packing = [packing_node(hw) for hw in nodes]
    found = failing_too(packing, ops, results.values(), churn_claims, time_limit_s=time_limit_s)
    if found is not None:
        best, proven, seconds = found
    else:
        known = max(churn_claims, *(r["arrivals_before_first_failure"] for r in results.values()))
        best, proven, seconds = optimal_prefix(
            packing, ops, known, capacity_gpus=capacity, time_limit_s=time_limit_s
        )
    arrived = [op.shape for op in ops if isinstance(op, Arrival)][:best]
    optimum = {
        "arrivals_before_first_failure": best,
        "claims": best,
        "gpus": round(sum(shape.gpus() for shape in arrived), 3),
        "proven": proven,
        "seconds": seconds,
    }
    for result in results.values():
        result["claims_ratio"] = round(result["claims"] / optimum["claims"], 4) if optimum["claims"] else 1.0
        result["gpus_ratio"] = round(result["gpus"] / optimum["gpus"], 4) if optimum["gpus"] else 1.0
    return {
        "trace": "churn" if churn_claims else "fill",
        "fleet": dict(fleet_spec),
        "node_names": sorted(hw.node for hw in nodes),
        "gpus": capacity,
        "seed": seed,
        "saturation": saturation,
        "arrivals": sum(isinstance(op, Arrival) for op in ops),
        "departures": sum(not isinstance(op, Arrival) for op in ops),
        "optimum": optimum,
        "policies": results,
    }


def summarize(instances: list[dict[str, Any]], policies: list[Policy]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for trace in ("fill", "churn", "all"):
        chosen = [i for i in instances if trace in ("all", i["trace"])]
        if not chosen:
            continue
        optimum_claims = sum(i["optimum"]["claims"] for i in chosen)
        optimum_gpus = sum(i["optimum"]["gpus"] for i in chosen)
        per_policy: dict[str, Any] = {}
        for policy in policies:
            rows = [i["policies"][policy] for i in chosen]
            nvlink = NvlinkTally()
            for row in rows:
                nvlink.add(NvlinkTally(**row["nvlink"]))
            claims = sum(r["claims"] for r in rows)
            gpus = sum(r["gpus"] for r in rows)
            per_policy[policy] = {
                "claims": claims,
                "gpus": round(gpus, 3),
                "claims_ratio": round(claims / optimum_claims, 4) if optimum_claims else 1.0,
                "gpus_ratio": round(gpus / optimum_gpus, 4) if optimum_gpus else 1.0,
                "mean_instance_claims_ratio": round(sum(r["claims_ratio"] for r in rows) / len(rows), 4),
                "worst_instance_claims_ratio": min(r["claims_ratio"] for r in rows),
                "stranded_gpus": round(sum(r["stranded_gpus"] for r in rows), 3),
                **nvlink.report(),
            }
        out[trace] = {
            "instances": len(chosen),
            "optimum": {"claims": optimum_claims, "gpus": round(optimum_gpus, 3)},
            "all_proven": all(i["optimum"]["proven"] for i in chosen),
            "policies": per_policy,
        }
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--instances", type=int, default=8, help="instances per trace kind, fill and churn (default 8)"
    )
    parser.add_argument(
        "--churn-claims", type=int, default=300, help="arrivals with departures before a churn trace fills"
    )
    parser.add_argument(
        "--saturation",
        type=float,
        default=1.3,
        help="a trace asks for this many times the fleet's GPUs (default 1.3)",
    )
    parser.add_argument("--time-limit", type=float, default=30.0, help="ILP time limit per solve, s")


def bench(args: argparse.Namespace) -> dict[str, Any]:
    if (
        args.instances < 1
        or args.churn_claims < 1
        or args.time_limit <= 0
        or not 1.0 <= args.saturation <= 2.0
    ):
        raise ValueError(
            "--instances and --churn-claims must be positive, --time-limit > 0, --saturation in [1, 2]"
        )
    classes = shipped_classes()
    policies = list(POLICIES)
    instances = [
        run_instance(
            FLEETS[n % len(FLEETS)],
            args.seed + n,
            classes,
            policies,
            churn_claims=churn,
            saturation=args.saturation,
            time_limit_s=args.time_limit,
        )
        for churn in (0, args.churn_claims)
        for n in range(args.instances)
    ]
    summary = summarize(instances, policies)
    tangram = {trace: summary[trace]["policies"]["tangram"] for trace in summary}
    first_fit = summary["all"]["policies"]["first-fit"]
    return {
        "benchmark": "quality",
        "seed": args.seed,
        "metric": "claims (and their GPUs) admitted before the first failure, against the longest "
        "prefix of the same trace whose claims alive an exact ILP (HiGHS) fits at every failure checked",
        "targets": TARGETS,
        "meets_targets": {
            "fill_claims_ratio": tangram["fill"]["claims_ratio"] >= TARGETS["fill_claims_ratio"],
            "churn_claims_ratio": tangram["churn"]["claims_ratio"] >= TARGETS["churn_claims_ratio"],
            "above_first_fit": tangram["all"]["mean_instance_claims_ratio"]
            > first_fit["mean_instance_claims_ratio"],
        },
        "summary": summary,
        "instances": instances,
    }


def run(args: argparse.Namespace) -> int:
    try:
        result = bench(args)
    except (ValueError, OSError) as error:
        print(f"tangram bench quality: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
