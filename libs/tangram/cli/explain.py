"""`tangram explain NAMESPACE/NAME`: why a claim got what it got, from a log file or a running JetStream."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from tangram.allocation import POLICIES
from tangram.cli.logsource import SourceError, add_nats_arguments, device_classes, load_log
from tangram.eventlog.explain import ClaimNotInLog, Explanation, explain


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("claim", metavar="NAMESPACE/NAME")
    parser.add_argument("--log", type=Path, help="a file from `tangram log export` (else --nats-url)")
    parser.add_argument("--policy", choices=POLICIES, default="tangram", help="the allocator's policy")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    add_nats_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.claim.count("/") != 1 or not all(args.claim.split("/")):
        print(f"tangram explain: {args.claim!r} is not NAMESPACE/NAME", file=sys.stderr)
        return 2
    try:
        log = load_log(args, "tangram-explain")
        report = explain(log, args.claim, device_classes(), args.policy)
    except (SourceError, ClaimNotInLog) as error:
        print(f"tangram explain: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(msgspec.to_builtins(report)))
    else:
        print(render(report), end="")
    return 0


def render(report: Explanation) -> str:
    lines = [f"claim {report.claim} (uid {report.uid})", "", "requests as understood:"]
    understood = report.understood
    if "error" in understood:
        lines.append(f"  {understood['error']}")
    for request in understood.get("requests", []):
        for alt in request["alternatives"]:
            lines.append(f"  {alt['name']}: {alt['count']} x {alt['device_class']}")
            lines.extend(f"    selector {s}" for s in alt["selectors"])
            if alt["capacity"]:
                lines.append(f"    capacity {alt['capacity']}")
    for constraint in understood.get("constraints", []):
        lines.append(f"  constraint {_inline(constraint)}")
    for rule in understood.get("topology", []):
        lines.append(f"  topology {_inline(rule)}")
    if "placement" in understood:
        lines.append(f"  placement {understood['placement']}")
    lines += ["", "candidate nodes:"]
    lines.extend(_tree(report.candidates, "  "))
    if report.losses:
        lines.append(f"  demand-weighted loss: {', '.join(str(v) for v in report.losses)}")
    lines += ["", "decision:"]
    outcome = report.recorded
    if outcome.status == "allocated":
        lines.append(f"  allocated on {outcome.node}")
    elif outcome.status == "failed":
        lines.append(f"  failed: {outcome.reason}")
    else:
        lines.append("  no decision recorded")
    if report.recomputed != report.recorded:
        lines.append(
            f"  replayed now, the engine decides otherwise: {_inline(msgspec.to_builtins(report.recomputed))}"
        )
    if report.scores:
        lines.append(f"  scores {_inline(report.scores)}")
    for device in report.devices:
        placement = device.get("placement")
        where = (
            f" slices {placement['start']}..{placement['start'] + placement['size'] - 1}" if placement else ""
        )
        lines.append(
            f"  device {device['device']} (GPU {device['gpu_index']}{where}) for request {device['request']}"
        )
    if report.commands:
        lines += ["", "partition commands:"]
        for c in report.commands:
            slices = f"slices {c.start}..{c.start + c.size - 1}"
            what = f"{c.action} {c.profile} on {c.node} GPU {c.gpu_index} {slices}"
            detail = f" {c.duration_ms:.1f} ms" if c.duration_ms is not None else ""
            lines.append(f"  {what}: {c.result}{detail}{' ' + c.reason if c.reason else ''}")
    lines += ["", "steps:"]
    lines.extend(f"  {s.step:<18} {s.at.isoformat()}  +{s.after_ms:.1f} ms" for s in report.steps)
    return "\n".join(lines) + "\n"


def _inline(value: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in value.items())


def _tree(value: Any, indent: str) -> list[str]:
    """Any explanation structure the engine gives, one line per item: new fields show up unasked."""
    if isinstance(value, list):
        return [line for item in value for line in _tree(item, indent)] or [f"{indent}(none)"]
    if isinstance(value, dict):
        simple = {k: v for k, v in value.items() if not isinstance(v, dict | list)}
        nested = {k: v for k, v in value.items() if isinstance(v, dict | list)}
        lines = [f"{indent}{_inline(simple)}"] if simple else []
        for key, item in nested.items():
            lines.append(f"{indent}{key}:")
            lines.extend(_tree(item, indent + "  "))
        return lines
    return [f"{indent}{value}"]
