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
import yaml

from tangram.allocation import POLICIES, Allocated, Claim, DeviceClass, FleetState, NvlinkTally
from tangram.events.inventory import NodeHardware


class InputError(ValueError):
    """A fleet or trace file that cannot be used, with the document and field it concerns."""


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

    entries = yaml.safe_load(path.read_text())
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: expected a non-empty YAML list of nodes")
    nodes: list[NodeHardware] = []
    seen: set[str] = set()
    machines: dict[str, NodeHardware] = {}
    for position, entry in enumerate(entries):
        where = f"{path}: node [{position}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or "machine" not in entry:
            raise InputError(f"{where}: needs name (string) and machine")
        count = entry.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise InputError(f"{where}: count must be a positive integer")
        machine = str(entry["machine"])
        if machine not in machines:
            try:
                nvml = SimNvml.from_machine(machine)
                nvml.nvmlInit()
                machines[machine] = read_node_hardware(nvml, "template")
            except (ValueError, OSError) as error:
                raise InputError(f"{where}: machine {machine!r}: {error}") from None
        names = [entry["name"]] if count is None else [f"{entry['name']}-{i}" for i in range(count)]
        for name in names:
            if name in seen:
                raise InputError(f"{where}: node name {name!r} appears twice")
            seen.add(name)
            nodes.append(_renamed(machines[machine], name))
    return nodes


def _renamed(template: NodeHardware, node: str) -> NodeHardware:
    """The same machine under another name: GPU UUIDs are made unique per node, as on real hardware."""
    import msgspec  # noqa: PLC0415

    gpus = [
        msgspec.structs.replace(
            g,
            uuid=_uuid(node, g.uuid),
            nvlink_domain=g.nvlink_domain.replace("template", node, 1) if g.nvlink_domain else None,
            mig_instances=[msgspec.structs.replace(m, uuid=_uuid(node, m.uuid)) for m in g.mig_instances],
        )
        for g in template.gpus
    ]
    return msgspec.structs.replace(template, node=node, gpus=gpus)


def _uuid(node: str, uuid: str) -> str:
    prefix = uuid.split("-", 1)[0] if "-" in uuid else "GPU"
    digest = hashlib.sha1(f"{node}/{uuid}".encode(), usedforsecurity=False).hexdigest()
    return f"{prefix}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _claim(doc: dict[str, Any], position: int) -> Claim:
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict) or not metadata.get("name"):
        raise InputError(f"trace document [{position}]: ResourceClaim has no metadata.name")
    namespace = str(metadata.get("namespace") or "default")
    name = str(metadata["name"])
    uid = (
        metadata.get("uid")
        or "uid-" + hashlib.sha1(f"{namespace}/{name}".encode(), usedforsecurity=False).hexdigest()[:16]
    )
    spec = doc.get("spec")
    return Claim(namespace=namespace, name=name, uid=str(uid), spec=spec if isinstance(spec, dict) else {})


def _device_json(device: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"request": device.request, "device": device.device, "gpu": device.gpu_index}
    if device.placement is not None:
        out["placement"] = {"start": device.placement.start, "size": device.placement.size}
    if device.admin_access:
        out["adminAccess"] = True
    return out


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (InputError, OSError, yaml.YAMLError) as error:
        print(f"tangram allocate: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    fleet = FleetState()
    for hw in load_fleet(args.fleet):
        fleet.apply_inventory(hw)
    classes: dict[str, DeviceClass] = {}
    if not args.no_shipped_classes:
        from tangram.k8s.deviceclasses import load_shipped_device_classes  # noqa: PLC0415

        for manifest in load_shipped_device_classes():
            device_class = DeviceClass.from_manifest(manifest)
            classes[device_class.name] = device_class
    by_key: dict[str, str] = {}
    timings: list[float] = []
    admitted = failed = 0
    nvlink = NvlinkTally()
    out = sys.stdout
    for position, doc in enumerate(yaml.safe_load_all(args.trace.read_text())):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise InputError(f"trace document [{position}]: expected a mapping")
        if doc.get("op") == "delete":
            key = str(doc.get("claim", ""))
            uid = by_key.pop(key, None)
            if uid is None:
                print(
                    f"tangram allocate: trace document [{position}]: no claim {key!r} to delete",
                    file=sys.stderr,
                )
                continue
            fleet.release(uid)
            continue
        kind = doc.get("kind")
        if kind == "DeviceClass":
            try:
                device_class = DeviceClass.from_manifest(doc)
            except ValueError as error:
                raise InputError(f"trace document [{position}]: {error}") from None
            classes[device_class.name] = device_class
            continue
        if kind != "ResourceClaim":
            raise InputError(
                f"trace document [{position}]: expected DeviceClass, ResourceClaim or op: delete"
            )
        claim = _claim(doc, position)
        started = time.perf_counter()
        decision = fleet.allocate(claim, classes, args.policy, explain=args.explain)
        timings.append(time.perf_counter() - started)
        line: dict[str, Any] = {"claim": claim.key}
        if isinstance(decision, Allocated):
            admitted += 1
            by_key[claim.key] = claim.uid
            nvlink.count(decision)
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
        "p50_decision_ms": round(_percentile(timings, 0.50) * 1000, 3),
        "p99_decision_ms": round(_percentile(timings, 0.99) * 1000, 3),
    }
    out.write(json.dumps({"summary": summary}) + "\n")
    return 0
