"""The packing problems the quality benchmarks solve exactly (HiGHS): what each node offers, the
most claims a fleet holds at once (claims may be rearranged), and the longest prefix of a trace
whose claims each keep one placement for their whole life (never moved).

Pure models: they read nothing and write nothing but the solver's banner, which goes to stderr.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any, Literal

from tangram.bench.traces import Arrival, ClaimShape, Op
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


def exact_solver(time_limit_s: float) -> Any:
    """A silent HiGHS instance that solves to optimality (no relative gap), within the time limit."""
    import highspy  # noqa: PLC0415 - the solver is needed by the benchmarks only

    with stdout_to_stderr():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 0.0)
    return h


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

    h = exact_solver(time_limit_s)
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


# --- claims that are never moved -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Held:
    """Where a claim is held: its node and GPUs, and for a MIG device its memory slices
    [start, start + size) on its one GPU (size 0: the GPUs are held whole)."""

    node: str
    gpus: tuple[int, ...]
    start: int = 0
    size: int = 0


def maximal_alive(ops: Sequence[Op], limit: int) -> tuple[list[ClaimShape], list[list[int]]]:
    """The shapes of the trace's first `limit` arrivals, and the sets of them (by arrival index)
    alive at once that no other such set contains: those alive at an arrival that a departure, or
    the end, follows. The claims alive at any moment are a subset of one of these, so capacity
    that holds for each of them holds at every moment. As everywhere in the benchmark, departures
    listed after an arrival happen after it."""
    shapes: list[ClaimShape] = []
    index: dict[str, int] = {}
    alive: dict[int, None] = {}  # insertion-ordered set
    sets: list[list[int]] = []
    grown = False
    for op in ops:
        if isinstance(op, Arrival):
            if len(shapes) == limit:
                break
            index[op.uid] = len(shapes)
            alive[len(shapes)] = None
            shapes.append(op.shape)
            grown = True
            continue
        gone = index.get(op.uid)
        if gone is None or gone not in alive:
            continue
        if grown:
            sets.append(list(alive))
            grown = False
        del alive[gone]
    if grown:
        sets.append(list(alive))
    return shapes, sets


def pooled(node: PackingNode) -> bool:
    """Whether any GPUs of the node serve any whole-GPU claim alike: no MIG, and NVLink between
    every pair of whole GPUs or between none. On such a node it is enough to count GPUs: claims
    taken in arrival order each find as many free GPUs as the count leaves, and any of them do."""
    whole = [g.index for g in node.gpus if g.whole]
    pairs = {(a, b) for a, b in combinations(sorted(whole), 2)}
    return all(not g.slices for g in node.gpus) and (pairs <= node.nvlinked or not pairs & node.nvlinked)


def _nvlink_set_exists(node: PackingNode, whole: list[int], count: int) -> bool:
    return any(
        all(pair in node.nvlinked for pair in combinations(chosen, 2))
        for chosen in combinations(sorted(whole), count)
    )


Row = tuple[list[int], list[float], float]  # columns, coefficients, right-hand side
Use = tuple[tuple[Any, ...], int, int]  # resource, column, amount of it


@dataclass(slots=True)
class _Model:
    """The model's integer columns and rows, handed to HiGHS at once."""

    cost: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    equal: list[Row] = field(default_factory=list)  # sum coef * column == rhs
    below: list[Row] = field(default_factory=list)  # sum coef * column <= rhs

    def new(self, *, cost: float = 0.0, upper: float = 1.0) -> int:
        self.cost.append(cost)
        self.upper.append(upper)
        return len(self.cost) - 1


@dataclass(slots=True)
class _Claim:
    """One claim's columns: those that sum to its admission, what each uses, and which are 1 for
    a placement (a Held with no GPUs: the node's y; with one GPU: that GPU's x or the MIG z)."""

    choices: list[int] = field(default_factory=list)
    uses: list[Use] = field(default_factory=list)
    places: dict[Held, list[int]] = field(default_factory=dict)


def non_migrating_admitted(
    nodes: Sequence[PackingNode],
    ops: Sequence[Op],
    *,
    at_least: int = 0,
    at_most: int | None = None,
    hint: Sequence[Held] = (),
    time_limit_s: float = 60.0,
) -> Optimum:
    """The longest prefix of the trace's arrivals whose claims each hold one placement from their
    arrival to their departure, the fleet's capacity respected at every moment (an exact ILP,
    HiGHS): what a policy that never moves a claim can admit before its first failure, at best.

    `at_least` arrivals are known to fit so (`hint`, when given, places them: the placements, in
    arrival order, of a policy that admitted them), and no more than `at_most` can (an optimum
    that may move claims bounds this one). Claims are not interchangeable here (each has its own
    lifetime), so each gets its own columns:

    - whole-GPU claim i (k GPUs, optionally NVLink) on a node where every set of k GPUs serves
      alike (`pooled`): y[i,n] in {0,1}, and per set of claims alive at once, sum k*y <= the
      node's whole GPUs;
    - elsewhere, y[i,n] and x[i,n,g] in {0,1}: sum_g x = k*y, and with NVLink x[i,n,g] + x[i,n,h]
      <= 1 for every pair g,h without NVLink (x is y itself when k is all the node's GPUs, and
      there is no y when k = 1);
    - MIG claim i: z[i,n,g,p] in {0,1} per placement p of its profile (no media extensions);
    - a[i] in {0,1}, claim i admitted: its columns sum to a[i], a[i] >= a[i+1] (a prefix), a[i]
      = 1 for i < at_least;
    - per set of claims alive at once (`maximal_alive`) and per memory slice q of a GPU: the
      whole-GPU uses of the GPU by claims of the set plus their placements covering q <= 1 (a
      GPU without MIG: its whole-GPU uses <= 1);
    - maximise sum a.
    """
    total = sum(isinstance(op, Arrival) for op in ops)
    limit = total if at_most is None else max(0, min(at_most, total))
    at_least = min(at_least, limit)
    if at_least == limit:
        return Optimum(admitted=limit, proven=True, bound=float(limit), seconds=0.0)
    model, admitted, claims = _prefix_model(nodes, ops, limit, at_least)
    solution = _hinted(model, admitted, claims, hint[:limit])
    h, seconds = _solve(model, time_limit_s, solution)
    import highspy  # noqa: PLC0415 - the solver is needed by the benchmarks only

    status = h.getModelStatus()
    info = h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        raise ValueError(f"the first {at_least} arrivals are said to fit but cannot without moving a claim")
    found = round(info.objective_function_value) if info.primal_solution_status == 2 else 0
    best = at_least + found
    if best < len(hint[:limit]):
        raise ValueError("the solver refused the hinted placements: they break a constraint of the model")
    bound = min(float(limit), at_least + float(info.mip_dual_bound))
    return Optimum(
        admitted=best,
        proven=status == highspy.HighsModelStatus.kOptimal or bound < best + 1 - 1e-6,
        bound=round(bound, 3),
        seconds=round(seconds, 3),
    )


@dataclass(frozen=True, slots=True)
class LosingPlacement:
    """The first placement of a policy after which the optimum's prefix no longer fits."""

    arrival: int  # its index among the trace's arrivals
    placed: Held | None  # where the policy put it; None: the policy failed it
    instead: Held  # where a placement reaching the optimum puts it, the policy's before it kept
    probes: int  # feasibility problems solved
    seconds: float


def first_losing_placement(
    nodes: Sequence[PackingNode],
    ops: Sequence[Op],
    reach: int,
    placed: Sequence[Held],
    *,
    time_limit_s: float = 60.0,
) -> LosingPlacement | None:
    """Where a policy that admitted `placed` (its placements, in arrival order) lost the first
    `reach` arrivals, `reach` being known to fit never moving a claim: the least n such that no
    such placement of them keeps the policy's first n placements, found by bisection (each probe
    an exact feasibility problem). None when the policy admitted `reach`, or when a probe hit the
    time limit undecided.

    When every placement of the policy still allows `reach`, the policy lost at its failure: the
    claim it failed fits beside what it held (`placed` is then None)."""
    reach = min(reach, sum(isinstance(op, Arrival) for op in ops))
    if len(placed) >= reach:
        return None
    started = time.perf_counter()
    probes = 0
    model, _, claims = _prefix_model(nodes, ops, reach, reach)
    # each placement's columns, pinned to 1 by the probes that keep it
    pins = [
        [([column], [1.0], 1.0) for column in _hint_columns(claims[i], held, i)]
        for i, held in enumerate(placed)
    ]

    def probe(pinned: int) -> list[float] | Literal[False] | None:
        """A solution keeping the first `pinned` placements; False: none exists; None: undecided."""
        nonlocal probes
        probes += 1
        kept = [row for rows in pins[:pinned] for row in rows]
        h, _ = _solve(replace(model, equal=[*model.equal, *kept]), time_limit_s, None)
        import highspy  # noqa: PLC0415 - the solver is needed by the benchmarks only

        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return False
        if h.getInfo().primal_solution_status != 2:
            return None
        return list(h.getSolution().col_value)

    low, high = 0, len(placed) + 1  # probe(low) has a solution; probe(high) has none (or high is past)
    solution = probe(low)
    if not isinstance(solution, list):
        return None
    while high - low > 1:
        middle = (low + high) // 2
        found = probe(middle)
        if found is None:
            return None
        if found is False:
            high = middle
        else:
            low, solution = middle, found
    return LosingPlacement(
        arrival=low,
        placed=placed[low] if low < len(placed) else None,
        instead=_placed(claims[low], solution),
        probes=probes,
        seconds=round(time.perf_counter() - started, 3),
    )


def _prefix_model(
    nodes: Sequence[PackingNode], ops: Sequence[Op], limit: int, at_least: int
) -> tuple[_Model, list[int | None], list[_Claim]]:
    """The model of non_migrating_admitted: the first `limit` arrivals, the first `at_least`
    admitted; its a[i] columns (None where a claim is admitted) and each claim's columns."""
    shapes, sets = maximal_alive(ops, limit)
    model = _Model()
    claims = [_claim_columns(model, nodes, shape) for shape in shapes]
    admitted: list[int | None] = []  # a[i]; None where it is 1
    for i, claim in enumerate(claims):
        ones = [1.0] * len(claim.choices)
        if i < at_least:
            if not claim.choices:
                raise ValueError(f"arrival {i} is said to fit but no node can hold it")
            admitted.append(None)
            model.equal.append((claim.choices, ones, 1.0))
            continue
        a = model.new(cost=1.0, upper=1.0 if claim.choices else 0.0)
        model.equal.append(([*claim.choices, a], [*ones, -1.0], 0.0))
        before = admitted[-1] if admitted else None
        if before is not None:
            model.below.append(([a, before], [1.0, -1.0], 0.0))
        admitted.append(a)
    model.below.extend(_capacity_rows(nodes, claims, sets))
    return model, admitted, claims


def _solve(model: _Model, time_limit_s: float, solution: list[float] | None) -> tuple[Any, float]:
    """The model maximised by HiGHS (every column an integer in its bounds), started from
    `solution` when given: the solver and the seconds it ran."""
    import highspy  # noqa: PLC0415 - the solver is needed by the benchmarks only

    h = exact_solver(time_limit_s)
    n = len(model.cost)
    h.addCols(n, model.cost, [0.0] * n, model.upper, 0, [], [], [])
    h.changeColsIntegrality(n, list(range(n)), [1] * n)  # all integer, within [0, 1]
    for rows, equal in ((model.equal, True), (model.below, False)):
        starts: list[int] = []
        indices: list[int] = []
        values: list[float] = []
        for cols, coefs, _ in rows:
            starts.append(len(indices))
            indices.extend(cols)
            values.extend(coefs)
        upper = [rhs for _, _, rhs in rows]
        lower = upper if equal else [-highspy.kHighsInf] * len(rows)
        h.addRows(len(rows), lower, upper, len(indices), starts, indices, values)
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    if solution is not None:
        h.setSolution(n, list(range(n)), solution)
    started = time.perf_counter()
    h.run()
    return h, time.perf_counter() - started


def _claim_columns(model: _Model, nodes: Sequence[PackingNode], shape: ClaimShape) -> _Claim:
    claim = _Claim()
    for node in nodes:
        if shape.kind == "gpu":
            _whole_columns(model, node, shape, claim)
            continue
        for gpu in node.gpus:
            for compute, start, size in gpu.placements:
                if compute != shape.compute or size != shape.slices:
                    continue
                z = model.new()
                claim.choices.append(z)
                claim.uses.extend(((node.name, gpu.index, q), z, 1) for q in range(start, start + size))
                claim.places[Held(node.name, (gpu.index,), start, size)] = [z]
    return claim


def _whole_columns(model: _Model, node: PackingNode, shape: ClaimShape, claim: _Claim) -> None:
    """A whole-GPU claim's columns on one node (see non_migrating_admitted)."""
    whole = [g.index for g in node.gpus if g.whole]
    k = shape.count
    if len(whole) < k or (shape.nvlink and k > 1 and not _nvlink_set_exists(node, whole, k)):
        return
    if pooled(node):
        y = model.new()
        claim.choices.append(y)
        claim.uses.append(((node.name,), y, k))
        claim.places[Held(node.name, ())] = [y]
        return
    if k == 1:
        xs = {g: model.new() for g in whole}
        claim.choices.extend(xs.values())
        claim.places.update((Held(node.name, (g,)), [x]) for g, x in xs.items())
    elif k == len(whole):
        y = model.new()
        xs = dict.fromkeys(whole, y)
        claim.choices.append(y)
        claim.places[Held(node.name, ())] = [y]
    else:
        y = model.new()
        xs = {g: model.new() for g in whole}
        claim.choices.append(y)
        claim.places[Held(node.name, ())] = [y]
        model.equal.append(([*xs.values(), y], [1.0] * len(xs) + [-float(k)], 0.0))
        if shape.nvlink:
            for a, b in combinations(sorted(whole), 2):
                if (a, b) not in node.nvlinked:
                    model.below.append(([xs[a], xs[b]], [1.0, 1.0], 1.0))
        claim.places.update((Held(node.name, (g,)), [x]) for g, x in xs.items())
    for gpu in node.gpus:
        if gpu.index in xs:
            for q in range(gpu.slices) if gpu.slices else (-1,):
                claim.uses.append(((node.name, gpu.index, q), xs[gpu.index], 1))


def _capacity_rows(
    nodes: Sequence[PackingNode], claims: list[_Claim], sets: list[list[int]]
) -> Iterator[Row]:
    """Per set of claims alive at once, per resource (a pooled node's GPUs, a GPU's memory slice):
    what the claims of the set use of it <= what there is. A row the claims cannot break whatever
    their placement, or that another set already gave, is left out."""
    capacity = {(node.name,): sum(g.whole for g in node.gpus) for node in nodes if pooled(node)}
    seen: set[tuple[tuple[Any, ...], frozenset[int]]] = set()
    for alive in sets:
        rows: dict[tuple[Any, ...], list[tuple[int, int, int]]] = {}
        for i in alive:
            for resource, column, amount in claims[i].uses:
                rows.setdefault(resource, []).append((i, column, amount))
        for resource, terms in rows.items():
            cap = capacity.get(resource, 1)
            most: dict[int, int] = {}
            for i, _, amount in terms:
                most[i] = max(most.get(i, 0), amount)
            key = (resource, frozenset(most))
            if sum(most.values()) <= cap or key in seen:
                continue
            seen.add(key)
            yield [c for _, c, _ in terms], [float(n) for _, _, n in terms], float(cap)


def _hinted(
    model: _Model, admitted: list[int | None], claims: list[_Claim], hint: Sequence[Held]
) -> list[float] | None:
    """Every column's value in the hinted placements (the first len(hint) claims admitted)."""
    if not hint:
        return None
    values = [0.0] * len(model.cost)
    for i, held in enumerate(hint):
        for column in _hint_columns(claims[i], held, i):
            values[column] = 1.0
        a = admitted[i]
        if a is not None:
            values[a] = 1.0
    return values


def _hint_columns(claim: _Claim, held: Held, arrival: int) -> list[int]:
    """The columns that are 1 when the claim is held there: a MIG device's z; or the node's y
    (where there is one) and each GPU's x (where there are)."""
    keys = [held] if held.size else [Held(held.node, ()), *(Held(held.node, (g,)) for g in held.gpus)]
    found = [column for key in keys for column in claim.places.get(key, ())]
    if not found:
        raise ValueError(f"arrival {arrival} is hinted at {held}, which the model does not offer")
    return found


def _placed(claim: _Claim, values: Sequence[float]) -> Held:
    """Where a solution holds the claim: the MIG device, or the node and the GPUs chosen on it
    (none named where the model counts GPUs, or where the claim takes them all)."""
    chosen = [held for held, columns in claim.places.items() if all(values[c] > 0.5 for c in columns)]
    device = next((held for held in chosen if held.size), None)
    if device is not None:
        return device
    return Held(chosen[0].node, tuple(sorted(g for held in chosen for g in held.gpus)))
