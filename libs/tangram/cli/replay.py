"""`tangram replay`: decide every claim of a log again, offline, and report where the decisions differ."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec

from tangram.allocation import POLICIES
from tangram.cli.logsource import SourceError, add_nats_arguments, device_classes, load_log
from tangram.eventlog.replay import ReplayReport, replay


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "log", nargs="?", type=Path, help="a file from `tangram log export` (else --nats-url)"
    )
    parser.add_argument("--policy", choices=POLICIES, default="tangram", help="the allocator's policy")
    parser.add_argument("--json", action="store_true", help="one JSON object with a `divergences` list")
    add_nats_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        log = load_log(args, "tangram-replay")
    except SourceError as error:
        print(f"tangram replay: {error}", file=sys.stderr)
        return 2
    report = replay(log, device_classes(), args.policy)
    if args.json:
        out = msgspec.to_builtins(report)
        out["version_changed"] = report.version_changed
        print(json.dumps(out))
    else:
        print(render(report), end="")
    return 1 if report.divergences else 0


def render(report: ReplayReport) -> str:
    lines = [
        f"replayed {report.events} events, {report.claims_decided} claims decided again"
        + (f", {report.undecodable} undecodable messages skipped" if report.undecodable else "")
        + (f", {report.refused} refused by their subject" if report.refused else ""),
    ]
    if report.version_changed:
        lines.append(
            f"recorded by Tangram {report.recorded_version}, replayed by {report.replayed_version}: "
            "a divergence may come from the version change"
        )
    if not report.divergences:
        lines.append("no divergence: every recomputed decision matches the recorded one")
    for d in report.divergences:
        lines.append(
            f"DIVERGENCE {d.claim} (uid {d.uid}, request seq {d.request_seq}): {', '.join(d.differs)}"
        )
        for label, outcome in (("recorded", d.recorded), ("recomputed", d.recomputed)):
            where = f" on {outcome.node}" if outcome.node else ""
            devices = f": {', '.join(outcome.devices)}" if outcome.devices else ""
            reason = f" ({outcome.reason})" if outcome.reason else ""
            lines.append(f"  {label:<10} {outcome.status}{where}{devices}{reason}")
    return "\n".join(lines) + "\n"
