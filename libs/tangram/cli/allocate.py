"""`tangram allocate`: run the allocator offline over a simulated fleet and a claim trace; JSON lines out."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from tangram.allocation import POLICIES, Allocated, Claim, DeviceClass, FleetState, NvlinkTally
from tangram.events.inventory import NodeHardware, renamed_machine
from tangram.inputs import Document, InputError, load_yaml_documents, read_text, read_yaml
from tangram.kubernetes.objects.limits import DNS_SUBDOMAIN, MAX_SUBDOMAIN
from tangram.stats import percentile

MAX_FLEET_NODES = 10_000  # ten times the fleet of the allocator benchmark


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet", required=True, type=Path, help="YAML list of nodes: {name, machine, count}"
    )
    parser.add_argument(
        "--trace", required=True, type=Path, help="YAML stream: DeviceClasses, ResourceClaims, deletions"
    )
    parser.add_argument("--policy", choices=POLICIES, default="tangram")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="add why the node was chosen (its demand-weighted loss, per claim kind) and why others were not",
    )
    parser.add_argument(
        "--no-shipped-classes", action="store_true", help="do not load Tangram's shipped DeviceClasses"
    )


def load_fleet(path: Path) -> list[NodeHardware]:
    from tangram.nvml import SimNvml  # noqa: PLC0415 - simulated NVML only when the CLI runs
    from tangram.nvml.inventory import read_node_hardware  # noqa: PLC0415

    entries = read_yaml(path, "fleet")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: expected a non-empty YAML list of nodes")
    nodes: list[NodeHardware] = []
    seen: set[str] = set()
    machines: dict[str, NodeHardware] = {}
    total = 0
    for position, entry in enumerate(entries):
        where = f"{path}: node [{position}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or "machine" not in entry:
            raise InputError(f"{where}: needs name (string) and machine")
        count = entry.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise InputError(f"{where}: count must be a positive integer")
        total += 1 if count is None else count
        if total > MAX_FLEET_NODES:
            raise InputError(f"{where}: the fleet would have more than {MAX_FLEET_NODES} nodes")
        base = entry["name"]
        longest = base if count is None else f"{base}-{count - 1}"
        if len(longest) > MAX_SUBDOMAIN or not DNS_SUBDOMAIN.fullmatch(base):
            raise InputError(f"{where}: name {base[:80]!r} is not a Kubernetes node name (DNS subdomain)")
        machine = entry["machine"]
        if not isinstance(machine, str):
            raise InputError(f"{where}: machine must be a shipped machine name or a file path")
        if machine not in machines:
            try:
                nvml = SimNvml.from_machine(machine)
                nvml.nvmlInit()
                machines[machine] = read_node_hardware(nvml, "template")
            except (ValueError, OSError) as error:
                raise InputError(f"{where}: machine {machine!r}: {error}") from None
        names = [base] if count is None else [f"{base}-{i}" for i in range(count)]
        for name in names:
            if name in seen:
                raise InputError(f"{where}: node name {name!r} appears twice")
            seen.add(name)
            nodes.append(renamed_machine(machines[machine], name))
    return nodes


def _claim(doc: dict[str, Any], where: str) -> Claim:
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise InputError(f"{where}: ResourceClaim has no metadata.name (string)")
    namespace = metadata.get("namespace") or "default"
    uid = metadata.get("uid")
    if not isinstance(namespace, str) or not (uid is None or isinstance(uid, str)):
        raise InputError(f"{where}: metadata.namespace and metadata.uid must be strings")
    name = metadata["name"]
    if uid is None:
        uid = "uid-" + hashlib.sha1(f"{namespace}/{name}".encode(), usedforsecurity=False).hexdigest()[:16]
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise InputError(f"{where}: ResourceClaim spec must be a mapping")
    return Claim(namespace=namespace, name=name, uid=uid, spec=spec)


class _Claims:
    """The claims of a trace by name and by uid, to refuse two claims that a reader would confuse.

    A name repeated with the same spec is the same claim asked again; with another spec, or a uid
    given to two claims, the trace contradicts itself and no decision would be meaningful.
    """

    def __init__(self, source: str) -> None:
        self._source = source
        self._by_key: dict[str, tuple[Claim, Document]] = {}
        self._by_uid: dict[str, tuple[Claim, Document]] = {}

    def add(self, claim: Claim, document: Document) -> None:
        here = f"{self._source}: document [{document.index}] (line {document.line})"
        known = self._by_key.get(claim.key)
        if known is not None and (known[0].spec != claim.spec or known[0].uid != claim.uid):
            what = "spec" if known[0].spec != claim.spec else "uid"
            raise InputError(
                f"{here}: claim {claim.key} was already given with another {what} by "
                f"document [{known[1].index}] (line {known[1].line}); delete it first"
            )
        owner = self._by_uid.get(claim.uid)
        if owner is not None and owner[0].key != claim.key:
            raise InputError(
                f"{here}: claim {claim.key} has uid {claim.uid!r}, which document [{owner[1].index}] "
                f"(line {owner[1].line}) gave to claim {owner[0].key}"
            )
        self._by_key[claim.key] = (claim, document)
        self._by_uid.setdefault(claim.uid, (claim, document))

    def delete(self, key: str) -> None:
        self._by_key.pop(key, None)


def load_trace(path: Path) -> list[tuple[Document, Claim | DeviceClass | str]]:
    """Every document of the trace, checked before any is decided: a claim, a DeviceClass, or the
    `namespace/name` of a claim to delete."""
    source = f"trace {path}"
    claims = _Claims(source)
    items: list[tuple[Document, Claim | DeviceClass | str]] = []
    for document in load_yaml_documents(read_text(path, "trace"), source):
        doc = document.data
        where = f"{source}: document [{document.index}] (line {document.line})"
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise InputError(f"{where}: expected a mapping")
        if doc.get("op") == "delete":
            key = doc.get("claim")
            if not isinstance(key, str):
                raise InputError(f"{where}: a deletion names its claim as claim: NAMESPACE/NAME")
            claims.delete(key)
            items.append((document, key))
            continue
        kind = doc.get("kind")
        if kind == "DeviceClass":
            try:
                items.append((document, DeviceClass.from_manifest(doc)))
            except ValueError as error:
                raise InputError(f"{where}: {error}") from None
            continue
        if kind != "ResourceClaim":
            raise InputError(f"{where}: expected DeviceClass, ResourceClaim or op: delete")
        claim = _claim(doc, where)
        claims.add(claim, document)
        items.append((document, claim))
    return items


def _device_json(device: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"request": device.request, "device": device.device, "gpu": device.gpu_index}
    if device.placement is not None:
        out["placement"] = {"start": device.placement.start, "size": device.placement.size}
    if device.admin_access:
        out["adminAccess"] = True
    return out


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except BrokenPipeError:
        raise  # the reader of stdout went away: not a problem with the input
    except (InputError, OSError) as error:
        print(f"tangram allocate: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    fleet = FleetState()
    for hw in load_fleet(args.fleet):
        fleet.apply_inventory(hw)
    classes: dict[str, DeviceClass] = {}
    if not args.no_shipped_classes:
        from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes  # noqa: PLC0415

        for manifest in load_shipped_device_classes():
            device_class = DeviceClass.from_manifest(manifest)
            classes[device_class.name] = device_class
    by_key: dict[str, str] = {}
    timings: list[float] = []
    admitted = failed = 0
    nvlink = NvlinkTally()
    out = sys.stdout
    for document, item in load_trace(args.trace):
        if isinstance(item, str):
            uid = by_key.pop(item, None)
            if uid is None:
                print(
                    f"tangram allocate: trace {args.trace}: document [{document.index}] "
                    f"(line {document.line}): no claim {item!r} to delete",
                    file=sys.stderr,
                )
                continue
            fleet.release(uid)
            continue
        if isinstance(item, DeviceClass):
            classes[item.name] = item
            continue
        claim = item
        # The same claim asked again while it holds devices gets its decision again, counted once.
        repeated = by_key.get(claim.key) == claim.uid
        started = time.perf_counter()
        decision = fleet.allocate(claim, classes, args.policy, explain=args.explain)
        timings.append(time.perf_counter() - started)
        line: dict[str, Any] = {"claim": claim.key}
        if isinstance(decision, Allocated):
            if not repeated:
                admitted += 1
                nvlink.count(decision)
            by_key[claim.key] = claim.uid
            line.update(
                status="allocated", node=decision.node, devices=[_device_json(d) for d in decision.devices]
            )
        else:
            failed += 1
            line.update(status="failed", reason=decision.reason)
        if args.explain:
            line["explanation"] = decision.explanation
            if decision.why is not None:
                line["why"] = msgspec.to_builtins(decision.why)
        out.write(json.dumps(line) + "\n")
    metrics = fleet.metrics()
    total = sum(timings)
    summary = {
        "policy": args.policy,
        "nodes": metrics.nodes,
        "admitted": admitted,
        "failed": failed,
        "stranded_gpus": metrics.stranded_gpus,
        "free_gpus": metrics.free_gpus,
        **nvlink.report(),
        "decisions_per_s": round(len(timings) / total, 1) if total > 0 else 0.0,
        "p50_decision_ms": round(percentile(timings, 0.50) * 1000, 3) if timings else 0.0,
        "p99_decision_ms": round(percentile(timings, 0.99) * 1000, 3) if timings else 0.0,
    }
    out.write(json.dumps({"summary": summary}) + "\n")
    return 0
