"""The packing problems the quality benchmarks solve exactly (HiGHS): what each node offers, and the
most claims a fleet holds at once.

Pure models: they read nothing and write nothing but the solver's banner, which goes to stderr.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from tangram.bench.traces import ClaimShape
from tangram.dra import partitionable, whole_gpu_advertised
from tangram.events.inventory import NodeHardware


@dataclass(frozen=True, slots=True)
class PackingGpu:
    index: int
    whole: bool  # can be handed out whole
    slices: int  # MIG memory slices; 0 when the GPU cannot be partitioned
    placements: tuple[tuple[int, int, int], ...] = ()  # (compute slices, start, size), no +me profile


@dataclass(frozen=True, slots=True)
class PackingNode:
    name: str
    gpus: tuple[PackingGpu, ...]
    nvlinked: frozenset[tuple[int, int]]  # GPU index pairs (a < b) with at least one NVLink


@dataclass(frozen=True, slots=True)
class Optimum:
    admitted: int
    proven: bool  # the solver proved optimality (no time limit hit)
    bound: float  # the solver's upper bound on the admitted claims
    seconds: float


def packing_node(hw: NodeHardware) -> PackingNode:
    """What a node offers to the packing problem, by the same advertising rules as discovery."""
    gpus = []
    for gpu in sorted(hw.gpus, key=lambda g: g.index):
        if gpu.health != "healthy":
            continue
        cut = partitionable(gpu)
        placements = (
            tuple(
                sorted(
                    {
                        (p.compute_slices, place.start, place.size)
                        for p in gpu.mig_profiles
                        if not p.media_extensions
                        for place in p.placements
                    }
                )
            )
            if cut
            else ()
        )
        gpus.append(
            PackingGpu(
                index=gpu.index,
                whole=whole_gpu_advertised(gpu),
                slices=gpu.memory_slices if cut else 0,
                placements=placements,
            )
        )
    nvlinked = frozenset((min(link.a, link.b), max(link.a, link.b)) for link in hw.links if link.nvlinks > 0)
    return PackingNode(name=hw.node, gpus=tuple(gpus), nvlinked=nvlinked)


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """HiGHS prints its banner on file descriptor 1 when first constructed; stdout carries the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def optimal_admitted(
    nodes: list[PackingNode], claims: list[ClaimShape], *, time_limit_s: float = 60.0
) -> Optimum:
    """The most claims of `claims` that the fleet admits at the same time (an exact ILP, HiGHS).

    Claims of one shape are interchangeable, so the model counts them per shape instead of naming
    each (the same optimum without the symmetry of identical claims):

    - whole-GPU shape s (k GPUs, optionally NVLink): on each node n, slots j = 0..floor(W/k)-1
      (W = GPUs the node hands out whole); y[s,n,j] in {0,1} says slot j holds a claim and
      x[s,n,j,g] in {0,1} that it uses GPU g: sum_g x[s,n,j,g] = k * y[s,n,j]; when the shape
      asks for NVLink, x[s,n,j,g] + x[s,n,j,h] <= 1 for every pair g,h without NVLink (so the set
      is NVLink-connected pairwise); y[s,n,j] >= y[s,n,j+1] breaks the slots' symmetry;
    - MIG shape s (c compute slices, m memory slices): z[s,n,g,p] in {0,1} for each placement p
      of a profile with c compute and m memory slices (media-extension profiles excluded);
    - supply: sum_{n,j} y[s,n,j] <= claims of shape s, and sum_{n,g,p} z[s,n,g,p] <= claims of s;
    - one GPU, per memory slice q: sum of its whole-GPU uses + sum of the placements covering q
      <= 1 (memory slices never overlap, a GPU used whole has no MIG device); a GPU without MIG
      has one such row over its whole-GPU uses;
    - maximise sum y + sum z.
    """
    import highspy  # noqa: PLC0415 - the solver is needed by this benchmark only

    with stdout_to_stderr():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 0.0)
    demand = Counter(claims)
    objective: list[Any] = []
    uses: dict[tuple[str, int, int], list[Any]] = {}  # (node, gpu, slice or -1) -> variables
    for shape, count in sorted(demand.items(), key=lambda item: item[0].label):
        supply: list[Any] = []
        for node in nodes:
            if shape.kind == "gpu":
                whole = [g.index for g in node.gpus if g.whole]
                slot_vars: list[Any] = []
                for _ in range(min(count, len(whole) // shape.count)):
                    y = h.addBinary()
                    xs = {g: h.addBinary() for g in whole}
                    h.addConstr(sum(xs.values()) - shape.count * y == 0)
                    if shape.nvlink:
                        for a, b in combinations(whole, 2):
                            if (min(a, b), max(a, b)) not in node.nvlinked:
                                h.addConstr(xs[a] + xs[b] <= 1)
                    for gpu in node.gpus:
                        if gpu.index in xs:
                            for q in range(gpu.slices) if gpu.slices else (-1,):
                                uses.setdefault((node.name, gpu.index, q), []).append(xs[gpu.index])
                    if slot_vars:
                        h.addConstr(slot_vars[-1] - y >= 0)
                    slot_vars.append(y)
                supply.extend(slot_vars)
                continue
            for gpu in node.gpus:
                for compute, start, size in gpu.placements:
                    if compute != shape.compute or size != shape.slices:
                        continue
                    z = h.addBinary()
                    supply.append(z)
                    for q in range(start, start + size):
                        uses.setdefault((node.name, gpu.index, q), []).append(z)
        if supply:
            h.addConstr(sum(supply) <= count)
            objective.extend(supply)
    for variables in uses.values():
        if len(variables) > 1:
            h.addConstr(sum(variables) <= 1)
    started = time.perf_counter()
    if not objective:
        return Optimum(admitted=0, proven=True, bound=0.0, seconds=0.0)
    h.maximize(sum(objective))
    seconds = time.perf_counter() - started
    status = h.getModelStatus()
    info = h.getInfo()
    return Optimum(
        admitted=round(h.getObjectiveValue()),
        proven=status == highspy.HighsModelStatus.kOptimal,
        bound=float(info.mip_dual_bound),
        seconds=round(seconds, 3),
    )
